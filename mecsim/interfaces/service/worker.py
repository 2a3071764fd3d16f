"""The service's workers: one Ray for the server's life, runs taken from a FIFO queue.

A supervisor thread starts Ray once (or attaches to ``--ray-address``) and keeps it
until the server stops; it must stay alive that long, because Ray's own processes are
tied to the thread that started them. It then starts ``workers`` threads, each taking
the first waiting run from the store (:meth:`Store.claim_next`) and running it with
:func:`mecsim.store.session.run_in_folder` — the same as ``mecsim run``, with the same observers
(records, plots, metrics) plus one that records each round in the store. Every run
uses the Ray backend on the service's Ray: a warm service does not pay Ray's start-up.

Exactly one place starts a run (:meth:`Worker._start`) and one resumes an interrupted
run from its newest checkpoint (:meth:`Worker._resume`, as ``mecsim run --resume``).

Stopping: cancelling a running run (``DELETE /runs/{id}``) and stopping the server
both end the run through ``should_stop``, which the run's executor also asks every half
second while it waits for its actors: a round in progress is discarded (its actors
killed), the finished rounds kept. A cancelled run is ``cancelled``, a run stopped by the
server's shutdown is ``interrupted`` and resumes when the server starts again. A server
that dies leaves its running runs ``running`` in the store; the next start marks them
``interrupted`` (:meth:`Store.recover`), or ``cancelled`` when their cancel was requested.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from mecsim.interfaces.metrics import MetricsExporter
from mecsim.interfaces.service.jobs import Run, Store
from mecsim.interfaces.service.plotjob import ChildPlotWriter, draw_in_child
from mecsim.run.backends.ray_start import ensure_ray
from mecsim.run.observers import RunInfo, RunObserver
from mecsim.scenario import Scenario, ScenarioError, scenario_from_dict
from mecsim.store.reader import read_csv_exact, read_meta, rows_from_csv
from mecsim.store.runfolder import (
    RunFolderError,
    RunFolderFinished,
    RunFolderInUse,
    prepare_resume,
)
from mecsim.store.session import BadRun, run_in_folder

log = logging.getLogger("mecsim.interfaces.service")

#: How long a resumed run waits for its folder's lock (held by processes of a killed
#: server that are still exiting) before it starts again from round 0 in a new folder.
LOCK_WAIT_S = 30.0


def quiet_ray_signals() -> None:
    """A SIGTERM is the service's ordinary stop, not a crash: no stack dump from Ray's
    failure-signal handler (read when ray is first imported; an explicit setting wins)."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")


class _PrepareGate(RunObserver):
    """Holds the service's prepare lock from before a run starts until its first hook.

    ``mecsim.run.setup.prepare`` seeds and draws torch's process-wide generator to build the
    initial model; two runs preparing at once in one process would interleave those draws
    and change each other's initial weights. The gate lets one run prepare at a time
    (``on_run_start`` is called right after ``prepare``); the rounds run concurrently.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        lock.acquire()
        self.held = True

    def on_run_start(self, info) -> None:
        self.release()

    def on_run_resume(self, info, rounds) -> None:  # a resumed run's first hook
        self.release()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.lock.release()


class _StoreRounds(RunObserver):
    """Records each finished round in the store (status, ETA, events read it)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def on_round_end(self, info, round_row, client_rows, traces) -> None:
        self.store.round_done(self.run_id, int(round_row["round"]), round_row)


