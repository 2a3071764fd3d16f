"""The timing engine: play one round's op-traces through a SimPy model of the network.

"Execute, then time": the clients of a round have already run for real and returned
op-traces (:mod:`mecsim.ops`). :func:`time_round` replays them in emulated time through
dedicated links, shared media (processor sharing), device CPUs and edge-server CPUs,
and returns per-client timelines and the round's critical-path breakdown. It is a pure
function: no torch, no Ray, no wall clock.

The SimPy processes below are the reference model. :func:`time_round` solves the same
model faster where it can: a numpy closed form when nothing is shared (here), each
shared resource for all its flows at once when clients visit resources in one order
(:mod:`mecsim.engine_media`), and event by event without SimPy otherwise
(:mod:`mecsim.engine_events`); docs/engine.md has the details and the speeds.

Units: seconds (``_s``), bits per second (``_bps``), FLOPs and FLOP/s (``flops_per_s``).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
import math
from bisect import bisect_right
from collections.abc import Collection, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import simpy

from mecsim.ops import Backhaul, Barrier, Compute, Download, OpTrace, ServerCompute, Upload

_Proc = Generator[simpy.Event, Any, None]


@dataclass(frozen=True)
class RateSchedule:
    """Piecewise-constant rate: ``rates_bps[k]`` holds from ``times_s[k]`` to ``times_s[k+1]``.

    Times are emulated seconds since the round started; the last rate holds forever.
    """

    times_s: tuple[float, ...]
    rates_bps: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.times_s or len(self.times_s) != len(self.rates_bps):
            raise ValueError("RateSchedule needs equally many (>= 1) times and rates")
        if self.times_s[0] != 0.0:
            raise ValueError("RateSchedule.times_s must start at 0.0")
        if any(b <= a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise ValueError("RateSchedule.times_s must be strictly ascending")
        if any(r < 0 or math.isnan(r) for r in self.rates_bps):
            raise ValueError("RateSchedule.rates_bps must be >= 0")

    def transfer_time_s(self, nbits: float, start_s: float) -> float:
        """Seconds to move ``nbits`` bits starting at ``start_s``; inf if never done."""
        if nbits <= 0:
            return 0.0
        first = max(bisect_right(self.times_s, start_s) - 1, 0)
        t_s, left = start_s, float(nbits)
        for k in range(first, len(self.times_s)):
            rate = self.rates_bps[k]
            end_s = self.times_s[k + 1] if k + 1 < len(self.times_s) else math.inf
            if rate > 0 and left <= rate * (end_s - t_s):
                return t_s + left / rate - start_s
            left -= rate * (end_s - t_s)
            t_s = end_s
        return math.inf


Rate = float | RateSchedule  # bits per second


@dataclass(frozen=True)
class ClientSpec:
    """A client's links and device CPU (``t = batches*step_overhead_s + flops/flops_per_s``).

    A transfer of ``nbits`` takes ``nbits / rate + latency`` on its link (the rate is the
    goodput; the latency, one-way, is added to every transfer after its last bit is sent).
    """

    client_id: int
    uplink_rate_bps: Rate
    downlink_rate_bps: Rate
    step_overhead_s: float
    flops_per_s: float
    edge_server: int = 0
    uplink_latency_s: float = 0.0
    downlink_latency_s: float = 0.0


@dataclass(frozen=True)
class ServerSpec:
    """An edge server's CPU, processor-shared among the jobs of its clients, and its wired
    backhaul to the central server (``t = backhaul_latency_s + 8*nbytes/backhaul_bps``)."""

    flops_per_s: float
    step_overhead_s: float = 0.0
    backhaul_bps: float = math.inf
    backhaul_latency_s: float = 0.0


@dataclass(frozen=True)
class NetworkSpec:
    """Which directions are shared media (per edge server), and the round's deadline."""

    uplink_shared: bool = False
    downlink_shared: bool = False
    deadline_s: float | None = None


@dataclass(frozen=True)
class ClientTimeline:
    """One client's round in emulated seconds; per-kind totals include contention."""

    client_id: int
    start_s: float
    finish_s: float
    download_s: float
    compute_s: float
    upload_s: float
    server_compute_s: float
    completed: bool
    # transfer time of its edge server's Backhaul ops; the time it waited at them for the
    # server's other clients is in none of the per-kind totals
    backhaul_s: float = 0.0


