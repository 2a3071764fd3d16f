"""A finite TCP flow (:mod:`mecsim.channel.tcp`) against numbers worked out by hand, and
through the scenario, the network model and every engine path.

The hand numbers: 800,040 bytes (MTFL's 2NN model) are 553 segments of 1,448 bytes;
1,500 bytes on the wire each (52 of header), so a goodput of rate · 1448/1500.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mecsim.channel.tcp import (
    TcpColumns,
    TcpFlow,
    codel_drop_stall_s,
    header_efficiency,
    lossy_transfer_times_s,
    slow_start_stall_s,
    tcp_extra_s,
)
from mecsim.emulation.engine import ClientSpec, NetworkSpec, ServerSpec, time_round
from mecsim.emulation.engine.closed_form import _closed_form_timelines
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.scenario import ScenarioError, load_recorded_scenario, scenario_from_dict

MODEL_BYTES = 800_040
EFF = 1448 / 1500


def test_header_efficiency_is_payload_over_wire():
    assert header_efficiency(1448, 52) == pytest.approx(0.965333333, rel=1e-9)
    assert header_efficiency(1460, 0) == 1.0


def test_slow_start_at_10_mbps_20_ms_by_hand():
    # τ = 12,000 bit / 10 Mb/s = 1.2 ms; R = 40 ms + τ = 41.2 ms; iw·τ = 12 ms.
    # R - iw·τ = 29.2 ms <= 40 ms: a delayed ACK holds a segment a round (g = 9, c = 1).
    # K: (9·2^K + 1)·1.2 ms >= 41.2 ms -> 2^K >= 3.70 -> K = 2.
    # j: 9·(2^(j+1) - 1) + 1 >= 553 -> 2^(j+1) >= 62.3 -> j = 5.
    # k = 2: S_2 = 9·3 + 1 = 28; stall = 2 · 41.2 - 28 · 1.2 = 82.4 - 33.6 = 48.8 ms
    assert float(slow_start_stall_s(553, 0.04, 0.0012, 10)) == pytest.approx(0.0488, abs=1e-12)
    # the whole transfer: 20 ms + 553 · 1.2 ms (its wire bits) + 48.8 ms = 0.7318 s
    # (the last segment is 752 bytes, so 8·800,040/goodput is 0.66364 s, not 0.6636)
    good = 10e6 * EFF
    total = 0.02 + 8 * MODEL_BYTES / good + float(tcp_extra_s(MODEL_BYTES, good, 0.04))
    assert total == pytest.approx(0.02 + 8 * 800_040 * 1500 / 1448 / 10e6 + 0.0488, rel=1e-12)
    assert total == pytest.approx(0.73182, abs=1e-5)


def test_slow_start_at_100_mbps_is_most_of_the_transfer():
    # τ = 0.12 ms, R = 40.12 ms, held (R - 1.2 ms <= 40 ms): K = 6 ((9·64 + 1)·0.12 ms
    # >= R); j = 5 (9·63 + 1 >= 553). k = 5: S_5 = 9·31 + 1 = 280;
    # stall = 5 · 40.12 - 280 · 0.12 = 200.6 - 33.6 = 167.0 ms
    good = 100e6 * EFF
    assert float(tcp_extra_s(MODEL_BYTES, good, 0.04)) == pytest.approx(0.1670, abs=1e-12)


def test_a_delayed_ack_costs_a_200_kb_transfer_a_fifth_round_as_in_ns3():
    """200 kB = 139 segments at 100 Mb/s, 20 ms each way: the rounds send 10, 18, 36, 72
    (136 segments), so the last 3 go in a fifth round. ns-3.37 (validation/reference,
    200000B-100M-20ms): 0.180771 s. Doubling (10, 20, 40, 80) would end a round early:
    0.1485 s, 18 % short."""
    good = 100e6 * EFF
    # k = 4: S_4 = 9·15 + 1 = 136; stall = 4 · 40.12 - 136 · 0.12 = 144.16 ms
    assert float(tcp_extra_s(200_000, good, 0.04)) == pytest.approx(0.14416, abs=1e-12)
    total = 0.02 + 8 * 200_000 / good + 0.14416
    assert total == pytest.approx(0.180735, abs=1e-6)
    assert abs(total / 0.180771146 - 1) < 0.001


def test_slow_start_edges():
    # no round trip: the window never limits (R = τ, iw·τ >= R)
    assert float(slow_start_stall_s(553, 0.0, 0.0012, 10)) == 0.0
    # everything fits in the initial window: no stall, whatever the round trip
    assert float(slow_start_stall_s(10, 0.5, 0.0012, 10)) == 0.0
    assert float(slow_start_stall_s(10, 0.02, 0.001, 10)) == 0.0
    # a long round trip (R - iw·τ > 40 ms): the delayed-ACK timer fires within the round
    # and the rounds send 10, 20, 40: 11 segments need one round trip more: R - 10·τ
    assert float(slow_start_stall_s(11, 0.1, 0.001, 10)) == pytest.approx(0.101 - 0.01)
    # exactly at a round's boundary: 30 segments end round 1 (10 + 20), k = 1
    assert float(slow_start_stall_s(30, 0.1, 0.001, 10)) == pytest.approx(0.101 - 0.01)
    assert float(slow_start_stall_s(31, 0.1, 0.001, 10)) == pytest.approx(2 * 0.101 - 0.03)
    # a short one (R = 21 ms): rounds of 10, 18, 36 (S_1 = 10, S_2 = 28)
    assert float(slow_start_stall_s(11, 0.02, 0.001, 10)) == pytest.approx(0.021 - 0.010)
    assert float(slow_start_stall_s(28, 0.02, 0.001, 10)) == pytest.approx(0.021 - 0.010)
    assert float(slow_start_stall_s(29, 0.02, 0.001, 10)) == pytest.approx(0.042 - 0.028)
    # an initial window of 1: nothing to pair with, its ACK is the timer's: doubling
    assert float(slow_start_stall_s(4, 0.02, 0.001, 1)) == pytest.approx(2 * 0.021 - 3 * 0.001)
    # a link filled from the start (iw·τ >= R): K = 0
    assert float(slow_start_stall_s(10_000, 0.001, 0.001, 10)) == 0.0
    # zero segments and an infinitely slow link add nothing here (the bits are inf)
    assert float(slow_start_stall_s(0, 0.1, 0.001, 10)) == 0.0
    assert float(tcp_extra_s(0, 1e6, 0.1)) == 0.0
    assert math.isinf(float(tcp_extra_s(10, 0.0, 0.1)))


def test_the_ack_train_ends_slow_start_on_a_short_fast_path_by_hand():
    """800,040 bytes (553 segments) at 1 Gb/s, 1 ms one way: τ = 1448·8/(1e9·1448/1500)
    = 12 µs, R = 2 ms + τ. Round 0's 10 segments leave a gap of R − 10τ = 1.89 ms ≤ 2 ms
    before round 1's first ACK, and the next window is 19 (≥ 16 with an ACK to spare):
    HyStart's ACK train ends slow start there (stall R − 10τ), and Cubic before its
    first loss grows the window a segment per 20 ACKed, w = 19 + u/20, a window per
    round trip: the 543 segments left idle ∫ (R/w − τ) du = 20·R·ln(46.15/19) − 543·τ."""
    tau = 8 * 1448 / (1e9 * 1448 / 1500)
    r = 0.002 + tau
    by_hand = (r - 10 * tau) + 20 * r * math.log((19 + 543 / 20) / 19) - 543 * tau
    got = float(slow_start_stall_s(553, 0.002, tau, 10))
    assert got == pytest.approx(by_hand, rel=1e-4)
    assert by_hand == pytest.approx(0.03109, rel=1e-3)
    # the same transfer 2 ms one way: round 0 leaves a gap of 3.89 ms, round 1 (19) 3.78
    # ms, more than the ACK delta: no train; the last segment leaves in round 5 (S_6 =
    # 9·63 + 1 = 568 ≥ 553), before the link fills: 5·R − S_5·τ, S_5 = 9·31 + 1 = 280
    r2 = 0.004 + tau
    assert float(slow_start_stall_s(553, 0.004, tau, 10)) == pytest.approx(5 * r2 - 280 * tau)


def test_the_ack_train_against_ns3_on_point_to_point_links():
    """ns-3.37 (validation/ns3/tcp_flows.cc, Cubic with HyStart, seed 1): 800,040 bytes,
    1 ms one way — 0.03984 s at 1 Gb/s and 0.04390 s at 200 Mb/s (0.01435 s and
    0.03665 s with the ACK-train test off, --ns3::TcpCubic::HyStartDetect=2); 2 ms one way
    at 1 Gb/s, 0.02535 s either way. mecsim within 6 %."""
    for delay_s, rate_bps, ns3_s in (
        (0.001, 1e9, 0.03984),
        (0.001, 2e8, 0.04390),
        (0.002, 1e9, 0.02535),
    ):
        goodput = rate_bps * header_efficiency(1448, 52)
        t = delay_s + 8 * 800_040 / goodput + float(tcp_extra_s(800_040, goodput, 2 * delay_s))
        assert t == pytest.approx(ns3_s, rel=0.06), (delay_s, rate_bps, t)


def test_a_window_limited_flow_on_an_aggregating_mac_by_hand():
    """A MAC whose cycle of A-MPDUs of m MPDUs takes P(m) = O + m·a, a = 0.5, k = 10,
    τ = P(k)/k = 1 (O = 5): at window w = 11.667 with a round trip of 10 on the wire,
    m = 5 solves m·(1 + 10/P(m)) = w (P(5) = 7.5), and a segment costs P(5)/5 = 1.5,
    0.5 more than at the saturated rate; a point-to-point link (a = τ, k = 1) at w = 5
    spends the round trip R = 10 + 1 per window: 11/5 − 1 = 1.2 a segment."""
    from mecsim.channel.tcp import _window_limited_s

    def one(w, a, k):
        arr = [np.array([v], dtype=float) for v in (0.02, w, 10.0, 1.0, a, k)]
        return float(_window_limited_s(*arr)[0]) / 0.02

    assert one(5 * (1 + 10 / 7.5), 0.5, 10) == pytest.approx(0.5, rel=1e-3)
    assert one(5.0, 1.0, 1.0) == pytest.approx(1.2, rel=1e-3)
    # at the window that fills the A-MPDU (m = k: w = 10·(1 + 10/10) = 20) nothing more
    assert one(20.0, 0.5, 10) == pytest.approx(0.0, abs=1e-3)


def test_a_station_sharing_its_cell_trains_with_the_medium_s_idle_share_by_hand():
    """Two stations in a cell (flows 2), τ = 0.1 ms a segment at the fair share (0.05 ms
    at the station's own rate), an MPDU adding a = 20 µs to the cycle, k = 42: the
    cell-mate's fixed part between two rounds is k·(τ − 2a)·(2 − 1)/2 = 1.26 ms, so with
    1 ms of wire each way a round trip is R = 2 ms + τ + 1.26 ms = 3.36 ms. Plain slow
    start: rounds of 10, 18, 36 (delayed ACKs, g = 9, c = 1), the link full from round
    K = 2 ((9·4 + 1)·τ ≥ R), the 139 segments' last in round 4: stall 2·R − S_2·τ =
    6.72 − 2.8 = 3.92 ms. The ACK train, as the station alone would have it (a round trip
    of 2 ms + 0.05 ms): round 0 leaves 2.05 − 10·0.05 = 1.55 ms <= 2 ms, round 1
    2.05 − 19·0.05 = 1.1 ms; it holds where the round's first ACKs find the medium free
    of the cell-mate, whose fixed part and A-MPDU of the same window take 1.26 + 10·0.02
    = 1.46 ms of round 0's 3.36 (chance 1.9/3.36) and 1.26 + 19·0.02 = 1.64 ms of round
    1's (chance 1.72/3.36). The exit after round 0 costs R − S_1·τ = 3.36 − 1.0 = 2.36 ms
    and the window-limited flow of the 129 segments left from a window of 19; after
    round 1, 2·R − S_2·τ = 3.92 ms and the 111 left from 37. The stall is the
    expectation over the three outcomes. With 0.5 ms of wire each way the same, R =
    2.36 ms (plain: 4.72 − 2.8 = 1.92 ms)."""
    from mecsim.channel.tcp import _window_limited_s

    tau, a, k = 0.1e-3, 20e-6, 42.0

    def limited(left: float, w0: float, rtt: float, air: float = 2 * a) -> float:
        # the cell's time an MPDU: each station's a, two stations
        args = [np.array([v]) for v in (left, w0, rtt, tau, air, k)]
        return float(_window_limited_s(*args)[0])

    for rtt in (0.002, 0.001):
        r = rtt + tau + 1.26e-3
        plain = 2 * r - 28 * tau
        p0 = 1.0 - (1.26e-3 + 10 * a) / r
        p1 = 1.0 - (1.26e-3 + 19 * a) / r
        after_0 = r - 10 * tau + limited(129, 19, rtt)
        after_1 = 2 * r - 28 * tau + limited(111, 37, rtt)
        by_hand = p0 * after_0 + (1 - p0) * (p1 * after_1 + (1 - p1) * plain)
        got = float(slow_start_stall_s(139, rtt, tau, 10, a, k, 2.0))
        assert got == pytest.approx(by_hand, rel=1e-9)
        # between the plain slow start and an exit after round 0 for certain
        assert plain < got < after_0
    # the chances are the figures above: 0.5655 and 0.5119 with 1 ms each way
    assert 1.0 - 1.46e-3 / 3.36e-3 == pytest.approx(0.565476, abs=1e-6)
    # alone in its cell (flows 1, the same τ: R = 2.1 ms) no cell-mate holds the medium:
    # R − 10·τ = 1.1 ms <= 2 ms, and the train ends slow start after round 0 (a window of
    # 19) for certain, a window-limited flow after it: longer than slow start to the full
    # link would take, 2·R − 28·τ = 1.4 ms
    alone = float(slow_start_stall_s(139, 0.002, tau, 10, a, k, 1.0))
    assert alone == pytest.approx(0.0021 - 10 * tau + limited(129, 19, 0.002, a), rel=1e-9)
    assert alone > 2 * (0.002 + tau) - 28 * tau + 1e-3


def test_the_aqm_drop_after_slow_start_by_hand():
    """R = 0.12 + τ = 0.122 s with τ = 2 ms: pipe 61 segments; HyStart's θ = R/8 =
    15.25 ms (a queue of 7.625 segments), θ − τ = 13.25 ms > CoDel's 5 ms target. No
    delayed ACK holds a segment (R − 10τ = 102 ms > 40 ms): rounds of 10, 20, 40, 80; the
    link fills in round 3 after 70 segments. The drop is seen 100 ms + θ + R = 237.25 ms
    (118.625 segments) later: 188.625 segments in. W_max = 68.625, cut to 48.0375; round 0
    idles (61 − 48.0375)·2 ms less the queue's 15.25 ms = 10.675 ms. K = ∛(68.625·0.3/0.4)
    = 3.71976 s; round 1's window 68.625 + 0.4·(0.122 − K)³ = 49.9975 (22.005 ms idle),
    round 2's 51.8289 (18.342 ms)."""
    # 236 segments: 47.375 left at the cut, sent in round 0
    assert codel_drop_stall_s(236, 0.12, 0.002, 10)[0] == pytest.approx(0.010675, abs=1e-12)
    # 188: done before the drop is seen
    assert codel_drop_stall_s(188, 0.12, 0.002, 10)[0] == 0.0
    # 300: 111.375 left; round 0 sends 48.04, round 1 49.997, round 2 the last 13.34
    three = 0.010675 + (61 - 49.9974653224) * 0.002 + (61 - 51.8289130174) * 0.002
    assert codel_drop_stall_s(300, 0.12, 0.002, 10)[0] == pytest.approx(three, abs=1e-9)
    # a long transfer: every round until Cubic's window is back at the pipe, (K − t)³ <=
    # 7.625/0.4, t >= 1.0487 s: rounds 1-8 idle, round 9's window is above the pipe
    k = (68.625 * 0.3 / 0.4) ** (1 / 3)
    rounds = [61 - (68.625 + 0.4 * (i * 0.122 - k) ** 3) for i in range(1, 10)]
    assert rounds[7] > 0 > rounds[8]
    whole = 0.010675 + 0.002 * sum(rounds[:8])
    assert codel_drop_stall_s(100_000, 0.12, 0.002, 10)[0] == pytest.approx(whole, abs=1e-9)


def test_no_aqm_drop_where_the_queue_stays_below_the_target():
    # 20 ms each way at 10 Mb/s: θ = 41.2/8 = 5.15 ms, θ − τ = 3.95 ms < 5 ms: no drop
    # (the grid's 20 ms cases, which ns-3 times as through a FIFO)
    assert codel_drop_stall_s(5000, 0.04, 0.0012, 10)[0] == 0.0
    # 30 ms each way: θ = 7.65 ms, θ − τ = 6.45 ms: a drop
    assert codel_drop_stall_s(5000, 0.06, 0.0012, 10)[0] > 0.0
    # no round trip, no rate, nothing to send: nothing
    assert codel_drop_stall_s(
        [5000, 5000, 0], [0.0, 0.06, 0.06], [0.0012, np.inf, 0.0012], 10
    ).tolist() == [0.0, 0.0, 0.0]
    # a flow through fq_codel (the default) pays it, through a FIFO not
    g = 8 * 1448 / 0.002
    codel = tcp_extra_s(300 * 1448, g, 0.12)
    fifo = tcp_extra_s(300 * 1448, g, 0.12, queue="fifo")
    assert codel - fifo == pytest.approx(codel_drop_stall_s(300, 0.12, 0.002, 10)[0], abs=1e-12)
    flow = TcpFlow(0.12, queue="fifo")
    assert flow.extra_s(300 * 1448, g) == pytest.approx(float(fifo), abs=1e-15)


def test_connection_set_up_is_round_trips():
    good = 10e6 * EFF
    base = float(tcp_extra_s(MODEL_BYTES, good, 0.04))
    r = 0.04 + 8 * 1448 / good  # one round trip with a segment's serialisation
    assert float(tcp_extra_s(MODEL_BYTES, good, 0.04, setup_round_trips=1)) == pytest.approx(
        base + r, rel=1e-12
    )
    assert float(tcp_extra_s(MODEL_BYTES, good, 0.04, setup_round_trips=2)) == pytest.approx(
        base + 2 * r, rel=1e-12
    )


def _draws(rounds, **at):
    """One path's draws: no loss in any round but those given as ``{round: (which,
    retransmission, again)}`` (``which``: the lost segment's place in the round, 0-1)."""
    u = np.zeros((rounds, 4, 1))
    u[:, 1:, 0] = 0.5
    for k, (which, rtx, again) in at.items():
        u[int(k[1:]), :, 0] = (0.999999, which, rtx, again)
    return u


def test_a_lossy_path_by_hand():
    """100 segments, R = 41.2 ms, τ = 1.2 ms (pipe 34.33, queue window 38.63: HyStart's
    threshold R/8 = 5.15 ms = 4.29 segments), iw 10, a delayed ACK holding one (c = 1).
    Rounds 0, 1: 10, 18 segments, no loss (t = 82.4 ms, 72 left, window 36).
    Round 2 sends the pipe, 34.33, and loses its 18th (pos 17): 54 segments behind it,
    35 + 2 duplicate ACKs: fast recovery, 2·R, delivering 34.33 · 1.7 = 58.37 (13.63 left);
    slow start's ACKs had grown the window to 36 + 17 = 53: W_max 53, cut to 37.1.
    Round 3: the last 13.63 segments at the link's rate: 16.36 ms. 0.18116 s."""
    u = _draws(6, r2=(0.5, 0.5, 0.5))
    got = lossy_transfer_times_s(100, 0.04, 0.0012, 10, 0.01, "cubic", 0.2, draws=u)
    assert got.shape == (1, 1)
    assert float(got[0, 0]) == pytest.approx(0.0824 + 0.0824 + 13.6333333 * 0.0012, abs=1e-9)
    # NewReno halves: 53 -> 26.5, recovery delivers 34.33 · 1.5 = 51.5 (20.5 left), the
    # window-limited last round sends them back to back: 24.6 ms
    reno = lossy_transfer_times_s(100, 0.04, 0.0012, 10, 0.01, "newreno", 0.2, draws=u)
    assert float(reno[0, 0]) == pytest.approx(0.1648 + 20.5 * 0.0012, abs=1e-9)
    # the same, and a loss in the last round among its last segments (pos 13 of 13.63):
    # no segment behind it, no duplicate ACK: a timeout, Linux's T0 = SRTT + max(4·RTTVAR,
    # 0.2 s) = R + max(R, 0.2) = 0.2412 s; the last segment then goes alone (window 1):
    # 1.2 ms. 0.1648 + 0.2412 + 0.0012 = 0.4072 s
    tail = _draws(6, r2=(0.5, 0.5, 0.5), r3=(0.99, 0.5, 0.5))
    got = lossy_transfer_times_s(100, 0.04, 0.0012, 10, 0.01, "cubic", 0.2, draws=tail)
    assert float(got[0, 0]) == pytest.approx(0.4072, abs=1e-9)
    # a lost retransmission times out too, and backs off (3·T0) when lost again
    rtx = _draws(6, r2=(0.5, 0.0, 0.5))
    got = lossy_transfer_times_s(100, 0.04, 0.0012, 10, 0.01, "cubic", 0.2, draws=rtx)
    again = _draws(6, r2=(0.5, 0.0, 0.0))
    worse = lossy_transfer_times_s(100, 0.04, 0.0012, 10, 0.01, "cubic", 0.2, draws=again)
    assert float(worse[0, 0]) - float(got[0, 0]) == pytest.approx(2 * 0.2412, abs=1e-9)
    # on a long round trip the timeout follows it: R = 0.3 s gives T0 = 0.3 + 0.3 = 0.6 s
    slow = lossy_transfer_times_s(100, 0.2988, 0.0012, 10, 0.01, "cubic", 0.2, draws=again)
    quick = lossy_transfer_times_s(100, 0.2988, 0.0012, 10, 0.01, "cubic", 0.2, draws=rtx)
    assert float(slow[0, 0]) - float(quick[0, 0]) == pytest.approx(2 * 0.6, abs=1e-9)


def test_the_lossy_expectation_is_the_mean_of_its_paths():
    good = 10e6 * EFF
    tau = 8 * 1448 / good
    paths = lossy_transfer_times_s(553, 0.04, tau, 10, 0.01)
    assert paths.shape == (1, 1024)
    got = float(tcp_extra_s(MODEL_BYTES, good, 0.04, loss_rate=0.01))
    assert got == pytest.approx(paths.mean() - 553 * tau, rel=1e-12)
    # single transfers spread: some finish in the loss-free time, some pay timeouts
    clean = 553 * tau + float(slow_start_stall_s(553, 0.04, tau, 10))
    assert clean <= paths.min() < 1.1 * clean and paths.max() > 2 * clean
    # ns-3.37 (validation/reference/tcp.json, 100 seeds): 1.726 s, 0.76-5.53 s
    assert 0.02 + 8 * MODEL_BYTES / good + got == pytest.approx(1.709, abs=0.001)
    reno = float(tcp_extra_s(MODEL_BYTES, good, 0.04, loss_rate=0.01, congestion_control="newreno"))
    assert reno > got  # halving and +1/2 a round trip recover slower than Cubic


def test_a_tiny_loss_rate_tends_to_the_loss_free_flow():
    good = 10e6 * EFF
    clean = float(tcp_extra_s(MODEL_BYTES, good, 0.04))
    assert float(tcp_extra_s(MODEL_BYTES, good, 0.04, loss_rate=1e-9)) == pytest.approx(
        clean, rel=1e-5
    )
    # and the expectation grows with the loss rate
    times = [
        float(tcp_extra_s(MODEL_BYTES, good, 0.04, loss_rate=p)) for p in (1e-4, 1e-3, 1e-2, 0.05)
    ]
    assert times == sorted(times)


def test_flow_scalar_and_columns_agree_bit_for_bit():
    """SimPy times a transfer with TcpFlow.extra_s, the closed form with TcpColumns: the
    same floats (the closed form equals SimPy to the bit)."""
    rng = np.random.default_rng(7)
    for loss in (0.0, 0.003):
        flows = [
            TcpFlow(float(rng.uniform(0, 0.3)), loss_rate=loss, flows=int(rng.integers(1, 9)))
            for _ in range(50)
        ]
        cols = TcpColumns.of(flows)
        assert cols is not None
        top, slowest = (50_000_000, 1e5) if loss == 0 else (3_000_000, 1e6)  # paths cost
        nbytes = rng.integers(1, top, size=50).astype(float)
        good = rng.uniform(slowest, 1e9, size=50)
        one = [f.extra_s(b, g) for f, b, g in zip(flows, nbytes, good, strict=True)]
        assert cols.extra_s(slice(None), nbytes, good).tolist() == one


def test_wifi_flows_scalar_and_columns_agree_bit_for_bit():
    """Flows on an aggregating MAC (an 802.11ax cell's stations: mpdu_air_s, ampdu_mpdus)
    through both paths: the same floats."""
    rng = np.random.default_rng(11)
    flows = [
        TcpFlow(
            float(rng.uniform(0.0, 0.004)),
            flows=int(rng.integers(1, 4)),
            mpdu_air_s=float(rng.uniform(20e-6, 200e-6)),
            ampdu_mpdus=float(rng.integers(20, 64)),
        )
        for _ in range(40)
    ]
    cols = TcpColumns.of(flows)
    assert cols is not None and cols.mpdu_air_s is not None
    nbytes = rng.integers(1, 3_000_000, size=40).astype(float)
    good = rng.uniform(50e6, 600e6, size=40)
    one = [f.extra_s(b, g) for f, b, g in zip(flows, nbytes, good, strict=True)]
    assert cols.extra_s(slice(None), nbytes, good).tolist() == one


def test_columns_of_flows_that_add_no_time_are_none():
    assert TcpColumns.of([TcpFlow(0.0), TcpFlow(0.0)]) is None
    assert TcpColumns.of([None, None]) is None
    assert not TcpColumns.uniform([TcpFlow(0.1), TcpFlow(0.1, loss_rate=0.01)])
    with pytest.raises(ValueError, match="initial_window"):
        TcpFlow(0.1, initial_window=0)


def _fixed(up=None, down=None, clients=4, **extra):
    return scenario_from_dict(
        {
            "topology": {"clients": clients},
            "channel": {
                "model": "fixed_rate",
                "uplink": {"rate_bps": 10e6, **(up or {})},
                "downlink": {"rate_bps": 10e6, **(down or {})},
            },
            **extra,
        },
        "tcp.yaml",
    )


def test_a_scenario_times_an_upload_as_a_tcp_flow_by_default():
    sc = _fixed(up={"latency_s": 0.02}, down={"latency_s": 0.02})
    assert sc.channel.uplink.transport == "tcp" and sc.channel.uplink.segment_bytes() == 1448
    nm = NetworkModel(sc, device_profiles(sc))
    specs, servers, net, rows = nm.round(0, [0])
    assert specs[0].uplink_rate_bps == pytest.approx(10e6 * EFF, rel=1e-15)
    assert rows[0]["uplink_goodput_bps"] == specs[0].uplink_rate_bps
    t = time_round({0: (Upload(MODEL_BYTES),)}, specs, servers, net)
    assert t.round_time_s == pytest.approx(0.73182, abs=1e-5)  # the hand number above
    ideal = _fixed(
        up={"latency_s": 0.02, "transport": "ideal"}, down={"latency_s": 0.02, "transport": "ideal"}
    )
    assert ideal.channel.uplink.segment_bytes() == 1460  # what its Mathis bound always used
    specs_i, servers_i, net_i, _ = NetworkModel(ideal, device_profiles(ideal)).round(0, [0])
    ti = time_round({0: (Upload(MODEL_BYTES),)}, specs_i, servers_i, net_i)
    assert ti.round_time_s == 0.02 + 8 * MODEL_BYTES / 10e6


def test_ten_flows_share_a_medium_each_ramping_at_its_fair_share():
    """10 flows share 10 Mb/s with 20 ms each way: each one's slow start at 1 Mb/s
    (τ = 12 ms, iw·τ = 120 ms >= R = 52 ms) never leaves the link idle: all ten end at
    10 · 8 · 800,040 · 1500/1448 / 10 Mb/s + 20 ms = 6.65017 s."""
    sc = _fixed(up={"latency_s": 0.02, "shared": True}, down={"latency_s": 0.02}, clients=10)
    nm = NetworkModel(sc, device_profiles(sc))
    specs, servers, net, _ = nm.round(0, list(range(10)))
    assert {s.uplink_tcp.flows for s in specs.values()} == {10}
    traces = {c: (Upload(MODEL_BYTES),) for c in specs}
    t = time_round(traces, specs, servers, net)
    assert t.round_time_s == pytest.approx(10 * 8 * MODEL_BYTES / (10e6 * EFF) + 0.02, rel=1e-12)
    # at 100 Mb/s each flow's fair share (10 Mb/s) ramps as one flow at 10 Mb/s does: +48.8 ms
    fast = _fixed(
        up={"rate_bps": 100e6, "latency_s": 0.02, "shared": True},
        down={"latency_s": 0.02},
        clients=10,
    )
    specs, servers, net, _ = NetworkModel(fast, device_profiles(fast)).round(0, list(range(10)))
    t = time_round(traces, specs, servers, net)
    expect = 10 * 8 * MODEL_BYTES / (100e6 * EFF) + 0.02 + 0.0488
    assert t.round_time_s == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("loss", [0.0, pytest.param(0.002, marks=pytest.mark.slow)])
def test_every_engine_path_times_tcp_flows_alike(loss):
    """Random rounds with TCP flows on dedicated links: closed form == SimPy to the bit;
    on a shared medium the auto path (SimPy) and the events/media paths' refusal."""
    rng = np.random.default_rng(3)
    longer = 0
    rounds = 60 if loss == 0 else 30  # a lossy transfer's sample paths cost milliseconds
    for _ in range(rounds):
        n = int(rng.integers(1, 12))
        traces, specs = {}, {}
        for cid in range(n):
            ops = []
            for _ in range(int(rng.integers(1, 5))):
                k = int(rng.integers(3))
                size = int(rng.integers(0, 3_000_000 if loss == 0 else 300_000))
                ops.append(
                    Download(size) if k == 0 else Upload(size) if k == 2 else Compute(1e9, 5)
                )
            traces[cid] = tuple(ops)
            rtt = float(rng.choice([0.0, rng.uniform(0.001, 0.2)]))
            flow = TcpFlow(rtt, loss_rate=loss)
            specs[cid] = ClientSpec(
                cid,
                float(rng.uniform(1e5 if loss == 0 else 2e6, 1e9)),
                float(rng.uniform(1e5 if loss == 0 else 2e6, 1e9)),
                0.01,
                5e9,
                uplink_latency_s=rtt / 2,
                downlink_latency_s=rtt / 2,
                uplink_tcp=flow,
                downlink_tcp=flow,
            )
        net = NetworkSpec()
        assert _closed_form_timelines(traces, specs, net) is not None
        fast = time_round(traces, specs, [ServerSpec(1e10)], net)
        slow = time_round(traces, specs, [ServerSpec(1e10)], net, method="simpy")
        assert fast == slow
        longer += any(s.adds_time() for s in specs.values())
    assert longer > rounds // 2  # most rounds had flows that add time


def test_bad_transport_fields_are_refused_naming_the_field():
    for link, field in (
        ({"initial_window_segments": 0}, "initial_window_segments"),
        ({"mss_bytes": 0}, "mss_bytes"),
        ({"connection": "udp"}, "connection"),
        ({"transport": "quic"}, "transport"),
        ({"congestion_control": "bbr"}, "congestion_control"),
        ({"min_rto_s": 0}, "min_rto_s"),
        ({"queue": "red"}, "queue"),
        ({"latency_s": 1e308}, "latency_s"),
    ):
        with pytest.raises(ScenarioError, match=rf"tcp.yaml: channel.uplink.{field}"):
            _fixed(up=link)


def test_a_recorded_scenario_without_transport_loads_as_ideal(tmp_path):
    """Run folders written before transfers were TCP flows were timed as bits / rate: a
    replay or resume of one keeps that."""
    text = (
        "channel:\n  model: fixed_rate\n  uplink: {rate_bps: 1.0e+6, mss_bytes: 1460}\n"
        "  downlink: {rate_bps: 1.0e+6}\nbackhaul: {bandwidth_bps: 1.0e+9}\n"
    )
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    sc = load_recorded_scenario(path)
    assert sc.channel.uplink.transport == sc.channel.downlink.transport == "ideal"
    assert sc.backhaul.transport == "ideal" and sc.channel.downlink.segment_bytes() == 1460
    path.write_text(text.replace("mss_bytes: 1460", "transport: tcp"))
    assert load_recorded_scenario(path).channel.uplink.transport == "tcp"


@pytest.mark.slow
def test_transport_is_a_sweep_axis_replayed_exactly(tmp_path):
    """Record a tiny run once (transport ideal), then sweep the uplink's transport and
    latency: each point's upload is the hand formula of its transport, and the points
    are replays (exact), not retraining."""
    import pandas as pd

    from mecsim.interfaces.cli import main
    from mecsim.store.session import run_in_folder

    sc = scenario_from_dict(
        {
            "name": "tiny-tcp",
            "rounds": 2,
            "seed": 5,
            "topology": {"clients": 3},
            "dataset": {"train_size": 300, "test_size": 60},
            "channel": {
                "model": "fixed_rate",
                "uplink": {"rate_bps": 10e6, "transport": "ideal"},
                "downlink": {"rate_bps": 10e6, "transport": "ideal"},
            },
            "execution": {"backend": "local"},
            "metrics": {"enabled": False},
        },
        "tiny.yaml",
    )
    rec = tmp_path / "rec"
    run_in_folder(sc, rec)
    nbytes = int(pd.read_csv(rec / "clients.csv")["bytes_up"].iloc[0])
    out = tmp_path / "sweep"
    args = ["sweep", str(rec), "--set", "channel.uplink.transport=ideal,tcp"]
    args += ["--set", "channel.uplink.latency_s=0.02", "--set", "channel.downlink.latency_s=0.02"]
    assert main([*args, "--metric", "ul_time_mean_s", "--out", str(out), "--quiet"]) == 0
    df = pd.read_csv(out / "sweep.csv")
    ideal = df[df["channel.uplink.transport"] == "ideal"].iloc[0]
    tcp = df[df["channel.uplink.transport"] == "tcp"].iloc[0]
    assert bool(ideal["exact"]) and bool(tcp["exact"])
    assert ideal["ul_time_mean_s"] == pytest.approx(8 * nbytes / 10e6 + 0.02, rel=1e-12)
    good = 10e6 * EFF
    expect = 8 * nbytes / good + float(tcp_extra_s(nbytes, good, 0.04)) + 0.02
    assert tcp["ul_time_mean_s"] == pytest.approx(expect, rel=1e-12)
    assert tcp["ul_time_mean_s"] > ideal["ul_time_mean_s"]
