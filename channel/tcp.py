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
   ``k`` starts at ``k·R``. The receiver ACKs every second segment (RFC 5681 §4.2; ns-3's
   and Linux's delayed ACKs), so a round of an even number of segments is ACKed whole, but
   from the second round on one segment is odd: its ACK waits for the next segment or the
   delayed-ACK timer (:data:`DELAYED_ACK_TIMEOUT_S`, Linux's 40 ms). When the round trip
   is short (``R − iw·τ ≤ 40 ms``) the next round's first segment comes first, and that
   segment is ACKed a round late: the window grows by the ``w − 1`` segments ACKed, one
   segment stays in flight, and the rounds send ``iw, 2(iw−1), 4(iw−1), …`` segments —
   ``S_k = (iw−1)(2^k − 1) + 1`` before round ``k`` (``k ≥ 1``; e.g. 10, 18, 36, 72: a
   200 kB model needs a fifth round at 100 Mb/s and 40 ms, as in ns-3). On a long round
   trip the timer fires within the round and the rounds send ``iw·2^k``:
   ``S_k = iw·(2^k − 1)``. Either way ``S_k = g·(2^k − 1) + c·[k ≥ 1]``, a round's window
   is ``g·2^k + c``; the link fills in round ``K``, the first with ``(g·2^K + c)·τ ≥ R``; the
   last segment leaves in round ``j``, the first with ``S_(j+1) ≥ n``. The transfer ends
   ``k·R + (n − S_k)·τ`` after it began, ``k = min(K, j)``; the time beyond ``n·τ`` is
   :func:`slow_start_stall_s` (0 when ``rtt`` is 0). (Linux's receiver also ACKs every
   segment for a while after a connection starts or idles, "quick ACKs", which speeds
   its first rounds; ns-3 does not, and ns-3 is the reference: docs/validation.md.)
   **2b. HyStart's ACK train** (ns-3.37's ``TcpCubic::HystartUpdate``, Linux's
   ``hystart_update`` in ``tcp_cubic.c``): once the window is at least 16 segments, ACKs
   at most 2 ms apart form a train, and slow start ends when the train has lasted longer
   than the least round trip (Linux: half of it). A round's test runs (in ns-3.37, and
   Linux kernels that reset the round after it; 6.x sources reset it first) to the
   first ACK that passes the segment sent last when the round began — with the delayed
   ACK holding
   a round's odd segment, the next round's first ACK, about ``R`` after the round's
   first — so the train holds, and slow start ends, at the first round ``x`` whose ACKs
   leave a gap of at most 2 ms before the next round's (``R − s_x·τ ≤ 2 ms``, ACKs
   ``2τ`` apart within it) and whose next window ``s_(x+1)`` has reached 16 with an ACK
   to spare. Before the window covers the path that happens only where ``R`` is a few
   ms (on a longer path the gap falls under 2 ms only in the round that nearly fills
   the link, full from the next round anyway). Then Cubic, with no loss yet, grows the
   window a segment per 20 segments ACKed (its ``cnt`` clamp), ``w = s_(x+1) + u/20``
   after ``u`` segments, each window a round trip, ``R/w`` a segment, until it covers
   the path (:func:`_window_limited_s`). 800 kB at 1 Gb/s, 1 ms one way: ns-3 0.0398 s
   (0.0144 s with the test off), mecsim 0.0387 s.
   **2c. On an aggregating MAC** (an 802.11ax station: ``TcpFlow.mpdu_air_s``, the air
   time an MPDU of its own adds to the cell's cycle, and ``ampdu_mpdus``, ``k``): with
   the cell's ``n`` stations alike, a cycle's time an MPDU is ``a = n·mpdu_air_s`` and
   its fixed part ``k·(τ − a)``; a station's round trip is the wired path's plus the
   other stations' share of that fixed part, ``k·(τ − a)·(n − 1)/n``; a round's ACKs
   come back as its A-MPDU's. A station alone in its cell (``n = 1``) leaves the medium
   idle while its ACKs cross the wire, so the access point returns a round's first ACKs
   as they come and the ACK clock spreads the round over bursts about an exchange
   apart: the train's gap is the round trip less the window at the station's own rate
   (``s_x·τ``; ns-3, one station at 44 m, 40 MHz: bursts 0.2–1.5 ms apart, slow start
   ends at 20 segments). With cell-mates (``n > 1``) the same gap, measured as the
   station alone would have it (``rtt + τ/n − s_x·τ/n``), ends slow start only when the
   round's first ACKs reach an idle medium; while the cell-mates' exchanges hold it the
   access point returns the round's ACKs in one burst a round trip after the last (ns-3,
   stations at 5 and 33 m, 80 MHz: the near one's bursts 2.4, 2.5 and 6.5 ms apart).
   Which happens is the order of the accesses, seed by seed (ns-3, 14 and 34 m, 80 MHz:
   the near station leaves at 19 segments in 4 seeds of 10, the far one at 19–37 in 6),
   so round ``x`` ends it with the chance of the round trip's idle share,
   ``1 − (k·(τ − a)·(n − 1)/n + (n − 1)·s_x·a/n) / R`` (the cell-mates' fixed parts and
   their A-MPDUs of the same window, stations alike), and the stall is the expectation
   over the round of the exit, or none (a stated approximation: the cell's last upload
   is then the last of the stations' expectations; docs/validation.md). After the exit
   the ACK-clocked station
   sends the A-MPDUs its ACK bursts release: a cycle of ``m`` MPDUs takes
   ``P(m) = k·(τ − a) + m·a``, ``w = (m / P(m))·(rtt + P(m))`` (Little's law, the
   medium busy) gives ``m``, and a segment costs ``P(m)/m`` instead of ``τ``.
3. **Set-up.** ``connection: new`` costs one more round trip (the handshake before the
   first byte), ``tls`` two (TCP's and a TLS 1.3 handshake's). ``persistent`` (the
   default: FL clients keep their connection to the server) none.
4. **The bottleneck's AQM** (``queue: fq_codel``, the default; ``fifo`` leaves it out).
   Slow start ends with a standing queue: HyStart stops it once the queue reaches its
   delay threshold ``θ = clamp(R/8, 4 ms, 16 ms)`` (the window ``pipe + θ/τ``,
   :func:`_queue_window`), and Cubic holds the window there. A packet then waits about
   ``θ − τ`` (the queue less the segment it replaces). CoDel (RFC 8289, fq_codel's
   defaults: target 5 ms, interval 100 ms) drops a packet once that sojourn has stayed
   above the target for an interval, i.e. when ``θ − τ > 5 ms`` (round trips from about
   48 ms): the sender learns of it a round trip and the queue later, and its fast recovery
   cuts the window to ``β·(pipe + θ/τ)``, below the pipe. The queue drains first (``θ`` of
   sending), then each round trip leaves ``(pipe − w)·τ`` of the link idle while Cubic's
   window ``W(t) = W_max + C·(t − K)³`` (``W_max = pipe + θ/τ``) climbs back to the pipe
   (:func:`codel_drop_stall_s`). A flow that ends before the drop is seen, or whose slow
   start never fills the link, pays nothing. Through a deep FIFO nothing is dropped and the
   link stays busy: the time is items 1-3's.

With a **loss rate** ``p`` (random, independent per segment) the time is an
**expectation over sample paths**: :data:`LOSS_PATHS` transfers are followed round trip
by round trip, each drawing its own losses, and the mean of their times is the
transfer's. (Closed forms were tried first: Cardwell, Savage and Anderson's "Modeling TCP
latency" (INFOCOM 2000) with Padhye et al.'s timeout probability, then the window's
expected course; both put the lossy ns-3 cases 20-50 % off, because a finite flow's
time is decided by *when* its few losses fall — an early one leaves the window small
for the rest of the transfer — and an average window cannot say that.) A round trip of
a path sends ``s = min(w, pipe, left)`` segments (``pipe = R/τ``) and loses one of them
with probability ``1 − (1−p)^s`` (the draw says which: position ``i``):

- no loss: the round takes ``R`` (the last one, ``left·τ``) and the window grows — in
  slow start as above (iw, 2(iw−c), doubling), until the queue the window builds beyond
  the pipe reaches HyStart's delay threshold ``clamp(R/8, 4 ms, 16 ms)`` (Linux's; the
  window stops at ``pipe + threshold/τ``, :func:`_queue_window`); in congestion
  avoidance by Cubic's window function ``W(t) = W_max + C·(t − K)³`` (RFC 9438 §4.2,
  ``C = 0.4``, ``K = ∛((W_max − W₀)/C)``, fast convergence), with the integer
  arithmetic of Linux's and ns-3's ``bictcp_update`` (``cnt = ⌊w / (⌊W(t)⌋ − ⌊w⌋)⌋``
  ACKs per increment, at most 1.5× a round trip, 5 % a round trip before the first
  loss) — as ns-3.37 implements it, *without* the Reno-friendly region of §4.3 that
  Linux adds (docs/channel.md says what that changes) — or NewReno's ``+1/2`` segment
  (an ACK per second segment); never beyond what the bottleneck's queue lets stand
  (``pipe + threshold/τ``: an AQM such as fq_codel drops beyond it);