@dataclass(frozen=True)
class RoundTiming:
    """A round's timelines and critical-path breakdown (seconds)."""

    clients: tuple[ClientTimeline, ...]
    critical_client: int | None
    wait_s: float
    aggregate_s: float
    round_time_s: float
    download_s: float
    client_s: float
    upload_s: float
    server_s: float
    idle_s: float
    dropped: tuple[int, ...]
    backhaul_s: float = 0.0


class ProcessorSharing:
    """Generalised processor sharing: with n active jobs, each progresses at its rate / n.

    Implemented with virtual time ``v`` (dv/dt = 1/n): a job of ``work`` units at ``rate``
    units/s arriving at ``v0`` finishes when ``v`` reaches ``v0 + work/rate``. Finish tags
    sit in a heap, so each arrival/departure costs O(log n). One timer is pending for the
    head job; a version counter makes stale timers no-ops.
    """

    def __init__(self, env: simpy.Environment, name: str) -> None:
        self.env, self.name = env, name
        self._v, self._last_s = 0.0, env.now  # virtual time (s of solo service), its update
        self._heap: list[tuple[float, int, simpy.Event]] = []  # (finish tag, seq, event)
        self._seq = self._version = 0

    def __repr__(self) -> str:
        return f"ProcessorSharing({self.name!r}, active={len(self._heap)})"

    def serve(self, work: float, rate: float) -> simpy.Event:
        """Event that fires when ``work`` units at own ``rate`` units/s are done (work > 0)."""
        self._advance()
        tag = self._v + work / rate if rate > 0 else math.inf
        event = self.env.event()
        self._seq += 1
        heapq.heappush(self._heap, (tag, self._seq, event))
        self._reschedule()
        return event

    def _advance(self) -> None:
        if self._heap:
            self._v += (self.env.now - self._last_s) / len(self._heap)
        self._last_s = self.env.now

    def _reschedule(self) -> None:
        self._version += 1
        if not self._heap or math.isinf(self._heap[0][0]):
            return
        version = self._version
        delay_s = max(0.0, (self._heap[0][0] - self._v) * len(self._heap))
        self.env.timeout(delay_s).callbacks.append(lambda _: self._on_timer(version))

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        self._v = max(self._v, self._heap[0][0])
        while self._heap and self._heap[0][0] <= self._v:
            heapq.heappop(self._heap)[2].succeed()
        self._reschedule()


class DedicatedLink:
    """A client's own link: no contention; it owns its transfer delay
    (``nbits / rate + latency_s``)."""

    def __init__(self, env: simpy.Environment, rate_bps: Rate, latency_s: float = 0.0) -> None:
        self.env, self.rate_bps, self.latency_s = env, rate_bps, latency_s

    def __repr__(self) -> str:
        return f"DedicatedLink(rate_bps={self.rate_bps!r}, latency_s={self.latency_s})"

    def transfer(self, nbits: float) -> _Proc:
        if nbits <= 0:
            return
        if isinstance(self.rate_bps, RateSchedule):
            delay_s = self.rate_bps.transfer_time_s(nbits, self.env.now) + self.latency_s
        else:
            delay_s = nbits / self.rate_bps + self.latency_s if self.rate_bps > 0 else math.inf
        # an infinitely long transfer waits on an event that never fires
        yield self.env.event() if math.isinf(delay_s) else self.env.timeout(delay_s)


class SharedLink:
    """A client's share of a medium: its transfers are served at ``rate_bps / n``, then
    arrive ``latency_s`` later (the latency does not hold the medium)."""

    def __init__(self, medium: ProcessorSharing, rate_bps: float,
                 latency_s: float = 0.0) -> None:
        self.medium, self.rate_bps, self.latency_s = medium, rate_bps, latency_s

    def __repr__(self) -> str:
        return (f"SharedLink({self.medium.name!r}, rate_bps={self.rate_bps}, "
                f"latency_s={self.latency_s})")

    def transfer(self, nbits: float) -> _Proc:
        if nbits > 0:
            yield self.medium.serve(nbits, self.rate_bps)
            if self.latency_s > 0:
                yield self.medium.env.timeout(self.latency_s)


