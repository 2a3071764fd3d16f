"""Running a scenario into a run folder: the one way mecsim does it.

``mecsim run`` (and ``--resume``), the service's worker, what-if sweeps' recorded and
retrained runs, the benchmarks and ``mecsim.simulate`` all call :func:`run_in_folder`:

1. **Before anything is written**: the pre-flight (:func:`mecsim.run.preflight.check`:
   everything that would stop the run, each problem one line naming the field), of the
   folder where the run goes. A fresh run's folder must not exist; a resumed run
   (:class:`~mecsim.store.runfolder.ResumeTarget`, from
   :func:`~mecsim.store.runfolder.prepare_resume`) arrives with its folder locked and
   its records cut back to its newest checkpoint.
2. **The folder**: made (with the parents it needs) and locked. Every OS error while
   making or first writing it (no permission, a read-only, full or pseudo file system)
   is one line naming the path, and what was made for it is removed; so is a folder
   whose set-up finds that the scenario cannot run (a model that does not fit a device's
   RAM, data that cannot be read): :class:`BadRun`, before the first round.
3. **The run**: :func:`mecsim.run.loop.run` with the records writer
   (:class:`~mecsim.store.records.RecordsWriter`), the checkpoint store
   (:class:`~mecsim.store.checkpoints.CheckpointStore`) and the caller's observers
   (progress, metrics, figures...). An interrupt (Ctrl-C, SIGTERM) propagates as
   ``KeyboardInterrupt`` with the finished rounds on disk, a run that cannot go on as
   :class:`~mecsim.run.setup.RunFailed`; either can be resumed.
4. **Always**: the folder's lock released.
"""

from __future__ import annotations

import errno
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mecsim.run import preflight
from mecsim.run.limits import LOCAL, Limits
from mecsim.run.loop import run
from mecsim.run.observers import RunObserver
from mecsim.run.setup import ScenarioInfeasible
from mecsim.scenario import Scenario, ScenarioError, scenario_from_dict
from mecsim.store.checkpoints import CheckpointStore, scenario_digest
from mecsim.store.records import RecordsWriter
from mecsim.store.runfolder import ResumeTarget, RunFolderError, RunLock


class BadRun(RunFolderError):
    """The run cannot start as asked: its folder cannot be made or written, or the set-up
    found that the scenario cannot run. Nothing of it is left on disk (a resumed run's
    folder is left as it was). ``str()`` is one line naming the path or the field."""


@dataclass
class Outcome:
    """How a call of :func:`run_in_folder` ended, when it returned."""

    run_id: str
    run_dir: Path
    scenario: Scenario
    #: finished, or what ``should_stop`` asked for: cancelled or interrupted
    status: str
    rows: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def new_run_id(scenario: Scenario) -> str:
    """The scenario's ``outputs.run_id``, or ``<name>-<timestamp>-<8 random hex digits>``:
    two runs of one scenario started in the same second get different folders."""
    return (
        scenario.outputs.run_id
        or f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
    )


def _outermost_missing(run_dir: Path) -> Path:
    """The outermost folder that making ``run_dir`` creates (``run_dir`` itself when its
    parent exists)."""
    made = run_dir
    while not made.parent.exists() and made.parent != made:
        made = made.parent
    return made


def os_problem(path: Path | str, exc: OSError) -> str:
    """One line for an OS error while making or writing a run folder."""
    reasons = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENOTDIR: "a part of the path is not a folder",
        errno.ENAMETOOLONG: "the name is too long",
    }
    reason = reasons.get(exc.errno or 0) or exc.strerror or type(exc).__name__
    return f"{exc.filename or path}: cannot make or write the run folder ({reason})"


