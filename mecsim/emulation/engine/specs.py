"""What the engine times, and what it answers: the specs of a round's clients, edge
servers and network, and the timelines and critical-path breakdown it returns.

Units: seconds (``_s``), bits per second (``_bps``), FLOPs and FLOP/s (``flops_per_s``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mecsim.channel.tcp import TcpFlow


class TimeVaryingRate:
    """A dedicated link whose rate changes during the round: what the engines accept in
    place of a constant rate (b/s). On a dedicated link they ask only how long a
    transfer takes, :meth:`transfer_time_s`; on a shared medium, the link's rate piece
    by piece, :meth:`segments` (processor sharing re-rated where a flow's rate changes:
    :class:`.sharing.VaryingSharing`).

    :class:`RateSchedule` (a rate trace) and
    :class:`~mecsim.emulation.moving_rate.MovingRate` (a client that moves) are the two."""

    __slots__ = ()

    def transfer_time_s(self, nbits: float, start_s: float) -> float:
        """Seconds to move ``nbits`` bits starting at ``start_s`` (emulated seconds
        since the round started); inf if never done."""
        raise NotImplementedError

    @classmethod
    def transfer_times_s(
        cls,
        rates: Sequence[TimeVaryingRate],
        nbits: Sequence[float],
        starts_s: Sequence[float],
    ) -> np.ndarray:
        """:meth:`transfer_time_s` of many links (0.0 for ``nbits <= 0``), one by one; a
        subclass may time them at once (the same numbers)."""
        return np.array(
            [
                r.transfer_time_s(b, t) if b > 0 else 0.0
                for r, b, t in zip(rates, nbits, starts_s, strict=True)
            ],
            dtype=float,
        )

    def batch_link(self) -> tuple[Any, int] | None:
        """``(links, j)`` when this link can be timed together with the other links of
        ``links`` (``links.transfer_times_s(j, nbits, start_s)``, numpy over links: the
        closed form does), else None (one by one)."""
        return None

    def segments(self, start_s: float) -> Iterator[tuple[float, float]]:
        """The link's rate from ``start_s`` (s since the round started) on, as
        ``(rate_bps, until_s)`` pairs in order, each rate holding until its ``until_s``
        (the last: inf); what a shared medium re-rates its flows by."""
        raise NotImplementedError

    def with_outages(self, cuts: list[tuple[float, float]]) -> TimeVaryingRate:
        """The same link at 0 b/s during each interval [a, b) of ``cuts`` (s since the
        round started, sorted): :func:`mecsim.emulation.faults.with_outages`."""
        raise NotImplementedError


@dataclass(frozen=True)
class RateSchedule(TimeVaryingRate):
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

    def segments(self, start_s: float) -> Iterator[tuple[float, float]]:
        """Its pieces from ``start_s`` on: ``(rates_bps[k], times_s[k + 1])``, the last
        until inf."""
        first = max(bisect_right(self.times_s, start_s) - 1, 0)
        ends = (*self.times_s[first + 1 :], math.inf)
        return zip(self.rates_bps[first:], ends, strict=True)


def constant_segments(rate_bps: float) -> Iterator[tuple[float, float]]:
    """A constant rate as :meth:`TimeVaryingRate.segments`: one piece, for ever."""
    return iter(((rate_bps, math.inf),))


Rate = float | TimeVaryingRate  # bits per second


@dataclass(frozen=True)
class ClientSpec:
    """A client's links and device CPU (``t = batches*step_overhead_s + flops/flops_per_s``).

    A transfer of ``nbits`` takes ``nbits / rate + latency`` on its link (the rate is the
    goodput; the latency, one-way, is added to every transfer after its last bit is sent).
    A link with a ``*_tcp`` flow adds :meth:`TcpFlow.extra_s` of the transfer's bytes to
    that (slow start, set-up, loss recovery: :mod:`mecsim.channel.tcp`); None: nothing.

    ``*_max_share`` matter on a shared medium only: the largest fraction of the medium's
    time the client's flow can use, its goodput over its link's rate (``c / r`` when a
    Mathis cap ``c`` binds below the link rate ``r``; 1.0 when nothing caps the flow).
    A medium with a flow below 1.0 shares its time max-min fairly (water-filling,
    :mod:`.sharing`); one without is processor-shared, each flow at ``rate / n``.
    """

    client_id: int
    uplink_rate_bps: Rate
    downlink_rate_bps: Rate
    step_overhead_s: float
    flops_per_s: float
    edge_server: int = 0
    uplink_latency_s: float = 0.0
    downlink_latency_s: float = 0.0
    uplink_max_share: float = 1.0
    downlink_max_share: float = 1.0
    uplink_tcp: TcpFlow | None = None
    downlink_tcp: TcpFlow | None = None

    def adds_time(self) -> bool:
        """Does a transfer of this client take more than its bits at the rate (a latency,
        or a TCP flow whose window or losses can hold it)? The media and event paths
        time only links that do not."""
        return bool(
            self.uplink_latency_s
            or self.downlink_latency_s
            or (self.uplink_tcp is not None and self.uplink_tcp.adds_time)
            or (self.downlink_tcp is not None and self.downlink_tcp.adds_time)
        )


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


@dataclass(frozen=True, eq=False)
class RoundColumns:
    """A round's timing as columns: what :func:`~mecsim.emulation.engine.time_round_columns`
    returns instead of a :class:`RoundTiming` (the same numbers, without an object per
    client). Per client, in the round's order: ``finish_s``, ``spent_s`` (n x 3: download,
    compute, upload seconds; n x 5 with server compute and backhaul) and ``completed``;
    ``summary`` is the round's RoundTiming without its client timelines."""

    ids: tuple[int, ...]
    finish_s: np.ndarray
    spent_s: np.ndarray
    completed: np.ndarray
    summary: RoundTiming  # clients=(): the breakdown, critical client and dropped ids

    def timing(self) -> RoundTiming:
        """The same round as a :class:`RoundTiming` (a ClientTimeline per client)."""
        return dataclasses.replace(
            self.summary,
            clients=_timelines(list(self.ids), self.finish_s, self.spent_s, None, self.completed),
        )


