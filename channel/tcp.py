"""A finite TCP flow: how long a transfer of ``n`` bytes takes on a link, beyond its bits.

``latency + 8·bytes/rate`` is what a link would give a flow that is already at full
speed and carries no headers. A real transfer of a model is a finite TCP flow on an open
(persistent) connection, and it pays three things more (docs/channel.md, "Transport"):

1. **Headers.** Each segment carries ``mss_bytes`` of payload and ``header_bytes`` more on
   the wire (IPv4 20 + TCP 20 + the timestamps option 12 = 52 bytes: 1,500 bytes on the
   wire per 1,448 of payload). The goodput is the link's rate times
   ``mss / (mss + header)`` (:func:`header_efficiency`).
2. **Slow start.** The sender starts with ``initial_window`` segments (RFC 6928: 10) and
   doubles its window each round trip (byte counting, RFC 3465, as Linux and ns-3's
   Cubic do) until the window covers the path (the bandwidth-delay product); from then
   on the link is busy. With a segment's serialisation ``τ = 8·mss / goodput`` and the
   round trip ``R = rtt + τ`` (the scenario's latencies both ways plus one segment), round
   ``k`` starts at ``k·R`` and sends ``iw·2^k`` segments back to back. The link fills in
   round ``K``, the first with ``iw·2^K·τ ≥ R``; the last segment leaves in round ``j``,
   the first with ``iw·(2^(j+1) − 1) ≥ n``. The transfer ends ``k·R + (n − S_k)·τ`` after
   it began, ``k = min(K, j)``, ``S_k = iw·(2^k − 1)`` segments sent before round ``k``;
   the time beyond ``n·τ`` is :func:`slow_start_stall_s` (0 when ``rtt`` is 0).
3. **Set-up.** ``connection: new`` costs one more round trip (the handshake before the
   first byte), ``tls`` two (TCP's and a TLS 1.3 handshake's). ``persistent`` (the
   default: FL clients keep their connection to the server) none.

With a **loss rate** ``p`` the expected time of the transfer follows the decomposition
of Cardwell, Savage and Anderson ("Modeling TCP latency", INFOCOM 2000) for its start:
the initial slow start sends ``E[d_ss] = (1 − (1−p)^d)(1−p)/p + 1`` of the ``d``
segments before the first loss (their Eq. 5), timed as above; with probability
``1 − (1−p)^d`` that loss is then recovered, by a timeout with probability ``Q(p, w)``
(their Eq. 16, after Padhye et al.) at ``E[Z_TO] = G(p)·T0/(1−p)``, else by a fast
retransmit in one round trip. Cardwell et al. send the rest at the steady-state rate;
a finite flow on a fast link never reaches it (its window, cut from where slow start
left it, takes many losses to come down), so here congestion avoidance is followed
round trip by round trip on the window's expected course: a round trip sends
``s = min(w, pipe)`` segments (``pipe = R/τ``, what the link carries in a round trip),
loses one of them with probability ``1 − (1−p)^s`` — costing a round trip of fast
recovery, or a timeout with probability ``Q(p, w)``, and a timeout when the
retransmission is lost too (``p``) — and the window moves by its expectation,
``w ← (1 − (1 − (1−p)^s)·(1 − β))·w + α``: Cubic's Reno-friendly AIMD (RFC 9438 §4.3:
β = 0.7, α = 3(1−β)/(1+β)), NewReno's β = 0.5 and α = 1/2 (an ACK per second
segment). After :data:`AVOIDANCE_ROUNDS` round trips the rest goes at the last one's
rate. The retransmission timeout is ``T0 = max(min_rto_s, 2·R)`` (RFC 6298's
SRTT + 4·RTTVAR once RTTVAR has settled near a quarter of the round trip). It is the
expectation; single transfers spread widely around it (a timeout or none), and
docs/validation.md gives the spread ns-3 shows.

Pure numpy, vectorised over transfers; no engine, no scenario.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "CONNECTION_SETUP_ROUND_TRIPS",
    "TCP_HEADER_BYTES",
    "TCP_MSS_BYTES",
    "TcpColumns",
    "TcpFlow",
    "header_efficiency",
    "slow_start_stall_s",
    "tcp_extra_s",
]

#: IPv4 (20) + TCP (20) + the timestamps option (12) bytes: a segment's header on the wire
TCP_HEADER_BYTES = 52
#: the payload of a segment that fills a 1,500-byte Ethernet MTU with timestamps on
TCP_MSS_BYTES = 1448
#: round trips before the first byte, by ``connection``
CONNECTION_SETUP_ROUND_TRIPS = {"persistent": 0, "new": 1, "tls": 2}
#: Cubic's constants (RFC 9438): the scaling constant C and the multiplicative decrease β
CUBIC_C = 0.4
CUBIC_BETA = 0.7

CongestionControl = Literal["cubic", "newreno"]
Connection = Literal["persistent", "new", "tls"]


def header_efficiency(mss_bytes: int, header_bytes: int) -> float:
    """The share of the wire that is payload: ``mss / (mss + header)``."""
    return mss_bytes / (mss_bytes + header_bytes)


def _first_power(ratio: np.ndarray) -> np.ndarray:
    """The smallest integer ``k >= 0`` with ``2^k >= ratio``, element-wise (exact: the
    logarithm's rounding is checked both ways)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        k = np.ceil(np.log2(np.maximum(ratio, 1.0)))
        k = np.where(np.isfinite(k), k, 1100.0)  # 2^1100 > any float: "never"
        k = np.where(_pow2(k) < ratio, k + 1.0, k)
        k = np.where((k > 0) & (_pow2(k - 1.0) >= ratio), k - 1.0, k)
    return np.maximum(k, 0.0)


def _pow2(k: np.ndarray) -> np.ndarray:
    """``2^k`` for integer-valued ``k``, exactly (``ldexp``, not a logarithm's rounding)."""
    return np.ldexp(1.0, np.minimum(k, 1100.0).astype(np.int64))


def slow_start_stall_s(
    segments: ArrayLike, rtt_s: ArrayLike, segment_s: ArrayLike, initial_window: float
) -> np.ndarray:
    """Seconds a transfer of ``segments`` spends beyond ``segments · segment_s`` because
    slow start leaves the link idle while the window grows (item 2 of the module's
    docstring): ``k·R − iw·(2^k − 1)·τ`` with ``R = rtt_s + segment_s``,
    ``k = min(K, j)``. ``segments`` may be fractional (an expected count)."""
    n = np.asarray(segments, dtype=float)
    tau = np.asarray(segment_s, dtype=float)
    r = np.asarray(rtt_s, dtype=float) + tau
    iw = float(initial_window)
    with np.errstate(divide="ignore", invalid="ignore"):
        fill = _first_power(np.where(tau > 0, r / (iw * tau), 0.0))  # K
    last = _first_power(n / iw + 1.0) - 1.0  # j: the round of the last segment
    k = np.maximum(np.minimum(fill, last), 0.0)
    with np.errstate(invalid="ignore"):  # an infinite τ (no rate): answered below
        stall = k * r - iw * (_pow2(k) - 1.0) * tau
    return np.where((n > 0) & np.isfinite(tau), np.maximum(stall, 0.0), 0.0)


def _timeout_probability(p: float, window: np.ndarray) -> np.ndarray:
    """Q(p, w): the chance that a loss in a window of ``w`` segments is recovered by a
    timeout, not a fast retransmit (Padhye et al., as Cardwell et al. Eq. 16 use it)."""
    q = 1.0 - p
    w = np.maximum(window, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        num = (1.0 - q**3) * (1.0 + q**3 * (1.0 - q ** np.maximum(w - 3.0, 0.0)))
        out = num / (1.0 - q**w)
    return np.where(w <= 3.0, 1.0, np.minimum(1.0, out))


#: (multiplicative decrease β, additive increase α segments per round trip) in congestion
#: avoidance: Cubic's Reno-friendly AIMD (RFC 9438 §4.3, α = 3(1−β)/(1+β)); NewReno's
#: halving, and +1/2 a round trip with an ACK per second segment (ns-3 counts ACKs)
_AIMD = {
    "cubic": (CUBIC_BETA, 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA)),
    "newreno": (0.5, 0.5),
}
#: round trips of congestion avoidance followed one by one before the rest of a transfer
#: goes at the last one's rate (the window has long settled by then)
AVOIDANCE_ROUNDS = 300


def _lossy_time_s(
    d: np.ndarray,
    rtt_s: np.ndarray,
    tau: np.ndarray,
    iw: float,
    p: float,
    cc: CongestionControl,
    min_rto_s: float,
) -> np.ndarray:
    """Expected seconds to send ``d`` segments at loss rate ``p`` (the module's
    docstring): slow start to the first loss, its recovery, then congestion avoidance
    round trip by round trip on the window's expected course."""
    q = 1.0 - p
    r = rtt_s + tau
    pipe = r / tau  # segments a round trip carries at the link's rate
    d_ss = np.minimum(d, (1.0 - q**d) * q / p + 1.0)  # Cardwell et al. Eq. 5
    lost = 1.0 - q**d  # a loss happens at all
    w_ss = (d_ss + iw) / 2.0  # the window when it does (Eq. 7, γ = 2)
    t0 = np.maximum(min_rto_s, 2.0 * r)
    g_p = 1.0 + p + 2 * p**2 + 4 * p**3 + 8 * p**4 + 16 * p**5 + 32 * p**6
    z_to = g_p * t0 / q  # a timeout with its back-offs (Cardwell et al. Eq. 17)
    timeout = _timeout_probability(p, w_ss)
    t = slow_start_stall_s(d_ss, rtt_s, tau, iw) + d_ss * tau
    t = t + lost * (timeout * z_to + (1.0 - timeout) * r)
    beta, alpha = _AIMD[cc]
    w = np.maximum(beta * w_ss, 1.0)
    left = d - d_ss
    for _ in range(AVOIDANCE_ROUNDS):
        going = left > 0
        if not going.any():
            break
        sent = np.minimum(w, pipe)
        last = left <= sent
        # a round trip, or the last segments back to back at the link's rate
        dt = np.where(last, left * tau, r)
        # this round's loss: recovered by a timeout (Q), else by fast retransmit in a round
        # trip; a retransmission lost too times out
        hit = 1.0 - q ** np.minimum(sent, left)
        timeout = _timeout_probability(p, w)
        dt = dt + hit * (timeout * z_to + (1.0 - timeout) * r + p * z_to)
        t = np.where(going, t + dt, t)
        left = np.where(going, left - sent, left)
        w = np.where(going, np.maximum((1.0 - hit * (1.0 - beta)) * w + alpha, 1.0), w)
    return t + np.where(left > 0, left / np.minimum(w, pipe) * r, 0.0)


def tcp_extra_s(
    nbytes: ArrayLike,
    goodput_bps: ArrayLike,
    rtt_s: ArrayLike,
    *,
    mss_bytes: int = TCP_MSS_BYTES,
    initial_window: int = 10,
    setup_round_trips: int = 0,
    loss_rate: float = 0.0,
    congestion_control: CongestionControl = "cubic",
    min_rto_s: float = 0.2,
) -> np.ndarray:
    """Expected seconds a transfer of ``nbytes`` takes beyond ``8·nbytes / goodput_bps``
    (and its one-way latency) as a finite TCP flow: set-up, slow start and, with a loss
    rate, loss recovery and congestion avoidance below the link's rate (the module's
    docstring). ``goodput_bps`` is the payload rate the link gives the flow (its rate
    times :func:`header_efficiency`); ``rtt_s`` the round trip of the path without
    serialisation. 0 for ``nbytes <= 0``; inf where the goodput is 0."""
    nb = np.asarray(nbytes, dtype=float)
    g = np.asarray(goodput_bps, dtype=float)
    rtt = np.asarray(rtt_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = np.where(g > 0, 8.0 * mss_bytes / g, np.inf)  # one segment's serialisation
    tau = np.where(np.isfinite(tau), tau, 0.0)  # no rate: inf below, whatever the rest
    d = np.ceil(nb / mss_bytes)  # segments
    r = rtt + tau
    extra = setup_round_trips * r
    iw = float(initial_window)
    p = float(loss_rate)
    if p <= 0.0:
        extra = extra + slow_start_stall_s(d, rtt, tau, iw)
    else:
        extra = extra + _lossy_time_s(d, rtt, tau, iw, p, congestion_control, min_rto_s) - d * tau
    out = np.where(g > 0, extra, np.inf)
    return np.where(nb > 0, out, 0.0)


@dataclass(frozen=True)
class TcpColumns:
    """One direction's TCP flows of a round's clients as columns (the closed form's
    :class:`TcpFlow` s): their common parameters (``flow``, whose ``rtt_s`` and
    ``flows`` are unused) and each client's round trip and flow count."""

    flow: TcpFlow
    rtt_s: np.ndarray
    flows: np.ndarray

    @staticmethod
    def uniform(flows: Sequence[TcpFlow | None]) -> bool:
        """Can these flows be columns (all None, or all alike but for rtt and flows)?"""
        first = flows[0] if flows else None
        if all(f is first for f in flows):  # one object for all (no latency): at C speed
            return True
        if first is None:
            return all(f is None for f in flows)
        key = first.kind()
        return all(f is not None and f.kind() == key for f in flows)

    @classmethod
    def of(cls, flows: Sequence[TcpFlow | None]) -> TcpColumns | None:
        """The columns of ``flows`` (:meth:`uniform` ones); None when no flow adds time
        (then every transfer is its bits at the rate plus its latency)."""
        if not flows:
            return None
        first = flows[0]
        if all(f is first for f in flows):  # one object for all (no latency)
            if first is None or not first.adds_time:
                return None
        elif not any(f is not None and f.adds_time for f in flows):
            return None
        if not cls.uniform(flows):
            raise ValueError("TcpColumns.of: flows of different kinds in one direction")
        first = cast(TcpFlow, flows[0])
        rtt = np.array([cast(TcpFlow, f).rtt_s for f in flows], dtype=float)
        count = np.array([cast(TcpFlow, f).flows for f in flows], dtype=float)
        return cls(first, rtt, count)

    def extra_s(
        self, at: np.ndarray | slice, nbytes: np.ndarray, goodput_bps: np.ndarray
    ) -> np.ndarray:
        """:meth:`TcpFlow.extra_array` of rows ``at``' transfers, element-wise."""
        f = self.flow
        return tcp_extra_s(
            nbytes,
            np.asarray(goodput_bps, dtype=float) / self.flows[at],
            self.rtt_s[at],
            mss_bytes=f.mss_bytes,
            initial_window=f.initial_window,
            setup_round_trips=f.setup_round_trips,
            loss_rate=f.loss_rate,
            congestion_control=f.congestion_control,
            min_rto_s=f.min_rto_s,
        )


@dataclass(frozen=True)
class TcpFlow:
    """A link direction's TCP transfers as the engine times them: each transfer of ``n``
    bytes takes :func:`tcp_extra_s` more than its bits at the link's goodput, computed at
    ``goodput / flows`` (on a shared medium, the flow's fair share of it: ``flows`` is
    the number of the round's flows on that medium; 1 on a dedicated link).

    ``rtt_s`` is this client-round's round trip (the scenario's one-way latencies of both
    directions, jitter included)."""

    rtt_s: float
    mss_bytes: int = TCP_MSS_BYTES
    initial_window: int = 10
    setup_round_trips: int = 0
    loss_rate: float = 0.0
    congestion_control: CongestionControl = "cubic"
    min_rto_s: float = 0.2
    flows: int = 1

    def __post_init__(self) -> None:
        if not (self.rtt_s >= 0 and self.mss_bytes > 0 and self.initial_window >= 1):
            raise ValueError(f"{self!r}: rtt_s >= 0, mss_bytes > 0, initial_window >= 1")
        if self.flows < 1:
            raise ValueError(f"{self!r}: flows must be >= 1")

    def kind(self) -> tuple[object, ...]:
        """The parameters a direction's flows share (all but ``rtt_s`` and ``flows``)."""
        return (
            self.mss_bytes,
            self.initial_window,
            self.setup_round_trips,
            self.loss_rate,
            self.congestion_control,
            self.min_rto_s,
        )

    @property
    def adds_time(self) -> bool:
        """Can a transfer take longer than its bits? Not with no round trip, no set-up
        and no loss: then the window never limits the flow (:func:`slow_start_stall_s`
        is 0), and every engine path times the link as ``latency + bits / goodput``."""
        return self.rtt_s > 0 or self.setup_round_trips > 0 or self.loss_rate > 0

    def extra_s(self, nbytes: float, goodput_bps: float) -> float:
        """:func:`tcp_extra_s` of one transfer on this link (at ``goodput / flows``)."""
        return float(self.extra_array(np.asarray(nbytes), np.asarray(goodput_bps)))

    def extra_array(self, nbytes: np.ndarray, goodput_bps: np.ndarray) -> np.ndarray:
        """:func:`tcp_extra_s` of transfers on this link, element-wise."""
        return tcp_extra_s(
            nbytes,
            np.asarray(goodput_bps, dtype=float) / self.flows,
            self.rtt_s,
            mss_bytes=self.mss_bytes,
            initial_window=self.initial_window,
            setup_round_trips=self.setup_round_trips,
            loss_rate=self.loss_rate,
            congestion_control=self.congestion_control,
            min_rto_s=self.min_rto_s,
        )
