"""Seeds for the paper-table benchmarks: every configuration runs under seeds 0 .. N-1
(``--seeds N``, default 3) and the tables show mean ± standard deviation.

The scenario seed decides every draw of a run (data split, initial model, channel,
selection), so the spread over seeds is the run-to-run variation a reader of a single
run does not see. The standard deviation is the sample one (ddof = 1). An ordering
"holds beyond the spread" when the two intervals mean ± std do not overlap
(:func:`beyond_spread`); with 3 seeds that is a loose test, stated as such in the docs.

Runs are kept under ``OUT/<variant>/seed<k>/``: a finished run of the same scenario is
reused (a table can be rebuilt from the records alone), a run that was killed resumes
from its newest checkpoint (as ``mecsim run --resume`` does), and a run of another
scenario (say other ``--epochs``) is run again. Of a finished run only the newest
checkpoint is kept (``kapc_relations.py`` reads it; its records are what is reused): KAPC
on the ResNet18 system scenario left ~6.5 GB of them per run (every client's personal
model), ~3.5-4.4 GB with one.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mecsim.scenario import Scenario, ScenarioError, load_scenario
from mecsim.store.checkpoints import CheckpointStore, scenario_digest
from mecsim.store.runfolder import RunFolderError, RunFolderInUse, prepare_resume
from mecsim.store.session import run_in_folder

DEFAULT_SEEDS = 3


def add_seeds_argument(p: argparse.ArgumentParser, default: int = DEFAULT_SEEDS) -> None:
    p.add_argument(
        "--seeds",
        type=int,
        default=default,
        metavar="N",
        help=f"run every configuration under seeds 0 .. N-1 and report mean ± "
        f"std (default {default})",
    )


def seed_list(n: int) -> list[int]:
    if n < 1:
        raise SystemExit("--seeds must be >= 1")
    return list(range(n))


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample std, count) of the finite values; std is NaN with fewer than two."""
    x = np.array([float(v) for v in values], dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return math.nan, math.nan, 0
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else math.nan, len(x)


def pm(values: Sequence[float], fmt: str = ".2f", scale: float = 1.0, missing: str = "X") -> str:
    """'mean ± std' of the finite values (scaled), 'mean' for one, ``missing`` for none;
    '(k of n)' is appended when some values are missing (e.g. a target not reached)."""
    mean, std, k = mean_std(values)
    if k == 0:
        return missing
    text = format(scale * mean, fmt)
    if k > 1:
        text += " ± " + format(scale * std, fmt)
    if k < len(values):
        text += f" ({k} of {len(values)})"
    return text


def beyond_spread(a: Sequence[float], b: Sequence[float]) -> bool:
    """True when mean(a) - std(a) > mean(b) + std(b): a is above b beyond the spread."""
    ma, sa, ka = mean_std(a)
    mb, sb, kb = mean_std(b)
    if ka == 0 or kb == 0:
        return False
    sa, sb = (0.0 if math.isnan(s) else s for s in (sa, sb))
    return ma - sa > mb + sb


@dataclass(frozen=True)
class Comparison:
    """Every pair of labels compared (:func:`compare_all`). ``order``: the labels, best
    mean first. ``ahead[a]``: the labels ``a`` is better than beyond the spread (in
    ``order``). ``level``: groups of labels whose intervals mean ± std all overlap (the
    maximal ones); two labels are level exactly when some group holds both."""

    order: list[str]
    ahead: dict[str, list[str]]
    level: list[list[str]]

    def is_level(self, a: str, b: str) -> bool:
        return any(a in group and b in group for group in self.level)


def _interval(values: Sequence[float]) -> tuple[float, float]:
    mean, std, _ = mean_std(values)
    std = 0.0 if math.isnan(std) else std
    return mean - std, mean + std


def compare_all(values: dict[str, Sequence[float]], higher_is_better: bool = True) -> Comparison:
    """Compare every pair, not only neighbours in the order of the means: a chain of
    level neighbours (A ≈ B ≈ C) may hide A beyond the spread of C. The relation
    "beyond the spread" (:func:`beyond_spread`) between intervals is a partial order."""
    kept = {label: v for label, v in values.items() if mean_std(v)[2] > 0}
    order = [
        label
        for _, label in sorted(
            ((mean_std(v)[0], label) for label, v in kept.items()), reverse=higher_is_better
        )
    ]

    def better(a: str, b: str) -> bool:
        return (
            beyond_spread(kept[a], kept[b]) if higher_is_better else beyond_spread(kept[b], kept[a])
        )

    ahead = {a: [b for b in order if b != a and better(a, b)] for a in order}
    # maximal groups of pairwise overlapping intervals: those holding a common point
    # (intervals on a line), found at each interval's start
    spans = {label: _interval(kept[label]) for label in order}
    groups: list[list[str]] = []
    for _, start in sorted((lo, label) for label, (lo, _) in spans.items()):
        lo = spans[start][0]
        group = [x for x in order if spans[x][0] <= lo <= spans[x][1]]
        if len(group) > 1 and not any(set(group) <= set(g) for g in groups):
            groups = [g for g in groups if not set(g) < set(group)] + [group]
    groups.sort(key=lambda g: order.index(g[0]))
    return Comparison(order, ahead, groups)


def ordering(values: dict[str, Sequence[float]], higher_is_better: bool = True) -> str:
    """Every pair compared, as a partial order: for each label (best mean first) the labels
    it is better than beyond the spread, then the groups that are level, e.g.
    'FedProx > KAPC, FedAvg; Local > FedAvg; KAPC > FedAvg; level: FedProx ≈ Local,
    Local ≈ KAPC'. ('>': higher beyond the spread; '<': lower, when lower is better.)"""
    c = compare_all(values, higher_is_better)
    if not c.order:
        return ""
    sign = ">" if higher_is_better else "<"
    parts = [f"{a} {sign} {', '.join(c.ahead[a])}" for a in c.order if c.ahead[a]]
    text = "; ".join(parts) if parts else f"no pair beyond the spread ({', '.join(c.order)})"
    if c.level:
        text += "; level: " + ", ".join(" ≈ ".join(g) for g in c.level)
    return text


def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / variant / f"seed{seed}"


def finished(path: Path, rounds: int) -> bool:
    """A finished run with ``rounds`` rounds is recorded in ``path``."""
    csv = path / "rounds.csv"
    if not csv.is_file():
        return False
    try:
        meta = json.loads((path / "run.json").read_text())
    except (OSError, ValueError):
        meta = {}
    return meta.get("status", "finished") == "finished" and len(pd.read_csv(csv)) == rounds


def same_scenario(path: Path, scenario: Scenario) -> bool:
    """The run recorded in ``path`` is of ``scenario`` (what decides its results: not its
    outputs, execution, metrics or checkpoint settings)."""
    try:
        recorded = load_scenario(path / "scenario.yaml")
    except (OSError, ScenarioError):
        return False
    return scenario_digest(recorded) == scenario_digest(scenario)


def run_or_reuse(
    scenario: Scenario,
    path: Path,
    label: str = "",
    hosts: int | None = None,
    on_reuse: Callable[[Path], None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rounds, clients) of ``scenario`` recorded in ``path``: reused when that run is
    finished there, resumed from its checkpoint when it was killed, else (re)run with the
    records writer."""
    same = path.is_dir() and same_scenario(path, scenario)
    if same and finished(path, scenario.rounds):
        print(f"  {label or path}: reusing {path}", flush=True)
        if on_reuse:
            on_reuse(path)
    else:
        start = time.perf_counter()
        target = None
        if same:
            try:
                target = prepare_resume(path, warn=lambda m: print(f"  {label}: {m}"))
            except RunFolderInUse as exc:  # another benchmark is running it: not deleted
                raise SystemExit(f"error: {exc}") from None
            except RunFolderError as exc:
                print(f"  {label or path}: not resumable ({exc}); run again", flush=True)
        elif path.exists():
            print(
                f"  {label or path}: {path} holds a run of another scenario; run again", flush=True
            )
        if target is not None:
            print(f"  {label or path}: resuming after round {target.rounds_done}", flush=True)
            run_in_folder(None, resume=target, hosts=hosts)
        else:
            if path.exists():
                shutil.rmtree(path)
            run_in_folder(scenario, path, hosts=hosts)
        print(
            f"  {label or path}: {scenario.rounds} rounds in "
            f"{time.perf_counter() - start:.0f} s host",
            flush=True,
        )
    # the newest checkpoint stays (kapc_relations.py reads the server's state from it)
    CheckpointStore(path, label, "").prune(keep=1)
    clients = path / "clients.csv"
    return (
        pd.read_csv(path / "rounds.csv"),
        pd.read_csv(clients) if clients.is_file() else pd.DataFrame(),
    )