class Device:
    """A client's own CPU: ``batches*step_overhead_s + flops/flops_per_s`` seconds."""

    def __init__(self, env: simpy.Environment, step_overhead_s: float, flops_per_s: float):
        self.env, self.step_overhead_s, self.flops_per_s = env, step_overhead_s, flops_per_s

    def __repr__(self) -> str:
        return f"Device(step_overhead_s={self.step_overhead_s}, flops_per_s={self.flops_per_s})"

    def run(self, flops: float, batches: int) -> _Proc:
        flop_s = flops / self.flops_per_s if self.flops_per_s > 0 else math.inf
        delay_s = batches * self.step_overhead_s + (flop_s if flops > 0 else 0.0)
        if delay_s > 0:
            yield self.env.event() if math.isinf(delay_s) else self.env.timeout(delay_s)


class EdgeServerCPU:
    """An edge server's CPU, processor-shared; a job is its step overheads + FLOPs, in FLOPs."""

    def __init__(self, env: simpy.Environment, index: int, spec: ServerSpec) -> None:
        self.spec = spec
        self.cpu = ProcessorSharing(env, f"server{index}.cpu")

    def __repr__(self) -> str:
        return f"EdgeServerCPU({self.cpu.name!r}, {self.spec})"

    def run(self, flops: float, batches: int) -> _Proc:
        work = batches * self.spec.step_overhead_s * self.spec.flops_per_s + max(flops, 0.0)
        if work > 0:
            yield self.cpu.serve(work, self.spec.flops_per_s)


class EdgeBackhaul:
    """An edge server's wired link to the central server, used once per Backhaul op position.

    The k-th Backhaul op of the server's clients is one transfer: it starts when the last of
    the ``expected[k]`` clients carrying a k-th Backhaul op reaches it, lasts
    ``latency + 8*nbytes/bandwidth`` and then releases them all.
    """

    def __init__(self, env: simpy.Environment, index: int, spec: ServerSpec,
                 expected: list[int]) -> None:
        self.env, self.index, self.spec, self.expected = env, index, spec, expected
        self.arrived = [0] * len(expected)
        self.start_s = [math.nan] * len(expected)
        self.done = [env.event() for _ in expected]

    def __repr__(self) -> str:
        return (f"EdgeBackhaul(server{self.index}, bandwidth_bps={self.spec.backhaul_bps}, "
                f"latency_s={self.spec.backhaul_latency_s})")

    def transfer(self, k: int, nbytes: int) -> _Proc:
        self.arrived[k] += 1
        if self.arrived[k] == self.expected[k]:
            self.start_s[k] = self.env.now
            bw = self.spec.backhaul_bps
            delay_s = self.spec.backhaul_latency_s + (8.0 * nbytes / bw if nbytes > 0 else 0.0)
            self.env.timeout(delay_s).callbacks.append(lambda _: self.done[k].succeed())
        yield self.done[k]


class RoundBarrier:
    """The round's Barrier ops: the k-th releases every client carrying a k-th Barrier op
    when the last of the ``expected[k]`` of them reaches it."""

    def __init__(self, env: simpy.Environment, expected: list[int]) -> None:
        self.expected = expected
        self.arrived = [0] * len(expected)
        self.done = [env.event() for _ in expected]

    def wait(self, k: int) -> _Proc:
        self.arrived[k] += 1
        if self.arrived[k] == self.expected[k]:
            self.done[k].succeed()
        yield self.done[k]


_Link = DedicatedLink | SharedLink
_KIND: dict[type, str] = {
    Download: "download", Compute: "compute", Upload: "upload", ServerCompute: "server",
    Backhaul: "backhaul", Barrier: "barrier",
}


