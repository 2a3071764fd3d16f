"""A shared medium whose flows are capped: max-min fair shares of its time (water-filling).

On a shared medium (:class:`.simpy_model.ProcessorSharing`) every flow in progress gets
an equal share of the medium's time, ``1/n``, and moves at its own link rate ``r_i``
for that share: ``r_i / n``. A flow may also be capped below its link rate, by the
Mathis et al. bound ``c_i`` of a lossy TCP flow (:mod:`mecsim.channel.transport`): on
its own it moves at its goodput ``g_i = min(r_i, c_i)`` and so needs only the fraction
``u_i = g_i / r_i`` of the medium's time (its ``max_share``; 1 when the cap does not
bind). Sharing the medium's time max-min fairly among flows that need at most ``u_i``
each is water-filling:

    φ_i = min(u_i, λ),   λ such that Σ_i min(u_i, λ) = 1   (λ = ∞ when Σ_i u_i <= 1)

(the surplus a capped flow leaves goes to the others, in equal parts), and flow ``i``
moves at ``φ_i · r_i = min(c_i, λ · r_i)`` bit/s. In units of its solo time (the
seconds ``bits / g_i`` it would take alone) it progresses at

    p_i = φ_i / u_i = min(1, λ / u_i)

solo-seconds per second. With no flow capped (every ``u_i = 1``) this is ``λ = 1/n``,
``p_i = 1/n``: processor sharing, which the engine keeps solving with its virtual time
(a medium with no capped flow is never solved here). When the flows' link rates are
equal, ``r_i = r``, the shares are the max-min fair rates of a link of capacity ``r``
with per-flow caps ``c_i``: each flow gets ``min(c_i, its fair share)``.

Rates change only when a flow arrives or leaves; between two such events every flow's
progress rate is constant, so the medium is solved exactly from event to event
(:class:`CappedSharing`). The SimPy model and the engine's fast paths all use this class,
so they agree float for float; ``tests/unit/emulation/test_engine_capped.py`` checks it against a
water-filling simulation of its own, in bits.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Generic, TypeVar

_INF = math.inf
_Job = TypeVar("_Job")


def progress_rates(max_share: Sequence[float]) -> list[float]:
    """Each flow's progress rate ``p_i = min(1, λ / u_i)`` (solo-seconds per second) for
    flows needing at most the fractions ``max_share`` (``u_i`` in [0, 1]) of the medium.

    Water-filling: the flows in order of ``u_i``; a flow whose ``u_i`` fits under the
    equal share of what is left (``u_i · k <= left`` with ``k`` flows not yet placed)
    takes its ``u_i`` and runs at its goodput (``p_i = 1``); the first that does not fit
    sets the level ``λ = left / k`` for it and every flow after it.
    """
    n = len(max_share)
    rates = [1.0] * n
    left, k = 1.0, n
    order = sorted(range(n), key=max_share.__getitem__)
    for j, i in enumerate(order):
        u = max_share[i]
        if u * k <= left:  # capped under the level: its own share
            left -= u
            k -= 1
            continue
        level = left / k
        for i2 in order[j:]:
            rates[i2] = level / max_share[i2]
        break
    return rates


class CappedSharing(Generic[_Job]):
    """One shared medium with capped flows, solved from event to event.

    Each active job has its solo seconds left ``w_i`` (inf for a link of rate 0: it never
    finishes, but keeps its share), its ``max_share`` ``u_i`` and its progress rate
    ``p_i`` (:func:`progress_rates` of the active jobs). An arrival or a departure at
    ``now`` advances every job's ``w_i -= p_i · (now - last)`` and re-computes the rates;
    the next departure is at ``last + max(0, min_i w_i / p_i)`` (:attr:`timer_s`), where
    every job whose ``w_i / p_i`` is that minimum leaves.
    """

    def __init__(self) -> None:
        self.last_s = 0.0
        self.left_s: list[float] = []  # solo seconds left, per active job
        self.max_share: list[float] = []
        self.rate: list[float] = []  # progress rates (solo seconds per second)
        self.jobs: list[_Job] = []
        self.timer_s = _INF  # the next departure's time (inf: none): last_s + wait_s
        self.wait_s = _INF  # max(0, min_i w_i / p_i)
        self._due_s = _INF  # min_i w_i / p_i

    def __len__(self) -> int:
        return len(self.jobs)

    def _advance(self, now_s: float) -> None:
        dt = now_s - self.last_s
        if dt > 0.0 and self.jobs:
            self.left_s = [w - p * dt for w, p in zip(self.left_s, self.rate, strict=True)]
        self.last_s = now_s

    def _reschedule(self) -> None:
        self.rate = progress_rates(self.max_share)
        due = min(
            (w / p for w, p in zip(self.left_s, self.rate, strict=True)),
            default=_INF,
        )
        self._due_s = due
        self.wait_s = due if due > 0.0 else 0.0
        self.timer_s = _INF if due == _INF else self.last_s + self.wait_s

    def arrive(self, now_s: float, solo_s: float, max_share: float, job: _Job) -> None:
        """A job needing ``solo_s`` seconds alone (inf: never done) and at most
        ``max_share`` of the medium's time (clipped to [0, 1]; NaN: 1) joins at ``now_s``."""
        self._advance(now_s)
        self.left_s.append(solo_s)
        self.max_share.append(1.0 if not max_share < 1.0 else max_share if max_share > 0.0 else 0.0)
        self.jobs.append(job)
        self._reschedule()

    def on_timer(self, now_s: float) -> list[_Job]:
        """The jobs leaving at :attr:`timer_s` (``now_s``), in order of arrival; the
        others advance to ``now_s``."""
        due = self._due_s
        done = [w / p <= due for w, p in zip(self.left_s, self.rate, strict=True)]
        self._advance(now_s)
        leaving = [j for j, d in zip(self.jobs, done, strict=True) if d]
        keep = [k for k, d in enumerate(done) if not d]
        self.left_s = [self.left_s[k] for k in keep]
        self.max_share = [self.max_share[k] for k in keep]
        self.jobs = [self.jobs[k] for k in keep]
        self._reschedule()
        return leaving


