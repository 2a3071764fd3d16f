"""The rounds of a run, with checkpoints and recovery from actor deaths.

:func:`run` prepares a run (:func:`mecsim.run.setup.prepare`), plays its rounds
(:func:`mecsim.run.round.run_round`) and tells its observers (:mod:`mecsim.run.observers`)
what happens. Where checkpoints go is the caller's business: a :class:`Checkpoints` (the
run folder's :class:`mecsim.store.checkpoints.CheckpointStore`, given by
:func:`mecsim.store.session.run_in_folder`) saves and loads the :class:`Checkpoint` the loop
takes after every ``checkpoint.every`` rounds.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mecsim.agents.state import BlobSink
from mecsim.run.async_run import AsyncRun
from mecsim.run.async_run import refusals as async_refusals
from mecsim.run.backends.base import (
    MAX_RECOVERIES,
    ActorFailure,
    ExecutorState,
    RoundAborted,
    abort_status,
)
from mecsim.run.backends.placement import PlacementTimeout
from mecsim.run.chaos import kill_point
from mecsim.run.observers import RunObserver
from mecsim.run.round import run_round
from mecsim.run.setup import RunFailed, RunSetup, prepare
from mecsim.scenario import Scenario


@dataclass(frozen=True)
class Checkpoint:
    """What a run needs to continue after ``rounds_done`` rounds as if it had not stopped
    (see :mod:`mecsim.store.checkpoints`)."""

    rounds_done: int
    elapsed_s: float
    server: Any  # encoded CentralServer state
    clients: dict[int, Any]  # encoded ctx.state of every client
    costs: Any  # encoded measured step costs
    path: Path | None = None
    blobs: dict[str, Any] = field(default_factory=dict)  # new large tensors, by digest
    # encoded EdgeServer state of each edge server of a hierarchical algorithm (a
    # checkpoint written before edge servers had states of their own has none: see
    # ServerAlgorithm.legacy_edge_states)
    edges: dict[int, Any] = field(default_factory=dict)
    # an asynchronous run's own state (AsyncRun.state; None: a synchronous run)
    clocked: Any = None


class Checkpoints(Protocol):
    """Where the loop's checkpoints go (:class:`mecsim.store.checkpoints.CheckpointStore`)."""

    last_bytes: int  # of the last save
    last_seconds: float

    def blob_keys(self) -> set[str]:
        """Digests of the large arrays already stored (sent by reference)."""

    def save(self, ckpt: Checkpoint) -> Path:
        """Store ``ckpt`` whole or not at all; returns where."""

    def load(self, path: Path) -> Checkpoint:
        """The checkpoint stored at ``path``."""


_SAME_COLUMNS = (
    "selected",
    "completed",
    "bytes_up",
    "bytes_down",
    "client_gflops",
    "elapsed_s",
    "mean_accuracy",
    "train_loss",
)


