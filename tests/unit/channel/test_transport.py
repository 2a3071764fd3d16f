"""Latency, jitter and packet loss: the Mathis goodput and transfer times against numbers
worked out by hand, through the network model and the engine, and replayed / swept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mecsim.channel.transport import (
    MATHIS_C,
    jittered_latency_s,
    mathis_goodput_bps,
    transfer_time_s,
)
from mecsim.emulation.engine import ClientSpec, NetworkSpec, ServerSpec, time_round
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Backhaul, Compute, Download, Upload
from mecsim.scenario import ScenarioError, scenario_from_dict
from mecsim.store.session import run_in_folder


def test_mathis_hand_numbers():
    assert MATHIS_C == pytest.approx(1.2247449, rel=1e-7)
    # MSS 1460 B, RTT 100 ms, p = 1 %: 11680 bit / (0.1 s * 0.1) * 1.2247449 = 1.43050 Mbit/s
    assert mathis_goodput_bps(10e6, 0.1, 0.01) == pytest.approx(1_430_502.1, rel=1e-7)
    assert mathis_goodput_bps(1e6, 0.1, 0.01) == 1e6  # capped by the link rate
    assert mathis_goodput_bps(10e6, 0.1, 0.0) == 10e6  # no loss: the link rate
    assert mathis_goodput_bps(10e6, 0.0, 0.01) == 10e6  # no round trip: no window limit
    # MSS 536 B, RTT 20 ms, p = 1e-4: 4288 / (0.02 * 0.01) * 1.2247449 = 26.2585 Mbit/s
    assert mathis_goodput_bps(1e9, 0.02, 1e-4, 536) == pytest.approx(26_258_530.6, rel=1e-7)
    np.testing.assert_allclose(
        mathis_goodput_bps([1e9, 1e5], [0.1, 0.1], 0.01), [1_430_502.1, 1e5], rtol=1e-7
    )
    with pytest.raises(ValueError, match="loss_rate"):
        mathis_goodput_bps(1e6, 0.1, 1.0)


def test_transfer_time_and_jitter_hand_numbers():
    # 1 MB at 1.4305021 Mbit/s + 50 ms: 8e6 / 1430502.1 + 0.05 = 5.5924420 + 0.05 s
    assert transfer_time_s(1e6, 1_430_502.1, 0.05) == pytest.approx(5.6424420, rel=1e-7)
    assert transfer_time_s(0, 1e6, 0.05) == 0.0  # nothing sent, no latency
    assert math.isinf(transfer_time_s(10, 0.0, 0.05))
    np.testing.assert_allclose(
        jittered_latency_s(0.05, 0.02, [-1.0, 0.0, 0.5, 1.0]), [0.03, 0.05, 0.06, 0.07]
    )
    assert jittered_latency_s(0.01, 0.05, -1.0) == 0.0  # clipped at 0


def _scenario(**channel_links):
    # the ideal transport these hand numbers are worked for (tests/unit/channel/test_tcp.py: tcp)
    up = {"rate_bps": 10e6, "transport": "ideal", **channel_links.get("uplink", {})}
    down = {"rate_bps": 10e6, "transport": "ideal", **channel_links.get("downlink", {})}
    data = {
        "topology": {"clients": 4},
        "channel": {"model": "fixed_rate", "uplink": up, "downlink": down},
        "backhaul": {"transport": "ideal", **channel_links.get("backhaul", {})},
    }
    return scenario_from_dict(data, "test.yaml")


def test_fixed_rate_round_with_latency_and_loss_hand_computed():
    sc = _scenario(uplink={"latency_s": 0.03, "loss_rate": 0.01}, downlink={"latency_s": 0.02})
    specs, servers, net, rec = NetworkModel(sc, device_profiles(sc)).round(0, [2, 0])
    # RTT = 0.03 + 0.02 = 0.05 s; uplink goodput = 11680 * 1.2247449 / (0.05 * 0.1)
    up_good = 11680 * math.sqrt(1.5) / (0.05 * math.sqrt(0.01))
    assert up_good == pytest.approx(2_861_004.2, rel=1e-7)
    for cid in (0, 2):
        assert specs[cid].uplink_rate_bps == pytest.approx(up_good, rel=1e-12)
        assert specs[cid].downlink_rate_bps == 10e6
        assert (specs[cid].uplink_latency_s, specs[cid].downlink_latency_s) == (0.03, 0.02)
        assert rec[cid]["uplink_goodput_bps"] == pytest.approx(up_good, rel=1e-12)
        assert rec[cid]["uplink_latency_s"] == 0.03
    trace = (Download(1_000_000), Compute(0.0, 0), Upload(1_000_000))
    t = time_round({0: trace, 2: trace}, specs, servers, net)
    # download 8e6 / 10e6 + 0.02 = 0.82 s; upload 8e6 / 2861004.2 + 0.03 = 2.826224 s
    assert t.download_s == pytest.approx(0.82, rel=1e-12)
    assert t.upload_s == pytest.approx(8e6 / up_good + 0.03, rel=1e-12)
    assert t.round_time_s == pytest.approx(0.82 + 2.7962211 + 0.03, rel=1e-7)
    assert (
        t.round_time_s
        == time_round({0: trace, 2: trace}, specs, servers, net, method="simpy").round_time_s
    )  # both paths agree


def test_shared_medium_latency_after_the_share():
    # two 10 Mbit uploads on one 10 Mbit/s medium: both done at 2 s, arriving 0.1 s later
    spec = {c: ClientSpec(c, 10e6, 10e6, 0.0, 1e9, uplink_latency_s=0.1) for c in (0, 1)}
    trace = (Upload(1_250_000),)
    t = time_round({0: trace, 1: trace}, spec, [ServerSpec(1e9)], NetworkSpec(uplink_shared=True))
    assert [c.finish_s for c in t.clients] == [pytest.approx(2.1), pytest.approx(2.1)]


def test_jitter_seeded_within_bounds_and_per_round():
    sc = _scenario(
        uplink={"latency_s": 0.05, "jitter_s": 0.02}, downlink={"latency_s": 0.01, "jitter_s": 0.01}
    )
    net = NetworkModel(sc, device_profiles(sc))
    a = net.round(3, [0, 1, 2, 3])[0]
    b = NetworkModel(sc, device_profiles(sc)).round(3, [0, 1, 2, 3])[0]  # same seed, round
    c = net.round(4, [0, 1, 2, 3])[0]
    ul = [a[i].uplink_latency_s for i in range(4)]
    assert ul == [b[i].uplink_latency_s for i in range(4)]  # reproducible
    assert ul != [c[i].uplink_latency_s for i in range(4)]  # drawn per round
    assert all(0.03 <= x <= 0.07 for x in ul) and len(set(ul)) == 4
    assert all(0.0 <= a[i].downlink_latency_s <= 0.02 for i in range(4))


def test_backhaul_loss_hand_computed():
    sc = _scenario(backhaul={"bandwidth_bps": 1e9, "latency_s": 0.01, "loss_rate": 0.001})
    _, servers, _, rec = NetworkModel(sc, device_profiles(sc)).round(0, [0])
    # RTT = 2 * 0.01; 11680 * 1.2247449 / (0.02 * sqrt(0.001)) = 22.6182 Mbit/s
    good = 11680 * math.sqrt(1.5) / (0.02 * math.sqrt(0.001))
    assert servers[0].backhaul_bps == pytest.approx(good, rel=1e-12)
    assert good == pytest.approx(22_618_222.7, rel=1e-7)
    assert rec[0]["backhaul_goodput_bps"] == servers[0].backhaul_bps
    assert rec[0]["backhaul_latency_s"] == 0.01
    t = time_round(
        {0: (Backhaul(1_000_000),)}, {0: ClientSpec(0, 1e6, 1e6, 0.0, 1e9)}, servers, NetworkSpec()
    )
    assert t.round_time_s == pytest.approx(0.01 + 8e6 / good, rel=1e-12)


def test_no_transport_settings_change_nothing():
    sc = _scenario()
    specs, servers, _, rec = NetworkModel(sc, device_profiles(sc)).round(0, [0, 1])
    assert specs[0].uplink_rate_bps == 10e6 and specs[0].uplink_latency_s == 0.0
    assert servers[0].backhaul_latency_s == 0.005 and servers[0].backhaul_bps == 1e9


@pytest.mark.parametrize(
    "channel,field,fragment",
    [
        (
            {
                "model": "fixed_rate",
                "uplink": {"rate_bps": 1e6, "loss_rate": 0.01},
                "downlink": {"rate_bps": 1e6},
            },
            "channel.uplink.loss_rate",
            "round-trip",
        ),
        (
            {"model": "shannon", "downlink": {"loss_rate": 0.02}},
            "channel.downlink.loss_rate",
            "round-trip",
        ),
        (
            {
                "model": "fixed_rate",
                "uplink": {"rate_bps": 1e6, "loss_rate": 1.0, "latency_s": 0.1},
                "downlink": {"rate_bps": 1e6},
            },
            "channel.uplink.loss_rate",
            "less than 1",
        ),
        (
            {"model": "shannon", "uplink": {"jitter_s": -0.1}},
            "channel.uplink.jitter_s",
            "greater than or equal to 0",
        ),
    ],
)
def test_bad_transport_settings_refused_with_the_field(channel, field, fragment):
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict({"channel": channel}, "bad.yaml")
    line = str(e.value)
    assert line.startswith(f"bad.yaml: {field}: ") and fragment in line
    assert len(line.splitlines()) == 1


def test_backhaul_loss_needs_latency():
    with pytest.raises(ScenarioError, match=r"bad.yaml: backhaul.loss_rate: .*round-trip"):
        scenario_from_dict({"backhaul": {"latency_s": 0.0, "loss_rate": 0.01}}, "bad.yaml")


def test_loss_rate_swept_from_the_command_line_hand_computed(tmp_path):
    """Record a tiny run once, then `mecsim sweep --set channel.uplink.loss_rate=...`:
    each point's upload time is 8 * bytes / min(rate, Mathis) + latency."""
    import pandas as pd

    from mecsim.interfaces.cli import main

    sc = scenario_from_dict(
        {
            "name": "tiny-loss",
            "rounds": 2,
            "seed": 5,
            "topology": {"clients": 3},
            "dataset": {"train_size": 300, "test_size": 60},
            "channel": {
                "model": "fixed_rate",
                "uplink": {"rate_bps": 2e6, "transport": "ideal"},
                "downlink": {"rate_bps": 8e6, "transport": "ideal"},
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
    assert (
        main(
            [
                "sweep",
                str(rec),
                "--set",
                "channel.uplink.loss_rate=0,0.001,0.05",
                "--set",
                "channel.uplink.latency_s=0.05",
                "--metric",
                "ul_time_mean_s",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    df = pd.read_csv(out / "sweep.csv")
    assert (out / "sweep.png").stat().st_size > 0
    for p, expected_bps in (
        (0.0, 2e6),
        (0.001, 2e6),  # the bound 9.05 Mbit/s > 2 Mbit/s
        (0.05, 11680 * math.sqrt(1.5) / (0.05 * math.sqrt(0.05))),
    ):
        row = df[df["channel.uplink.loss_rate"] == p].iloc[0]
        assert bool(row["exact"])
        assert row["ul_time_mean_s"] == pytest.approx(8 * nbytes / expected_bps + 0.05, rel=1e-12)
    assert expected_bps == pytest.approx(1_279_479.9, rel=1e-7)  # p = 5 %: binds
    # the bare loss rate without a round trip is refused, naming the field
    assert (
        main(
            [
                "sweep",
                str(rec),
                "--set",
                "channel.uplink.loss_rate=0.01",
                "--out",
                str(tmp_path / "bad"),
                "--quiet",
            ]
        )
        == 2
    )
