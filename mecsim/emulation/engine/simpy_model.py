"""The reference model: one round's op-traces played through SimPy processes.

Dedicated links, shared media (processor sharing; water-filling when a flow on the medium
is capped below its link rate, :mod:`.sharing`), device CPUs, edge-server CPUs, the
backhaul and barriers, each a small class owning its delay; a client's round is one
generator (:class:`_Client`). The other paths of :mod:`mecsim.emulation.engine` solve the
same model faster and are tested against this one.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, cast

import simpy

from mecsim.channel.tcp import TcpFlow
from mecsim.emulation.engine.sharing import CappedSharing, VaryingSharing
from mecsim.emulation.engine.specs import (
    ClientSpec,
    ClientTimeline,
    NetworkSpec,
    Rate,
    ServerSpec,
    TimeVaryingRate,
    _made_it,
    constant_segments,
    varying_media,
)
from mecsim.emulation.ops import (
    Backhaul,
    Barrier,
    Compute,
    Download,
    Handoff,
    OpTrace,
    ServerCompute,
    Upload,
)

_Proc = Generator[simpy.Event, Any, None]


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


class _TimedMedium:
    """What the two solver-backed media share: one timer pending for the solver's next
    event (``timer_s``, ``wait_s`` from now), a version counter making stale timers no-ops,
    and on the timer the events the solver says are due."""

    env: simpy.Environment
    _medium: CappedSharing[simpy.Event] | VaryingSharing[simpy.Event]
    _version: int

    def _reschedule(self) -> None:
        self._version += 1
        if math.isinf(self._medium.timer_s):
            return
        version = self._version  # the medium's clock is env.now: timer_s = now + wait_s
        self.env.timeout(self._medium.wait_s).callbacks.append(lambda _: self._on_timer(version))

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return
        for event in self._medium.on_timer(self.env.now):
            event.succeed()
        self._reschedule()


class CappedProcessorSharing(_TimedMedium):
    """A shared medium with capped flows: each job may use at most ``max_share`` of the
    medium's time, and the time it leaves goes to the others (max-min fair shares,
    water-filling: :class:`.sharing.CappedSharing`). A job of ``work`` units at own
    ``rate`` needs ``work / rate`` seconds alone; with shares of the time ``φ`` it
    progresses at ``φ / max_share`` of that. One timer is pending for the next departure;
    a version counter makes stale timers no-ops."""

    def __init__(self, env: simpy.Environment, name: str) -> None:
        self.env, self.name = env, name
        self._medium: CappedSharing[simpy.Event] = CappedSharing()
        self._medium.last_s = env.now
        self._version = 0

    def __repr__(self) -> str:
        return f"CappedProcessorSharing({self.name!r}, active={len(self._medium)})"

    def serve(self, work: float, rate: float, max_share: float = 1.0) -> simpy.Event:
        """Event that fires when ``work`` units at own ``rate`` units/s are done (work > 0),
        the job using at most ``max_share`` of the medium's time."""
        event = self.env.event()
        self._medium.arrive(self.env.now, work / rate if rate > 0 else math.inf, max_share, event)
        self._reschedule()
        return event


class VaryingProcessorSharing(_TimedMedium):
    """A shared medium whose flows' link rates change at known times (a rate trace, a
    moving client): each flow at its link rate / n, re-rated where a rate changes
    (:class:`.sharing.VaryingSharing`). One timer is pending for the next event; a
    version counter makes stale timers no-ops."""

    def __init__(self, env: simpy.Environment, name: str) -> None:
        self.env, self.name = env, name
        self._medium: VaryingSharing[simpy.Event] = VaryingSharing()
        self._medium.last_s = env.now
        self._version = 0

    def __repr__(self) -> str:
        return f"VaryingProcessorSharing({self.name!r}, active={len(self._medium)})"

    def serve(self, nbits: float, rate: Rate) -> simpy.Event:
        """Event that fires when ``nbits`` (> 0) at the link's ``rate`` (b/s, or a
        :class:`TimeVaryingRate`: its segments from now) are through."""
        event = self.env.event()
        segments = (
            rate.segments(self.env.now)
            if isinstance(rate, TimeVaryingRate)
            else constant_segments(float(rate))
        )
        self._medium.arrive(self.env.now, nbits, segments, event)
        self._reschedule()
        return event