class _Client:
    """One client's round as a SimPy process; records time spent per kind of op."""

    def __init__(
        self, env: simpy.Environment, cid: int, trace: OpTrace, down: _Link, up: _Link,
        device: Device, server: EdgeServerCPU | None, backhaul: EdgeBackhaul | None = None,
        barrier: RoundBarrier | None = None,
    ) -> None:
        self.env, self.cid, self.trace = env, cid, trace
        self.down, self.up, self.device, self.server = down, up, device, server
        self.backhaul, self.barrier = backhaul, barrier
        self.spent_s = dict.fromkeys(_KIND.values(), 0.0)
        self.current: str | None = None
        self.finish_s: float | None = None

    def run(self) -> _Proc:
        k_backhaul = k_barrier = 0
        for op in self.trace:
            t0_s, self.current = self.env.now, _KIND[type(op)]
            if isinstance(op, Barrier):  # waiting for the others: idle, in no total
                assert self.barrier is not None  # _simulate made one for the round
                yield from self.barrier.wait(k_barrier)
                k_barrier += 1
                continue
            if isinstance(op, Backhaul):
                assert self.backhaul is not None  # _edge_backhauls made one for its server
                yield from self.backhaul.transfer(k_backhaul, op.nbytes)
                t0_s = self.backhaul.start_s[k_backhaul]  # waiting for peers is not transfer
                k_backhaul += 1
            elif isinstance(op, Download):
                yield from self.down.transfer(8 * op.nbytes)
            elif isinstance(op, Upload):
                yield from self.up.transfer(8 * op.nbytes)
            elif isinstance(op, Compute):
                yield from self.device.run(op.flops, op.batches)
            elif self.server is not None:
                yield from self.server.run(op.flops, op.batches)
            self.spent_s[self.current] += self.env.now - t0_s
        self.current, self.finish_s = None, self.env.now

    def timeline(self, deadline_s: float | None) -> ClientTimeline:
        spent, finish_s = dict(self.spent_s), self.finish_s
        if finish_s is None:  # stuck in an op that never ends
            spent[self.current or "compute"] = finish_s = math.inf
        return ClientTimeline(
            self.cid, 0.0, finish_s, spent["download"], spent["compute"], spent["upload"],
            spent["server"], _made_it(finish_s, deadline_s), spent["backhaul"],
        )


