"""What-if sweeps: replay recorded runs over a grid of network / device parameters.

    >>> import mecsim
    >>> df = mecsim.sweep("runs/fedavg-mnist-10-...",
    ...                   {"channel.uplink.bandwidth_hz": [5e6, 10e6, 20e6]},
    ...                   target_accuracy=0.8)

One row per (run, grid point) with round-time statistics and the critical-path split,
total emulated time, time to a target accuracy (accuracy from the recorded rounds, while
the replay is exact), bytes, and whether the point is exact (see :mod:`mecsim.analysis.replay`).
Grid points are the Cartesian product of the values, in the order given. Points are
replayed in a process pool when there are enough of them to pay for it (``workers``).

``mecsim.sweep(...)`` is this module's :func:`sweep` (the module is callable).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import multiprocessing
import os
import sys
import tempfile
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from rich.console import Console

from mecsim.analysis.labels import axis, setting_text, value_text
from mecsim.analysis.replay import (
    RecordedRun,
    ReplayInfeasible,
    ReplayResult,
    RunLoadError,
    association_changes,
    geometry_axis_refusal,
    load_run,
    membership_changes,
    membership_free,
    moving_hierarchy,
    replay,
    retime,
)
from mecsim.run.interrupts import die_with_parent
from mecsim.run.observers import RunObserver
from mecsim.run.progress import ProgressBar
from mecsim.run.setup import moving_rate_refusal
from mecsim.scenario import Scenario, load_scenario, resolved_yaml, scenario_from_dict
from mecsim.scenario.overrides import OverrideError, apply_overrides, is_timing_path
from mecsim.store.runfolder import RunFolderFinished, prepare_resume
from mecsim.store.session import run_in_folder

# Columns of a sweep's DataFrame; the grid's paths come after "algorithm".
HEAD_COLUMNS = ["run_id", "algorithm"]
METRIC_COLUMNS = [
    "source",
    "exact",
    "inexact_from_round",
    "feasible",
    "rounds",
    "round_time_mean_s",
    "round_time_median_s",
    "round_time_p95_s",
    "round_time_min_s",
    "round_time_max_s",
    "dl_time_mean_s",
    "client_time_mean_s",
    "ul_time_mean_s",
    "server_time_mean_s",
    "backhaul_time_mean_s",
    "idle_time_mean_s",
    "total_time_s",
    "target_accuracy",
    "rounds_to_target",
    "time_to_target_s",
    "final_accuracy",
    "bytes_up",
    "bytes_down",
    "energy_mean_j",
    "energy_compute_mean_j",
    "energy_radio_mean_j",
    "energy_idle_mean_j",
    "energy_sleep_mean_j",
    "energy_total_j",
    "dropped",
    "notes",
]
# A process pool costs ~50 ms to start and replaying costs ~10 us per client-round (both
# measured on 2 shared cores, FedAvg runs; see benchmarks/speed/sweep.py): below this many
# client-rounds in a sweep, one process is faster.
MIN_CLIENT_ROUNDS_FOR_POOL = 20_000

RunLike = RecordedRun | Scenario | str | Path


def grid_size(grid: Mapping[str, Sequence[Any]]) -> int:
    """How many points :func:`grid_points` would give, worked out without making them."""
    return math.prod(len(values) for values in grid.values())


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The Cartesian product of the grid's values, first path varying slowest."""
    for path, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise OverrideError(f"grid[{path!r}] must be a list of values, got {values!r}")
        if len(values) == 0:
            raise OverrideError(f"grid[{path!r}] has no values")
    paths = list(grid)
    return [
        dict(zip(paths, combo, strict=True))
        for combo in itertools.product(*(grid[p] for p in paths))
    ]


