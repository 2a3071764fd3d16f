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
    header_efficiency,
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
    # K: 12 ms · 2^K >= 41.2 ms -> K = 2 (48 ms). j: 10·(2^(j+1) - 1) >= 553 -> j = 5.
    # k = 2: stall = 2 · 41.2 - 10 · (4 - 1) · 1.2 = 82.4 - 36 = 46.4 ms
    assert float(slow_start_stall_s(553, 0.04, 0.0012, 10)) == pytest.approx(0.0464, abs=1e-12)
    # the whole transfer: 20 ms + 553 · 1.2 ms (its wire bits) + 46.4 ms = 0.7298 s
    # (the last segment is 752 bytes, so 8·800,040/goodput is 0.66364 s, not 0.6636)
    good = 10e6 * EFF
    total = 0.02 + 8 * MODEL_BYTES / good + float(tcp_extra_s(MODEL_BYTES, good, 0.04))
    assert total == pytest.approx(0.02 + 8 * 800_040 * 1500 / 1448 / 10e6 + 0.0464, rel=1e-12)
    assert total == pytest.approx(0.72942, abs=1e-5)


def test_slow_start_at_100_mbps_is_most_of_the_transfer():
    # τ = 0.12 ms, R = 40.12 ms: K = 6 (1.2 ms · 64 = 76.8 ms >= R); j = 5 (10·63 >= 553)
    # k = 5: stall = 5 · 40.12 - 10 · 31 · 0.12 = 200.6 - 37.2 = 163.4 ms
    good = 100e6 * EFF
    assert float(tcp_extra_s(MODEL_BYTES, good, 0.04)) == pytest.approx(0.1634, abs=1e-12)


def test_slow_start_edges():
    # no round trip: the window never limits (R = τ, iw·τ >= R)
    assert float(slow_start_stall_s(553, 0.0, 0.0012, 10)) == 0.0
    # everything fits in the initial window: no stall, whatever the round trip
    assert float(slow_start_stall_s(10, 0.5, 0.0012, 10)) == 0.0
    # 11 segments: one round trip to get the 11th going: R - 10·τ
    assert float(slow_start_stall_s(11, 0.1, 0.001, 10)) == pytest.approx(0.101 - 0.01)
    # exactly at a round's boundary: 30 segments end round 1 (10 + 20), k = 1
    assert float(slow_start_stall_s(30, 0.1, 0.001, 10)) == pytest.approx(0.101 - 0.01)
    assert float(slow_start_stall_s(31, 0.1, 0.001, 10)) == pytest.approx(2 * 0.101 - 0.03)
    # a link filled from the start (iw·τ >= R): K = 0
    assert float(slow_start_stall_s(10_000, 0.001, 0.001, 10)) == 0.0
    # zero segments and an infinitely slow link add nothing here (the bits are inf)
    assert float(slow_start_stall_s(0, 0.1, 0.001, 10)) == 0.0
    assert float(tcp_extra_s(0, 1e6, 0.1)) == 0.0
    assert math.isinf(float(tcp_extra_s(10, 0.0, 0.1)))


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


def _lossy_by_hand(d, rtt, tau, p, beta, alpha, iw=10, min_rto=0.2, rounds=300):
    """The loss model of mecsim.channel.tcp written out with floats, one step at a time."""
    q = 1 - p
    r = rtt + tau

    def qto(w):  # Padhye et al.'s Q(p, w)
        if w <= 3:
            return 1.0
        return min(1.0, (1 - q**3) * (1 + q**3 * (1 - q ** (w - 3))) / (1 - q**w))

    d_ss = min(d, (1 - q**d) * q / p + 1)
    t0 = max(min_rto, 2 * r)
    z = (1 + p + 2 * p**2 + 4 * p**3 + 8 * p**4 + 16 * p**5 + 32 * p**6) * t0 / q
    w = (d_ss + iw) / 2
    t = float(slow_start_stall_s(d_ss, rtt, tau, iw)) + d_ss * tau
    t += (1 - q**d) * (qto(w) * z + (1 - qto(w)) * r)
    w, left, pipe = max(beta * w, 1.0), d - d_ss, r / tau
    for _ in range(rounds):
        if left <= 0:
            break
        sent = min(w, pipe)
        dt = left * tau if left <= sent else r
        hit = 1 - q ** min(sent, left)
        dt += hit * (qto(w) * z + (1 - qto(w)) * r + p * z)
        t, left = t + dt, left - sent
        w = max((1 - hit * (1 - beta)) * w + alpha, 1.0)
    if left > 0:
        t += left / min(w, pipe) * r
    return t - d * tau