class _Loop:
    """The rounds of one run, with checkpoints and recovery from actor deaths."""

    def __init__(
        self,
        rs: RunSetup,
        observers,
        store: Checkpoints | None,
        start: Checkpoint | None,
        prior_rows: list[dict[str, Any]],
        should_stop: Callable[[], bool | str] | None,
    ) -> None:
        self.rs, self.observers, self.store = rs, list(observers), store
        self.should_stop = should_stop
        self.rows = list(prior_rows)
        self.rnd = start.rounds_done if start else 0
        self.elapsed_s = start.elapsed_s if start else 0.0
        self.base = start  # the newest checkpoint of this history (None: the start)
        sc = rs.info.scenario
        self.every = sc.checkpoint.every if store is not None else 0

    def _emit(self, name: str, *args: Any) -> None:
        for obs in self.observers:
            getattr(obs, name)(self.rs.info, *args)

    def _checkpoint(self) -> None:
        assert self.store is not None
        st = self.rs.executor.state(self.store.blob_keys())
        ckpt = Checkpoint(
            self.rnd,
            self.elapsed_s,
            st.server,
            st.clients,
            st.costs,
            blobs=st.blobs,
            edges=st.edges,
        )
        self._emit("on_checkpoint_start", self.rnd)
        path = self.store.save(ckpt)
        self.base = Checkpoint(ckpt.rounds_done, ckpt.elapsed_s, None, {}, None, path)
        self._emit("on_checkpoint", self.rnd, self.store.last_bytes, self.store.last_seconds)

    def _load_base(self) -> Checkpoint:
        assert self.base is not None
        if self.base.path is not None and self.base.clocked is None and self.store is not None:
            return self.store.load(self.base.path)
        return self.base

    def _checkpoint_clocked(self, clocked: AsyncRun, versions: int, now: float) -> None:
        """A checkpoint of an asynchronous run after ``versions`` versions."""
        assert self.store is not None
        if versions >= self.rs.info.scenario.rounds:  # the last is not cut short
            self.rs.executor.abort_when(None)
        known = self.store.blob_keys()
        st = self.rs.executor.state(known)
        sink = BlobSink(known | set(st.blobs))
        ckpt = Checkpoint(
            versions,
            now,
            st.server,
            st.clients,
            st.costs,
            blobs={**st.blobs},
            edges=st.edges,
            clocked=clocked.state(sink),
        )
        ckpt.blobs.update(sink.new)
        self._emit("on_checkpoint_start", versions)
        self.store.save(ckpt)
        self._emit("on_checkpoint", versions, self.store.last_bytes, self.store.last_seconds)

    def _recover(self, failure: ActorFailure) -> None:
        """New actors, restored from the newest checkpoint (or the run's start); the
        rounds after it are re-executed without being recorded again."""
        rs = self.rs
        try:
            rs.executor.restart()
        except PlacementTimeout as exc:
            raise RunFailed(f"{exc}, after {failure}") from None
        self._emit("on_placement", self.rnd, rs.executor.placement())
        target = self.rnd
        if self.base is not None:
            if self.base.path is not None:  # a checkpoint saved by this run's store
                assert self.store is not None
                ckpt = self.store.load(self.base.path)
            else:
                ckpt = self.base
            rs.executor.load_state(
                ExecutorState(ckpt.server, ckpt.clients, ckpt.costs, edges=ckpt.edges)
            )
            redo, elapsed = ckpt.rounds_done, ckpt.elapsed_s
        else:
            redo, elapsed = 0, 0.0
        for r in range(redo, target):
            row, _, _ = run_round(rs, r, elapsed)
            elapsed = row["elapsed_s"]
            recorded = self.rows[r] if r < len(self.rows) else None
            if recorded is not None and any(
                not _same(row[k], recorded.get(k)) for k in _SAME_COLUMNS
            ):
                print(
                    f"mecsim: warning: round {r + 1}, re-executed after an actor died, "
                    "differs from its record",
                    file=sys.stderr,
                )
        self.elapsed_s = elapsed

    def run(self) -> str:
        """Run the remaining rounds; returns ``finished``, or ``cancelled`` or
        ``interrupted`` when ``should_stop`` says so, at the end of a round or (asked by
        the executor while it waits, :class:`RoundAborted`) in the middle of one, whose
        work is then discarded."""
        try:
            return self._run()
        except RoundAborted as exc:
            return exc.status

    def _run(self) -> str:
        sc = self.rs.info.scenario
        if sc.aggregation.clocked():
            return self._run_clocked()
        faults_in_round, recoveries = 0, 0
        while self.rnd < sc.rounds:
            kill_point(f"round-start:{self.rnd}")
            try:
                checkpoint_next = bool(self.every) and (self.rnd + 1) % self.every == 0
                row, client_rows, traces = run_round(
                    self.rs, self.rnd, self.elapsed_s, plan_next=not checkpoint_next
                )
            except ActorFailure as exc:
                faults_in_round, recoveries = faults_in_round + 1, recoveries + 1
                self._emit("on_fault", self.rnd, str(exc))
                if recoveries > MAX_RECOVERIES:
                    raise RunFailed(
                        f"actors died {recoveries} times without a round "
                        f"finishing in between (last: {exc})"
                    ) from exc
                self._recover(exc)
                continue
            row["faults"] = faults_in_round
            faults_in_round = recoveries = 0
            self.rows.append(row)
            self.elapsed_s = row["elapsed_s"]
            self.rnd += 1
            self._emit("on_round_end", row, client_rows, traces)
            kill_point(f"round-end:{self.rnd - 1}")
            if self.rnd == sc.rounds:  # every round done: the last checkpoint is not cut short
                self.rs.executor.abort_when(None)
            if self.every and (self.rnd % self.every == 0 or self.rnd == sc.rounds):
                while True:
                    try:
                        self._checkpoint()
                        break
                    except ActorFailure as exc:
                        # counted in the next round's row (this one's is written)
                        faults_in_round, recoveries = faults_in_round + 1, recoveries + 1
                        self._emit("on_fault", self.rnd - 1, str(exc))
                        if recoveries > MAX_RECOVERIES:
                            raise RunFailed(
                                f"actors died {recoveries} times while checkpointing (last: {exc})"
                            ) from exc
                        self._recover(exc)
            if self.should_stop is not None and self.rnd < sc.rounds:
                stop = self.should_stop()
                if stop:
                    return abort_status(stop)
        return "finished"

    def _run_clocked(self) -> str:
        """An asynchronous run (:mod:`mecsim.run.async_run`): its versions, checkpointed
        at version boundaries and resumed from one (docs/async.md)."""
        sc = self.rs.info.scenario
        refused = async_refusals(sc)
        if refused:
            raise RunFailed("; ".join(f"{where}: {why}" for where, why in refused))
        resume, hosts = None, None
        if self.rnd > 0:
            if self.rnd >= sc.rounds:  # killed after its last checkpoint: nothing to run
                return "finished"
            ckpt = self._load_base()
            if ckpt.clocked is None:
                raise RunFailed(
                    f"aggregation.mode {sc.aggregation.mode}: the checkpoint after version "
                    f"{self.rnd} holds no asynchronous run's state; run the scenario again"
                )
            resume = (self.rnd, ckpt.clocked)
            # the hosts were given the checkpoint's state (run()): what a host that dies
            # before the run's first recovery point is restored to
            hosts = ExecutorState(ckpt.server, ckpt.clients, ckpt.costs, edges=ckpt.edges)
        clocked = AsyncRun(
            self.rs,
            self._emit,
            self.should_stop,
            checkpoint=self._checkpoint_clocked if self.every else None,
            every=self.every,
            resume=resume,
            hosts_state=hosts,
        )
        status = clocked.run()
        self.rows.extend(clocked.rows)
        self.rnd = len(self.rows)
        if clocked.rows:
            self.elapsed_s = float(clocked.rows[-1]["elapsed_s"])
        return status


