"""Asynchronous and buffered FL in emulated time: the clock decides what each client
trains on (docs/async.md).

In a synchronous run training does not depend on the clock ("execute, then time"). Here
it does: which model version a client downloads, and how stale its update is when it
arrives, are emulated times. So the SimPy core drives the run:

- one process per client cycles download -> train -> upload on the scenario's links
  (dedicated, or the edge server's shared medium: processor sharing among the transfers
  in flight, as in a round) and its device CPU; it trains on the version current when
  its download started; once the server has taken its update it starts again;
- the server takes updates in arrival order, one at a time on its CPU (its aggregation
  time from the edge-server profile), and publishes a new version when the mode's rule
  (:mod:`mecsim.agents.algorithms.asynchronous`) makes one;
- a training is executed, for real, on the hosts when its client's process needs its
  result (the download done): then every training whose start is already known (all
  clients whose download has begun: the version each trains on is fixed) is executed
  together, in one :meth:`~mecsim.run.backends.base.Executor.fit`, so the hosts work in
  parallel as in a round.

The order of events is a function of the seed and the op-traces (SimPy breaks ties by
scheduling order, which is itself deterministic), so the same seed gives the same
records in-process and on Ray. ``rounds`` counts the server's versions; evaluation comes
every ``evaluation.every`` versions and at the last. The channel is drawn once, at the
run's start (round 0's draw), and holds for the run.

Checkpoints are taken at version boundaries (every ``checkpoint.every`` versions and
after the last): the server (its model, version and whatever else it keeps: FedBuff's
buffer), the versions in-flight cycles trained on, the uploads of the cycles already
trained and not yet taken, and the result of every training executed so far (its
op-trace, loss, samples: no weights). The SimPy clock's state (which client is
downloading, training or uploading which version, until when) is not stored: a resume
re-plays the clock from the run's start with the recorded results in place of the
trainings and a stand-in server of one element that counts the versions exactly as the
real one, and at the checkpoint's version puts the real server, versions and uploads in
place. The clock's events depend on the op-traces, the upload sizes, which updates were
finite and the versions made, never on the weights' values, so the re-play reaches the
very state the run was in (checked: the updates, batches and versions' times must
match), and the run continues as if it had not stopped.

A Ray actor that dies mid-run does not stop it: every :data:`RECOVERY_POINT_BATCHES`
batches the hosts' state is taken into memory, and a call to the hosts that fails on a
dead actor re-creates the actors, restores that state, executes the batches since again
and is made again (:meth:`AsyncRun._on_hosts`), so the run goes on as if undisturbed.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import psutil
import simpy

from mecsim.agents.algorithms import ClientResult, ClientTask, algorithm_classes
from mecsim.agents.algorithms.asynchronous import AsyncServer, Update
from mecsim.agents.algorithms.fedavg import FedAvgServer
from mecsim.agents.state import BlobSink, decode, encode
from mecsim.emulation import faults
from mecsim.emulation.energy import ENERGY_KEYS, client_energy
from mecsim.emulation.engine import ClientSpec, ClientTimeline
from mecsim.emulation.engine.simpy_model import (
    CappedProcessorSharing,
    DedicatedLink,
    Device,
    ProcessorSharing,
    SharedLink,
)
from mecsim.emulation.ops import Compute, Download, Upload, op_to_dict, trace_flops
from mecsim.registry import ASYNC_SERVERS
from mecsim.run.backends.base import MAX_RECOVERIES, ActorFailure, ExecutorState
from mecsim.run.backends.placement import PlacementTimeout
from mecsim.run.chaos import kill_point
from mecsim.run.setup import MiB, RunFailed, RunSetup
from mecsim.scenario import Scenario

_Proc = Generator[simpy.Event, Any, None]
_T = TypeVar("_T")

#: Batches of trainings between two recovery points: on an executor whose processes can
#: die (Ray), the hosts' state (clients' private states, measured step costs) is taken
#: into memory every this many batches; a host that dies is re-created, given the last
#: one and the batches since are executed again (their results thrown away: the run has
#: them), so the trainings it then executes are the uninterrupted run's.
RECOVERY_POINT_BATCHES = 32

#: Updates per client a server may take without making a version (modes async and
#: buffered) before the run calls it stuck (:meth:`AsyncRun._check_progress`).
STALL_UPDATES_PER_CLIENT = 100


def refusals(scenario: Scenario) -> list[tuple[str, str]]:
    """Why ``scenario`` cannot run in its asynchronous mode, as (field, message) pairs
    (none: it can, or it is synchronous). :mod:`mecsim.run.preflight` reports them
    before anything starts; the run refuses them again if started without it."""
    agg = scenario.aggregation
    if not agg.clocked():
        return []
    out: list[tuple[str, str]] = []
    mode = f"aggregation.mode {agg.mode}"
    name = scenario.algorithm.name
    try:
        server_cls, _ = algorithm_classes(name)
    except (KeyError, ValueError):
        return out  # the schema names an unknown algorithm itself
    if server_cls.Edge is not None:
        out.append(
            (
                "aggregation.mode",
                f"algorithm {name!r} is hierarchical (edge servers aggregate in rounds) and "
                f"cannot run asynchronously; use mode sync, or a flat algorithm (fedavg, "
                "fedprox)",
            )
        )
    elif not issubclass(server_cls, FedAvgServer):
        out.append(
            (
                "aggregation.mode",
                f"algorithm {name!r} cannot run asynchronously: {mode} takes the clients of "
                "FedAvg's kind (fedavg, fedprox: each trains the downloaded model and "
                "uploads it whole)",
            )
        )
    n = scenario.topology.clients
    if agg.mode == "buffered" and agg.buffer_size > n:
        out.append(
            (
                "aggregation.buffer_size",
                f"a buffer of {agg.buffer_size} updates is larger than the {n} clients",
            )
        )
    if agg.mode == "buffered" and agg.concurrency is not None and agg.buffer_size > agg.concurrency:
        out.append(
            (
                "aggregation.buffer_size",
                f"a buffer of {agg.buffer_size} updates is larger than the concurrency "
                f"({agg.concurrency} clients training at once)",
            )
        )
    if agg.concurrency is not None and agg.concurrency > n:
        out.append(("aggregation.concurrency", f"{agg.concurrency} is more than the {n} clients"))
    if scenario.deadline_s is not None:
        out.append(("deadline_s", f"a round deadline has no meaning in {mode}; remove it"))
    f = scenario.faults
    if f is not None and (
        f.crash_prob
        or f.dropout_prob
        or f.outage_prob
        or f.link_outages
        or f.edge_server_outages
        or f.wait_for_fraction < 1
    ):
        out.append(
            (
                "faults",
                f"{mode} emulates stragglers only (faults.stragglers); crashes, drop-outs, "
                "outages and wait_for_fraction are not modelled in it yet",
            )
        )
    g = scenario.geometry
    if g is not None and g.moves():
        out.append(
            (
                "geometry.mobility",
                f"{mode} draws the channel once for the run; clients that move are not "
                "followed in it yet",
            )
        )
    if scenario.topology.participation < 1:
        out.append(
            (
                "topology.participation",
                f"{mode} has every client cycle on its own; to limit how many train at "
                "once set aggregation.concurrency",
            )
        )
    return out


@dataclass
class _Cycle:
    """One client's download -> train -> upload."""

    client_id: int
    cycle: int
    version: int  # the version it downloaded
    start_s: float
    task: ClientTask
    result: ClientResult | None = None
    upload: np.ndarray | None = None
    upload_size: int = 0  # elements of the upload (the server's FLOPs count them)
    finite: bool = False  # whether the upload is all finite (looked at once, when trained)
    download_s: float = 0.0
    compute_s: float = 0.0
    upload_s: float = 0.0
    arrive_s: float = math.nan