def test_loss_recovery_at_10_mbps_1_percent_step_by_step():
    """p = 0.01, d = 553, R = 41.2 ms: E[d_ss] = 99.618 segments before the first loss,
    then the window's expected course through congestion avoidance."""
    p, d, tau = 0.01, 553, 0.0012
    q = 1 - p
    assert (1 - q**d) * q / p + 1 == pytest.approx(99.618, abs=1e-3)
    good = 10e6 * EFF
    got = float(tcp_extra_s(MODEL_BYTES, good, 0.04, loss_rate=p))
    cubic = _lossy_by_hand(d, 0.04, tau, p, 0.7, 3 * 0.3 / 1.7)
    assert got == pytest.approx(cubic, rel=1e-9)
    reno = float(tcp_extra_s(MODEL_BYTES, good, 0.04, loss_rate=p, congestion_control="newreno"))
    assert reno == pytest.approx(_lossy_by_hand(d, 0.04, tau, p, 0.5, 0.5), rel=1e-9)
    assert reno > got  # halving and +1/2 a round trip recover slower than Cubic's AIMD
    # ns-3 (validation/reference/tcp.json, 30 seeds): 1.444 s Cubic, 0.768-5.476 s; here
    # 20 ms + 0.66364 s of bits + the extra
    assert 0.02 + 8 * MODEL_BYTES / good + got == pytest.approx(1.28, abs=0.01)


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
        nbytes = rng.integers(1, 50_000_000, size=50).astype(float)
        good = rng.uniform(1e5, 1e9, size=50)
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
    assert t.round_time_s == pytest.approx(0.72942, abs=1e-5)  # the hand number above
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
    # at 100 Mb/s each flow's fair share (10 Mb/s) ramps as one flow at 10 Mb/s does: +46.4 ms
    fast = _fixed(
        up={"rate_bps": 100e6, "latency_s": 0.02, "shared": True},
        down={"latency_s": 0.02},
        clients=10,
    )
    specs, servers, net, _ = NetworkModel(fast, device_profiles(fast)).round(0, list(range(10)))
    t = time_round(traces, specs, servers, net)
    expect = 10 * 8 * MODEL_BYTES / (100e6 * EFF) + 0.02 + 0.0464
    assert t.round_time_s == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("loss", [0.0, 0.002])
def test_every_engine_path_times_tcp_flows_alike(loss):
    """Random rounds with TCP flows on dedicated links: closed form == SimPy to the bit;
    on a shared medium the auto path (SimPy) and the events/media paths' refusal."""
    rng = np.random.default_rng(3)
    longer = 0
    for _ in range(60):
        n = int(rng.integers(1, 12))
        traces, specs = {}, {}
        for cid in range(n):
            ops = []
            for _ in range(int(rng.integers(1, 5))):
                k = int(rng.integers(3))
                size = int(rng.integers(0, 3_000_000))
                ops.append(
                    Download(size) if k == 0 else Upload(size) if k == 2 else Compute(1e9, 5)
                )
            traces[cid] = tuple(ops)
            rtt = float(rng.choice([0.0, rng.uniform(0.001, 0.2)]))
            flow = TcpFlow(rtt, loss_rate=loss)
            specs[cid] = ClientSpec(
                cid,
                float(rng.uniform(1e5, 1e9)),
                float(rng.uniform(1e5, 1e9)),
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
    assert longer > 30  # most rounds had flows that add time


def test_bad_transport_fields_are_refused_naming_the_field():
    for link, field in (
        ({"initial_window_segments": 0}, "initial_window_segments"),
        ({"mss_bytes": 0}, "mss_bytes"),
        ({"connection": "udp"}, "connection"),
        ({"transport": "quic"}, "transport"),
        ({"congestion_control": "bbr"}, "congestion_control"),
        ({"min_rto_s": 0}, "min_rto_s"),
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
