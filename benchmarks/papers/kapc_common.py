"""Shared by the KAPC benchmarks: run a scenario under another algorithm and seed, read back.

Each variant is run into its own folder (:func:`seeds.run_or_reuse`, which calls
:func:`mecsim.store.session.run_in_folder` as `mecsim run` does), so every
run leaves its ``rounds.csv`` / ``clients.csv`` / op-traces under
``OUT/<variant>/seed<k>/`` and the printed tables can be checked against them (``mecsim
report`` reads the same files); a finished run is reused.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from seeds import run_dir, run_or_reuse

from mecsim.scenario import load_scenario, scenario_from_dict

MiB = 1024 * 1024
# --quick (seconds, not minutes): small data, one epoch, in-process, one seed, records in
# a new temporary directory unless --out is given
QUICK_OVERRIDES: dict[str, Any] = {
    "dataset": {"train_size": 400, "test_size": 100},
    "training": {"epochs": 1},
}


def quick_out(out: str | None, quick: bool, default: str) -> Path:
    """The records directory: --out, else a new temporary one with --quick, else default."""
    if out:
        return Path(out)
    return Path(tempfile.mkdtemp(prefix=Path(default).name + "-")) if quick else Path(default)


def scenario_variant(
    scenario_path: str | Path,
    run_id: str,
    algorithm: dict[str, Any],
    *,
    rounds: int | None,
    backend: str,
    seed: int,
    overrides: dict[str, Any] | None = None,
):
    """The scenario with ``algorithm`` ({"name", "params"}), ``seed`` and ``overrides``
    (top-level sections, merged one level deep: {"training": {"epochs": 1}})."""
    data = load_scenario(scenario_path).model_dump(mode="json")
    data["algorithm"] = algorithm
    data["seed"] = seed
    if rounds is not None:
        data["rounds"] = rounds
    data["metrics"]["enabled"] = False
    data["outputs"]["table_format"] = "csv"
    data["execution"]["backend"] = backend
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return scenario_from_dict(data, f"{scenario_path} [{run_id}, seed {seed}]")


def run_variant(
    scenario_path: str | Path,
    run_id: str,
    algorithm: dict[str, Any],
    *,
    rounds: int | None,
    backend: str,
    hosts: int | None,
    out: Path,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run (or reuse) the variant for one seed; its (rounds, clients) tables."""
    sc = scenario_variant(
        scenario_path,
        run_id,
        algorithm,
        rounds=rounds,
        backend=backend,
        seed=seed,
        overrides=overrides,
    )
    return run_or_reuse(sc, run_dir(out, run_id, seed), f"{run_id} seed {seed}", hosts)


def best_mean_accuracy(rounds: pd.DataFrame) -> float:
    """The papers' "best mean accuracy": max over rounds of the mean user accuracy."""
    return float(rounds["mean_accuracy"].max())


def mean_of_client_best(clients: pd.DataFrame) -> float:
    """The mean over clients of each client's best accuracy over rounds (TMC Sec. 7.1's
    wording for Local and FedAvg)."""
    acc = clients.dropna(subset=["accuracy"])
    return float(acc.groupby("client_id")["accuracy"].max().mean())


def per_round_mean(rounds: pd.DataFrame, column: str) -> float:
    """Mean of a round column over the rounds that have it (NaN when absent)."""
    if column not in rounds:
        return float("nan")
    value = float(rounds[column].mean())
    return value if not math.isnan(value) else float("nan")


def column_max(rounds: pd.DataFrame, column: str) -> float:
    return float(rounds[column].max()) if column in rounds else float("nan")