def _same(a: Any, b: Any) -> bool:
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return a == b
    return fa == fb or (np.isnan(fa) and np.isnan(fb))


@dataclass
class ResumePoint:
    """Where a run continues: its newest usable checkpoint (None: from the start) and the
    round rows already recorded up to it."""

    checkpoint: Checkpoint | None
    rows: list[dict[str, Any]]


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """While the rounds run, what this process held before them (torch, Ray, the data,
    the set-up) is exempt from Python's cyclic garbage collector, whose full collections
    would otherwise walk it all, a stall of tens of milliseconds in the rounds they fall
    in. Afterwards it is collectable again (a service runs many runs in one process)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run(
    scenario: Scenario,
    run_id: str,
    out_dir: Path | None = None,
    observers: Sequence[RunObserver] = (),
    *,
    checkpoints: Checkpoints | None = None,
    should_stop: Callable[[], bool | str] | None = None,
    resume: ResumePoint | None = None,
    **prepare_kwargs: Any,
) -> list[dict[str, Any]]:
    """Run every round of ``scenario``; returns the round rows.

    With ``checkpoints``, a checkpoint is saved there after every ``checkpoint.every``
    rounds (and after the last). ``resume`` continues a run from its checkpoint (see
    :mod:`mecsim.store.runfolder`). ``should_stop`` is asked after every
    round, and by the executor while it waits for its processes; when it returns True (or
    ``"cancelled"``, or ``"interrupted"``: the status the run then gets) the run stops
    there, keeping the rounds done and discarding a round in progress (the service
    cancelling a run, or stopping). A Ray actor that dies is re-created and restored
    from the last checkpoint, and the round re-executed (``faults`` column).

    Observers hear how the run ends: ``on_run_end`` when every round is done,
    ``on_run_stopped`` otherwise (then the exception, if any, propagates).
    """
    rs = prepare(scenario, run_id, out_dir, **prepare_kwargs)
    store = checkpoints if scenario.checkpoint.every > 0 else None
    start = resume.checkpoint if resume else None
    loop = _Loop(rs, observers, store, start, resume.rows if resume else [], should_stop)
    if start is not None and rs.network.moving is not None:
        # the A3 timers of clients that move continue from the recorded rounds' starts
        prior = list(loop.rows)[: loop.rnd]
        rs.network.moving.catch_up([0.0] + [float(r["elapsed_s"]) for r in prior[:-1]])
    try:
        if start is not None:
            rs.executor.load_state(
                ExecutorState(start.server, start.clients, start.costs, edges=start.edges)
            )
        # from here on a stop is taken in the middle of a round too (_Loop.run)
        rs.executor.abort_when(should_stop)
        rs.info.resumed_from = loop.rnd
        if resume is not None:
            loop._emit("on_run_resume", list(loop.rows))
        else:
            loop._emit("on_run_start")
        loop._emit("on_placement", loop.rnd, rs.executor.placement())
        with _heap_frozen():
            status = loop.run()
    except BaseException as exc:
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        message = "" if status == "interrupted" else f"{type(exc).__name__}: {exc}"
        try:
            loop._emit("on_run_stopped", loop.rows, status, message)
        finally:
            rs.executor.close()
        raise
    try:
        if status == "finished":
            loop._emit("on_run_end", loop.rows)
        else:
            loop._emit("on_run_stopped", loop.rows, status, "")
    finally:
        rs.executor.close()
    return loop.rows
