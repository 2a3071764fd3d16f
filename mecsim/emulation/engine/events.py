"""The engine's event-driven path: the SimPy model's round, solved without SimPy.

Between two events of a round (an arrival at, or a departure from, a shared medium or an
edge-server CPU; a backhaul transfer starting or ending) every active job's service rate
is constant: with ``n`` jobs on a processor-sharing resource each progresses at its own
rate / n (:class:`.simpy_model.ProcessorSharing`). So the round is solved exactly by
jumping from event to event: the next departure of a resource is where its virtual time
``v`` (dv/dt = 1/n) reaches the smallest finish tag ``v_arrival + work / rate``, i.e.
``(tag - v) * n`` seconds on. A medium on which a flow is capped below its link rate
(``ClientSpec.*_max_share < 1``) shares its time by water-filling instead
(:class:`.sharing.CappedSharing`, as the SimPy model does). Everything a client does on
its own (dedicated links, constant or :class:`~mecsim.emulation.engine.RateSchedule`
rates, its device CPU) needs no event: its end is computed directly, and only the next
arrival at a shared resource is queued.

This is the same model as the SimPy processes of :func:`.simpy_model._simulate`, with
the same floating-point operations in the same order (virtual-time update
``v += (now - last) / n``, timer ``now + max(0, (tag - v) * n)``, ``v = max(v, tag)``,
clock ``now + delay``, per-kind time ``+= now - t0``), so its timelines equal the SimPy
model's (``tests/unit/emulation/test_engine_events.py`` checks thousands of random rounds), and runs
recorded with either replay identically. What it leaves out is SimPy's machinery: one
generator, several event objects and callbacks per op and a stale timer per arrival.

Nothing here is approximate; anything it does not recognise (an op type it does not
know, an input the SimPy model rejects) makes :func:`event_timelines` return ``None``
and the caller runs the SimPy model instead, which also reports the errors.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

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
from mecsim.emulation.ops import Backhaul, Compute, Download, OpTrace, ServerCompute, Upload

_INF = math.inf

# Kinds of op: the column of each in a client's per-kind time list.
_DOWN, _COMP, _UP, _SERVER, _BACKHAUL = 0, 1, 2, 3, 4
# Op codes of the compiled traces: (code, kind, x, y)
_FIXED = 0  # x = delay_s (> 0, maybe inf), y unused: the client's own link or CPU
_SCHEDULE = (
    1  # x = nbits (> 0), y = TimeVaryingRate: a dedicated link with a rate trace or a moving client
)
_SHARED = 2  # x = resource index, y = work / rate (s of solo service, maybe inf)
_BARRIER = 3  # x = barrier index (edge server, k-th Backhaul op), y unused
_CAPPED = 4  # x = resource index, y = (s of solo service, max share): a capped medium
# x = resource index, y = (nbits, Rate): a medium on which a flow's rate changes in the round
_VARYING = 5
# What a queued event does: a client goes on, or a backhaul transfer ends
_RESUME, _RELEASE = 0, 1

_Op = tuple[
    int,
    int,
    float | int,
    float | TimeVaryingRate | tuple[float, float] | tuple[float, Rate] | None,
]
# _compile's answer: per-client programs, the number of processor-sharing resources, the
# clients expected at each backhaul barrier, each barrier's transfer seconds, and the
# resources that are media with capped flows (water-filling, not processor sharing), and
# those on which a flow's rate changes during the round (re-rated processor sharing)
_Compiled = tuple[list[list[_Op]], int, list[int], list[float], set[int], set[int]]


class _Unsupported(Exception):
    """An input the event-driven path leaves to the SimPy model."""


def _compile(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
) -> _Compiled:
    """Per-client op lists, the processor-sharing resources and the backhaul barriers.

    Ops that take no time in the SimPy model (no bytes, no work) are left out: they add
    ``now - now = 0.0`` to a per-kind total and change nothing else.
    """
    resources: dict[tuple[str, int], int] = {}  # (medium or "cpu", edge server) -> index
    barrier_index: dict[tuple[int, int], int] = {}
    barrier_ops: list[Backhaul] = []
    barrier_server: list[int] = []
    programs: list[list[_Op]] = []
    up_shared, down_shared = network.uplink_shared, network.downlink_shared
    capped_keys: set[tuple[str, int]] = set()  # media on which a flow is capped
    shares: list[tuple[float, float]] = []  # per client: (downlink, uplink) max share
    spec: ClientSpec | ServerSpec
    # Typed by hand where the checks that decide the type are beyond mypy (and casts
    # would cost a call per client or op): a client's rates (Rate: a shared medium's is a
    # float, a TimeVaryingRate there raises _Unsupported), and an op, dispatched on through
    # ``kind = type(op)`` (each branch reads the fields of the type it tests).
    down: Any
    up: Any
    op: Any

    def resource(key: tuple[str, int]) -> int:
        if key not in resources:
            resources[key] = len(resources)
        return resources[key]

    # the media on which a flow's rate changes during the round (varying_media)
    varying_keys = varying_media(traces, clients, network) if up_shared or down_shared else set()

    for cid, trace in traces.items():
        spec = clients[cid]
        if spec.client_id != cid:
            raise ValueError(f"clients[{cid}] has client_id {spec.client_id}")
        es = spec.edge_server
        down, up = spec.downlink_rate_bps, spec.uplink_rate_bps
        down_varies = ("downlink", es) in varying_keys
        up_varies = ("uplink", es) in varying_keys
        # SharedLink keeps float(rate), or a TimeVaryingRate on a varying medium
        down_f = (down if down_varies else float(down)) if down_shared else 0.0
        up_f = (up if up_varies else float(up)) if up_shared else 0.0
        down_u = spec.downlink_max_share if down_shared else 1.0
        up_u = spec.uplink_max_share if up_shared else 1.0
        shares.append((down_u, up_u))
        if down_u < 1.0:
            capped_keys.add(("downlink", es))
        if up_u < 1.0:
            capped_keys.add(("uplink", es))
        overhead_s, flops_per_s = spec.step_overhead_s, spec.flops_per_s
        prog: list[_Op] = []
        k_backhaul = 0
        for op in trace:
            kind = type(op)
            if kind is Download or kind is Upload:
                nbits = 8 * op.nbytes
                if not nbits > 0:
                    continue
                is_down = kind is Download
                col = _DOWN if is_down else _UP
                if down_shared if is_down else up_shared:  # SharedLink.transfer
                    rate = down_f if is_down else up_f
                    r = resource(("downlink" if is_down else "uplink", es))
                    if down_varies if is_down else up_varies:
                        prog.append((_VARYING, col, r, (nbits, rate)))
                    else:
                        prog.append((_SHARED, col, r, nbits / rate if rate > 0 else _INF))
                    continue
                rate_bps = down if is_down else up  # DedicatedLink.transfer
                if isinstance(rate_bps, TimeVaryingRate):
                    prog.append((_SCHEDULE, col, nbits, rate_bps))
                    continue
                delay_s = nbits / rate_bps if rate_bps > 0 else _INF
                if delay_s != delay_s:
                    raise _Unsupported  # NaN: whatever SimPy makes of it
                prog.append((_FIXED, col, delay_s, None))
            elif kind is Compute:  # Device.run
                flops = op.flops
                flop_s = flops / flops_per_s if flops_per_s > 0 else _INF
                delay_s = op.batches * overhead_s + (flop_s if flops > 0 else 0.0)
                if delay_s > 0:
                    prog.append((_FIXED, _COMP, delay_s, None))
                elif delay_s != delay_s:
                    raise _Unsupported
            elif kind is ServerCompute:  # EdgeServerCPU.run
                if not 0 <= es < len(servers):
                    raise _Unsupported  # the SimPy model reports the missing server
                sv = servers[es]
                work = op.batches * sv.step_overhead_s * sv.flops_per_s + max(op.flops, 0.0)
                if work > 0:
                    rate = sv.flops_per_s
                    prog.append(
                        (_SHARED, _SERVER, resource(("cpu", es)), work / rate if rate > 0 else _INF)
                    )
                elif work != work:
                    raise _Unsupported
            elif kind is Backhaul:  # EdgeBackhaul.transfer: one transfer per (server, k)
                key = (es, k_backhaul)
                if key not in barrier_index:
                    if not 0 <= es < len(servers):
                        raise _Unsupported
                    barrier_index[key] = len(barrier_ops)
                    barrier_ops.append(op)
                    barrier_server.append(es)
                elif barrier_ops[barrier_index[key]] != op:
                    raise _Unsupported  # the SimPy model reports the differing ops
                prog.append((_BARRIER, _BACKHAUL, barrier_index[key], None))
                k_backhaul += 1
            else:
                raise _Unsupported  # an op type this path does not know
        programs.append(prog)

    expected = [0] * len(barrier_ops)
    for prog in programs:
        for code, _, x, _ in prog:
            if code == _BARRIER:
                expected[cast(int, x)] += 1  # x: a barrier index
    delays = []
    for op, es in zip(barrier_ops, barrier_server, strict=True):
        spec = servers[es]
        bw = spec.backhaul_bps
        delays.append(spec.backhaul_latency_s + (8.0 * op.nbytes / bw if op.nbytes > 0 else 0.0))
    capped = {resources[k] for k in capped_keys if k in resources}
    varying = {resources[k] for k in varying_keys if k in resources}
    if capped & varying:
        raise _Unsupported  # the SimPy model says it is not built
    if capped:  # every transfer on such a medium carries its client's max share
        for prog, (down_u, up_u) in zip(programs, shares, strict=True):
            for p, (code, col, x, y) in enumerate(prog):
                if code == _SHARED and x in capped:
                    u = down_u if col == _DOWN else up_u
                    prog[p] = (_CAPPED, col, x, (cast(float, y), u))
    return programs, len(resources), expected, delays, capped, varying


def event_timelines(
    traces: Mapping[int, OpTrace],
    clients: Mapping[int, ClientSpec],
    servers: Sequence[ServerSpec],
    network: NetworkSpec,
) -> tuple[ClientTimeline, ...] | None:
    """Per-client timelines of the SimPy model, computed event by event without SimPy.

    Covers every op type of :mod:`mecsim.emulation.ops`, shared and dedicated links (constant or
    :class:`~mecsim.emulation.engine.RateSchedule` rates), edge-server CPUs and backhaul transfers.
    Returns None when the round has something it does not cover (the caller then runs
    the SimPy model, which also raises the errors for invalid input).
    """
    try:
        programs, n_res, expected, barrier_delay_s, capped, varying = _compile(
            traces, clients, servers, network
        )
    except _Unsupported:
        return None
    ids = list(traces)
    n = len(ids)
    spent = [[0.0, 0.0, 0.0, 0.0, 0.0] for _ in range(n)]
    pos = [0] * n
    since_s = [0.0] * n  # when the client joined its current shared resource
    current = [-1] * n  # kind of the op a client is blocked in (-1: none)
    finish: list[float | None] = [None] * n

    # processor-sharing resources (ProcessorSharing): virtual time, its last update, the
    # heap of (finish tag, seq, client), and the next departure (inf: none) with the seq
    # it was set at (equal times are served in the order they were set, as in SimPy)
    res_v = [0.0] * n_res
    res_last = [0.0] * n_res
    res_jobs: list[list[tuple[float, int, int]]] = [[] for _ in range(n_res)]
    res_timer = [_INF] * n_res
    res_seq = [0] * n_res
    # media with capped flows: their state instead of (v, last, jobs)
    res_capped: list[CappedSharing[int] | VaryingSharing[int] | None] = [
        CappedSharing() if r in capped else VaryingSharing() if r in varying else None
        for r in range(n_res)
    ]
    # backhaul transfers (EdgeBackhaul): clients arrived, waiting, transfer start
    arrived = [0] * len(expected)
    waiting: list[list[int]] = [[] for _ in expected]
    start_s = [math.nan] * len(expected)

    queue: list[tuple[float, int, int, int]] = []  # (time_s, seq, what, index)
    push, pop = heapq.heappush, heapq.heappop
    seq = 0

    def set_timer(r: int) -> None:
        """ProcessorSharing._reschedule: the head job's departure if nothing changes."""
        nonlocal seq
        medium = res_capped[r]
        if medium is not None:  # Capped/VaryingProcessorSharing._reschedule
            res_timer[r] = medium.timer_s
            if medium.timer_s != _INF:
                seq += 1
                res_seq[r] = seq
            return
        jobs = res_jobs[r]
        if jobs and jobs[0][0] != _INF:
            d = (jobs[0][0] - res_v[r]) * len(jobs)
            res_timer[r] = res_last[r] + (d if d > 0.0 else 0.0)  # max(0.0, d)
            seq += 1
            res_seq[r] = seq
        else:
            res_timer[r] = _INF

    def run(i: int, now: float) -> None:
        """Client i goes on at ``now`` until it blocks at a shared resource or ends."""
        nonlocal seq
        prog, p, sp = programs[i], pos[i], spent[i]
        t, moved = now, False
        x: Any  # what x and y hold depends on the op code (see _Op)
        y: Any
        while p < len(prog):
            code, kind, x, y = prog[p]
            if code <= _SCHEDULE:  # its own link or CPU: the end is known now
                d = x if code == _FIXED else y.transfer_time_s(x, t)
                if d == _INF:  # an op that never ends
                    pos[i], current[i] = p, kind
                    return
                t_end = t + d
                sp[kind] += t_end - t
                t, moved = t_end, True
                p += 1
                continue
            if moved:  # reach the shared resource at t, in time order with the others
                pos[i] = p
                seq += 1
                push(queue, (t, seq, _RESUME, i))
                return
            pos[i], current[i] = p, kind
            if code == _SHARED:  # ProcessorSharing.serve
                jobs = res_jobs[x]
                if jobs:
                    res_v[x] += (t - res_last[x]) / len(jobs)
                res_last[x] = t
                seq += 1
                push(jobs, (res_v[x] + y, seq, i))
                since_s[i] = t
                set_timer(x)
            elif code == _CAPPED:  # CappedProcessorSharing.serve
                cast(CappedSharing[int], res_capped[x]).arrive(t, y[0], y[1], i)
                since_s[i] = t
                set_timer(x)
            elif code == _VARYING:  # VaryingProcessorSharing.serve
                rate = y[1]
                segments = (
                    rate.segments(t)
                    if isinstance(rate, TimeVaryingRate)
                    else constant_segments(rate)
                )
                cast(VaryingSharing[int], res_capped[x]).arrive(t, y[0], segments, i)
                since_s[i] = t
                set_timer(x)
            else:  # EdgeBackhaul.transfer
                arrived[x] += 1
                waiting[x].append(i)
                if arrived[x] == expected[x]:
                    start_s[x] = t
                    seq += 1
                    push(queue, (t + barrier_delay_s[x], seq, _RELEASE, x))
            return
        pos[i], current[i], finish[i] = p, -1, t

    def resume(released: list[int], now: float) -> None:
        """Released clients go on at ``now``, after the events already set for then."""
        nonlocal seq
        due = queue[0][0] <= now if queue else False
        if not due:
            for r in range(n_res):
                if res_timer[r] <= now:
                    due = True
                    break
        if due:
            for i in released:
                seq += 1
                push(queue, (now, seq, _RESUME, i))
        else:
            for i in released:
                run(i, now)

    for i in range(n):  # every client starts at 0 s, in order
        run(i, 0.0)
    while True:
        # the next event: a departure (ProcessorSharing._on_timer) or a queued one
        r, t_r = -1, _INF
        if n_res:
            t_r = min(res_timer)
            if t_r != _INF:
                r = res_timer.index(t_r)
                if res_timer.count(t_r) > 1:
                    r = min(
                        (k for k in range(n_res) if res_timer[k] == t_r), key=res_seq.__getitem__
                    )
        if queue and (queue[0][0] < t_r or (queue[0][0] == t_r and queue[0][1] < res_seq[r])):
            now, _, what, a = pop(queue)
            if what == _RESUME:
                run(a, now)
            else:  # the backhaul transfer is done: its clients go on
                released = waiting[a]
                for i in released:
                    pos[i] += 1
                    current[i] = -1
                    spent[i][_BACKHAUL] += now - start_s[a]
                resume(released, now)
            continue
        if r < 0:
            break
        now = t_r
        medium = res_capped[r]
        if medium is not None:  # Capped/VaryingProcessorSharing._on_timer
            released = medium.on_timer(now)
            for i in released:
                pos[i] += 1
                spent[i][current[i]] += now - since_s[i]
                current[i] = -1
            res_timer[r] = _INF
            resume(released, now)
            set_timer(r)
            continue
        jobs = res_jobs[r]
        v = res_v[r] + (now - res_last[r]) / len(jobs)
        res_last[r] = now
        if jobs[0][0] > v:  # v = max(v, head)
            v = jobs[0][0]
        released = []
        while jobs and jobs[0][0] <= v:
            i = pop(jobs)[2]
            pos[i] += 1
            spent[i][current[i]] += now - since_s[i]
            current[i] = -1
            released.append(i)
        res_v[r] = v
        res_timer[r] = _INF  # fired; SimPy sets the next one after the releases
        resume(released, now)
        set_timer(r)

    deadline_s = network.deadline_s
    out = []
    for i, cid in enumerate(ids):
        sp, fin = spent[i], finish[i]
        if fin is None:  # stuck in an op that never ends (_Client.timeline)
            sp[current[i] if current[i] >= 0 else _COMP] = fin = _INF
        out.append(
            ClientTimeline(
                cid, 0.0, fin, sp[0], sp[1], sp[2], sp[3], _made_it(fin, deadline_s), sp[4]
            )
        )
    return tuple(out)