def time_round(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
    aggregate_s: float = 0.0,
    *,
    method: str = "auto",
    failed: Collection[int] = (),
    wait_for: int | None = None,
) -> RoundTiming:
    """Time one round: all clients start at 0 s and run their op-traces in order.

    ``traces`` maps client_id -> op-trace (its order is the output order); ``clients``
    must hold a spec for each. Raises ValueError for a shared medium with a
    :class:`RateSchedule` rate, or a ServerCompute on a missing edge server.

    ``method`` picks how the model is solved. Every way gives the SimPy model's timelines
    float for float (tests check thousands of random rounds), except that when two
    events fall on the very same instant the fast paths may take them in another order
    than SimPy does, which can move a result by a few ulps (tests check <= 1e-9
    relative on rounds built to be full of such ties):

    - ``"closed_form"``: :func:`_closed_form_timelines`, numpy, when nothing is shared
      (no shared medium, edge-server CPU, backhaul or rate trace);
    - ``"media"``: :func:`mecsim.engine_media.media_timelines`, each shared resource for
      all its flows at once, when every client visits each resource at most once and in
      an order all agree on (download, then upload: FedAvg-like rounds on shared media);
    - ``"events"``: :func:`mecsim.engine_events.event_timelines`, event by event without
      SimPy, for any round (per-batch split learning, backhaul, rate traces);
    - ``"simpy"``: :func:`_simulate`, the SimPy model: the reference the others are
      tested against, and what runs a round none of them covers (an op type they do not
      know) or reports invalid input;
    - ``"auto"`` (default): the first of closed_form, media, events that covers the
      round, else simpy; media only for groups of clients large enough to pay for
      numpy's per-call cost (``engine_media.WORTHWHILE_GROUP_SIZE``), as in a
      1,000-client round on a shared access point.

    A named method that does not cover the round falls back the same way (closed_form ->
    media -> events -> simpy).

    ``failed``: clients whose op-trace ends in a failure (a crash, a drop-out before the
    upload): timed as they ran, never completed. ``wait_for``: the server aggregates once
    this many clients have completed; the later ones are dropped as at a deadline.
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {METHODS}")
    with _collector_paused():
        _, timelines = _solve(traces, clients, servers, network, method)
        deadline_s = network.deadline_s
        if failed or wait_for is not None:
            failed = frozenset(failed)
            finishes = sorted(t.finish_s for t in timelines
                              if t.completed and t.client_id not in failed)
            if wait_for is not None and 0 < wait_for < len(finishes):
                cutoff_s = finishes[wait_for - 1]
                deadline_s = cutoff_s if deadline_s is None else min(deadline_s, cutoff_s)
            timelines = tuple(
                replace(t, completed=t.client_id not in failed
                        and _made_it(t.finish_s, deadline_s))
                for t in timelines)
        return _summarise(timelines, deadline_s, aggregate_s)


METHODS = ("auto", "closed_form", "media", "events", "simpy")
_PATHS = METHODS[1:]


def engine_path(traces: Mapping[int, OpTrace], clients: Mapping[int, ClientSpec],
                servers: Sequence[ServerSpec], network: NetworkSpec) -> str:
    """Which way :func:`time_round` (``method="auto"``) solves this round (it solves it)."""
    with _collector_paused():
        return _solve(traces, clients, servers, network, "auto")[0]


def _solve(traces: Mapping[int, OpTrace], clients: Mapping[int, ClientSpec],
           servers: Sequence[ServerSpec], network: NetworkSpec,
           method: str) -> tuple[str, tuple[ClientTimeline, ...]]:
    """(path, timelines): the first path from ``method`` on that covers the round."""
    from mecsim import engine_events, engine_media

    # the media and event paths do not model per-link latency yet: such rounds go to
    # the closed form (which does) or to SimPy
    latency = any(s.uplink_latency_s or s.downlink_latency_s for s in clients.values())
    for path in _PATHS[0 if method == "auto" else _PATHS.index(method):]:
        if latency and path in ("media", "events"):
            continue
        if path == "closed_form":
            timelines = _closed_form_timelines(traces, clients, network)
        elif path == "media":
            timelines = engine_media.media_timelines(
                traces, clients, servers, network,
                min_group_size=engine_media.WORTHWHILE_GROUP_SIZE if method == "auto" else 0)
        elif path == "events":
            timelines = engine_events.event_timelines(traces, clients, servers, network)
        else:
            timelines = _simulate(traces, clients, servers, network)
        if timelines is not None:
            return path, timelines
    raise AssertionError("the SimPy model covers every round")


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a round is solved, as ``timeit`` does.

    Solving allocates tens of thousands of small objects (heap entries, timelines) that
    form no cycles; each allocation burst would start collections that traverse every
    live object, including all the recorded op-traces a replay holds (millions). That
    cost 30-40 % of a 10,000-client round. Reference counting frees everything as usual;
    the collector runs again afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# Op types the closed form covers, and the column of each in its per-kind time table.
# Exact types only: a subclass (or any op type added later) goes to the SimPy model.
_CLOSED_FORM_KIND: dict[type, int] = {Download: 0, Compute: 1, Upload: 2}


def _closed_form_timelines(
    traces: Mapping[int, OpTrace], clients: Mapping[int, ClientSpec], network: NetworkSpec,
) -> tuple[ClientTimeline, ...] | None:
    """Per-client timelines without SimPy, or None when the round needs the SimPy model.

    Applies when nothing is shared: no shared medium, no edge-server compute, constant
    rates, and only Download / Compute / Upload ops. Then each client's clock is the sum
    of its op durations. Clients with the same sequence of op kinds are stacked into numpy
    arrays and advanced together, one op at a time, with the arithmetic of the SimPy
    model in the same order (clock ``now + delay``, per-kind time += clock difference,
    an op that never ends leaves the client stuck at ``inf``), so the result is equal to
    the SimPy model's bit for bit (``tests/test_engine_closed_form.py`` checks it on
    random rounds).
    """
    if network.uplink_shared or network.downlink_shared:
        return None
    ids = list(traces)
    groups: dict[tuple[type, ...], list[int]] = {}  # sequence of op types -> positions
    for pos, cid in enumerate(ids):
        spec = clients[cid]
        if spec.client_id != cid:
            raise ValueError(f"clients[{cid}] has client_id {spec.client_id}")
        if isinstance(spec.uplink_rate_bps, RateSchedule) or isinstance(
                spec.downlink_rate_bps, RateSchedule):
            return None
        groups.setdefault(tuple(map(type, traces[cid])), []).append(pos)
    if any(t not in _CLOSED_FORM_KIND for types in groups for t in types):
        return None

    finish_s = np.zeros(len(ids))
    spent_s = np.zeros((len(ids), 3))  # download, compute, upload
    for types, positions in groups.items():
        kinds = tuple(_CLOSED_FORM_KIND[t] for t in types)
        rows = [traces[ids[p]] for p in positions]
        specs = [clients[ids[p]] for p in positions]
        finish_s[positions], spent_s[positions] = _advance_group(kinds, rows, specs)

    return _timelines(ids, finish_s, spent_s, network.deadline_s)


def _timelines(ids: list[int], finish_s: np.ndarray, spent_s: np.ndarray,
               deadline_s: float | None) -> tuple[ClientTimeline, ...]:
    """Each client's ClientTimeline from its finish time and per-kind seconds (n x 3:
    download, compute, upload; or n x 5 with server and backhaul); ``completed`` as
    :func:`_made_it` says, computed for all clients at once."""
    made_it = np.isfinite(finish_s)
    if deadline_s is not None:
        made_it &= finish_s <= deadline_s
    cols = spent_s.T.tolist()
    zeros = itertools.repeat(0.0)
    server, backhaul = (cols[3], cols[4]) if len(cols) == 5 else (zeros, zeros)
    return tuple(map(ClientTimeline, ids, itertools.repeat(0.0), finish_s.tolist(), cols[0],
                     cols[1], cols[2], server, made_it.tolist(), backhaul))


def _advance_group(kinds: tuple[int, ...], rows: list[OpTrace],
                   specs: list[ClientSpec]) -> tuple[np.ndarray, np.ndarray]:
    """(finish_s, per-kind seconds) of clients sharing one sequence of op kinds."""
    m = len(rows)
    down_bps = np.array([float(s.downlink_rate_bps) for s in specs])
    up_bps = np.array([float(s.uplink_rate_bps) for s in specs])
    down_lat_s = np.array([float(s.downlink_latency_s) for s in specs])
    up_lat_s = np.array([float(s.uplink_latency_s) for s in specs])
    overhead_s = np.array([float(s.step_overhead_s) for s in specs])
    flops_per_s = np.array([float(s.flops_per_s) for s in specs])
    now_s, spent_s = np.zeros(m), np.zeros((m, 3))
    stuck, stuck_kind = np.zeros(m, dtype=bool), np.zeros(m, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for k, kind in enumerate(kinds):
            if kind == 1:  # Device.run
                flops = np.array([float(r[k].flops) for r in rows])
                batches = np.array([float(r[k].batches) for r in rows])
                flop_s = np.where(flops_per_s > 0, flops / flops_per_s, np.inf)
                delay_s = batches * overhead_s + np.where(flops > 0, flop_s, 0.0)
                delay_s = np.where(delay_s > 0, delay_s, 0.0)
            else:  # DedicatedLink.transfer
                nbits = 8.0 * np.array([float(r[k].nbytes) for r in rows])
                rate, lat_s = (down_bps, down_lat_s) if kind == 0 else (up_bps, up_lat_s)
                delay_s = np.where(nbits > 0,
                                   np.where(rate > 0, nbits / rate + lat_s, np.inf), 0.0)
            blocked = np.isinf(delay_s) & ~stuck
            stuck_kind[blocked] = kind
            stuck |= blocked
            new_s = np.where(stuck, now_s, now_s + delay_s)
            spent_s[:, kind] += new_s - now_s
            now_s = new_s
    now_s[stuck] = np.inf
    spent_s[stuck, stuck_kind[stuck]] = np.inf
    return now_s, spent_s


def _simulate(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
) -> tuple[ClientTimeline, ...]:
    """Per-client timelines from the SimPy model (any op-trace, media, CPUs)."""
    env = simpy.Environment()
    media: dict[tuple[str, int], ProcessorSharing] = {}
    cpus: dict[int, EdgeServerCPU] = {}

    def link(spec: ClientSpec, rate: Rate, shared: bool, direction: str) -> _Link:
        latency_s = spec.uplink_latency_s if direction == "uplink" else spec.downlink_latency_s
        if not shared:
            return DedicatedLink(env, rate, latency_s)
        if isinstance(rate, RateSchedule):
            raise ValueError(f"client {spec.client_id}: a shared {direction} medium needs a "
                             "constant rate, not a RateSchedule")
        key = (direction, spec.edge_server)
        if key not in media:
            media[key] = ProcessorSharing(env, f"server{key[1]}.{direction}")
        return SharedLink(media[key], float(rate), latency_s)

    backhauls = _edge_backhauls(env, traces, clients, servers)
    barriers = [sum(isinstance(op, Barrier) for op in trace) for trace in traces.values()]
    barrier = RoundBarrier(env, [sum(n > k for n in barriers) for k in range(max(barriers,
                                                                               default=0))])
    procs: list[_Client] = []
    for cid, trace in traces.items():
        spec = clients[cid]
        if spec.client_id != cid:
            raise ValueError(f"clients[{cid}] has client_id {spec.client_id}")
        es, server = spec.edge_server, None
        if any(isinstance(op, ServerCompute) for op in trace):
            if not 0 <= es < len(servers):
                raise ValueError(f"client {cid}: no edge server {es}")
            if es not in cpus:
                cpus[es] = EdgeServerCPU(env, es, servers[es])
            server = cpus[es]
        client = _Client(
            env, cid, tuple(trace),
            link(spec, spec.downlink_rate_bps, network.downlink_shared, "downlink"),
            link(spec, spec.uplink_rate_bps, network.uplink_shared, "uplink"),
            Device(env, spec.step_overhead_s, spec.flops_per_s), server,
            backhauls.get(es), barrier,
        )
        procs.append(client)
        env.process(client.run())
    env.run()

    return tuple(c.timeline(network.deadline_s) for c in procs)


def _edge_backhauls(env: simpy.Environment, traces: Mapping[int, OpTrace],
                    clients: Mapping[int, ClientSpec],
                    servers: Sequence[ServerSpec]) -> dict[int, EdgeBackhaul]:
    """One :class:`EdgeBackhaul` per edge server whose clients carry Backhaul ops.

    Raises ValueError when the k-th Backhaul ops of one server's clients differ (they are
    one transfer) or name a missing edge server.
    """
    ops_by_server: dict[int, list[list[Backhaul]]] = {}
    for cid, trace in traces.items():
        ops = [op for op in trace if isinstance(op, Backhaul)]
        if ops:
            ops_by_server.setdefault(clients[cid].edge_server, []).append(ops)
    out: dict[int, EdgeBackhaul] = {}
    for es, per_client in ops_by_server.items():
        if not 0 <= es < len(servers):
            raise ValueError(f"Backhaul op of a client of edge server {es}: no such server")
        depth = max(len(ops) for ops in per_client)
        for k in range(depth):
            kth = {ops[k] for ops in per_client if len(ops) > k}
            if len(kth) > 1:
                raise ValueError(f"edge server {es}: its clients' Backhaul op #{k} differ "
                                 f"({sorted(map(repr, kth))}); it is one transfer")
        expected = [sum(len(ops) > k for ops in per_client) for k in range(depth)]
        out[es] = EdgeBackhaul(env, es, servers[es], expected)
    return out


def _made_it(finish_s: float, deadline_s: float | None) -> bool:
    """A client completes when it finishes at all (an op that never ends, e.g. a link of
    rate 0 for ever, is an outage, not a completion) and, with a deadline, by it."""
    return math.isfinite(finish_s) and (deadline_s is None or finish_s <= deadline_s)


def _busy_s(t: ClientTimeline) -> float:
    return t.download_s + t.compute_s + t.upload_s + t.server_compute_s + t.backhaul_s


def _summarise(timelines: tuple[ClientTimeline, ...], deadline_s: float | None,
               aggregate_s: float) -> RoundTiming:
    """The round's makespan and critical-path breakdown from its client timelines."""
    done = [t for t in timelines if t.completed]
    dropped = tuple(t.client_id for t in timelines if not t.completed)
    # among clients finishing together (released by one backhaul transfer), the critical
    # one is the one that waited least: its own ops make up the path
    crit = max(done, key=lambda t: (t.finish_s, _busy_s(t))) if done else None
    wait_s = deadline_s if dropped and deadline_s is not None else crit.finish_s if crit else 0.0
    round_s = wait_s + aggregate_s
    parts = (
        (crit.download_s, crit.compute_s, crit.upload_s, crit.server_compute_s + aggregate_s,
         crit.backhaul_s)
        if crit else (0.0, 0.0, 0.0, aggregate_s, 0.0)
    )
    idle_s = round_s - sum(parts) if math.isfinite(round_s) else 0.0
    return RoundTiming(
        clients=timelines, critical_client=crit.client_id if crit else None,
        wait_s=wait_s, aggregate_s=aggregate_s, round_time_s=round_s,
        download_s=parts[0], client_s=parts[1], upload_s=parts[2], server_s=parts[3],
        idle_s=max(0.0, idle_s), dropped=dropped, backhaul_s=parts[4],
    )