class DedicatedLink:
    """A client's own link: no contention; it owns its transfer delay
    (``nbits / rate + latency_s``, plus a TCP flow's :meth:`TcpFlow.extra_s`)."""

    def __init__(
        self,
        env: simpy.Environment,
        rate_bps: Rate,
        latency_s: float = 0.0,
        tcp: TcpFlow | None = None,
    ) -> None:
        self.env, self.rate_bps, self.latency_s = env, rate_bps, latency_s
        self.tcp = tcp if tcp is not None and tcp.adds_time else None

    def __repr__(self) -> str:
        return (
            f"DedicatedLink(rate_bps={self.rate_bps!r}, latency_s={self.latency_s}, "
            f"tcp={self.tcp!r})"
        )

    def transfer(self, nbits: float) -> _Proc:
        if nbits <= 0:
            return
        if isinstance(self.rate_bps, TimeVaryingRate):
            took_s = self.rate_bps.transfer_time_s(nbits, self.env.now)
            # a schedule's TCP flow runs at the rate the transfer averaged
            extra_s = self.tcp.extra_s(nbits / 8.0, nbits / took_s) if self.tcp else 0.0
            delay_s = took_s + extra_s + self.latency_s
        elif self.rate_bps > 0:
            extra_s = self.tcp.extra_s(nbits / 8.0, self.rate_bps) if self.tcp else 0.0
            delay_s = nbits / self.rate_bps + extra_s + self.latency_s
        else:
            delay_s = math.inf
        # an infinitely long transfer waits on an event that never fires
        yield self.env.event() if math.isinf(delay_s) else self.env.timeout(delay_s)


class SharedLink:
    """A client's share of a medium: its transfers are served at ``rate_bps / n`` (on a
    medium with capped flows, at its water-filling share: :class:`CappedProcessorSharing`),
    then arrive ``latency_s`` later (the latency does not hold the medium)."""

    def __init__(
        self,
        medium: ProcessorSharing | CappedProcessorSharing | VaryingProcessorSharing,
        rate_bps: Rate,
        latency_s: float = 0.0,
        max_share: float = 1.0,
        tcp: TcpFlow | None = None,
    ) -> None:
        self.medium, self.rate_bps, self.latency_s = medium, rate_bps, latency_s
        self.max_share = max_share
        self.tcp = tcp if tcp is not None and tcp.adds_time else None

    def __repr__(self) -> str:
        return (
            f"SharedLink({self.medium.name!r}, rate_bps={self.rate_bps}, "
            f"latency_s={self.latency_s}, max_share={self.max_share})"
        )

    def transfer(self, nbits: float) -> _Proc:
        if nbits > 0:
            t0_s = self.medium.env.now
            rate = self.rate_bps
            if isinstance(self.medium, VaryingProcessorSharing):
                yield self.medium.serve(nbits, rate)
            else:
                assert not isinstance(rate, TimeVaryingRate)  # _simulate: a varying medium
                if isinstance(self.medium, CappedProcessorSharing):
                    yield self.medium.serve(nbits, rate, self.max_share)
                else:
                    yield self.medium.serve(nbits, rate)
            if self.tcp and isinstance(rate, TimeVaryingRate):
                # a varying link's TCP flow runs at the link rate it averaged: the bits
                # over the seconds they would take alone (TimeVaryingRate.transfer_time_s)
                rate = nbits / rate.transfer_time_s(nbits, t0_s)
            # a TCP flow's window and losses hold it at its fair share of the medium
            # (TcpFlow.flows), after its bits: the medium is not held meanwhile
            wait_s = self.latency_s + (
                self.tcp.extra_s(nbits / 8.0, rate) if self.tcp and isinstance(rate, float) else 0.0
            )
            if wait_s > 0:
                yield self.medium.env.timeout(wait_s)


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

    def __init__(
        self, env: simpy.Environment, index: int, spec: ServerSpec, expected: list[int]
    ) -> None:
        self.env, self.index, self.spec, self.expected = env, index, spec, expected
        self.arrived = [0] * len(expected)
        self.start_s = [math.nan] * len(expected)
        self.done = [env.event() for _ in expected]

    def __repr__(self) -> str:
        return (
            f"EdgeBackhaul(server{self.index}, bandwidth_bps={self.spec.backhaul_bps}, "
            f"latency_s={self.spec.backhaul_latency_s})"
        )

    def transfer(self, k: int, nbytes: int) -> _Proc:
        self.arrived[k] += 1
        if self.arrived[k] == self.expected[k]:
            self.start_s[k] = self.env.now
            bw = self.spec.backhaul_bps
            delay_s = self.spec.backhaul_latency_s + (8.0 * nbytes / bw if nbytes > 0 else 0.0)
            self.env.timeout(delay_s).callbacks.append(
                cast(  # succeed's answer is unused
                    "Callable[[simpy.Event], None]", lambda _: self.done[k].succeed()
                )
            )
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
    Download: "download",
    Compute: "compute",
    Upload: "upload",
    ServerCompute: "server",
    Backhaul: "backhaul",
    Barrier: "barrier",
    Handoff: "backhaul",
}


def handoff_s(op: Handoff, servers: Sequence[ServerSpec], to_edge_server: int) -> float:
    """Seconds of a :class:`~mecsim.emulation.ops.Handoff`: the client's state up the old
    edge server's backhaul to the central server, then down the new one's, one hop after
    the other, each ``latency_s + 8 * nbytes / bandwidth_bps`` (as an EdgeBackhaul
    transfer; no bytes: the latencies alone)."""
    total_s = 0.0
    for es in (op.from_edge_server, to_edge_server):
        if not 0 <= es < len(servers):
            raise ValueError(
                f"Handoff between edge servers {op.from_edge_server} and "
                f"{to_edge_server}: no edge server {es}"
            )
        spec = servers[es]
        bw = spec.backhaul_bps
        total_s += spec.backhaul_latency_s + (8.0 * op.nbytes / bw if op.nbytes > 0 else 0.0)
    return total_s


