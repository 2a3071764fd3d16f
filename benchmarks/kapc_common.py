"""Shared by the KAPC benchmarks: run a scenario under another algorithm and read back.

Each variant is run through :func:`mecsim.runner.run` with the records writer, so every
run leaves its ``rounds.csv`` / ``clients.csv`` / op-traces under ``OUT/<variant>/`` and
the printed tables can be checked against them (``mecsim report`` reads the same files).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from mecsim.records import RecordsWriter
from mecsim.runner import run
from mecsim.scenario import load_scenario, scenario_from_dict

MiB = 1024 * 1024
# --quick (seconds, not minutes): small data, one epoch, in-process, records in a new
# temporary directory unless --out is given
QUICK_OVERRIDES: dict[str, Any] = {"dataset": {"train_size": 400, "test_size": 100},
                                   "training": {"epochs": 1}}


def quick_out(out: str | None, quick: bool, default: str) -> Path:
    """The records directory: --out, else a new temporary one with --quick, else default."""
    if out:
        return Path(out)
    return Path(tempfile.mkdtemp(prefix=Path(default).name + "-")) if quick else Path(default)


def run_variant(scenario_path: str | Path, run_id: str, algorithm: dict[str, Any], *,
                rounds: int | None, backend: str, hosts: int | None, out: Path,
                overrides: dict[str, Any] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the scenario with ``algorithm`` ({"name", "params"}); (rounds, clients) tables."""
    data = load_scenario(scenario_path).model_dump(mode="json")
    data["algorithm"] = algorithm
    if rounds is not None:
        data["rounds"] = rounds
    data["metrics"]["enabled"] = False
    data["outputs"]["table_format"] = "csv"
    data["execution"]["backend"] = backend
    for key, value in (overrides or {}).items():  # sections merged one level deep
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    scenario = scenario_from_dict(data, f"{scenario_path} [{run_id}]")
    run_dir = out / run_id
    if run_dir.exists():
        shutil.rmtree(run_dir)
    start = time.perf_counter()
    run(scenario, run_id, run_dir, [RecordsWriter(run_dir)], hosts=hosts)
    print(f"  {run_id}: {scenario.rounds} rounds in {time.perf_counter() - start:.0f} s host",
          flush=True)
    return pd.read_csv(run_dir / "rounds.csv"), pd.read_csv(run_dir / "clients.csv")


def best_mean_accuracy(rounds: pd.DataFrame) -> float:
    """The papers' "best mean accuracy": max over rounds of the mean user accuracy."""
    return float(rounds["mean_accuracy"].max())


def mean_of_client_best(clients: pd.DataFrame) -> float:
    """The mean over clients of each client's best accuracy over rounds (TMC Sec. 7.1's
    wording for Local and FedAvg)."""
    acc = clients.dropna(subset=["accuracy"])
    return float(acc.groupby("client_id")["accuracy"].max().mean())


def per_round_mean(rounds: pd.DataFrame, column: str) -> float:
    value = float(rounds[column].mean())
    return value if not math.isnan(value) else float("nan")