def capped_processor_sharing(
    arrive_s: Sequence[float], solo_s: Sequence[float], max_share: Sequence[float]
) -> list[float]:
    """Departure times (inf: never) of jobs on one medium with capped flows
    (:class:`CappedSharing`): job k arrives at ``arrive_s[k]`` (ascending; equal times in
    arrival order) needing ``solo_s[k]`` seconds alone and at most ``max_share[k]`` of the
    medium's time. As :func:`.media.processor_sharing`, an arrival at the very time of a
    departure is served first."""
    medium: CappedSharing[int] = CappedSharing()
    return _departures(
        medium, arrive_s, lambda k: medium.arrive(arrive_s[k], solo_s[k], max_share[k], k)
    )


def _departures(
    medium: CappedSharing[int] | VaryingSharing[int],
    arrive_s: Sequence[float],
    arrive: Callable[[int], None],
) -> list[float]:
    """Job k's departure time (inf: never) on ``medium``, job k joining it at
    ``arrive_s[k]`` (ascending) through ``arrive(k)``; an arrival at the very time of the
    medium's next event is served first."""
    m = len(arrive_s)
    depart_s = [_INF] * m
    k = 0
    while True:
        a = arrive_s[k] if k < m else _INF
        if a <= medium.timer_s:
            if a == _INF:
                return depart_s
            arrive(k)
            k += 1
        else:
            t = medium.timer_s
            for j in medium.on_timer(t):
                depart_s[j] = t


#: a flow's link rate from some time on: (rate in b/s, the time it holds until) pairs,
#: in order; the last pair's time is inf (:meth:`.specs.TimeVaryingRate.segments`)
Segments = Iterator[tuple[float, float]]