- a loss: three duplicate ACKs need a window's worth of segments behind the lost one
  (``min(w − 1, behind) + min(2, beyond)`` with limited transmit's two new ones, RFC
  3042); with them, fast recovery (SACK, PRR): the round and one more, ``2·R``, deliver
  ``s + β·s`` segments, the window is cut to ``max(β·w', 2)`` (``w'``: slow start's
  window once the ACKs before the lost one have grown it) and a new Cubic epoch starts
  (``W_max = w'``, or ``w'(1+β)/2`` below the last ``W_max``); without them (a loss
  among a transfer's last segments, a window of one), or when the retransmission is lost
  too (probability ``p``), a retransmission timeout ``T0 = R + max(R, min_rto_s)``
  (Linux's SRTT + max(4·RTTVAR, TCP_RTO_MIN) once RTTVAR has settled near a quarter of
  the round trip; 3·T0 when the retransmission is lost again: the timer backs off), after which the
  window restarts at one segment in slow start. β is 0.7 for Cubic, 0.5 for NewReno.

The draws are the same for every transfer (common random numbers from a fixed seed),
so a transfer's time does not depend on what else it is timed with and engines agree to
the bit. Single
transfers spread widely around the expectation (:func:`lossy_transfer_times_s` gives
the paths; docs/validation.md sets their spread beside ns-3's).

Pure numpy, vectorised over transfers; no engine, no scenario.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Literal, cast

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "CONNECTION_SETUP_ROUND_TRIPS",
    "DELAYED_ACK_TIMEOUT_S",
    "TCP_HEADER_BYTES",
    "TCP_MSS_BYTES",
    "TcpColumns",
    "TcpFlow",
    "codel_drop_stall_s",
    "header_efficiency",
    "lossy_transfer_times_s",
    "slow_start_stall_s",
    "tcp_extra_s",
]

#: IPv4 (20) + TCP (20) + the timestamps option (12) bytes: a segment's header on the wire
TCP_HEADER_BYTES = 52
#: the payload of a segment that fills a 1,500-byte Ethernet MTU with timestamps on
TCP_MSS_BYTES = 1448
#: round trips before the first byte, by ``connection``
CONNECTION_SETUP_ROUND_TRIPS = {"persistent": 0, "new": 1, "tls": 2}
#: the receiver's delayed-ACK timer (Linux's TCP_DELACK_MIN; ns-3's reference runs set it
#: too): a segment left alone at the end of a round is ACKed after it
DELAYED_ACK_TIMEOUT_S = 0.04
#: Cubic's constants (RFC 9438): the scaling constant C and the multiplicative decrease β
CUBIC_C = 0.4
CUBIC_BETA = 0.7
#: CoDel's target sojourn and interval (RFC 8289 §4.2-4.3; Linux's and ns-3's fq_codel
#: defaults), s
CODEL_TARGET_S, CODEL_INTERVAL_S = 0.005, 0.1
#: HyStart's ACK-train test (ns-3.37's TcpCubic HyStartAckDelta and HyStartLowWindow;
#: Linux's hystart_ack_delta_us and hystart_low_window): ACKs at most this far apart
#: (s) form a train, tested once the window reaches this many segments
HYSTART_ACK_DELTA_S = 0.002
HYSTART_LOW_WINDOW = 16
#: segments a delayed ACK acknowledges
ACK_SEGMENTS = 2
#: points of the midpoint rule over a window-limited flow's segments
WINDOW_LIMITED_POINTS = 64
#: Cubic's cnt clamp before the first loss (ns-3.37's CntClamp, Linux's bictcp_update):
#: the window grows a segment per this many segments ACKed at most
CUBIC_CNT_CLAMP = 20
#: the seed of the loss model's draws (common random numbers: fixed, never the scenario's)
LOSS_SEED = 20261128
#: HyStart's delay threshold's bounds (Linux's HYSTART_DELAY_MIN / MAX), s
HYSTART_DELAY_MIN_S, HYSTART_DELAY_MAX_S = 0.004, 0.016
#: rounds of draws made at a time (a chunk is 3.3 MB; most transfers need the first only)
LOSS_CHUNK_ROUNDS = 100

CongestionControl = Literal["cubic", "newreno"]
Connection = Literal["persistent", "new", "tls"]
Queue = Literal["fq_codel", "fifo"]


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
    segments: ArrayLike,
    rtt_s: ArrayLike,
    segment_s: ArrayLike,
    initial_window: float,
    mpdu_air_s: ArrayLike | None = None,
    ampdu_mpdus: ArrayLike = 1.0,
    flows: ArrayLike = 1.0,
) -> np.ndarray:
    """Seconds a transfer of ``segments`` spends beyond ``segments · segment_s`` because
    slow start leaves the link idle while the window grows (item 2 of the module's
    docstring): ``k·R − S_k·τ`` with ``R = rtt_s + segment_s``, ``k = min(K, j)``,
    ``S_k = g·(2^k − 1) + c·[k ≥ 1]`` (``g, c = iw − 1, 1`` when a delayed ACK holds a
    segment a round, ``iw, 0`` when its timer fires within the round or ``iw < 2``) —
    unless HyStart's ACK train ends slow start first (item 2b): then the rounds up to
    the exit and the window-limited flow after it (:func:`_window_limited_s`). On an
    aggregating MAC (an 802.11ax cell: ``mpdu_air_s``, the air time an MPDU of the
    station's own adds to the cell's cycle, ``ampdu_mpdus`` an A-MPDU's MPDUs at the
    goodput, ``flows`` the stations of the cell; item 2c) a round trip also holds the
    other stations' exchanges, and a station with cell-mates leaves by the ACK train
    with the chance that the medium is idle as its ACKs come back: the stall is the
    expectation over the round of the exit. ``segments`` may be fractional (an expected
    count)."""
    n = np.asarray(segments, dtype=float)
    tau = np.asarray(segment_s, dtype=float)
    rtt = np.asarray(rtt_s, dtype=float)
    r = rtt + tau
    iw = float(initial_window)
    mac = mpdu_air_s is not None
    kk = np.asarray(ampdu_mpdus, dtype=float) if mac else np.asarray(1.0)
    fl = np.asarray(flows, dtype=float) if mac else np.asarray(1.0)
    # the cell's stations alike: an MPDU of each adds ``flows · mpdu_air_s`` to the cycle,
    # whose fixed part (AIFS, backoff, preambles, block acks, idle and collision time)
    # is ``k·(τ − air)``; the other stations' share of it lies between a station's rounds
    air = np.asarray(mpdu_air_s, dtype=float) * fl if mac else tau
    with np.errstate(invalid="ignore"):
        others = kk * (tau - air) * (fl - 1.0) / fl if mac else np.asarray(0.0)
        r_round = r + others if mac else r
    # how far apart a round's ACKs come back, a segment: on a link, a segment's time; on
    # a cell, a segment at the station's own rate (the access point finds the medium
    # idle as the round's first ACKs arrive and returns them in bursts the ACK clock
    # spreads over the round); with cell-mates that holds only with the chance the
    # medium is idle then, below (item 2c)
    with np.errstate(invalid="ignore"):
        own = tau / fl if mac else tau
    with np.errstate(invalid="ignore"):  # an infinite τ (no rate): answered below
        held = (r - iw * tau <= DELAYED_ACK_TIMEOUT_S) & (iw >= 2.0)
    g = np.where(held, iw - 1.0, iw)  # segments a round adds, doubling
    c = np.where(held, 1.0, 0.0)  # the segment a delayed ACK keeps in flight
    with np.errstate(divide="ignore", invalid="ignore"):
        fill = _first_power(np.where(tau > 0, (r_round / tau - c) / g, 0.0))  # K
    last = _first_power((n - c) / g + 1.0) - 1.0  # j: the round of the last segment
    k = np.maximum(np.minimum(fill, last), 0.0)
    sent = np.where(k > 0, g * (_pow2(k) - 1.0) + c, 0.0)  # S_k
    with np.errstate(invalid="ignore"):
        stall = k * r_round - sent * tau
    shape = np.shape(stall)
    # HyStart's ACK train (item 2b): the first round x < min(K, j) whose next window
    # reaches the low window with an ACK to spare and whose ACKs (2τ apart: one per two
    # segments) leave a gap of at most the ACK delta before the next round's first,
    # R − s_x·τ (on a cell: the round trip less the station's own A-MPDU of the window)
    with np.errstate(invalid="ignore"):
        ok = (n > 0) & (tau > 0) & np.isfinite(tau) & (2.0 * tau <= HYSTART_ACK_DELTA_S)
    # the gap shrinks as the window grows: only where the last round before min(K, j)
    # leaves at most the delta can any round's (most transfers are skipped here)
    with np.errstate(invalid="ignore", over="ignore"):
        s_last = np.where(k > 1, g * _pow2(np.maximum(k - 1.0, 0.0)) + c, g + c)
        r_own = rtt + own if mac else r  # the round trip as the station alone has it
        ok &= (k >= 1) & (r_own - s_last * own <= HYSTART_ACK_DELTA_S)
    cand = np.flatnonzero(np.broadcast_to(ok, shape))
    if cand.size == 0:
        return np.where((n > 0) & np.isfinite(tau), np.maximum(stall, 0.0), 0.0)
    n_b, r_b, ro_b, own_b, tau_b, rtt_b, g_b, c_b, k_b, a_b, kk_b, ot_b, fl_b = (
        np.broadcast_to(v, shape).ravel()[cand]
        for v in (n, r_round, r_own, own, tau, rtt, g, c, k, air, kk, others, fl)
    )
    # the cell-mates' time on the air in a round: their exchanges' fixed parts and an
    # A-MPDU of the same window each (stations alike); the train holds only where the
    # station's first ACKs reach an idle medium, with the chance of the round trip's
    # idle share (1 without cell-mates: the first round that passes is the exit)
    a_own = a_b / fl_b
    rounds = int(np.max(k_b))
    hits: list[np.ndarray] = []
    chances: list[np.ndarray] = []
    stalls: list[np.ndarray | None] = []
    for i in range(rounds):  # a handful of rounds
        s_i = g_b * 2.0**i + c_b if i > 0 else g_b + c_b  # round i's window (iw in round 0)
        s_next = g_b * 2.0 ** (i + 1) + c_b
        hit = (i < k_b) & (s_next - ACK_SEGMENTS >= HYSTART_LOW_WINDOW)
        hit &= ro_b - s_i * own_b <= HYSTART_ACK_DELTA_S
        with np.errstate(invalid="ignore"):
            busy = np.where(fl_b > 1.0, ot_b + (fl_b - 1.0) * s_i * a_own, 0.0)
            chance = np.where(fl_b > 1.0, np.clip(1.0 - busy / r_b, 0.0, 1.0), 1.0)
        hits.append(hit)
        chances.append(chance)
        stalls.append(None)
        if hit.any():
            t = hit
            sent_x = g_b[t] * (2.0 ** (i + 1) - 1.0) + c_b[t]  # S_(i+1): rounds 0..i
            w_x = g_b[t] * 2.0 ** (i + 1) + c_b[t]  # the window at the exit
            st = np.zeros(cand.size)
            st[t] = (
                (i + 1.0) * r_b[t]
                - sent_x * tau_b[t]
                + _window_limited_s(n_b[t] - sent_x, w_x, rtt_b[t], tau_b[t], a_b[t], kk_b[t])
            )
            stalls[-1] = st
    # the expectation over the round of the exit (or none), from the last round back
    expected = np.array(np.broadcast_to(stall, shape), dtype=float).reshape(-1)[cand]
    for hit, chance, st in zip(reversed(hits), reversed(chances), reversed(stalls), strict=True):
        if st is not None:
            expected = np.where(
                hit, np.where(chance >= 1.0, st, chance * st + (1.0 - chance) * expected), expected
            )
    stall = np.array(np.broadcast_to(stall, shape), dtype=float, copy=True)
    stall.reshape(-1)[cand] = expected
    return np.where((n > 0) & np.isfinite(tau), np.maximum(stall, 0.0), 0.0)