@dataclass
class _VersionLog:
    """What the server took since its previous version."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    cycles: list[_Cycle] = field(default_factory=list)  # accepted
    staleness: list[int] = field(default_factory=list)
    staleness_s: list[float] = field(default_factory=list)
    server_s: float = 0.0
    server_flops: float = 0.0
    host_aggregate_s: float = 0.0
    traces: dict[str, Any] = field(default_factory=dict)


class AsyncRun:
    """One asynchronous run: SimPy processes for the clients and the server, trainings
    executed in batches when the clock reaches them; rows emitted per version."""

    def __init__(
        self,
        rs: RunSetup,
        emit: Callable[..., None],
        should_stop: Callable[[], bool | str] | None = None,
        *,
        checkpoint: Callable[[AsyncRun, int, float], None] | None = None,
        every: int = 0,
        resume: tuple[int, Any] | None = None,
        hosts_state: ExecutorState | None = None,
    ) -> None:
        """``checkpoint(run, versions, now)`` is called after the rows of every ``every``-th
        version (and of the last) are emitted; ``resume`` is (versions done, the
        :meth:`state` of the checkpoint taken then) of a run to continue, and
        ``hosts_state`` the state its hosts were given (None: new hosts')."""
        self.rs, self.emit, self.should_stop = rs, emit, should_stop
        self.checkpoint, self.every = checkpoint, every
        sc = rs.info.scenario
        self.sc = sc
        self.agg = sc.aggregation
        self.n = sc.topology.clients
        self.env = simpy.Environment()
        assert rs.init_weights is not None  # prepare() keeps them
        self.model_size = int(np.asarray(rs.init_weights).size)
        # every training executed so far, per batch, encoded once (a checkpoint holds them)
        self.executed: list[list[Any]] = []
        # a resume re-plays the clock up to this version (see the module's docstring)
        self.replay_to = 0
        self.replay_log: list[list[dict[str, Any]]] = []
        self.saved: dict[str, Any] = {}
        self.live = resume is None  # False while a resume re-plays the clock
        init = rs.init_weights
        if resume is not None:
            self.replay_to, state = resume
            self.executed = list(state["executed"])
            self.replay_log = [[decode(e) for e in batch] for batch in self.executed]
            self.saved = decode(state["state"])
            init = np.zeros(1, dtype=np.float32)  # the stand-in server of the re-play
        self.server: AsyncServer = self._new_server(init)
        self.published_at = {0: 0.0}  # version -> emulated s it was made
        self.current = 0  # the version downloads get: the last published
        # the versions kept: the current one and those in-flight cycles trained on, found
        # by counting the in-flight cycles of each version (_start, _release) rather
        # than by a pass over the clients in flight after every update (quadratic)
        self.versions = {0: self.server.weights}
        self.users: dict[int, int] = {}  # version -> its cycles in flight (none: absent)
        self.pending: list[_Cycle] = []  # started, not yet executed
        self.in_flight: dict[int, _Cycle] = {}
        self.batches = 0
        self.updates = 0
        self.log = _VersionLog()
        self.rows: list[dict[str, Any]] = []
        self.stop_status: str | None = None
        self.done = self.env.event()
        self.avail = rs.availability
        self.cpu = simpy.Resource(self.env, capacity=1)
        self.slots = simpy.Resource(self.env, capacity=self.agg.concurrency or self.n)
        self.wall0 = time.perf_counter()
        self.train_wall = 0.0
        # this process (server_rss_mb): psutil.Process() reads /proc at each creation,
        # 4 ms a version under load at 10,000 versions
        self.process = psutil.Process()
        # a host that dies (Ray) is re-created and restored (_on_hosts): the hosts' state
        # at the last recovery point (None: new hosts') and the batches fit since
        self.can_fail = bool(getattr(rs.executor, "actors_can_die", False))
        self.recovery = hosts_state
        self.redo: list[tuple[int, list[ClientTask]]] = []
        self.faults = 0  # actor deaths since the last version's row
        self.recoveries = 0  # since the last call to the hosts that went through
        self._network()

    def _new_server(self, init_weights: np.ndarray) -> AsyncServer:
        """The scenario's asynchronous server (``aggregation.server``, else the mode's own)
        of the ``mecsim.async_servers`` registry, on ``init_weights``."""
        agg = self.agg
        cls = ASYNC_SERVERS.get(agg.server_name())
        params = dict(agg.server.params) if agg.server is not None else {}
        server: AsyncServer = cls(init_weights, agg, params)
        return server

    # -- the network, drawn once -----------------------------------------------------
    def _network(self) -> None:
        rs, sc = self.rs, self.sc
        clients = list(range(self.n))
        specs, _, net, rows = rs.network.round(0, clients, 0.0)
        self.specs: dict[int, ClientSpec] = faults.apply_to_specs(
            specs, sc.faults, rs.slowdown, 0.0, ()
        )
        self.channel_rows = rows
        self.air_rates = rs.network.round_links[0].tolist()
        media: dict[tuple[str, int], ProcessorSharing | CappedProcessorSharing] = {}
        capped = {
            (d, s.edge_server)
            for s in self.specs.values()
            for d, shared, share in (
                ("uplink", net.uplink_shared, s.uplink_max_share),
                ("downlink", net.downlink_shared, s.downlink_max_share),
            )
            if shared and share < 1.0
        }

        def link(spec: ClientSpec, direction: str, shared: bool) -> DedicatedLink | SharedLink:
            up = direction == "uplink"
            rate = spec.uplink_rate_bps if up else spec.downlink_rate_bps
            latency_s = spec.uplink_latency_s if up else spec.downlink_latency_s
            tcp = spec.uplink_tcp if up else spec.downlink_tcp
            if not shared:
                return DedicatedLink(self.env, rate, latency_s, tcp)
            key = (direction, spec.edge_server)
            if key not in media:
                kind = CappedProcessorSharing if key in capped else ProcessorSharing
                media[key] = kind(self.env, f"server{key[1]}.{direction}")
            share = spec.uplink_max_share if up else spec.downlink_max_share
            return SharedLink(media[key], float(rate), latency_s, share, tcp)  # type: ignore[arg-type]

        self.down = {c: link(self.specs[c], "downlink", net.downlink_shared) for c in clients}
        self.up = {c: link(self.specs[c], "uplink", net.uplink_shared) for c in clients}
        self.device = {
            c: Device(self.env, self.specs[c].step_overhead_s, self.specs[c].flops_per_s)
            for c in clients
        }

    # -- training, in batches --------------------------------------------------------
    def _start(self, cid: int, cycle: int) -> _Cycle:
        v = self.current
        nbytes = int(self.rs.info.model_nbytes)
        cyc = _Cycle(cid, cycle, v, self.env.now, ClientTask(cid, self.versions[v], nbytes))
        self.pending.append(cyc)
        self.in_flight[cid] = cyc
        self.users[v] = self.users.get(v, 0) + 1
        return cyc

    @property
    def replaying(self) -> bool:
        return not self.live

    def _execute(self) -> None:
        """Every started cycle not yet executed, in one fit (their versions are fixed)."""
        batch, self.pending = self.pending, []
        if self.replaying:
            self._replayed(batch)
            return
        tasks = sorted((c.task for c in batch), key=lambda t: t.client_id)
        t0 = time.perf_counter()
        executor, b = self.rs.executor, self.batches
        if self.can_fail and len(self.redo) >= RECOVERY_POINT_BATCHES:
            self.recovery = self._on_hosts(lambda: executor.state())
            self.redo = []
        results, uploads = self._on_hosts(lambda: (executor.fit(b, tasks), executor.take_uploads()))
        if self.can_fail:
            self.redo.append((b, tasks))
        self.train_wall += time.perf_counter() - t0
        self.batches += 1
        by_id = {r.client_id: r for r in results}
        done = []
        for cyc in sorted(batch, key=lambda c: c.client_id):
            r = by_id[cyc.client_id]
            cyc.result = r
            w = r.weights if r.weights is not None else uploads.get(cyc.client_id)
            cyc.upload = None if w is None else np.array(w, dtype=np.float32, copy=True)
            cyc.upload_size = 0 if cyc.upload is None else int(cyc.upload.size)
            r.weights = None
            cyc.finite = cyc.upload is not None and bool(np.isfinite(cyc.upload).all())
            kind = "none" if cyc.upload is None else "finite" if cyc.finite else "nonfinite"
            entry = {
                "client_id": cyc.client_id,
                "cycle": cyc.cycle,
                "result": r,
                "upload": kind,
                "upload_size": cyc.upload_size,
            }
            done.append(encode(entry, f"asynchronous run: client {cyc.client_id}'s result"))
        self.executed.append(done)

    def _on_hosts(self, call: Callable[[], _T]) -> _T:
        """``call()``, a request to the hosts; when a host (any actor) has died, the
        actors are re-created, given the hosts' state of the last recovery point, the
        batches fit since are executed again, and ``call`` is made again: its results are
        those the uninterrupted run gets (each training is seeded by its batch and
        client, and the hosts are where they were). Each death is an ``on_fault`` and
        counts in the next version's ``faults``; more than :data:`MAX_RECOVERIES` in a
        row fail the run."""
        failure: ActorFailure | None = None
        while True:
            try:
                if failure is not None:
                    self._restore(failure)
                out = call()
            except ActorFailure as exc:
                failure = exc
                self.faults += 1
                self.recoveries += 1
                self.emit("on_fault", self.current, str(exc))
                if self.recoveries > MAX_RECOVERIES:
                    raise RunFailed(
                        f"actors died {self.recoveries} times without a call to the hosts "
                        f"going through in between (last: {exc})"
                    ) from exc
                continue
            self.recoveries = 0
            return out

    def _restore(self, failure: ActorFailure) -> None:
        executor = self.rs.executor
        try:
            executor.restart()
        except PlacementTimeout as exc:
            raise RunFailed(f"{exc}, after {failure}") from None
        self.emit("on_placement", self.current, executor.placement())
        if self.recovery is not None:
            executor.load_state(self.recovery)
        for b, tasks in self.redo:
            executor.fit(b, tasks)
            executor.take_uploads()

    def _replayed(self, batch: list[_Cycle]) -> None:
        """A resume's re-play: the batch's recorded results in place of its trainings,
        with a one-element stand-in for each upload (finite or not, as the real one)."""
        if self.batches >= len(self.replay_log):
            self._diverged(f"batch {self.batches} of trainings was not recorded")
        recorded = {(e["client_id"], e["cycle"]): e for e in self.replay_log[self.batches]}
        if set(recorded) != {(c.client_id, c.cycle) for c in batch}:
            self._diverged(f"batch {self.batches} holds other clients' trainings")
        self.batches += 1
        for cyc in batch:
            e = recorded[(cyc.client_id, cyc.cycle)]
            cyc.result = e["result"]
            cyc.upload_size = int(e["upload_size"])
            cyc.finite = e["upload"] == "finite"
            cyc.upload = (
                None
                if e["upload"] == "none"
                else np.full(1, 0.0 if e["upload"] == "finite" else np.nan, np.float32)
            )

    def _diverged(self, why: str) -> None:
        raise RunFailed(
            f"aggregation.mode {self.agg.mode}: the resume re-played the run's clock up to "
            f"version {self.replay_to} and it went another way ({why}): the checkpoint was "
            "written by another mecsim or for another scenario; run the scenario again"
        )

    def _go_live(self) -> None:
        """The re-play has reached the checkpoint's version: the real server, the versions
        in-flight cycles trained on and their uploads take the stand-ins' places."""
        saved = self.saved
        now = {"updates": self.updates, "batches": self.batches}
        for key, value in now.items():
            if saved[key] != value:
                self._diverged(f"{value} {key} where the checkpoint has {saved[key]}")
        if saved["published_at"] != self.published_at:
            self._diverged("the versions were made at other times")
        if set(saved["versions"]) != set(self.versions):
            self._diverged("other versions in use")
        server = self._new_server(saved["server"]["weights"])
        for name, value in saved["server"].items():
            setattr(server, name, value)
        self.server = server
        self.versions = dict(saved["versions"])
        nbytes = int(self.rs.info.model_nbytes)
        uploads = saved["uploads"]
        for cyc in self.in_flight.values():
            if cyc.result is None:  # started, not trained: it trains on the real version
                cyc.task = ClientTask(cyc.client_id, self.versions[cyc.version], nbytes)
            elif cyc.upload is not None:
                cyc.upload = uploads[cyc.client_id]
        self.saved, self.replay_log = {}, []
        self.live = True
        self.wall0, self.train_wall = time.perf_counter(), 0.0

    def state(self, blobs: BlobSink | None = None) -> dict[str, Any]:
        """What a checkpoint at this version boundary holds (see the module's docstring);
        ``blobs`` takes the large arrays by reference."""
        server = {k: v for k, v in vars(self.server).items() if k not in ("config", "params")}
        uploads = {
            c.client_id: c.upload
            for c in self.in_flight.values()
            if c.result is not None and c.upload is not None
        }
        state = {
            "updates": self.updates,
            "batches": self.batches,
            "published_at": dict(self.published_at),
            "server": server,
            "versions": dict(self.versions),
            "uploads": uploads,
        }
        return {"executed": self.executed, "state": encode(state, "asynchronous run", blobs)}

    def _result(self, cyc: _Cycle) -> ClientResult:
        if cyc.result is None:
            self._execute()
        assert cyc.result is not None
        return cyc.result

    # -- the processes ---------------------------------------------------------------
    def _client(self, cid: int) -> _Proc:
        cycle = 0
        avail = self.avail
        while not self.done.triggered:
            if avail is not None:  # an offline client starts no cycle: it waits
                on = avail.next_on(cid, self.env.now)
                if math.isinf(on):
                    return  # offline for the rest of the run
                if on > self.env.now:
                    yield self.env.timeout(on - self.env.now)
                    if self.done.triggered:
                        return
            with self.slots.request() as slot:
                yield slot
                if self.done.triggered:
                    return
                if avail is not None and not avail.online(cid, self.env.now):
                    continue  # went offline while it waited for a slot
                off = math.inf if avail is None else avail.next_off(cid, self.env.now)
                cyc = self._start(cid, cycle)
                yield from self.down[cid].transfer(8 * cyc.task.download_nbytes)
                cyc.download_s = self.env.now - cyc.start_s
                done: list[Any] = [Download(cyc.task.download_nbytes)]
                lost = "download" if self.env.now >= off else None
                if lost is None:
                    result = self._result(cyc)
                    for op in result.trace:
                        t0 = self.env.now
                        if isinstance(op, Compute):
                            yield from self.device[cid].run(op.flops, op.batches)
                            cyc.compute_s += self.env.now - t0
                        elif isinstance(op, Upload):
                            yield from self.up[cid].transfer(8 * op.nbytes)
                            cyc.upload_s += self.env.now - t0
                        elif not isinstance(op, Download):  # the download is timed above
                            raise RuntimeError(
                                f"client {cid}: op {type(op).__name__} is not timed in "
                                f"aggregation.mode {self.agg.mode}"
                            )
                        else:
                            continue
                        done.append(op)
                        if self.env.now >= off:  # it went offline in this op
                            lost = "upload" if isinstance(op, Upload) else "training"
                            break
                cyc.arrive_s = self.env.now
                if lost is not None:
                    self._lose(cyc, lost, tuple(done))
                else:
                    # the cycle (and its slot of aggregation.concurrency) ends when the
                    # server has taken the update
                    yield from self._server_takes(cyc)
            cycle += 1

    def _lose(self, cyc: _Cycle, phase: str, done: tuple[Any, ...]) -> None:
        """The client went offline during ``phase`` of ``cyc``: its update never reaches
        the server; its row says so (``lost_offline_<phase>``), with the time and energy
        of the ops it did (``done``; the op it was in is timed to its end)."""
        self.in_flight.pop(cyc.client_id, None)
        self.pending = [c for c in self.pending if c is not cyc]  # not trained, if not yet
        staleness = self.server.version - cyc.version
        staleness_s = self.env.now - self.published_at[cyc.version]
        if not self.replaying:
            status = f"lost_offline_{phase}"
            self.log.rows.append(
                self._update_row(
                    cyc, self.server.version, staleness, staleness_s, 0.0, status, done
                )
            )
        self.updates += 1
        cyc.upload = None
        self._release(cyc)

    def _periods(self) -> _Proc:
        """semi_sync: at the end of every period the server averages what arrived."""
        period_s = self.agg.period_s
        while not self.done.triggered:
            yield self.env.timeout(period_s)
            with self.cpu.request() as turn:
                yield turn
                if self.done.triggered:
                    return
                # (a resume puts the real server in the stand-in's place; the schema
                # refuses a server without flush() in this mode)
                flush = getattr(self.server, "flush")  # noqa: B009 (not on AsyncServer)
                size = self.model_size
                t0 = time.perf_counter()
                before = self.server.version
                made = flush()
                self.log.host_aggregate_s += time.perf_counter() - t0
                self._check_version(made, before, "flush")
                if made:
                    agg_s = self.rs.server_profile.aggregate_time_s(size)  # the division
                    self.log.server_s += agg_s
                    self.log.server_flops += size
                    if agg_s > 0:
                        yield self.env.timeout(agg_s)
                    self._publish()

    def _server_takes(self, cyc: _Cycle) -> _Proc:
        with self.cpu.request() as turn:
            yield turn
            if self.done.triggered:
                return
            self.in_flight.pop(cyc.client_id, None)
            made, agg_s = self._take(cyc)
            if agg_s > 0:
                yield self.env.timeout(agg_s)
            if made:
                self._publish()

    def _take(self, cyc: _Cycle) -> tuple[bool, float]:
        """The server takes ``cyc``'s update: checked, weighted, folded; returns whether
        it made a new version and the emulated seconds of its aggregation."""
        result = cyc.result
        assert result is not None
        staleness = self.server.version - cyc.version
        staleness_s = self.env.now - self.published_at[cyc.version]
        limit = self.agg.max_staleness
        finite = cyc.upload is not None and cyc.finite
        finite = finite and math.isfinite(result.train_loss)
        status = (
            "rejected_nonfinite"
            if not finite
            else "dropped_stale"
            if limit is not None and staleness > limit
            else "accepted"
        )
        made, flops, wall = False, 0.0, 0.0
        at_version = self.server.version  # before this update (it may make the next)
        weight = self.server.factor(staleness) if status == "accepted" else 0.0
        if status == "accepted":
            assert cyc.upload is not None
            t0 = time.perf_counter()
            made = self.server.on_update(
                Update(
                    cyc.client_id,
                    cyc.upload,
                    self.versions[cyc.version],
                    cyc.version,
                    result.num_samples,
                ),
                staleness,
            )
            wall = time.perf_counter() - t0
            self._check_version(made, at_version, "on_update")
            flops = self.server.aggregate_flops(cyc.upload_size)
            self.log.cycles.append(cyc)
            self.log.staleness.append(staleness)
            self.log.staleness_s.append(staleness_s)
            self._check_progress()
        agg_s = self.rs.server_profile.aggregate_time_s(flops)
        self.log.server_s += agg_s
        self.log.server_flops += flops
        self.log.host_aggregate_s += wall
        if not self.replaying:  # (a re-play's rows are on disk already)
            self.log.rows.append(
                self._update_row(cyc, at_version, staleness, staleness_s, weight, status)
            )
            self.log.traces[str(self.updates)] = {
                "client_id": cyc.client_id,
                "ops": [op_to_dict(op) for op in self._trace(cyc)],
            }
        self.updates += 1
        cyc.upload = None
        self._release(cyc)
        return made, agg_s

    def _check_version(self, made: Any, before: int, method: str) -> None:
        """The server's contract: ``method`` returns True exactly when it made the next
        version (one more), False when the version stays; anything else stops the run
        (a server that says it made a version and did not would never reach ``rounds``)."""
        after = self.server.version
        if isinstance(made, bool | np.bool_) and after == before + int(made):
            return
        raise RunFailed(
            f"aggregation.server: {type(self.server).__name__}.{method} returned {made!r} "
            f"and took the version from {before} to {after}: it must return True when it "
            "made a new version (version one more), False when it did not (version unchanged)"
        )

    def _check_progress(self) -> None:
        """In modes async and buffered only ``on_update`` makes versions: a server that
        has taken :data:`STALL_UPDATES_PER_CLIENT` updates per client since its last
        version would never reach ``rounds`` (FedBuff makes one every ``buffer_size``, at
        most the clients), so the run stops rather than run for ever."""
        taken = len(self.log.cycles)
        if self.agg.mode == "semi_sync" or taken < STALL_UPDATES_PER_CLIENT * self.n:
            return
        raise RunFailed(
            f"aggregation.server: {type(self.server).__name__} took {taken} updates "
            f"({STALL_UPDATES_PER_CLIENT} per client) since version {self.server.version} "
            "without making another: it would never reach the scenario's rounds"
        )

    def _trace(self, cyc: _Cycle) -> tuple[Any, ...]:
        assert cyc.result is not None
        trace = tuple(cyc.result.trace)
        if not any(isinstance(op, Download) for op in trace):
            trace = (Download(cyc.task.download_nbytes), *trace)
        return trace

    def _release(self, cyc: _Cycle) -> None:
        """``cyc`` (taken by the server, or lost) no longer trains on its version: the
        version is dropped when no other cycle in flight trained on it and it is not the
        current one (kept: the published version, and those in-flight cycles trained on)."""
        v = cyc.version
        left = self.users[v] - 1
        if left:
            self.users[v] = left
            return
        del self.users[v]
        if v != self.current:
            del self.versions[v]

    def _update_row(
        self,
        cyc: _Cycle,
        at_version: int,
        staleness: int,
        staleness_s: float,
        weight: float,
        status: str,
        trace: tuple[Any, ...] | None = None,
    ) -> dict[str, Any]:
        """``trace``: the ops the client did (None: its training's whole trace)."""
        r = cyc.result
        trained = r is not None and (trace is None or any(isinstance(op, Compute) for op in trace))
        rs, cid = self.rs, cyc.client_id
        trace = self._trace(cyc) if trace is None else trace
        up = sum(op.nbytes for op in trace if isinstance(op, Upload))
        down = sum(op.nbytes for op in trace if isinstance(op, Download))
        energy = self._energy(cyc, trace)
        return {
            "run_id": rs.info.run_id,
            "update": self.updates,
            "client_id": cid,
            "device": rs.info.client_devices[cid],
            "edge_server": int(rs.network.edge_server[cid]),
            "cycle": cyc.cycle,
            "trained_on": cyc.version,
            "server_version": at_version,
            "staleness": staleness,
            "staleness_s": staleness_s,
            "weight": weight,
            "status": status,
            "version": -1,  # the version this update's row is emitted with (_emit_version)
            "start_s": cyc.start_s,
            "arrive_s": cyc.arrive_s,
            "download_s": cyc.download_s,
            "compute_s": cyc.compute_s,
            "upload_s": cyc.upload_s,
            "bytes_up": up,
            "bytes_down": down,
            "gflops": trace_flops(trace)[0] / 1e9,
            # (a cycle lost before it trained: none of these)
            "steps": r.steps if trained and r is not None else 0,
            "num_samples": r.num_samples if trained and r is not None else 0,
            "train_loss": r.train_loss if trained and r is not None else math.nan,
            "peak_memory_mb": r.peak_memory_bytes / MiB if trained and r is not None else 0.0,
            "host_train_s": r.host_seconds if trained and r is not None else 0.0,
            **energy,
        }

    def _energy(self, cyc: _Cycle, trace: tuple[Any, ...]) -> dict[str, float]:
        """The client's energy over ``cyc``'s busy time (download, training, upload)."""
        rs, cid = self.rs, cyc.client_id
        busy_s = cyc.download_s + cyc.compute_s + cyc.upload_s
        timeline = ClientTimeline(
            cid, 0.0, busy_s, cyc.download_s, cyc.compute_s, cyc.upload_s, 0.0, True
        )
        return client_energy(
            rs.network.devices[cid],
            timeline,
            trace,
            self.specs[cid],
            busy_s,
            idle_policy=self.sc.energy.idle_policy,
            tx_power_dbm=float(rs.network.tx_power_dbm[cid]),
            air_rates_bps=self.air_rates[cid],
        )

    def _publish(self) -> None:
        """The server's new version is what downloads get from now; its row is emitted."""
        v = self.server.version
        now = self.env.now
        w = self.server.weights
        size = self.model_size if self.live else 1  # (a re-play's stand-in has one element)
        if not (isinstance(w, np.ndarray) and w.dtype == np.float32 and w.shape == (size,)):
            raise RunFailed(
                f"aggregation.server: {type(self.server).__name__} made version {v} of "
                f"{type(w).__name__} {getattr(w, 'dtype', '')} {getattr(w, 'shape', '')}: the "
                f"weights must stay a flat float32 array of the model's {size} values"
            )
        if not np.isfinite(self.server.weights).all():  # finite updates, an unstable step
            raise RunFailed(
                f"aggregation.mode {self.agg.mode}: version {v} of the model holds NaN or "
                f"inf after the server's step at {now:.1f} emulated s (every update it took "
                "was finite: the step diverged; a smaller server_lr or alpha)"
            )
        before_s = self.published_at[v - 1]
        self.published_at[v] = now
        self.versions[v] = self.server.weights
        previous, self.current = self.current, v
        if previous not in self.users:  # no cycle in flight trained on it
            del self.versions[previous]
        if self.replaying:  # its rows are on disk and its checkpoint is where the resume began
            self.log = _VersionLog()
            if v == self.replay_to:
                self._go_live()
            return
        self._emit_version(v - 1, now, before_s)
        kill_point(f"round-end:{v - 1}")
        last = v >= self.sc.rounds
        if self.checkpoint is not None and self.every and (v % self.every == 0 or last):
            checkpoint = self.checkpoint
            self._on_hosts(lambda: checkpoint(self, v, now))
        if last:
            self.done.succeed()
        elif self.should_stop is not None:
            stop = self.should_stop()
            if stop:
                self.stop_status = stop if isinstance(stop, str) else "cancelled"
                self.done.succeed()

    def _emit_version(self, rnd: int, now: float, before_s: float) -> None:
        sc, log = self.sc, self.log
        self.log = _VersionLog()
        for taken_row in log.rows:
            taken_row["version"] = rnd + 1
        last = rnd == sc.rounds - 1
        evals: dict[int, tuple[float, float]] = {}
        if (rnd + 1) % sc.evaluation.every == 0 or last:
            nbytes = int(self.rs.info.model_nbytes)
            who = list(range(self.n))
            tasks = [ClientTask(c, self.server.weights, nbytes) for c in who]
            executor = self.rs.executor
            for cid, acc, loss, *_ in self._on_hosts(lambda: executor.evaluate_tasks(rnd, tasks)):
                evals[cid] = (acc, loss)
        accs = [a for a, _ in evals.values() if not np.isnan(a)]

        def mean(values: list[float]) -> float:
            finite = [v for v in values if not np.isnan(v)]
            return float(np.mean(finite)) if finite else float("nan")

        taken = log.rows
        accepted = [r for r in taken if r["status"] == "accepted"]
        energy = {k: float(sum(r[k] for r in taken)) for k in ENERGY_KEYS}
        row: dict[str, Any] = {
            "run_id": self.rs.info.run_id,
            "round": rnd,
            "algorithm": sc.algorithm.name,
            "selected": len(taken),
            "completed": len(accepted),
            "dropped": len(taken) - len(accepted),
            "dropped_deadline": 0,
            "crashed": 0,
            "dropped_out": sum(r["status"].startswith("lost_offline") for r in taken),
            "outage": 0,
            "rejected": sum(r["status"] == "rejected_nonfinite" for r in taken),
            "faults": self.faults,  # actor deaths recovered from (_on_hosts)
            "round_time_s": now - before_s,
            "dl_time_s": mean([r["download_s"] for r in accepted]),
            "client_time_s": mean([r["compute_s"] for r in accepted]),
            "ul_time_s": mean([r["upload_s"] for r in accepted]),
            "server_time_s": log.server_s,
            "backhaul_time_s": 0.0,
            "idle_time_s": 0.0,
            "elapsed_s": now,
            "bytes_up": sum(r["bytes_up"] for r in taken),
            "bytes_down": sum(r["bytes_down"] for r in taken),
            **energy,
            "client_gflops": sum(r["gflops"] for r in taken),
            "server_gflops": log.server_flops / 1e9,
            "server_rss_mb": self.process.memory_info().rss / MiB,
            "client_peak_mb": max((r["peak_memory_mb"] for r in taken), default=0.0),
            "mean_accuracy": mean(accs),
            "min_accuracy": min(accs) if accs else float("nan"),
            "max_accuracy": max(accs) if accs else float("nan"),
            "mean_test_loss": mean([lo for _, lo in evals.values()]),
            "train_loss": mean([r["train_loss"] for r in accepted]),
            "host_wall_s": float("nan"),
            "host_train_wall_s": self.train_wall,
            "host_aggregate_s": log.host_aggregate_s,
            "mean_staleness": mean([float(s) for s in log.staleness]),
            "max_staleness": max(log.staleness, default=0),
            "mean_staleness_s": mean(log.staleness_s),
            "in_flight": len(self.in_flight),
            "dropped_stale": sum(r["status"] == "dropped_stale" for r in taken),
        }
        row["host_wall_s"] = time.perf_counter() - self.wall0
        self.wall0, self.train_wall = time.perf_counter(), 0.0
        self.faults = 0
        self.rows.append(row)
        traces = {"round": rnd, "aggregation": self.agg.mode, "updates": log.traces}
        self.emit("on_round_end", row, taken, traces)

    # -- the run ---------------------------------------------------------------------
    def run(self) -> str:
        """Every version up to ``rounds``; returns ``finished`` or the stop status."""
        for cid in range(self.n):
            self.env.process(self._client(cid))
        if self.agg.mode == "semi_sync":
            self.env.process(self._periods())
        self.env.run(until=self.done)
        if self.stop_status is not None:
            return self.stop_status
        if self.server.version < self.sc.rounds:  # pragma: no cover - every client stuck
            print("mecsim: warning: the asynchronous run stalled", file=sys.stderr)
        return "finished"