class _Client:
    """One client's round as a SimPy process; records time spent per kind of op."""

    def __init__(
        self,
        env: simpy.Environment,
        cid: int,
        trace: OpTrace,
        down: _Link,
        up: _Link,
        device: Device,
        server: EdgeServerCPU | None,
        backhaul: EdgeBackhaul | None = None,
        barrier: RoundBarrier | None = None,
        handoff: Callable[[Handoff], float] | None = None,
    ) -> None:
        self.env, self.cid, self.trace = env, cid, trace
        self.handoff = handoff
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
            elif isinstance(op, Handoff):
                assert self.handoff is not None  # _simulate gives every client one
                yield self.env.timeout(self.handoff(op))
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
            self.cid,
            0.0,
            finish_s,
            spent["download"],
            spent["compute"],
            spent["upload"],
            spent["server"],
            _made_it(finish_s, deadline_s),
            spent["backhaul"],
        )


def _simulate(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
) -> tuple[ClientTimeline, ...]:
    """Per-client timelines from the SimPy model (any op-trace, media, CPUs)."""
    env = simpy.Environment()
    media: dict[
        tuple[str, int], ProcessorSharing | CappedProcessorSharing | VaryingProcessorSharing
    ] = {}
    cpus: dict[int, EdgeServerCPU] = {}
    capped = _capped_media(traces, clients, network)
    varying = varying_media(traces, clients, network)

    def link(spec: ClientSpec, rate: Rate, shared: bool, direction: str) -> _Link:
        up = direction == "uplink"
        latency_s = spec.uplink_latency_s if up else spec.downlink_latency_s
        tcp = spec.uplink_tcp if up else spec.downlink_tcp
        if not shared:
            return DedicatedLink(env, rate, latency_s, tcp)
        key = (direction, spec.edge_server)
        if key in capped and key in varying:
            raise ValueError(
                f"client {spec.client_id}: the shared {direction} medium of edge server "
                f"{spec.edge_server} has a flow capped below its link rate (max_share < 1: "
                "a loss rate) and a flow whose rate changes during the round (a rate trace "
                "or a moving client): water-filling with time-varying rates is not built"
            )
        if key not in media:
            kind: type[ProcessorSharing | CappedProcessorSharing | VaryingProcessorSharing]
            kind = (
                VaryingProcessorSharing
                if key in varying
                else CappedProcessorSharing
                if key in capped
                else ProcessorSharing
            )
            media[key] = kind(env, f"server{key[1]}.{direction}")
        max_share = spec.uplink_max_share if up else spec.downlink_max_share
        if not isinstance(rate, TimeVaryingRate):
            rate = float(rate)
        return SharedLink(media[key], rate, latency_s, max_share, tcp)

    backhauls = _edge_backhauls(env, traces, clients, servers)
    barriers = [sum(isinstance(op, Barrier) for op in trace) for trace in traces.values()]
    barrier = RoundBarrier(
        env, [sum(n > k for n in barriers) for k in range(max(barriers, default=0))]
    )
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
            env,
            cid,
            tuple(trace),
            link(spec, spec.downlink_rate_bps, network.downlink_shared, "downlink"),
            link(spec, spec.uplink_rate_bps, network.uplink_shared, "uplink"),
            Device(env, spec.step_overhead_s, spec.flops_per_s),
            server,
            backhauls.get(es),
            barrier,
            functools.partial(handoff_s, servers=servers, to_edge_server=es),
        )
        procs.append(client)
        env.process(client.run())
    env.run()

    return tuple(c.timeline(network.deadline_s) for c in procs)


def _capped_media(
    traces: Mapping[int, OpTrace], clients: Mapping[int, ClientSpec], network: NetworkSpec
) -> set[tuple[str, int]]:
    """The shared media ((direction, edge server)) on which a client of the round is capped
    below its link rate (``max_share < 1``): water-filling there, processor sharing on
    the others."""
    out: set[tuple[str, int]] = set()
    for cid in traces:
        spec = clients[cid]
        if network.uplink_shared and spec.uplink_max_share < 1.0:
            out.add(("uplink", spec.edge_server))
        if network.downlink_shared and spec.downlink_max_share < 1.0:
            out.add(("downlink", spec.edge_server))
    return out


def _edge_backhauls(
    env: simpy.Environment,
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
) -> dict[int, EdgeBackhaul]:
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
                raise ValueError(
                    f"edge server {es}: its clients' Backhaul op #{k} differ "
                    f"({sorted(map(repr, kth))}); it is one transfer"
                )
        expected = [sum(len(ops) > k for ops in per_client) for k in range(depth)]
        out[es] = EdgeBackhaul(env, es, servers[es], expected)
    return out
