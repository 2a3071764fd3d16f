"""The engine's medium-at-once path: each shared resource solved for all its flows at once.

In most rounds a client visits each shared resource (its edge server's shared downlink,
shared uplink, CPU, a backhaul transfer) at most once, and all clients visit them in an
order they agree on (download, then upload). Then a resource's arrival times are known
before any of its departures is needed: the round is solved resource by resource, in
that order. Per resource, :func:`processor_sharing` computes every flow's departure
exactly: between two events each active flow progresses at its own rate / n, so the next
event is the next arrival or the moment virtual time ``v`` (dv/dt = 1/n) reaches the
smallest finish tag ``v_arrival + work / rate``. A medium on which a flow is capped below
its link rate (``max_share < 1``) shares its time by water-filling instead
(:func:`.sharing.capped_processor_sharing`). What a client does on its own between
two resources (dedicated links, device compute) is advanced with numpy for all clients
with the same sequence of op kinds at once, as in the closed form.

The arithmetic is the SimPy model's (:mod:`.simpy_model`: ``ProcessorSharing``,
``DedicatedLink``, ``Device``, ``EdgeServerCPU``, ``EdgeBackhaul``): the same
floating-point operations in the same order, so the timelines equal the SimPy model's
(``tests/unit/emulation/test_engine_events.py`` checks thousands of random rounds). A
round that visits a resource twice per client, or in orders that conflict (per-batch split
learning), is left to :mod:`mecsim.emulation.engine.events` (``media_timelines`` returns None).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import cast

import numpy as np

from mecsim.emulation.engine.closed_form import ClientColumns, PlanGroup, TracePlan
from mecsim.emulation.engine.sharing import capped_processor_sharing, varying_processor_sharing
from mecsim.emulation.engine.specs import (
    ClientSpec,
    ClientTimeline,
    NetworkSpec,
    ServerSpec,
    TimeVaryingRate,
    _timelines,
    constant_segments,
    varying_media,
)
from mecsim.emulation.ops import (
    Backhaul,
    Compute,
    Download,
    Op,
    OpTrace,
    ServerCompute,
    Upload,
)

_INF = math.inf
_DOWN, _COMP, _UP, _SERVER, _BACKHAUL = 0, 1, 2, 3, 4  # per-kind time columns
# Clients per group from which this path beats the event-driven one (measured: at 32
# clients of one FedAvg group on shared media 0.44 ms against 0.48 ms a round).
WORTHWHILE_GROUP_SIZE = 32
_KIND = {Download: _DOWN, Compute: _COMP, Upload: _UP, ServerCompute: _SERVER, Backhaul: _BACKHAUL}
# A shared resource: (medium or "cpu", edge server), or ("backhaul", edge server, k) for
# the k-th Backhaul op of its clients
_Resource = tuple[str, int] | tuple[str, int, int]


def processor_sharing(arrive_s: Sequence[float], solo_s: Sequence[float]) -> list[float]:
    """Departure times of jobs on one processor-sharing resource (inf: never).

    Job k arrives at ``arrive_s[k]`` (ascending; equal times in arrival order) needing
    ``solo_s[k]`` seconds of service alone (work / its own rate; inf for rate 0, which
    never finishes but keeps its share). With n jobs present each is served at 1/n of
    its own rate. Exactly :class:`.simpy_model.ProcessorSharing`'s arithmetic: virtual
    time ``v += (t - last) / n`` at each event, finish tag ``v + solo_s``, the next
    departure at ``last + max(0, (tag - v) * n)``, then ``v = max(v, tag)`` and every job
    whose tag ``<= v`` leaves. An arrival at the very time of a departure is served first.
    """
    m = len(arrive_s)
    depart_s = [_INF] * m
    jobs: list[tuple[float, int]] = []  # (finish tag, arrival index): a heap
    push, pop = heapq.heappush, heapq.heappop
    v = last = 0.0
    n = k = 0  # jobs present, next arrival
    a = arrive_s[0] if m else _INF  # the next arrival's time
    timer = _INF  # the next departure's
    while True:
        if a <= timer:
            if a == _INF:
                return depart_s
            if n:
                v += (a - last) / n
            last = a
            j = k  # every arrival at this very time: v moves by (a - a) / n = 0 between
            while k < m and arrive_s[k] == a:
                k += 1
            if n:
                for i in range(j, k):
                    push(jobs, (v + solo_s[i], i))
            else:
                jobs = [(v + solo_s[i], i) for i in range(j, k)]
                heapq.heapify(jobs)
            n += k - j
            a = arrive_s[k] if k < m else _INF
        else:
            v += (timer - last) / n
            last = timer
            head = jobs[0][0]
            if head > v:  # v = max(v, head)
                v = head
            while n and jobs[0][0] <= v:
                depart_s[pop(jobs)[1]] = timer
                n -= 1
        if n and jobs[0][0] != _INF:
            d = (jobs[0][0] - v) * n
            timer = last + (d if d > 0.0 else 0.0)  # max(0.0, d)
        else:
            timer = _INF


class _Unsupported(Exception):
    """The round is left to the event-driven path (or the SimPy model)."""


class _Group:
    """Clients with the same edge server, link types and sequence of op types.

    ``now_s``/``spent_s`` are their clocks and per-kind totals; ``stuck`` marks clients
    blocked for ever in an op (``stuck_kind``); ``col`` is the next op to play.
    """

    def __init__(
        self,
        positions: list[int] | np.ndarray,
        rows: list[OpTrace],
        specs: list[ClientSpec],
        types: tuple[type, ...],
        es: int,
        servers: Sequence[ServerSpec],
        network: NetworkSpec,
    ) -> None:
        self.positions, self.rows, self.specs, self.types = positions, rows, specs, types
        m = len(positions)
        self.now_s, self.spent_s = np.zeros(m), np.zeros((m, 5))
        self.stuck, self.stuck_kind = np.zeros(m, dtype=bool), np.zeros(m, dtype=np.int64)
        self.col = 0
        self._spec_cache: dict[str, np.ndarray] = {}
        self.es, self.servers, self.network = es, servers, network
        # the resource each op column visits (None: the client's own link or CPU)
        self.visits: list[_Resource | None] = []
        k_backhaul = 0
        for t in types:
            if t not in _KIND:
                raise _Unsupported  # an op type (or subclass) this path does not know
            if t is Download and network.downlink_shared:
                self.visits.append(("downlink", es))
            elif t is Upload and network.uplink_shared:
                self.visits.append(("uplink", es))
            elif t is ServerCompute:
                if not 0 <= es < len(servers):
                    raise _Unsupported  # the SimPy model reports the missing server
                self.visits.append(("cpu", es))
            elif t is Backhaul:
                if not 0 <= es < len(servers):
                    raise _Unsupported
                self.visits.append(("backhaul", es, k_backhaul))
                k_backhaul += 1
            else:
                self.visits.append(None)
        seen = [r for r in self.visits if r is not None]
        if len(set(seen)) != len(seen):
            raise _Unsupported  # a resource visited twice: event by event instead

    def _column(self, attr: str, k: int) -> np.ndarray:
        return np.array(list(map(attrgetter(attr), map(itemgetter(k), self.rows))), dtype=float)

    def _spec(self, attr: str) -> np.ndarray:
        if attr not in self._spec_cache:
            self._spec_cache[attr] = np.array(list(map(attrgetter(attr), self.specs)), dtype=float)
        return self._spec_cache[attr]

    def advance(self, upto: int) -> None:
        """Play the client-own ops from ``col`` up to (not including) column ``upto``."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for k in range(self.col, upto):
                t = self.types[k]
                assert self.visits[k] is None  # resources are served in _serve/_barrier
                if t is Compute:  # Device.run
                    flops, batches = self._column("flops", k), self._column("batches", k)
                    fps = self._spec("flops_per_s")
                    flop_s = np.where(fps > 0, flops / fps, _INF)
                    delay_s = batches * self._spec("step_overhead_s") + np.where(
                        flops > 0, flop_s, 0.0
                    )
                    delay_s = np.where(delay_s > 0, delay_s, 0.0)
                else:  # DedicatedLink.transfer
                    delay_s = self._transfer_s(t is Download, k)
                self._step(delay_s, _KIND[t])
        self.col = max(self.col, upto)

    def _transfer_s(self, down: bool, k: int) -> np.ndarray:
        nbits = 8.0 * self._column("nbytes", k)
        rates = [s.downlink_rate_bps if down else s.uplink_rate_bps for s in self.specs]
        if not isinstance(rates[0], TimeVaryingRate):
            # one group's links are all constant or all schedules (media_timelines' key)
            rate = np.array([float(r) for r in cast("list[float]", rates)])
            return np.where(nbits > 0, np.where(rate > 0, nbits / rate, _INF), 0.0)
        links = cast("list[TimeVaryingRate]", rates)
        kind = type(links[0])
        if any(type(r) is not kind for r in links):
            kind = TimeVaryingRate  # one by one
        # a moving client's links are timed all at once (MovingRate.transfer_times_s)
        return kind.transfer_times_s(links, nbits.tolist(), self.now_s.tolist())

    def _step(self, delay_s: np.ndarray, kind: int) -> None:
        blocked = np.isinf(delay_s) & ~self.stuck
        self.stuck_kind[blocked] = kind
        self.stuck |= blocked
        new_s = np.where(self.stuck, self.now_s, self.now_s + delay_s)
        self.spent_s[:, kind] += new_s - self.now_s
        self.now_s = new_s

    def solo_s(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(visits, seconds of solo service) of column k's shared-resource op."""
        t = self.types[k]
        if t is ServerCompute:  # EdgeServerCPU.run
            sv = self.servers[self.es]
            work = self._column("batches", k) * sv.step_overhead_s * sv.flops_per_s + np.maximum(
                self._column("flops", k), 0.0
            )
            rate: float | np.ndarray = sv.flops_per_s
            return work > 0, (work / rate if rate > 0 else np.full(len(work), _INF))
        # SharedLink.transfer: float(rate) of each client
        nbits = 8.0 * self._column("nbytes", k)
        rate = self._spec("downlink_rate_bps" if t is Download else "uplink_rate_bps")
        with np.errstate(divide="ignore", invalid="ignore"):
            return nbits > 0, np.where(rate > 0, nbits / rate, _INF)

    def bits_of(self, k: int) -> np.ndarray:
        """Column k's transfer bits (8 × bytes), per client."""
        return 8.0 * self._column("nbytes", k)

    def rates_of(self, k: int, idx: np.ndarray) -> list[float | TimeVaryingRate]:
        """The link rates (SharedLink's: ``float`` of a constant one) of column k's
        medium for the clients at ``idx``."""
        down = self.types[k] is Download
        out: list[float | TimeVaryingRate] = []
        for i in idx.tolist():
            spec = self.specs[i]
            r = spec.downlink_rate_bps if down else spec.uplink_rate_bps
            out.append(r if isinstance(r, TimeVaryingRate) else float(r))
        return out

    def max_share(self, k: int) -> np.ndarray | None:
        """Column k's clients' max shares of their medium (None: a CPU, never capped)."""
        t = self.types[k]
        if t is ServerCompute:
            return None
        return self._shares(t is Download)

    def _shares(self, down: bool) -> np.ndarray | None:
        """The clients' max shares of the downlink or uplink medium (None: all 1)."""
        return self._spec("downlink_max_share" if down else "uplink_max_share")

    def capped_media(self) -> set[_Resource]:
        """The shared media of its edge server on which one of its clients is capped
        (``max_share < 1``; :func:`.simpy_model._capped_media`)."""
        out: set[_Resource] = set()
        for down, shared in (
            (True, self.network.downlink_shared),
            (False, self.network.uplink_shared),
        ):
            shares = self._shares(down) if shared else None
            if shares is not None and len(shares) and shares.min() < 1.0:
                out.add(("downlink" if down else "uplink", self.es))
        return out


class _ColumnGroup(_Group):
    """A :class:`_Group` read from columns: its op sizes from a
    :class:`~mecsim.emulation.engine.closed_form.TracePlan` group, its links and CPUs
    from :class:`~mecsim.emulation.engine.closed_form.ClientColumns` (constant rates)."""

    def __init__(
        self,
        positions: np.ndarray,
        kinds: tuple[int, ...],
        sizes: tuple[tuple[np.ndarray, ...], ...],
        at: np.ndarray,
        clients: ClientColumns,
        es: int,
        servers: Sequence[ServerSpec],
        network: NetworkSpec,
    ) -> None:
        types = tuple(_TYPE_OF_KIND[k] for k in kinds)
        super().__init__(positions, [], [], types, es, servers, network)
        # op k's sizes for this group's clients (``at``: their rows in the plan group)
        self._sizes: list[tuple[np.ndarray, ...]] = [tuple(a[at] for a in sz) for sz in sizes]
        self._clients, self._rows_at = clients, positions

    def _column(self, attr: str, k: int) -> np.ndarray:
        assert attr in ("flops", "batches")  # transfers read their bits from _bits
        sizes = self._sizes[k]
        return sizes[0] if attr == "flops" else sizes[1]

    def _bits(self, k: int) -> np.ndarray:
        return self._sizes[k][0]

    def bits_of(self, k: int) -> np.ndarray:
        return self._bits(k)

    def _spec(self, attr: str) -> np.ndarray:
        if attr not in self._spec_cache:
            self._spec_cache[attr] = getattr(self._clients, attr)[self._rows_at]
        return self._spec_cache[attr]

    def _transfer_s(self, down: bool, k: int) -> np.ndarray:
        nbits = self._bits(k)
        rate = self._spec("downlink_rate_bps" if down else "uplink_rate_bps")
        return np.where(nbits > 0, np.where(rate > 0, nbits / rate, _INF), 0.0)

    def _shares(self, down: bool) -> np.ndarray | None:
        shares = self._clients.downlink_max_share if down else self._clients.uplink_max_share
        return None if shares is None else shares[self._rows_at]

    def solo_s(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        t = self.types[k]
        nbits = self._bits(k)
        rate = self._spec("downlink_rate_bps" if t is Download else "uplink_rate_bps")
        with np.errstate(divide="ignore", invalid="ignore"):
            return nbits > 0, np.where(rate > 0, nbits / rate, _INF)


_TYPE_OF_KIND = {_DOWN: Download, _COMP: Compute, _UP: Upload}


def media_columns(
    plan: TracePlan,
    clients: ClientColumns,
    edge_server: np.ndarray,
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
    *,
    min_group_size: float = 0.0,
) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`media_timelines` on columns: (finish_s, per-kind seconds n x 5) of a round
    of Download/Compute/Upload traces (a :class:`TracePlan`) over constant-rate links
    (``edge_server``: each client's, in the plan's order), or None where
    :func:`media_timelines` would return None. The groups are formed and ordered as
    there (by edge server and sequence of op types, in order of first appearance), so
    the arithmetic, ties included, is the same."""
    n = len(plan.ids)
    keyed: list[tuple[int, np.ndarray, PlanGroup, np.ndarray, int]] = []
    for group in plan.groups:
        where = np.arange(n) if isinstance(group.positions, slice) else group.positions
        servers_of = edge_server[where]
        for es in np.unique(servers_of).tolist():
            at = np.flatnonzero(servers_of == es)
            keyed.append((int(where[at[0]]), where[at], group, at, int(es)))
    keyed.sort(key=itemgetter(0))
    if n < min_group_size * len(keyed):
        return None
    try:
        groups: list[_Group] = [
            _ColumnGroup(pos, group.kinds, group.sizes, at, clients, es, servers, network)
            for _, pos, group, at, es in keyed
        ]
    except _Unsupported:
        return None
    return _solve_groups(groups, {}, n)


def media_timelines(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
    *,
    min_group_size: float = 0.0,
) -> tuple[ClientTimeline, ...] | None:
    """Per-client timelines of the SimPy model, one shared resource at a time, or None.

    None when a client visits a resource twice, when clients visit resources in
    conflicting orders, or when the round has anything else this path does not cover
    (an unknown op type, input the SimPy model rejects). Also None when the clients
    fall into groups (same edge server, link kinds and op types) of fewer than
    ``min_group_size`` on average: numpy's per-call cost then outweighs what it saves
    (:func:`mecsim.emulation.engine.time_round` asks for :data:`WORTHWHILE_GROUP_SIZE`).
    """
    ids = list(traces)
    # (edge server, downlink a schedule, uplink a schedule, op types) -> positions
    keyed: dict[tuple[int, bool, bool, tuple[type, ...]], list[int]] = {}
    for pos, cid in enumerate(ids):
        spec = clients[cid]
        if spec.client_id != cid:
            raise ValueError(f"clients[{cid}] has client_id {spec.client_id}")
        down_sched = isinstance(spec.downlink_rate_bps, TimeVaryingRate)
        up_sched = isinstance(spec.uplink_rate_bps, TimeVaryingRate)
        types = tuple(map(type, traces[cid]))
        keyed.setdefault((spec.edge_server, down_sched, up_sched, types), []).append(pos)
    if len(ids) < min_group_size * len(keyed):
        return None
    varying: set[_Resource] = set(varying_media(traces, clients, network))
    try:
        groups = [
            _Group(
                positions,
                [traces[ids[p]] for p in positions],
                [clients[ids[p]] for p in positions],
                key[3],
                key[0],
                servers,
                network,
            )
            for key, positions in keyed.items()
        ]
        backhaul_s = _backhaul_delays(groups, servers)
    except _Unsupported:
        return None
    solved = _solve_groups(groups, backhaul_s, len(ids), varying)
    if solved is None:
        return None
    finish_s, spent_s = solved
    return _timelines(ids, finish_s, spent_s, network.deadline_s)


def _solve_groups(
    groups: list[_Group],
    backhaul_s: dict[_Resource, float],
    n: int,
    varying: set[_Resource] | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(finish_s, per-kind seconds) of the groups' clients, or None when they visit the
    shared resources in conflicting orders or a medium of ``varying`` (on which a flow's
    rate changes in the round) has a capped flow (the SimPy model says it is not
    built)."""
    order = _resource_order(groups)
    if order is None:
        return None

    capped: set[_Resource] = set()
    for g in groups:
        capped |= g.capped_media()
    varying = varying or set()
    if capped & varying:
        return None
    for res in order:
        visiting = [(g, g.visits.index(res)) for g in groups if res in g.visits]
        for g, k in visiting:
            g.advance(k)
        if res[0] == "backhaul":
            _barrier(visiting, backhaul_s[res])
        else:
            _serve(visiting, res in capped, res in varying)
    for g in groups:
        g.advance(len(g.types))

    finish_s, spent_s = np.zeros(n), np.zeros((n, 5))
    for g in groups:
        g.now_s[g.stuck] = _INF
        g.spent_s[g.stuck, g.stuck_kind[g.stuck]] = _INF
        finish_s[g.positions], spent_s[g.positions] = g.now_s, g.spent_s
    return finish_s, spent_s


def _resource_order(groups: list[_Group]) -> list[_Resource] | None:
    """The shared resources in an order every client visits them in, or None."""
    succ: dict[_Resource, list[_Resource]] = {}
    indeg: dict[_Resource, int] = {}
    for g in groups:
        seq = [r for r in g.visits if r is not None]
        for r in seq:
            succ.setdefault(r, [])
            indeg.setdefault(r, 0)
        for a, b in zip(seq, seq[1:], strict=False):
            succ[a].append(b)
            indeg[b] += 1
    ready = [r for r, d in indeg.items() if d == 0]
    order = []
    while ready:
        r = ready.pop(0)
        order.append(r)
        for b in succ[r]:
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    return order if len(order) == len(indeg) else None


def _serve(visiting: list[tuple[_Group, int]], capped: bool, varying: bool = False) -> None:
    """One processor-sharing resource: every visiting client's departure (water-filling on
    a ``capped`` medium: one of its clients has ``max_share < 1``; re-rated where a flow's
    rate changes on a ``varying`` one: :func:`.sharing.varying_processor_sharing`)."""
    parts = []
    for g, k in visiting:
        if varying:  # the bits (its links' rates are read in order below)
            solo = g.bits_of(k)
            visits = solo > 0
        else:
            visits, solo = g.solo_s(k)
        idx = np.flatnonzero(visits & ~g.stuck)
        shares = g.max_share(k) if capped else None
        parts.append((g, k, idx, g.now_s[idx], solo[idx], None if shares is None else shares[idx]))
    arrive = np.concatenate([p[3] for p in parts])
    solo = np.concatenate([p[4] for p in parts])
    order = np.argsort(arrive, kind="stable")
    depart = np.empty(len(arrive))
    if varying:
        bits = solo  # the parts' bits
        rates = [r for g, k, idx, *_ in parts for r in g.rates_of(k, idx)]
        arrive_o = arrive[order].tolist()
        depart[order] = varying_processor_sharing(
            arrive_o,
            bits[order].tolist(),
            [
                r.segments(a) if isinstance(r, TimeVaryingRate) else constant_segments(r)
                for r, a in zip((rates[i] for i in order.tolist()), arrive_o, strict=True)
            ],
        )
    elif capped:
        share = np.concatenate([np.ones(len(p[2])) if p[5] is None else p[5] for p in parts])
        depart[order] = capped_processor_sharing(
            arrive[order].tolist(), solo[order].tolist(), share[order].tolist()
        )
    else:
        depart[order] = processor_sharing(arrive[order].tolist(), solo[order].tolist())
    at = 0
    for g, k, idx, arr, _, _ in parts:
        dep = depart[at : at + len(idx)]
        at += len(idx)
        kind = _KIND[g.types[k]]
        never = np.isinf(dep)
        g.stuck[idx[never]] = True
        g.stuck_kind[idx[never]] = kind
        done = idx[~never]
        g.spent_s[done, kind] += dep[~never] - arr[~never]
        g.now_s[done] = dep[~never]
        g.col = k + 1


def _barrier(visiting: list[tuple[_Group, int]], delay_s: float) -> None:
    """One backhaul transfer: it starts when the last of its clients arrives."""
    if any(g.stuck.any() for g, _ in visiting):  # one never arrives: none goes on
        for g, k in visiting:
            free = ~g.stuck
            g.stuck_kind[free] = _BACKHAUL
            g.stuck[:] = True
            g.col = k + 1
        return
    start_s = max(float(g.now_s.max()) for g, _ in visiting)
    end_s = start_s + delay_s
    for g, k in visiting:
        g.spent_s[:, _BACKHAUL] += end_s - start_s
        g.now_s[:] = end_s
        g.col = k + 1


def _backhaul_delays(groups: list[_Group], servers: Sequence[ServerSpec]) -> dict[_Resource, float]:
    """Each backhaul transfer's duration; its clients must all carry the same op."""
    ops: dict[_Resource, Op] = {}
    for g in groups:
        for k, res in enumerate(g.visits):
            if res is None or res[0] != "backhaul":
                continue
            for row in g.rows:
                if ops.setdefault(res, row[k]) != row[k]:
                    raise _Unsupported  # the SimPy model reports the differing ops
    out = {}
    for res, op in cast("dict[_Resource, Backhaul]", ops).items():  # backhaul columns
        spec = servers[res[1]]
        bw = spec.backhaul_bps
        out[res] = spec.backhaul_latency_s + (8.0 * op.nbytes / bw if op.nbytes > 0 else 0.0)
    return out