def record(
    scenario: Scenario | str | Path,
    record_dir: str | Path | None = None,
    *,
    backend: str | None = None,
    progress: bool = False,
) -> RecordedRun:
    """Run a scenario once with training, recording its op-traces, and load the run.

    The record goes to ``record_dir/<name>-<hash of the resolved scenario>/`` (default: a
    temporary directory), run into that folder as ``mecsim run`` does
    (:func:`mecsim.store.session.run_in_folder`); a finished record of the same scenario
    already there is reused, one that was killed is resumed.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    data = scenario.model_dump(mode="json")
    data["outputs"]["save_optraces"] = True
    data["metrics"]["enabled"] = False
    scenario = scenario_from_dict(data, scenario.name)
    base = Path(record_dir) if record_dir is not None else Path(tempfile.mkdtemp("-mecsim"))
    # the id names the resolved scenario, so a record is reused only for the same scenario
    digest = hashlib.sha1(resolved_yaml(scenario).encode()).hexdigest()[:8]
    out_dir = base / f"{scenario.outputs.run_id or scenario.name}-{digest}"
    observers: list[RunObserver] = [ProgressBar(Console(stderr=True))] if progress else []
    if out_dir.exists():
        try:
            target = prepare_resume(out_dir)
        except RunFolderFinished:
            return load_run(out_dir)  # a seeded run is reproducible: no need to train again
        run_in_folder(None, observers=observers, resume=target, backend=backend)
    else:
        run_in_folder(scenario, out_dir, observers=observers, backend=backend)
    return load_run(out_dir)


def as_runs(
    runs: RunLike | Sequence[RunLike],
    *,
    record_dir: str | Path | None = None,
    backend: str | None = None,
    progress: bool = False,
) -> list[RecordedRun]:
    """Recorded runs from run directories, scenario files / objects (trained once), or runs."""
    items = list(runs) if isinstance(runs, (list, tuple)) else [runs]
    out = []
    for item in items:
        if isinstance(item, RecordedRun):
            out.append(item)
        elif isinstance(item, Scenario):
            out.append(record(item, record_dir, backend=backend, progress=progress))
        else:
            path = Path(cast("str | Path", item))
            if path.is_dir():
                out.append(load_run(path))
            elif path.suffix in (".yaml", ".yml") and path.is_file():
                out.append(record(path, record_dir, backend=backend, progress=progress))
            else:
                raise RunLoadError(f"{path}: neither a run directory nor a scenario file")
    if not out:
        raise RunLoadError("no runs to sweep")
    return out


def summarise(result: ReplayResult, target_accuracy: float | None = None) -> dict[str, Any]:
    """One sweep row (METRIC_COLUMNS) from a replayed or retrained run."""
    rounds = result.rounds
    times = rounds["round_time_s"].to_numpy(dtype=float)
    acc = rounds["mean_accuracy"].to_numpy(dtype=float)
    notes = list(result.notes)
    rounds_to, time_to = math.nan, math.nan
    if target_accuracy is not None:
        reached = np.flatnonzero(acc >= target_accuracy)
        if reached.size:
            rounds_to = int(reached[0]) + 1
            time_to = float(rounds["elapsed_s"].iloc[reached[0]])
        elif not result.exact:
            where = (
                f"round {result.inexact_from_round + 1}"
                if result.inexact_from_round is not None
                else "the first round"
            )
            notes.append(
                f"target accuracy {target_accuracy} not reached before {where}, "
                "where the replay stops being exact"
            )
        else:
            notes.append(f"target accuracy {target_accuracy} not reached in {len(acc)} rounds")
    return {
        "source": result.source,
        "exact": result.exact,
        "inexact_from_round": result.inexact_from_round,
        "feasible": True,
        "rounds": len(rounds),
        "round_time_mean_s": float(np.mean(times)),
        "round_time_median_s": float(np.median(times)),
        "round_time_p95_s": float(np.percentile(times, 95)),
        "round_time_min_s": float(np.min(times)),
        "round_time_max_s": float(np.max(times)),
        "dl_time_mean_s": float(rounds["dl_time_s"].mean()),
        "client_time_mean_s": float(rounds["client_time_s"].mean()),
        "ul_time_mean_s": float(rounds["ul_time_s"].mean()),
        "server_time_mean_s": float(rounds["server_time_s"].mean()),
        "backhaul_time_mean_s": float(rounds["backhaul_time_s"].mean()),
        "idle_time_mean_s": float(rounds["idle_time_s"].mean()),
        "total_time_s": float(rounds["elapsed_s"].iloc[-1]),
        "target_accuracy": math.nan if target_accuracy is None else float(target_accuracy),
        "rounds_to_target": rounds_to,
        "time_to_target_s": time_to,
        "final_accuracy": float(acc[-1]),
        "bytes_up": int(rounds["bytes_up"].sum()),
        "bytes_down": int(rounds["bytes_down"].sum()),
        # joules of all selected clients: mean per round, its parts, and the whole run
        "energy_mean_j": float(rounds["energy_j"].mean(skipna=False)),
        "energy_compute_mean_j": float(rounds["energy_compute_j"].mean(skipna=False)),
        "energy_radio_mean_j": float(rounds["energy_radio_j"].mean(skipna=False)),
        "energy_idle_mean_j": float(rounds["energy_idle_j"].mean(skipna=False)),
        "energy_sleep_mean_j": float(rounds["energy_sleep_j"].mean(skipna=False)),
        "energy_total_j": float(rounds["energy_j"].sum(min_count=len(rounds))),
        "dropped": int(rounds["dropped"].sum()),
        "notes": " | ".join(notes),
    }


def _infeasible_row(message: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(METRIC_COLUMNS, math.nan)
    row.update(
        source="replay",
        exact=False,
        inexact_from_round=None,
        feasible=False,
        notes=f"infeasible: {message}",
    )
    return row


def baseline_mismatch(run: RecordedRun) -> int | None:
    """First round whose no-override replay differs from the recorded round time, or None.

    A run recorded by a mecsim whose timing model differed replays differently; every
    point of such a run is then marked not exact.
    """
    timed = retime(run, run.scenario)
    for r, (row, recorded) in enumerate(zip(timed.rows, run.round_time_s, strict=True)):
        if row["round_time_s"] != recorded:
            return r
    return None


def _point(
    run: RecordedRun, point: dict[str, Any], target: float | None, mismatch: int | None
) -> dict[str, Any]:
    try:
        row = summarise(replay(run, point), target)
    except ReplayInfeasible as exc:
        return _infeasible_row(str(exc))
    if mismatch is not None:
        row.update(
            exact=False,
            inexact_from_round=mismatch
            if row["exact"]
            else min(mismatch, row["inexact_from_round"]),
        )
        row["notes"] = " | ".join(
            filter(
                None,
                [
                    row["notes"],
                    (
                        "the replay with no override does not reproduce the recorded "
                        f"round {mismatch + 1} (recorded by another version of the "
                        "timing model?)"
                    ),
                ],
            )
        )
    return row


# Process-pool workers get the runs once, when the pool forks, not with every task.
_WORKER_RUNS: list[RecordedRun] = []


#: how often a pool worker checks that its parent is alive (besides PR_SET_PDEATHSIG)
PARENT_WATCH_S = 1.0


def _init_worker(runs: list[RecordedRun], parent_pid: int) -> None:
    # a worker dies with the sweep that forked it, however the sweep dies (kill -9,
    # SIGTERM): no orphan replaying on for nobody
    die_with_parent(parent_pid, watch_s=PARENT_WATCH_S)
    global _WORKER_RUNS
    _WORKER_RUNS = runs


def _work(chunk: list[tuple[int, int, dict[str, Any], float | None, int | None]]):
    return [(i, _point(_WORKER_RUNS[r], p, t, m)) for i, r, p, t, m in chunk]


def _auto_workers(client_rounds: int, n_tasks: int) -> int:
    """Processes for a sweep of ``n_tasks`` points totalling ``client_rounds`` to re-time."""
    if client_rounds < MIN_CLIENT_ROUNDS_FOR_POOL:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, n_tasks))


def _replay_all(
    runs: list[RecordedRun],
    tasks: list[tuple[int, dict[str, Any]]],
    target: float | None,
    mismatch: list[int | None],
    workers: int,
    tick: Callable[[int], None],
) -> list[dict[str, Any]]:
    """Summary rows of every (run index, point) task, in task order."""
    rows: list[dict[str, Any] | None] = [None] * len(tasks)
    full = [(i, r, p, target, mismatch[r]) for i, (r, p) in enumerate(tasks)]
    fork_ok = "fork" in multiprocessing.get_all_start_methods()
    if workers > 1 and fork_ok and len(tasks) > 1:
        # a few chunks per worker: little IPC, and the progress bar still moves
        n_chunks = min(len(full), 4 * workers)
        chunks = [full[k::n_chunks] for k in range(n_chunks)]
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(runs, os.getpid())
        ) as pool:
            for done in pool.map(_work, chunks):
                for i, row in done:
                    rows[i] = row
                tick(len(done))
    else:
        for i, r, p, t, m in full:
            rows[i] = _point(runs[r], p, t, m)
            tick(1)
    return [row for row in rows if row is not None]


def sweep(
    runs: RunLike | Sequence[RunLike],
    grid: Mapping[str, Sequence[Any]] | None = None,
    *,
    target_accuracy: float | None = None,
    retrain: bool = False,
    workers: int | None = None,
    progress: bool = False,
    backend: str | None = None,
    record_dir: str | Path | None = None,
    retrain_dir: str | Path | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> pd.DataFrame:
    """Replay each run at every point of ``grid``; one DataFrame row per (run, point).

    ``runs``: a run directory, a scenario (file or object: trained once and recorded in
    ``record_dir``, default a temporary directory), a :class:`RecordedRun`, or a list of
    them. ``grid``: dotted scenario path -> values, e.g.
    ``{"channel.uplink.bandwidth_hz": [5e6, 10e6], "devices.clients.0.profile":
    ["rpi4", "rpi2b"]}``; empty: one point, the run as recorded.
    ``target_accuracy``: for ``rounds_to_target`` / ``time_to_target_s`` (mean user
    accuracy from the recorded rounds). ``retrain``: points whose replay is not exact
    (or that override anything but timing) are re-run with training (``backend``; records
    under ``retrain_dir`` when given) and marked ``source == "retrained"``.
    ``workers``: processes for replaying (default: one per core when the sweep re-times
    at least MIN_CLIENT_ROUNDS_FOR_POOL client-rounds, else 1).
    ``should_stop``: asked after every point; True stops the sweep with
    :class:`SweepStopped` (the service cancelling a sweep).
    Columns: ``run_id, algorithm, <grid paths...>,`` then METRIC_COLUMNS.
    """
    grid = dict(grid or {})
    points = grid_points(grid)
    recorded = as_runs(runs, record_dir=record_dir, backend=backend, progress=progress)
    # validate every point of every run before any work: a typo fails in milliseconds
    untimed = [p for p in grid if not is_timing_path(p)]
    if untimed and not retrain:
        raise OverrideError(
            f"grid path {', '.join(map(repr, untimed))} changes what the clients execute, so "
            "replaying the recorded op-traces cannot answer it; pass retrain=True (--retrain) "
            "or sweep only channel.*, devices.*, deadline_s, backhaul.*, and the geometry's "
            "speeds and inter-site distance"
        )
    for run in recorded:
        refusal = geometry_axis_refusal(run.scenario, grid)
        if refusal and not retrain:
            raise OverrideError(f"grid path {refusal}")
        check_membership = not retrain and not membership_free(run.scenario)
        for point in points:
            scenario = apply_overrides(
                run.scenario, point, f"{run.run_dir or run.run_id}/scenario.yaml"
            )
            moving = moving_rate_refusal(scenario)
            if moving is not None:  # a moving client's rate on a shared medium
                raise OverrideError(f"grid point {point}: geometry.mobility.rate: {moving}")
            moved = association_changes(run.scenario, scenario) if check_membership else ""
            if not moved and not retrain and point and moving_hierarchy(run.scenario):
                # its edge servers group the clients by where they are at each round's
                # start, which follows the round times: re-timed to check
                moved = membership_changes(run, retime(run, scenario))
            if moved:
                raise OverrideError(
                    f"grid point {point} changes which edge server serves clients "
                    f"({moved}: geometry.association), so the clients would train in "
                    "other groups than the recorded run's; pass retrain=True (--retrain)"
                )

    tasks = [(r, p) for r in range(len(recorded)) for p in points]
    size = [sum(len(rec.traces) for rec in run.rounds) for run in recorded]
    n_workers = (
        workers
        if workers is not None
        else _auto_workers(sum(size[r] for r, _ in tasks), len(tasks))
    )
    bar = _Progress(len(tasks) + len(recorded), progress, should_stop)
    try:
        mismatch = []
        for run in recorded:
            mismatch.append(baseline_mismatch(run))
            bar.tick(1)
            if mismatch[-1] is not None:
                warnings.warn(
                    f"{run.run_id}: a replay with no override does not reproduce the "
                    f"recorded round {mismatch[-1] + 1}; its points are marked not "
                    "exact",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if untimed:  # every point needs training
            rows = [dict.fromkeys(METRIC_COLUMNS) for _ in tasks]
            redo = list(range(len(tasks)))
        else:
            rows = _replay_all(recorded, tasks, target_accuracy, mismatch, n_workers, bar.tick)
            redo = [
                i for i, row in enumerate(rows) if retrain and row["feasible"] and not row["exact"]
            ]
        for i in redo:
            r, point = tasks[i]
            bar.describe(f"retraining {recorded[r].run_id} at {point}")
            try:
                rows[i] = summarise(
                    replay(
                        recorded[r], point, retrain=True, backend=backend, retrain_dir=retrain_dir
                    ),
                    target_accuracy,
                )
            except ReplayInfeasible as exc:
                rows[i] = _infeasible_row(str(exc))
            if untimed:
                bar.tick(1)
    finally:
        bar.close()

    out = []
    for (r, point), row in zip(tasks, rows, strict=True):
        run = recorded[r]
        out.append({"run_id": run.run_id, "algorithm": run.algorithm, **point, **row})
    frame = pd.DataFrame(out, columns=HEAD_COLUMNS + list(grid) + METRIC_COLUMNS)
    frame["inexact_from_round"] = frame["inexact_from_round"].astype("Int64")
    frame["rounds_to_target"] = frame["rounds_to_target"].astype("Float64").astype("Int64")
    return frame


class SweepStopped(Exception):
    """A sweep told to stop (``should_stop``) before its last point."""


class _Progress:
    """A rich progress bar over the sweep's points (does nothing when disabled), and the
    point at which a sweep told to stop stops."""

    def __init__(
        self, total: int, enabled: bool, should_stop: Callable[[], bool] | None = None
    ) -> None:
        self.should_stop = should_stop
        self.progress = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self.progress.start()
            self.task = self.progress.add_task("replaying", total=total)

    def tick(self, n: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=n)
        if self.should_stop is not None and self.should_stop():
            raise SweepStopped("the sweep was told to stop")

    def describe(self, text: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=text)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


# --------------------------------------------------------------------------- plot


def _numeric(values: Sequence[Any]) -> bool:
    return all(
        isinstance(v, (int, float, np.integer, np.floating))
        and not isinstance(v, bool)
        and not (isinstance(v, float) and math.isnan(v))
        for v in values
    )


def plot_sweep(
    frame: pd.DataFrame, x: str, metric: str, path: str | Path, title: str | None = None
) -> Path:
    """Write :func:`sweep_figure` as a PNG to ``path``."""
    fig = sweep_figure(frame, x, metric, title)  # selects the Agg backend first
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def sweep_figure(frame: pd.DataFrame, x: str, metric: str, title: str | None = None):
    """The figure of ``metric`` against the grid path ``x``: one line per run (algorithm)
    and combination of the other grid paths.

    Axes carry human labels and units (:mod:`mecsim.analysis.labels`: Hz shown as MHz, seconds,
    joules...), the y axis starts at 0 for times, energies, bytes and counts, and every
    grid point is drawn: numeric x spanning >= 20x on a log axis; x with a ``null`` (or
    any non-numeric value: profile names, ranges) as categories in the grid's order, null
    included; a point whose metric has no value (a target never reached, an infeasible
    point) as a hollow marker on the x axis, labelled in the legend. Points that are not
    exact are crossed in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x not in frame.columns or metric not in frame.columns:
        raise KeyError(f"plot needs columns {x!r} and {metric!r}")
    grid_cols = [
        c for c in frame.columns[len(HEAD_COLUMNS) :] if c not in METRIC_COLUMNS and c != x
    ]
    x_axis, y_axis = axis(x), axis(metric)
    xs_all = list(frame[x])
    numeric = _numeric(xs_all)
    categories = list(dict.fromkeys(value_text(v) for v in xs_all))
    groups = list(frame.groupby(["algorithm", "run_id", *grid_cols], sort=False, dropna=False))
    wide = len(groups) > 6
    fig, ax = plt.subplots(figsize=(9.5 if wide else 7, 4.5), dpi=120, layout="constrained")
    missing_drawn = inexact_drawn = False
    for keys, group in groups:
        keys = keys if isinstance(keys, tuple) else (keys,)
        label = f"{keys[0]} ({keys[1]})" + "".join(
            f", {setting_text(c, v)}" for c, v in zip(grid_cols, keys[2:], strict=True)
        )
        xs = (
            group[x].to_numpy(dtype=float) * x_axis.scale
            if numeric
            else np.array([categories.index(value_text(v)) for v in group[x]], float)
        )
        ys = pd.to_numeric(group[metric], errors="coerce").to_numpy(dtype=float) * y_axis.scale
        # categories (profile names, null) have no order to join: markers only
        style = "o" if not numeric else "o-" if len(group) < 30 else "-"
        (line,) = ax.plot(xs, ys, style, label=label, markersize=4)
        missing = np.isnan(ys)
        if missing.any():  # shown on the x axis, not dropped
            ax.plot(
                xs[missing],
                np.zeros(missing.sum()),
                "v",
                markersize=8,
                markerfacecolor="none",
                markeredgecolor=line.get_color(),
                clip_on=False,
                zorder=4,
            )
            missing_drawn = True
        inexact = ~group["exact"].fillna(False).astype(bool).to_numpy()
        if inexact.any():
            ax.plot(
                xs[inexact],
                np.where(np.isnan(ys[inexact]), 0.0, ys[inexact]),
                "x",
                color="red",
                markersize=8,
                clip_on=False,
                zorder=5,
            )
            inexact_drawn = True
    if numeric:
        lo, hi = float(np.min(np.asarray(xs_all, float))), float(np.max(np.asarray(xs_all, float)))
        if lo > 0 and hi / lo >= 20:
            ax.set_xscale("log")
    else:
        ax.set_xticks(
            range(len(categories)), categories, rotation=20 if max(map(len, categories)) > 6 else 0
        )
    ax.set_xlabel(x_axis.text)
    ax.set_ylabel(y_axis.text)
    if y_axis.zero_based:
        top = (
            np.nanmax(pd.to_numeric(frame[metric], errors="coerce").to_numpy(float) * y_axis.scale)
            if frame[metric].notna().any()
            else 1.0
        )
        ax.set_ylim(bottom=0, top=max(top * 1.08, 1e-12) if np.isfinite(top) else None)
    ax.set_title(title or f"{y_axis.label} vs {x_axis.label}")
    ax.grid(True, alpha=0.3)
    if missing_drawn:
        ax.plot(
            [],
            [],
            "v",
            markerfacecolor="none",
            markeredgecolor="black",
            label="no value (target not reached, infeasible; see notes)",
        )
    if inexact_drawn:
        ax.plot([], [], "x", color="red", label="not exact (see notes)")
    if wide:
        fig.legend(loc="outside right upper", fontsize=7)
    else:
        ax.legend(fontsize=7)
    return fig


class _CallableModule(types.ModuleType):
    """``mecsim.sweep(...)`` calls :func:`sweep` even once this module is imported."""

    def __call__(self, *args: Any, **kwargs: Any) -> pd.DataFrame:
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