def run_in_folder(
    scenario: Scenario | None,
    run_dir: str | Path | None = None,
    *,
    observers: Sequence[RunObserver] = (),
    source: str | None = None,
    resume: ResumeTarget | None = None,
    should_stop: Callable[[], bool | str] | None = None,
    backend: str | None = None,
    hosts: int | None = None,
    ray_address: str | None = None,
    serves_metrics: bool = False,
    on_folder_ready: Callable[[], None] | None = None,
    warn: Callable[[str], None] | None = None,
    limits: Limits | None = LOCAL,
) -> Outcome:
    """Run ``scenario`` into the new folder ``run_dir``, or continue ``resume``.

    ``source`` names the scenario in error lines (its file; default the folder's
    scenario.yaml). ``serves_metrics``: the caller's observers serve ``/metrics`` on the
    scenario's ``metrics.host`` and ``port`` (``mecsim run``), so the pre-flight checks
    them; otherwise it leaves them alone (the service serves every run's series itself).
    ``on_folder_ready`` is called once the folder is made and locked, before anything else
    starts (e.g. listening on the metrics port): a
    :class:`~mecsim.scenario.ScenarioError` or ``OSError`` from it is bad input like the
    pre-flight's, the folder removed. ``warn`` receives the pre-flight's warnings.
    ``backend``, ``hosts`` and ``ray_address`` override the scenario's execution section.
    ``limits`` bound what a new run may cost (:mod:`mecsim.run.limits`; None: no bound);
    a resumed run was accepted when it started and is not checked again.

    Raises :class:`~mecsim.scenario.ScenarioError` (the pre-flight's problems) or
    :class:`BadRun` before the first round, with nothing left on disk;
    ``KeyboardInterrupt`` or :class:`~mecsim.run.setup.RunFailed` with the finished rounds
    kept (resumable).
    """
    lock: RunLock | None = None
    if resume is not None:
        scenario, folder, lock = resume.scenario, resume.run_dir, resume.lock
    else:
        if scenario is None or run_dir is None:
            raise TypeError("run_in_folder needs a scenario and a run folder, or resume")
        folder = Path(run_dir)
    made: Path | None = None
    try:
        source = source or str(folder / "scenario.yaml")
        # the pre-flight of the folder where the run goes (a resumed folder may have been
        # moved since it was made; a fresh one is named by the caller)
        data = scenario.model_dump(mode="json")
        data["outputs"].update(dir=str(folder.parent), run_id=folder.name)
        if not serves_metrics:
            data["metrics"]["enabled"] = False
        warnings = preflight.check(
            scenario_from_dict(data, source),
            source,
            run_dir=folder,
            backend=backend,
            hosts=hosts,
            ray_address=ray_address,
            resume=resume is not None,
            limits=limits if resume is None else None,
        )
        for line in warnings:
            if warn is not None:
                warn(line)
        if lock is None:
            if folder.exists():
                raise BadRun(
                    f"{folder} already exists; choose another run id (or "
                    f"continue it: mecsim run --resume {folder})"
                )
            made = _outermost_missing(folder)
            try:
                folder.mkdir(parents=True)
                lock = RunLock(folder).acquire()
            except OSError as exc:
                raise BadRun(os_problem(folder, exc)) from None
        if on_folder_ready is not None:
            try:
                on_folder_ready()
            except OSError as exc:
                raise BadRun(os_problem(folder, exc)) from None
        store = CheckpointStore(
            folder, folder.name, scenario_digest(scenario), scenario.checkpoint.keep
        )
        stopped: list[str] = []

        def stop() -> bool | str:
            asked = should_stop() if should_stop is not None else False
            if asked:
                stopped.append(asked if asked in ("cancelled", "interrupted") else "cancelled")
            return asked

        records = RecordsWriter(folder)
        try:
            rows = run(
                scenario,
                folder.name,
                folder,
                [records, *observers],
                checkpoints=store,
                should_stop=stop if should_stop is not None else None,
                resume=resume.point if resume is not None else None,
                hosts=hosts,
                backend=backend,
                ray_address=ray_address,
            )
        except ScenarioInfeasible as exc:
            raise BadRun(f"{source}: {exc}") from None
        except (FileNotFoundError, ValueError) as exc:  # data that cannot be read, at set-up
            if made is not None and not records.meta:
                raise BadRun(f"{source}: {' '.join(str(exc).split())}") from None
            raise
        except OSError as exc:
            if made is not None and not records.meta:  # its first files could not be written
                raise BadRun(os_problem(folder, exc)) from None
            raise
        return Outcome(
            folder.name, folder, scenario, stopped[-1] if stopped else "finished", rows, warnings
        )
    except (BadRun, ScenarioError):
        if lock is not None:
            lock.release()
            lock = None
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            lock.release()
