"""What-if sweeps over the service's finished runs (``POST /sweeps``).

The grid uses ``mecsim sweep``'s syntax (``PATH=V1,V2,...`` or ``START:STOP:COUNT``) and
its rules: only timing (``channel.*``, ``devices.*``, ``deadline_s``, ``backhaul.*``) can be
replayed; there is no retraining through the service. Every grid point of every run is
checked before the sweep is queued, including that it names no file outside the data
root. The grid's size is worked out before any point is made and bounded
(``--max-sweep-points``); waiting sweeps are bounded too (``--max-queued``). Sweeps run
one at a time in their own thread (replays are short and need no Ray), can be cancelled
(``DELETE /sweeps/{id}``: the thread stops at its next point) and write
``STATE/sweeps/<id>/sweep.csv`` and ``sweep.png``.
"""

from __future__ import annotations

import secrets
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from mecsim.analysis.replay import RunLoadError, load_run
from mecsim.analysis.whatif_sweep import (
    METRIC_COLUMNS,
    SweepStopped,
    grid_points,
    grid_size,
    plot_sweep,
    sweep,
)
from mecsim.interfaces.service.jobs import Store
from mecsim.interfaces.service.submission import Problem, Rejected, confine
from mecsim.run.limits import Limits, check_sweep_points
from mecsim.scenario.overrides import (
    MAX_VALUES,
    OverrideError,
    apply_overrides,
    is_timing_path,
    parse_set,
)

DEFAULT_METRIC = "round_time_mean_s"


def new_sweep_id() -> str:
    return f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


#: Below this many (run, point) pairs every combination is checked before a sweep is
#: queued; above it each axis value is checked on each run (a combination invalid only
#: together then fails the sweep with its reason, recorded as the sweep's error).
CHECK_EVERY_POINT_BELOW = 256


def check_sweep(
    store: Store,
    runs: list[str],
    sets: list[str],
    metric: str,
    target_accuracy: float | None,
    data_root: Path | None,
    limits: Limits | None = None,
) -> dict[str, list]:
    """The parsed grid of a valid request; :class:`Rejected` naming each problem. With
    ``limits``, a grid of more than ``max_sweep_points`` points (worked out before any
    point is made) is refused."""

    problems: list[Problem] = []
    max_points = limits.max_sweep_points if limits is not None else None
    if not runs:
        problems.append(Problem("runs", "give at least one finished run"))
    for i, run_id in enumerate(runs):
        run = store.get_run(run_id)
        if run is None:
            problems.append(Problem(f"runs.{i}", f"no run {run_id!r}"))
        elif run.status != "finished":
            problems.append(
                Problem(f"runs.{i}", f"run {run_id} is {run.status}; sweeps replay finished runs")
            )
    grid: dict[str, list] = {}
    for i, text in enumerate(sets):
        try:
            path, values = parse_set(text, max_values=max_points or MAX_VALUES)
        except OverrideError as exc:
            problems.append(Problem(f"set.{i}", str(exc)))
            continue
        if path in grid:
            problems.append(Problem(f"set.{i}", f"{path} is given twice"))
        elif not is_timing_path(path):
            problems.append(
                Problem(
                    f"set.{i}",
                    f"{path} changes what the clients execute; "
                    "the service replays only channel.*, devices.*, "
                    "deadline_s, backhaul.*, the geometry's speeds and "
                    "inter-site distance (no retraining)",
                )
            )
        grid[path] = values
    numeric = [c for c in METRIC_COLUMNS if c not in ("source", "notes")]
    if metric not in numeric:
        problems.append(
            Problem("metric", f"{metric!r} is not a sweep column; one of: {', '.join(numeric)}")
        )
    if metric in ("time_to_target_s", "rounds_to_target") and target_accuracy is None:
        problems.append(Problem("target_accuracy", f"metric {metric} needs it"))
    if not problems and limits is not None:
        too_many = check_sweep_points(grid_size(grid), limits)
        if too_many:
            problems.append(Problem("set", too_many))
    if problems:
        raise Rejected(problems)
    if len(runs) * grid_size(grid) < CHECK_EVERY_POINT_BELOW:
        points = grid_points(grid)
    else:  # each value of each axis once, the others as recorded
        points = [{path: value} for path, values in grid.items() for value in values]
    for run_id in runs:
        try:
            recorded = load_run(store.run_dir(run_id))
        except RunLoadError as exc:
            raise Rejected([Problem("runs", str(exc))]) from None
        for point in points:
            try:
                sc = apply_overrides(recorded.scenario, point, "scenario")
            except OverrideError as exc:
                raise Rejected([Problem("set", line) for line in str(exc).splitlines()]) from None
            # a recorded run's own paths were confined when it was submitted
            before = recorded.scenario.model_dump(mode="json")
            after = sc.model_dump(mode="json")
            bad = [
                p
                for p in confine(after, data_root)
                if _value(after, p.field) != _value(before, p.field)
            ]
            if bad:
                raise Rejected(bad)
    return grid


def _value(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


class SweepRunner:
    """Runs queued sweeps one at a time in a thread."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mecsim-sweeps", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            waiting = self.store.waiting_sweeps()
            if not waiting:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            self._run(waiting[0].id)

    def _run(self, sweep_id: str) -> None:

        entry = self.store.get_sweep(sweep_id)
        assert entry is not None
        req = entry.request
        if not self.store.start_sweep(sweep_id):  # cancelled meanwhile
            return
        try:
            grid = dict(parse_set(s) for s in req["set"])
            frame = sweep(
                [self.store.run_dir(r) for r in req["runs"]],
                grid,
                target_accuracy=req.get("target_accuracy"),
                workers=1,
                should_stop=lambda: self._stop.is_set() or self.store.sweep_cancelled(sweep_id),
            )
            out = self.store.sweep_dir(sweep_id)
            out.mkdir(parents=True, exist_ok=True)
            frame.to_csv(out / "sweep.csv", index=False)
            if grid:
                plot_sweep(frame, next(iter(grid)), req["metric"], out / "sweep.png")
        except SweepStopped:
            if self.store.sweep_cancelled(sweep_id):
                self.store.set_sweep_status(sweep_id, "cancelled", error="cancelled")
            else:  # the server is stopping: the sweep runs again at its next start
                self.store.set_sweep_status(sweep_id, "queued")
        except Exception as exc:  # noqa: BLE001 - recorded as the sweep's failure
            first = f"{type(exc).__name__}: {exc}".splitlines()[0]
            traceback.print_exc()
            self.store.set_sweep_status(sweep_id, "failed", error=first)
        else:
            self.store.set_sweep_status(sweep_id, "finished")