def _window_limited_s(
    left: np.ndarray,
    w0: np.ndarray,
    rtt: np.ndarray,
    tau: np.ndarray,
    mpdu_air_s: np.ndarray,
    ampdu_mpdus: np.ndarray,
) -> np.ndarray:
    """Seconds ``left`` segments take beyond ``left · τ`` after slow start ended at window
    ``w0`` below the path (item 2b): Cubic before its first loss grows the window a
    segment per :data:`CUBIC_CNT_CLAMP` ACKed, ``w = w0 + u / clamp`` after ``u``
    segments, and the flow delivers ``X(w)`` segments a second. On an aggregating MAC
    (item 2c) a cycle of exchanges of ``m`` MPDUs takes ``P(m) = O + m·a`` (``a =
    mpdu_air_s``, the cycle's time an MPDU, ``O = k·(τ − a)``, ``k = ampdu_mpdus``:
    ``P(k) = k·τ``, the saturated rate); the ACK-clocked flow keeps the medium busy with
    A-MPDUs of the ``m`` segments an ACK burst releases, ``w = X·(rtt + P(m))`` with
    ``X = m / P(m)``
    (Little's law: a segment's round trip is the wired one and one exchange period), so
    ``m`` solves ``a·m² + (O + rtt − w·a)·m − w·O = 0``, and a segment costs
    ``P(m)/m = O/m + a``; from ``m ≥ k`` on, ``τ``; below one MPDU an exchange, the
    window per round trip, ``(rtt + P(1))/w``. A point-to-point link (``a = τ``,
    ``k = 1``, ``O = 0``) is the last case: a round trip ``R = rtt + τ`` per window,
    ``R/w`` a segment. The integral over ``u`` by the midpoint rule
    (:data:`WINDOW_LIMITED_POINTS` points)."""
    out = np.zeros(left.shape)
    live = left > 0
    if not live.any():
        return out
    u = (np.arange(WINDOW_LIMITED_POINTS) + 0.5) / WINDOW_LIMITED_POINTS
    span = left[live][:, None]
    w = w0[live][:, None] + span * u / CUBIC_CNT_CLAMP
    k = np.maximum(ampdu_mpdus[live][:, None], 1.0)
    t = tau[live][:, None]
    b = np.minimum(mpdu_air_s[live][:, None], t)
    o = k * (t - b)
    rt = rtt[live][:, None]
    big_b = o + rt - w * b
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(
            b > 0, (-big_b + np.sqrt(big_b * big_b + 4.0 * b * w * o)) / (2.0 * b), w * o / (o + rt)
        )
        per_segment = np.where(m >= k, t, np.where(m < 1.0, (rt + o + b) / w, o / m + b))
    extra = np.maximum(per_segment - t, 0.0)
    out[live] = extra.mean(axis=1) * left[live]
    return out