class Worker:
    """Runs queued runs, ``workers`` at a time, on one Ray instance."""

    def __init__(
        self,
        store: Store,
        *,
        workers: int = 1,
        ray_address: str | None = None,
        exporter: Callable[[str], RunObserver] | None = None,
        on_finished: Callable[[str], None] | None = None,
        shutdown_timeout_s: float = 60.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.store = store
        self.workers = workers
        self.ray_address = ray_address
        self.exporter = exporter
        self.on_finished = on_finished or (lambda run_id: None)
        self.shutdown_timeout_s = shutdown_timeout_s
        self.ray_error: str | None = None
        self.busy: dict[int, str] = {}  # worker slot -> run id
        self._owns_ray = False
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._prepare_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ life

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and not self._stopping.is_set()

    def start(self) -> None:
        self._supervisor = threading.Thread(target=self._supervise, name="mecsim-ray", daemon=True)
        self._supervisor.start()

    def wake(self) -> None:
        """A run was queued: let an idle worker take it now."""
        with self._wake:
            self._wake.notify_all()

    def stop(self) -> None:
        """Stop the running runs (within about a second: a round in progress is discarded;
        they become ``interrupted``), saying what it waits for."""
        self._stopping.set()
        self.wake()
        running = sorted(self.busy.values())
        if running:
            log.info(
                "mecsim serve: stopping: waiting for %d running run(s) to stop (%s; a "
                "round in progress is discarded), at most %.0f s (--shutdown-timeout); they "
                "resume from their newest checkpoint at the next start",
                len(running),
                ", ".join(running),
                self.shutdown_timeout_s,
            )
        else:
            log.info("mecsim serve: stopping (no run is running)")
        started = time.monotonic()
        if self._supervisor is not None:
            self._supervisor.join(self.shutdown_timeout_s + 30)
        left = sorted(self.busy.values())
        if left:
            log.warning(
                "mecsim serve: stopped waiting after %.0f s; still running: %s "
                "(marked interrupted at the next start)",
                time.monotonic() - started,
                ", ".join(left),
            )
        elif running:
            log.info("mecsim serve: every run stopped in %.1f s", time.monotonic() - started)

    def _supervise(self) -> None:
        try:
            self._init_ray()
        except Exception as exc:  # noqa: BLE001 - reported by /readyz and the log
            self.ray_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.error("mecsim serve: Ray did not start: %s", self.ray_error)
            self._stopped.set()
            return
        self._ready.set()
        self._threads = [
            threading.Thread(
                target=self._loop, args=(slot,), daemon=True, name=f"mecsim-worker-{slot}"
            )
            for slot in range(self.workers)
        ]
        for t in self._threads:
            t.start()
        self._stopping.wait()
        deadline = time.monotonic() + self.shutdown_timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self._owns_ray:
            import ray

            ray.shutdown()
        self._stopped.set()

    def _init_ray(self) -> None:
        quiet_ray_signals()

        # Ray warns that it sets no SIGTERM handler outside the main thread: uvicorn has one
        logging.getLogger("ray._private.worker").addFilter(
            lambda record: "SIGTERM handler is not set" not in record.getMessage()
        )

        # as `mecsim run` starts Ray (on loopback) or attaches to --ray-address; each of the
        # concurrent runs may place one host actor per core (an embedding process's Ray
        # is used as it is)
        self._owns_ray = ensure_ray(self.ray_address, (os.cpu_count() or 1) * self.workers)

    # ------------------------------------------------------------------ runs

    def _loop(self, slot: int) -> None:
        while not self._stopping.is_set():
            run = self.store.claim_next()
            if run is None:
                with self._wake:
                    self._wake.wait(timeout=1.0)
                continue
            self.busy[slot] = run.id
            try:
                self._execute(run)
            finally:
                self.busy.pop(slot, None)

    def _should_stop(self, run_id: str) -> Callable[[], str | bool]:
        """After each round, and every half second while the executor waits for its
        actors: ``cancelled`` when a user cancelled the run (never resumed), else
        ``interrupted`` when the server stops (the run resumes when it starts again), else
        False."""

        def stop() -> str | bool:
            if self.store.cancel_requested(run_id):
                return "cancelled"
            return "interrupted" if self._stopping.is_set() else False

        return stop

    def _scenario(self, run: Run) -> Scenario:
        return scenario_from_dict(yaml.safe_load(run.scenario_yaml), f"run {run.id}")

    def _observers(self, run: Run, scenario: Scenario, out_dir: Path) -> list[RunObserver]:
        # figures drawn in a child process: matplotlib would hold the GIL the API shares
        observers: list[RunObserver] = [
            _StoreRounds(self.store, run.id),
            ChildPlotWriter(out_dir / "plots"),
        ]
        if self.exporter is not None and scenario.metrics.enabled:
            observers.append(self.exporter(run.id))  # a new exporter per run
        return observers

    def _start(self, run: Run) -> list[dict[str, Any]]:
        """Run ``run`` from its first round, as ``mecsim run`` does
        (:func:`mecsim.store.session.run_in_folder`, with the service's observers)."""
        scenario = self._scenario(run)
        out_dir = self.store.run_dir(run.id)
        gate = _PrepareGate(self._prepare_lock)
        try:
            return run_in_folder(
                scenario,
                out_dir,
                source=f"run {run.id}",
                observers=[gate, *self._observers(run, scenario, out_dir)],
                should_stop=self._should_stop(run.id),
                backend="ray",
                limits=None,  # the service's own were checked when the run was submitted
            ).rows
        finally:
            gate.release()  # if prepare failed

    def _resume(self, run: Run) -> list[dict[str, Any]]:
        """Continue an interrupted run from its newest checkpoint: the one call into mecsim
        that resumes a run (what ``mecsim run --resume`` does). Its records end up equal
        to an uninterrupted run's. A run whose folder cannot be resumed (it never wrote
        one) starts again from round 0; a folder it leaves behind is kept beside the new
        one, in ``runs/<id>.attempt-<n>``. A folder another live process holds for longer
        than :data:`LOCK_WAIT_S` fails the run, the folder untouched."""

        out_dir = self.store.run_dir(run.id)
        deadline = time.monotonic() + LOCK_WAIT_S
        try:
            while True:
                try:
                    target = prepare_resume(
                        out_dir,
                        warn=lambda m: log.warning("mecsim serve: %s", m),
                        keep_finished_lock=True,
                    )
                    break
                except RunFolderInUse:
                    # processes of a server that was killed may take a moment to go
                    if time.monotonic() > deadline or self._stopping.is_set():
                        raise
                    time.sleep(0.5)
        except RunFolderFinished as exc:
            # the server died after the run's last records were written but before the
            # store heard of its end: the run is done, not run again (if its records are
            # whole; else it starts again from round 0, its folder kept)
            try:
                return self._adopt_finished(run, out_dir)
            except RunFolderError as bad:
                why: Exception = bad
            finally:
                if exc.lock is not None:
                    exc.lock.release()
            self._restart_from_scratch(run, out_dir, why)
            return self._start(run)
        except RunFolderInUse:
            # another live process (a `mecsim run --resume` on this folder?) holds it past
            # LOCK_WAIT_S: the run fails with that reason; its folder is not touched
            raise
        except RunFolderError as exc:
            self._restart_from_scratch(run, out_dir, exc)
            return self._start(run)
        try:
            self.store.clear_rounds(run.id, first=target.rounds_done)
            log.info("mecsim serve: run %s resumes after round %d", run.id, target.rounds_done)
            gate = _PrepareGate(self._prepare_lock)
            try:
                return run_in_folder(
                    None,
                    resume=target,
                    source=f"run {run.id}",
                    observers=[gate, *self._observers(run, target.scenario, out_dir)],
                    should_stop=self._should_stop(run.id),
                    backend="ray",
                ).rows
            finally:
                gate.release()
        finally:
            target.lock.release()

    def _restart_from_scratch(self, run: Run, out_dir: Path, why: Exception) -> None:
        """Before a run starts again from round 0: its folder, if any, kept beside the new
        one (``runs/<id>.attempt-<n>``), and the store's rounds of it forgotten."""
        if out_dir.exists():
            kept = out_dir.with_name(f"{run.id}.attempt-{run.attempts}")
            out_dir.rename(kept)
            log.warning(
                "mecsim serve: run %s restarts from round 0 (%s); its folder is kept in %s",
                run.id,
                why,
                kept,
            )
        self.store.clear_rounds(run.id)

    def _adopt_finished(self, run: Run, out_dir: Path) -> list[dict[str, Any]]:
        """The rounds of a run whose folder says it finished (the caller holds its lock),
        put back into the store in one transaction (the server may have died before it
        recorded the last ones), its figures drawn again (drawing may have been what the
        server was doing when it died). Raises :class:`RunFolderError`, the store
        untouched, when ``rounds.csv`` does not hold every planned round once, in order."""

        planned = self._scenario(run).rounds
        try:
            rows = rows_from_csv(out_dir / "rounds.csv")
            numbers = [int(row["round"]) for row in rows]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunFolderError(
                f"{out_dir}: says finished, but its rounds.csv cannot be "
                f"read ({type(exc).__name__}: {exc})"
            ) from None
        if numbers != list(range(planned)):
            raise RunFolderError(
                f"{out_dir}: says finished, but its rounds.csv holds rounds "
                f"{_span(numbers)}, not 0-{planned - 1}"
            )
        self.store.replace_rounds(run.id, rows)
        self._replay_series(run, out_dir, rows)
        draw_in_child(out_dir, planned)
        log.warning(
            "mecsim serve: run %s had finished before the server stopped; its %d "
            "rounds are kept as they were recorded",
            run.id,
            len(rows),
        )
        return rows

    def _replay_series(self, run: Run, out_dir: Path, rows: list[dict[str, Any]]) -> None:
        """An adopted run's Prometheus series, rebuilt from its records (the server that
        watched it died with them), so /metrics shows it finished, as a run that ended
        under this server does until its retention is over."""

        scenario = self._scenario(run)
        if self.exporter is None or not scenario.metrics.enabled:
            return
        exporter = self.exporter(run.id)
        if not isinstance(exporter, MetricsExporter):
            return
        meta = read_meta(out_dir)
        clients: dict[int, list[dict[str, Any]]] = {}
        if (out_dir / "clients.csv").is_file():
            for row in read_csv_exact(out_dir / "clients.csv").to_dict("records"):
                clients.setdefault(int(row["round"]), []).append(row)
        info = RunInfo(
            run.id,
            scenario,
            out_dir,
            int(meta.get("num_params", 0)),
            int(meta.get("model_bytes", 0)),
            int(meta.get("step_memory_bytes", 0)),
            float(meta.get("step_flops", 0.0)),
            list(meta.get("client_devices", [])),
            extra={"backend": meta.get("backend", "ray")},
        )
        exporter.on_run_replay(info, rows, clients, meta.get("checkpoint"))

    def _execute(self, run: Run) -> None:
        resume = run.status == "interrupted"
        try:
            rows = self._resume(run) if resume else self._start(run)
        except Exception as exc:  # noqa: BLE001 - recorded as the run's failure
            first = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if self._stopping.is_set() and not isinstance(exc, (BadRun, ScenarioError)):
                self.store.set_status(run.id, "interrupted", note=f"server stopping: {first}")
            else:
                self.store.set_status(
                    run.id, "failed", error=first, traceback=traceback.format_exc()
                )
                print(f"mecsim serve: run {run.id} failed: {first}", file=sys.stderr)
        except BaseException as exc:  # noqa: BLE001 - sys.exit() or a BaseException of a
            # plugin's own in this thread (no signal reaches it): the run failed, the
            # worker goes on taking runs
            first = f"code of the run raised {' '.join(repr(exc).split())[:200]} (user code)"
            self.store.set_status(run.id, "failed", error=first, traceback=traceback.format_exc())
            print(f"mecsim serve: run {run.id} failed: {first}", file=sys.stderr)
        else:
            planned = self._scenario(run).rounds
            if len(rows) >= planned:
                self.store.set_status(run.id, "finished")
            elif self.store.cancel_requested(run.id):
                self.store.set_status(
                    run.id, "cancelled", note=f"stopped after {len(rows)} of {planned} rounds"
                )
            elif self._stopping.is_set():
                self.store.set_status(run.id, "interrupted", note="the server stopped")
            else:
                self.store.set_status(
                    run.id,
                    "failed",
                    error=f"stopped after {len(rows)} of {planned} rounds "
                    "without a cancel or a shutdown",
                )
        self.on_finished(run.id)


def _span(numbers: list[int]) -> str:
    """Round numbers in short, for an error message."""
    if not numbers:
        return "none"
    if len(numbers) <= 6:
        return ", ".join(map(str, numbers))
    return f"{numbers[0]}-{numbers[-1]} ({len(numbers)} rows)"