def _timelines(
    ids: list[int],
    finish_s: np.ndarray,
    spent_s: np.ndarray,
    deadline_s: float | None,
    completed: np.ndarray | None = None,
) -> tuple[ClientTimeline, ...]:
    """Each client's ClientTimeline from its finish time and per-kind seconds (n x 3:
    download, compute, upload; or n x 5 with server and backhaul); ``completed`` as
    :func:`_made_it` says, computed for all clients at once (or as given)."""
    if completed is not None:
        made_it = completed
    else:
        made_it = np.isfinite(finish_s)
        if deadline_s is not None:
            made_it &= finish_s <= deadline_s
    cols = spent_s.T.tolist()
    zeros = itertools.repeat(0.0)
    server, backhaul = (cols[3], cols[4]) if len(cols) == 5 else (zeros, zeros)
    return tuple(
        map(
            ClientTimeline,
            ids,
            itertools.repeat(0.0),
            finish_s.tolist(),
            cols[0],
            cols[1],
            cols[2],
            server,
            made_it.tolist(),
            backhaul,
        )
    )


def _made_it(finish_s: float, deadline_s: float | None) -> bool:
    """A client completes when it finishes at all (an op that never ends, e.g. a link of
    rate 0 for ever, is an outage, not a completion) and, with a deadline, by it."""
    return math.isfinite(finish_s) and (deadline_s is None or finish_s <= deadline_s)


def varying_media(
    traces: Mapping[int, object], clients: Mapping[int, ClientSpec], network: NetworkSpec
) -> set[tuple[str, int]]:
    """The shared media ((direction, edge server)) on which a client of the round has a
    :class:`TimeVaryingRate` (a rate trace, a moving client): processor sharing re-rated
    where a flow's rate changes (:class:`.simpy_model.VaryingProcessorSharing`) there."""
    out: set[tuple[str, int]] = set()
    for cid in traces:
        spec = clients[cid]
        if network.uplink_shared and isinstance(spec.uplink_rate_bps, TimeVaryingRate):
            out.add(("uplink", spec.edge_server))
        if network.downlink_shared and isinstance(spec.downlink_rate_bps, TimeVaryingRate):
            out.add(("downlink", spec.edge_server))
    return out