class VaryingSharing(Generic[_Job]):
    """One shared medium processor-shared among flows whose link rates change at known
    times, solved from event to event.

    With ``n`` flows on the medium each moves at its own link rate / n, as on a medium of
    constant rates (:class:`.simpy_model.ProcessorSharing`), but a flow's link rate is
    piecewise constant: ``r_i`` until ``e_i``, then its next segment's (the
    :class:`~.specs.TimeVaryingRate`'s :meth:`~.specs.TimeVaryingRate.segments` from the
    flow's arrival; a constant rate is one segment). Between two events (an arrival, a
    departure, a flow's rate changing) every flow's rate is constant, so the medium keeps
    processor sharing's virtual time ``v`` (dv/dt = 1/n) and each flow's finish tag
    ``v + b_i / r_i`` (``b_i`` its bits left) in a heap: the next departure is at
    ``(min tag - v) · n`` seconds on, as there. Where a flow's rate changes from ``r`` to
    ``r'`` its bits left ``(tag - v) · r`` get the tag ``v + (tag - v) · r / r'`` (kept
    when ``r' = r``). The next event is at ``last + min(max(0, (min tag - v) · n),
    min_i e_i - last)`` (:attr:`timer_s`). A flow at rate 0 keeps its share (and its bits
    left) until its rate is above 0 again; for ever, it never leaves, as on a medium of
    constant rates. Each departure costs O(log n); a rate change, O(log n) for each flow
    whose rate changes (at a moving client's grid time, every flow's).
    """

    def __init__(self) -> None:
        self.last_s = 0.0
        self._v = 0.0  # virtual time: seconds of service alone
        self._n = 0  # flows on the medium
        self._tags: list[tuple[float, int, int]] = []  # (finish tag, seq, version): a heap
        self._changes: list[tuple[float, int, int]] = []  # (until, seq, version): a heap
        # per flow, by seq: [tag, rate, left bits (at rate 0), until, version, segments, job]
        self._flows: dict[int, list[Any]] = {}
        self._seq = 0
        self.timer_s = _INF  # the next event's time (inf: none): last_s + wait_s
        self.wait_s = _INF
        self._departs = self._changes_due = False  # what the timer is (both: at once)
        self._change_s = _INF

    def __len__(self) -> int:
        return self._n

    def _advance(self, now_s: float) -> None:
        if self._n:
            self._v += (now_s - self.last_s) / self._n
        self.last_s = now_s

    def _head(self, heap: list[tuple[float, int, int]]) -> float:
        """The heap's smallest live key (stale entries dropped), inf if none."""
        flows = self._flows
        while heap:
            key, seq, version = heap[0]
            flow = flows.get(seq)
            if flow is not None and flow[4] == version:
                return key
            heapq.heappop(heap)
        return _INF

    def _reschedule(self) -> None:
        head = self._head(self._tags)
        self._change_s = change = self._head(self._changes)
        if head == _INF:
            depart = _INF
        else:
            d = (head - self._v) * self._n
            depart = d if d > 0.0 else 0.0
        to_change = change - self.last_s
        self._departs = depart <= to_change
        self._changes_due = to_change <= depart
        self.wait_s = depart if self._departs else to_change
        self.timer_s = _INF if self.wait_s == _INF else self.last_s + self.wait_s

    def _set(self, seq: int, flow: list[Any], rate: float, until: float, left: float) -> None:
        """Flow ``seq`` at ``rate`` until ``until`` with ``left`` bits to go (from now)."""
        flow[4] += 1
        version = flow[4]
        flow[1], flow[3] = rate, until
        if rate > 0.0:
            flow[0] = tag = self._v + left / rate
            heapq.heappush(self._tags, (tag, seq, version))
        else:
            flow[0], flow[2] = _INF, left
        if until != _INF:
            heapq.heappush(self._changes, (until, seq, version))

    def arrive(self, now_s: float, nbits: float, segments: Segments, job: _Job) -> None:
        """A flow of ``nbits`` (> 0) joins at ``now_s``, its link rate ``segments`` from
        ``now_s`` on."""
        self._advance(now_s)
        rate, until = next(segments)
        while until <= now_s:  # a segment over by now (a rate change at this very time)
            rate, until = next(segments)
        self._seq += 1
        flow = [_INF, 0.0, 0.0, _INF, 0, segments, job]
        self._flows[self._seq] = flow
        self._n += 1
        self._set(self._seq, flow, rate, until, nbits)
        self._reschedule()

    def on_timer(self, now_s: float) -> list[_Job]:
        """At :attr:`timer_s` (``now_s``): the flows leaving then, in order of arrival; the
        others take their next rates where theirs end (at the rate change the timer was
        set for, even where ``last + (until - last)`` rounds an ulp below ``until``)."""
        departs, change = self._departs, self._change_s
        change = max(now_s, change) if self._changes_due else now_s
        self._advance(now_s)
        flows, tags = self._flows, self._tags
        leaving: list[tuple[int, _Job]] = []
        if departs:
            head = self._head(tags)
            if head > self._v:  # v = max(v, head)
                self._v = head
            while tags and self._head(tags) <= self._v:
                _, seq, _ = heapq.heappop(tags)
                leaving.append((seq, flows.pop(seq)[6]))
            self._n -= len(leaving)
        changes = self._changes
        while self._head(changes) <= change:
            _, seq, _ = heapq.heappop(changes)
            flow = flows[seq]
            rate, tag = flow[1], flow[0]
            left = (tag - self._v) * rate if rate > 0.0 else flow[2]
            new, until = next(flow[5])
            while until <= change:
                new, until = next(flow[5])
            if new == rate:  # the same rate: the same tag (or bits left, at rate 0)
                flow[3] = until
                if until != _INF:
                    heapq.heappush(changes, (until, seq, flow[4]))
            else:
                self._set(seq, flow, new, until, left)
        self._reschedule()
        leaving.sort(key=itemgetter(0))  # in order of arrival
        return [job for _, job in leaving]


def varying_processor_sharing(
    arrive_s: Sequence[float], nbits: Sequence[float], segments: Sequence[Segments]
) -> list[float]:
    """Departure times (inf: never) of flows on one medium whose link rates change at
    known times (:class:`VaryingSharing`): flow k arrives at ``arrive_s[k]`` (ascending;
    equal times in arrival order) with ``nbits[k]`` bits, its rate ``segments[k]`` from
    its arrival. As :func:`.media.processor_sharing`, an arrival at the very time of an
    event is served first."""
    medium: VaryingSharing[int] = VaryingSharing()
    return _departures(
        medium, arrive_s, lambda k: medium.arrive(arrive_s[k], nbits[k], segments[k], k)
    )