#: sample paths behind a lossy transfer's expected time
LOSS_PATHS = 1024
#: round trips a path is followed for; the rest of a transfer goes at the last one's rate
LOSS_ROUNDS = 4000


@cache
def _loss_draws(chunk: int) -> np.ndarray:
    """Chunk ``chunk`` of the draws: ``(LOSS_CHUNK_ROUNDS, 4, LOSS_PATHS)`` uniforms, per
    round and path whether a segment is lost, which one, whether its retransmission is
    lost, and whether again; chunk ``i`` from its own stream of :data:`LOSS_SEED`, so the
    draws of a round never depend on how many were made before."""
    seed = np.random.SeedSequence(LOSS_SEED, spawn_key=(chunk,))
    return np.random.default_rng(seed).random((LOSS_CHUNK_ROUNDS, 4, LOSS_PATHS))


def _queue_window(pipe: np.ndarray, r: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """The window at which slow start ends and beyond which no window stands: the pipe
    plus the queue HyStart's delay threshold allows, ``clamp(R/8, 4 ms, 16 ms) / τ``."""
    return pipe + np.clip(r / 8.0, HYSTART_DELAY_MIN_S, HYSTART_DELAY_MAX_S) / tau


def _cubes_s(k: np.ndarray, r: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``Σ_{j=1..m} (k − j·r)³`` element-wise, by the power sums of ``j``."""
    s1 = m * (m + 1.0) / 2.0
    s2 = m * (m + 1.0) * (2.0 * m + 1.0) / 6.0
    return m * k**3 - 3.0 * k * k * r * s1 + 3.0 * k * r * r * s2 - r**3 * s1 * s1


def codel_drop_stall_s(
    segments: ArrayLike, rtt_s: ArrayLike, segment_s: ArrayLike, initial_window: float
) -> np.ndarray:
    """Seconds a loss-free transfer of ``segments`` loses to the drop an AQM (CoDel) makes
    from the queue slow start leaves (item 4 of the module's docstring): with
    ``R = rtt_s + τ``, ``pipe = R/τ``, ``θ = clamp(R/8, 4 ms, 16 ms)``, the link fills in
    round ``K`` (:func:`slow_start_stall_s`' ``K``, after ``S_K`` segments); if
    ``θ − τ > CODEL_TARGET_S`` and segments are still left when the drop is seen,
    ``CODEL_INTERVAL_S + θ + R`` after that, the window falls to ``w₀ = β·(pipe + θ/τ)``;
    round trip ``i`` then leaves ``(pipe − wᵢ)·τ`` idle (the first less the queue's
    ``θ``), ``wᵢ = W_max + C·(i·R − K_c)³``, until ``wᵢ ≥ pipe`` or the segments left are
    sent. 0 where no drop falls."""
    n = np.atleast_1d(np.asarray(segments, dtype=float))
    tau = np.atleast_1d(np.asarray(segment_s, dtype=float))
    rtt = np.atleast_1d(np.asarray(rtt_s, dtype=float))
    n, tau, rtt = np.broadcast_arrays(n, tau, rtt)
    out = np.zeros(n.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = rtt + tau
        theta = np.clip(r / 8.0, HYSTART_DELAY_MIN_S, HYSTART_DELAY_MAX_S)
        live = (n > 0) & (tau > 0) & np.isfinite(tau) & (rtt > 0)
        live &= theta - tau > CODEL_TARGET_S
        pipe = np.where(live, r / tau, 1.0)
        iw = float(initial_window)
        held = (r - iw * tau <= DELAYED_ACK_TIMEOUT_S) & (iw >= 2.0)
        g = np.where(held, iw - 1.0, iw)
        c = np.where(held, 1.0, 0.0)
        fill = _first_power(np.where(live, (pipe - c) / g, 0.0))
        sent = np.where(fill > 0, g * (_pow2(fill) - 1.0) + c, 0.0)
        left = n - sent - (CODEL_INTERVAL_S + theta + r) / np.where(live, tau, 1.0)
    live &= left > 0
    if not live.any():
        return out
    idx = np.flatnonzero(live)
    r, tau, theta, pipe, left = r[idx], tau[idx], theta[idx], pipe[idx], left[idx]
    w_max = pipe + theta / tau
    k_c = np.cbrt(w_max * (1.0 - CUBIC_BETA) / CUBIC_C)
    w0 = CUBIC_BETA * w_max
    lost = np.maximum((pipe - w0) * tau - theta, 0.0)  # the queue drains first
    left = left - np.minimum(w0, pipe)

    def window(i: np.ndarray) -> np.ndarray:  # Cubic's window in round trip i after the cut
        return w_max + CUBIC_C * (i * r - k_c) ** 3

    # rounds i >= 1 below the pipe: i < (K - u*)/R, u* = ∛(θ/(τ·C)); checked both ways
    u_star = np.cbrt(theta / (tau * CUBIC_C))
    below = np.maximum(np.ceil((k_c - u_star) / r) - 1.0, 0.0)
    below = np.where(window(below + 1.0) < pipe, below + 1.0, below)
    below = np.where((below >= 1.0) & (window(below) >= pipe), below - 1.0, below)
    below = np.where((w0 < pipe) & (left > 0), below, 0.0)

    def sent_by(i: np.ndarray) -> np.ndarray:  # segments rounds 1..i send: Σ w_j
        return i * w_max - CUBIC_C * _cubes_s(k_c, r, i)

    # the last round: the first whose sending covers what is left (bisection), or `below`
    lo, hi = np.minimum(below, 1.0), below
    short = sent_by(below) >= left
    hi = np.where(short, hi, lo)
    while (lo < hi).any():
        mid = np.floor((lo + hi) / 2.0)
        enough = sent_by(mid) >= left
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid + 1.0)
    rounds = np.where(short, hi, below)
    # each round j idles (pipe − w_j)·τ = C·τ·(K − jR)³ − θ
    lost = lost + CUBIC_C * tau * _cubes_s(k_c, r, rounds) - rounds * theta
    out[idx] = lost
    return out


def lossy_transfer_times_s(
    d: ArrayLike,
    rtt_s: ArrayLike,
    tau: ArrayLike,
    iw: float,
    p: float,
    cc: CongestionControl = "cubic",
    min_rto_s: float = 0.2,
    draws: np.ndarray | None = None,
) -> np.ndarray:
    """Seconds each sample path takes to deliver ``d`` segments (shape ``(len(d), paths)``)
    at loss rate ``p`` (the module's docstring): rows are transfers (``d``, ``rtt_s``,
    ``tau``: segments, the round trip without serialisation, one segment's
    serialisation), columns paths. ``draws`` (``(rounds, 4, paths)`` uniforms) replaces
    the model's own, for tests that follow a path by hand."""
    given = None if draws is None else np.asarray(draws, dtype=float)
    paths = LOSS_PATHS if given is None else given.shape[2]
    rounds = LOSS_ROUNDS if given is None else given.shape[0]
    dd = np.atleast_1d(np.asarray(d, dtype=float))[:, None]
    tt = np.atleast_1d(np.asarray(tau, dtype=float))[:, None]
    rr = np.atleast_1d(np.asarray(rtt_s, dtype=float))[:, None] + tt
    shape = np.broadcast_shapes(dd.shape, rr.shape, (1, paths))

    def flat(a: np.ndarray) -> np.ndarray:  # one element a path of a transfer, row-major
        return np.broadcast_to(a, shape).ravel().copy()

    # the paths still going, as flat arrays (finished ones are dropped as they finish:
    # every operation is element by element, so no path's arithmetic depends on others)
    ids = np.arange(shape[0] * shape[1])
    path = ids % paths
    tau_, r = flat(tt), flat(rr)
    pipe = r / tau_  # segments a round trip carries at the link's rate
    cap = _queue_window(pipe, r, tau_)
    t0 = r + np.maximum(min_rto_s, r)
    c = np.where((r - iw * tau_ <= DELAYED_ACK_TIMEOUT_S) & (iw >= 2.0), 1.0, 0.0)
    beta = CUBIC_BETA if cc == "cubic" else 0.5
    log_q = np.log1p(-p)

    out = np.zeros(ids.size)
    t = np.zeros(ids.size)
    left = flat(dd)
    w = np.full(ids.size, float(iw))  # segments a round sends
    ssthresh = np.full(ids.size, np.inf)
    in_ss = np.ones(ids.size, dtype=bool)
    w_max = np.zeros(ids.size)  # Cubic's W_max (0: no loss yet)
    origin = np.zeros(ids.size)
    k_s = np.zeros(ids.size)  # Cubic's K
    epoch_s = np.zeros(ids.size)  # time since the epoch began
    for k in range(rounds):
        if ids.size == 0:
            break
        u = (
            _loss_draws(k // LOSS_CHUNK_ROUNDS)[k % LOSS_CHUNK_ROUNDS]
            if given is None
            else given[k]
        )
        lost_u, where_u, rtx_u, again_u = u[0][path], u[1][path], u[2][path], u[3][path]
        held = 0.0 if k == 0 else c  # the segment a delayed ACK holds from round 1 on
        fits = np.where(w + held >= pipe, pipe, w)  # link-limited?
        s = np.minimum(fits, left)
        last = left <= fits
        loss = lost_u >= np.exp(s * log_q)  # P(no loss in s segments) = (1-p)^s

        # no loss: a round trip (the last segments: their serialisation) and growth
        dt_ok = np.where(last, left * tau_, r)
        w_ss = 2.0 * (w - c) if k == 0 else 2.0 * w
        leave_ss = (w_ss >= ssthresh) | (w_ss >= cap)
        w_ss = np.minimum(w_ss, np.minimum(ssthresh, np.maximum(cap, w)))
        if cc == "cubic":
            epoch_next = epoch_s + r
            target = origin + CUBIC_C * (epoch_next - k_s) ** 3
            fw, ft = np.floor(w), np.floor(target)
            cnt = np.maximum(np.floor(fw / np.maximum(ft - fw, 1.0)), 1.0)
            inc = np.where(ft > fw, w / cnt, 0.01)  # else cnt = 100·w: +1/100 a round trip
            inc = np.where(w_max == 0, np.maximum(inc, 0.05 * w), inc)
            w_ca = np.minimum(w + inc, 1.5 * w)
        else:
            epoch_next = epoch_s
            w_ca = w + 0.5
        w_ca = np.minimum(w_ca, np.maximum(cap, w))

        # a loss: fast recovery, or a timeout
        pos = np.floor(where_u * s)  # segments of the round before the lost one
        behind = left - pos - 1.0
        dupacks = np.minimum(w - 1.0, behind) + np.minimum(2.0, np.maximum(behind - (w - 1.0), 0.0))
        timeout = (dupacks < 3.0) | (rtx_u < p)
        dt_loss = np.where(timeout, t0 * np.where(again_u < p, 3.0, 1.0), 2.0 * r)
        got_loss = np.where(timeout, s - 1.0, s + beta * s)
        w_seen = np.where(in_ss, w + pos, w)
        w_max_new = np.where(w_seen < w_max, w_seen * (1.0 + beta) / 2.0, w_seen)
        w_cut = np.maximum(beta * w_seen, 2.0)

        t = t + np.where(loss, dt_loss, dt_ok)
        left = np.maximum(left - np.where(loss, got_loss, s), 0.0)
        grow_ss, grow_ca = ~loss & in_ss, ~loss & ~in_ss
        w_new = np.where(grow_ss, w_ss, np.where(grow_ca, w_ca, w))
        w_new = np.where(loss, np.where(timeout, 1.0, w_cut), w_new)
        epoch_s = np.where(grow_ca, epoch_next, epoch_s)
        ssthresh = np.where(loss, w_cut, ssthresh)
        w_max = np.where(loss, w_max_new, w_max)
        # a new Cubic epoch: after a fast recovery, or when slow start ends
        new_epoch = (loss & ~timeout) | (grow_ss & leave_ss)
        origin = np.where(new_epoch, np.maximum(w_max, w_new), origin)
        k_s = np.where(new_epoch, np.cbrt(np.maximum(w_max - w_new, 0.0) / CUBIC_C), k_s)
        epoch_s = np.where(new_epoch, 0.0, epoch_s)
        in_ss = np.where(loss, timeout, np.where(grow_ss & leave_ss, False, in_ss))
        w = w_new

        done = left <= 0
        if done.any():
            out[ids[done]] = t[done]
            keep = ~done
            ids, path, tau_, r, pipe, cap, t0, c = (
                a[keep] for a in (ids, path, tau_, r, pipe, cap, t0, c)
            )
            t, left, w, ssthresh, in_ss = t[keep], left[keep], w[keep], ssthresh[keep], in_ss[keep]
            w_max, origin, k_s, epoch_s = w_max[keep], origin[keep], k_s[keep], epoch_s[keep]
    # paths still going after the last round: the rest at their last round's rate
    out[ids] = t + left / np.minimum(w, pipe) * r
    return out.reshape(shape)


def _lossy_time_s(
    d: np.ndarray,
    rtt_s: np.ndarray,
    tau: np.ndarray,
    iw: float,
    p: float,
    cc: CongestionControl,
    min_rto_s: float,
) -> np.ndarray:
    """Expected seconds to send ``d`` segments at loss rate ``p``: the mean of
    :func:`lossy_transfer_times_s`' paths."""
    return lossy_transfer_times_s(d, rtt_s, tau, iw, p, cc, min_rto_s).mean(axis=1)


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
    queue: Queue = "fq_codel",
    mpdu_air_s: ArrayLike = 0.0,
    ampdu_mpdus: ArrayLike = 1.0,
    flows: ArrayLike = 1.0,
) -> np.ndarray:
    """Expected seconds a transfer of ``nbytes`` takes beyond ``8·nbytes / goodput_bps``
    (and its one-way latency) as a finite TCP flow: set-up, slow start and, with a loss
    rate, loss recovery and congestion avoidance below the link's rate (the module's
    docstring). ``goodput_bps`` is the payload rate the link gives the flow (its rate
    times :func:`header_efficiency`); ``rtt_s`` the round trip of the path without
    serialisation; ``queue`` the bottleneck's (``fq_codel``: item 4's drop after slow
    start); ``mpdu_air_s`` and ``ampdu_mpdus`` the aggregating MAC the flow's goodput
    comes through (an 802.11ax station's: the air time an MPDU of its own adds to the
    cell's cycle, and the MPDUs an A-MPDU of the goodput carries; ``flows`` the stations
    sharing the cell; ``mpdu_air_s`` 0: a link that serialises segment by segment,
    :func:`slow_start_stall_s`). 0 for ``nbytes <= 0``; inf where the goodput is 0."""
    shape = np.broadcast(nbytes, goodput_bps, rtt_s).shape
    # at least 1-d: numpy times a 0-d array's powers with the C library's pow and an
    # array's with its SIMD kernels (AVX-512 ones differ in the last bit), so one
    # transfer timed alone (SimPy) and in a column (the closed form) must both be arrays
    nb = np.atleast_1d(np.asarray(nbytes, dtype=float))
    g = np.atleast_1d(np.asarray(goodput_bps, dtype=float))
    rtt = np.atleast_1d(np.asarray(rtt_s, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = np.where(g > 0, 8.0 * mss_bytes / g, np.inf)  # one segment's serialisation
    tau = np.where(np.isfinite(tau), tau, 0.0)  # no rate: inf below, whatever the rest
    d = np.ceil(nb / mss_bytes)  # segments
    r = rtt + tau
    extra = setup_round_trips * r
    iw = float(initial_window)
    p = float(loss_rate)
    if p <= 0.0:
        air = np.asarray(mpdu_air_s, dtype=float)
        mac = (air, ampdu_mpdus, flows) if bool(np.any(air > 0)) else (None,)
        extra = extra + slow_start_stall_s(d, rtt, tau, iw, *mac)
        if queue == "fq_codel":
            extra = extra + codel_drop_stall_s(d, rtt, tau, iw)
    else:
        extra = extra + _lossy_time_s(d, rtt, tau, iw, p, congestion_control, min_rto_s) - d * tau
    out = np.where(g > 0, extra, np.inf)
    return np.where(nb > 0, out, 0.0).reshape(shape)


@dataclass(frozen=True)
class TcpColumns:
    """One direction's TCP flows of a round's clients as columns (the closed form's
    :class:`TcpFlow` s): their common parameters (``flow``, whose ``rtt_s`` and
    ``flows`` are unused) and each client's round trip and flow count."""

    flow: TcpFlow
    rtt_s: np.ndarray
    flows: np.ndarray
    mpdu_air_s: np.ndarray | None = None
    ampdu_mpdus: np.ndarray | None = None

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
        if all(cast(TcpFlow, f).mpdu_air_s == 0.0 for f in flows):
            return cls(first, rtt, count)
        exchange = np.array([cast(TcpFlow, f).mpdu_air_s for f in flows], dtype=float)
        mpdus = np.array([cast(TcpFlow, f).ampdu_mpdus for f in flows], dtype=float)
        return cls(first, rtt, count, exchange, mpdus)

    def extra_s(
        self, at: np.ndarray | slice, nbytes: np.ndarray, goodput_bps: np.ndarray
    ) -> np.ndarray:
        """:meth:`TcpFlow.extra_array` of rows ``at``' transfers, element-wise."""
        f = self.flow
        mac: dict[str, np.ndarray] = {}
        if self.mpdu_air_s is not None and self.ampdu_mpdus is not None:
            mac = {
                "mpdu_air_s": self.mpdu_air_s[at],
                "ampdu_mpdus": self.ampdu_mpdus[at],
                "flows": self.flows[at],
            }
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
            queue=f.queue,
            **mac,
        )


@dataclass(frozen=True)
class TcpFlow:
    """A link direction's TCP transfers as the engine times them: each transfer of ``n``
    bytes takes :func:`tcp_extra_s` more than its bits at the link's goodput, computed at
    ``goodput / flows`` (on a shared medium, the flow's fair share of it: ``flows`` is
    the number of the round's flows on that medium; 1 on a dedicated link).

    ``rtt_s`` is this client-round's round trip (the scenario's one-way latencies of both
    directions, jitter included). ``mpdu_air_s`` and ``ampdu_mpdus``: on an aggregating
    MAC (an 802.11ax station), the air time one more MPDU of its own adds to the cell's
    cycle (its subframe and half a TCP ACK's in the access point's A-MPDU) and the MPDUs
    an A-MPDU of its goodput carries; 0 and 1 on a link that serialises segment by
    segment (:func:`tcp_extra_s`)."""

    rtt_s: float
    mss_bytes: int = TCP_MSS_BYTES
    initial_window: int = 10
    setup_round_trips: int = 0
    loss_rate: float = 0.0
    congestion_control: CongestionControl = "cubic"
    min_rto_s: float = 0.2
    flows: int = 1
    queue: Queue = "fq_codel"
    mpdu_air_s: float = 0.0
    ampdu_mpdus: float = 1.0

    def __post_init__(self) -> None:
        if not (self.rtt_s >= 0 and self.mss_bytes > 0 and self.initial_window >= 1):
            raise ValueError(f"{self!r}: rtt_s >= 0, mss_bytes > 0, initial_window >= 1")
        if self.flows < 1:
            raise ValueError(f"{self!r}: flows must be >= 1")
        if not (self.mpdu_air_s >= 0 and self.ampdu_mpdus >= 1):
            raise ValueError(f"{self!r}: mpdu_air_s >= 0, ampdu_mpdus >= 1")

    def kind(self) -> tuple[object, ...]:
        """The parameters a direction's flows share (all but ``rtt_s``, ``flows`` and the
        MAC's ``mpdu_air_s`` and ``ampdu_mpdus``)."""
        return (
            self.mss_bytes,
            self.initial_window,
            self.setup_round_trips,
            self.loss_rate,
            self.congestion_control,
            self.min_rto_s,
            self.queue,
        )

    @property
    def adds_time(self) -> bool:
        """Can a transfer take longer than its bits? Not with no round trip, no set-up
        and no loss: then the window never limits the flow (:func:`slow_start_stall_s`
        is 0), and every engine path times the link as ``latency + bits / goodput``."""
        return self.rtt_s > 0 or self.setup_round_trips > 0 or self.loss_rate > 0

    def extra_s(self, nbytes: float, goodput_bps: float) -> float:
        """:func:`tcp_extra_s` of one transfer on this link (at ``goodput / flows``); a
        lossy one, or one through fq_codel with a round trip, is remembered (sample paths
        cost milliseconds, the AQM's drop a hundred microseconds, and a round's transfers
        repeat from round to round on fixed rates)."""
        if self.loss_rate > 0 or (self.queue == "fq_codel" and self.rtt_s > 0):
            return _remembered_extra_s(
                self.kind(),
                self.rtt_s,
                self.flows,
                float(nbytes),
                float(goodput_bps),
                self.mpdu_air_s,
                self.ampdu_mpdus,
            )
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
            queue=self.queue,
            mpdu_air_s=self.mpdu_air_s,
            ampdu_mpdus=self.ampdu_mpdus,
            flows=self.flows,
        )


@lru_cache(maxsize=1 << 16)
def _remembered_extra_s(
    kind: tuple[object, ...],
    rtt_s: float,
    flows: int,
    nbytes: float,
    goodput_bps: float,
    mpdu_air_s: float = 0.0,
    ampdu_mpdus: float = 1.0,
) -> float:
    """:meth:`TcpFlow.extra_s` of a lossy flow or one through fq_codel, remembered (the
    same arithmetic as :meth:`TcpFlow.extra_array`: the cache changes no bit)."""
    mss, iw, setup, loss, cc, min_rto, queue = kind
    return float(
        tcp_extra_s(
            np.asarray(nbytes),
            np.asarray(goodput_bps, dtype=float) / flows,
            rtt_s,
            mss_bytes=cast(int, mss),
            initial_window=cast(int, iw),
            setup_round_trips=cast(int, setup),
            loss_rate=cast(float, loss),
            congestion_control=cast(CongestionControl, cc),
            min_rto_s=cast(float, min_rto),
            queue=cast(Queue, queue),
            mpdu_air_s=np.asarray(mpdu_air_s),
            ampdu_mpdus=np.asarray(ampdu_mpdus),
            flows=np.asarray(float(flows)),
        )
    )
