"""Energy per client-round against numbers worked out by hand; through a real run, its
records, summary and report; and as a sweep metric."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from mecsim.emulation.devices import DeviceProfile, builtin_profiles
from mecsim.emulation.energy import (
    ENERGY_KEYS,
    air_rate_bps,
    client_energy,
    radio_tx_power_w,
    round_energy,
)
from mecsim.emulation.engine import (
    ClientSpec,
    ClientTimeline,
    NetworkSpec,
    RateSchedule,
    ServerSpec,
    time_round,
)
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.scenario import ScenarioError, scenario_from_dict
from mecsim.store.session import run_in_folder

PI = DeviceProfile(
    "pi",
    1e9,
    0.0,
    2**30,
    active_power_w=6.4,
    idle_power_w=2.7,
    radio_tx_power_w=1.0,  # a measured transmit draw: the figure, whatever the dBm
    radio_rx_power_w=0.3,
    sleep_power_w=1.2,
)
#: the built-in radio model: P_tx / 0.25 + 0.2 W, 20 dBm where the channel gives none
PI_PA = DeviceProfile(
    "pi-pa",
    1e9,
    0.0,
    2**30,
    active_power_w=6.4,
    idle_power_w=2.7,
    radio_rx_power_w=0.3,
    radio_pa_efficiency=0.25,
    radio_circuit_power_w=0.2,
    radio_tx_power_dbm=20.0,
    sleep_power_w=1.2,
)


def _timeline(download_s, compute_s, upload_s, finish_s, cid=0):
    return ClientTimeline(
        cid, 0.0, finish_s, download_s, compute_s, upload_s, 0.0, math.isfinite(finish_s)
    )


def test_hand_computed_client_round():
    # download 2e6 B at 8 Mbit/s = 2 s, compute 10 s, upload 2.5e6 B at 4 Mbit/s = 5 s;
    # finish 17 s, the round ends at 20 s (a slower client):
    # compute 6.4 * 10 = 64 J; radio 1.0 * 5 + 0.3 * 2 = 5.6 J; idle 2.7 * (20 - 10) = 27 J
    trace = (Download(2_000_000), Compute(1e10, 0), Upload(2_500_000))
    spec = ClientSpec(0, 4e6, 8e6, 0.0, 1e9)
    e = client_energy(PI, _timeline(2.0, 10.0, 5.0, 17.0), trace, spec, 20.0, idle_policy="idle")
    assert e == pytest.approx(
        {
            "energy_j": 96.6,
            "energy_compute_j": 64.0,
            "energy_radio_j": 5.6,
            "energy_idle_j": 27.0,
            "energy_sleep_j": 0.0,
        }
    )


def test_air_time_excludes_latency_and_sharing():
    # two 10 Mbit uploads share a 10 Mbit/s medium (2 s each elapsed, 1 s each on the air)
    # and arrive 0.5 s later; nothing else: 2.5 s round
    specs = {c: ClientSpec(c, 10e6, 10e6, 0.0, 1e9, uplink_latency_s=0.5) for c in (0, 1)}
    traces = {c: (Upload(1_250_000),) for c in (0, 1)}
    t = time_round(traces, specs, [ServerSpec(1e9)], NetworkSpec(uplink_shared=True))
    assert t.round_time_s == pytest.approx(2.5)
    for tl in t.clients:
        e = client_energy(
            PI, tl, traces[tl.client_id], specs[tl.client_id], t.round_time_s, idle_policy="idle"
        )
        # radio 1.0 W x 1 s on the air; idle 2.7 W x 2.5 s; no compute
        assert e["energy_radio_j"] == pytest.approx(1.0)
        assert e["energy_idle_j"] == pytest.approx(6.75)
        assert e["energy_j"] == pytest.approx(7.75)


def test_rate_schedule_air_time_is_transfer_less_latency():
    sched = RateSchedule((0.0, 1.0), (4e6, 8e6))  # 4 Mbit in the first second, then 8 Mbit/s
    spec = ClientSpec(0, sched, 1e6, 0.0, 1e9, uplink_latency_s=0.25)
    trace = (Upload(1_500_000),)  # 12 Mbit: 1 s at 4 + 1 s at 8 Mbit/s = 2 s, + 0.25 s
    t = time_round({0: trace}, {0: spec}, [ServerSpec(1e9)], NetworkSpec())
    assert t.upload_s == pytest.approx(2.25)
    e = client_energy(PI, t.clients[0], trace, spec, t.round_time_s, idle_policy="idle")
    assert e["energy_radio_j"] == pytest.approx(2.0)  # 1.0 W x 2 s


def test_dropped_and_stuck_clients():
    trace = (Compute(1e9, 0), Upload(1_000_000))
    # dropped at a 5 s deadline but finishing at 9 s: counted until 9 s
    late = _timeline(0.0, 1.0, 8.0, 9.0)
    spec = ClientSpec(0, 1e6, 1e6, 0.0, 1e9)
    e = client_energy(PI, late, trace, spec, 5.0, idle_policy="idle")
    assert e["energy_idle_j"] == pytest.approx(2.7 * 8) and e["energy_radio_j"] == 8.0
    # a link at 0 bit/s never finishes: idle until the round ends, nothing on the air
    stuck = _timeline(0.0, 1.0, math.inf, math.inf)
    e = client_energy(PI, stuck, trace, ClientSpec(0, 0.0, 1e6, 0.0, 1e9), 30.0, idle_policy="idle")
    assert e == pytest.approx(
        {
            "energy_j": 6.4 + 2.7 * 29,
            "energy_compute_j": 6.4,
            "energy_radio_j": 0.0,
            "energy_idle_j": 2.7 * 29,
            "energy_sleep_j": 0.0,
        }
    )
    # stuck computing (a CPU at 0 FLOP/s): active until the round ends
    e = client_energy(
        PI, _timeline(0.0, math.inf, 0.0, math.inf), trace, spec, 12.0, idle_policy="idle"
    )
    assert e["energy_compute_j"] == pytest.approx(6.4 * 12) and e["energy_idle_j"] == 0.0
    # a round that never ends has no energy
    assert all(
        math.isnan(v)
        for v in client_energy(PI, stuck, trace, spec, math.inf, idle_policy="idle").values()
    )


def test_profile_without_power_is_nan_and_round_sums():
    bare = DeviceProfile("bare", 1e9, 0.0, 2**30)
    e = client_energy(
        bare,
        _timeline(0, 1, 0, 1),
        (Compute(1e9, 0),),
        ClientSpec(0, 1e6, 1e6, 0.0, 1e9),
        1.0,
        idle_policy="sleep",
    )
    assert all(math.isnan(e[k]) for k in ENERGY_KEYS)
    rows = [
        {
            "energy_j": 3.5,
            "energy_compute_j": 1.0,
            "energy_radio_j": 0.5,
            "energy_idle_j": 1.5,
            "energy_sleep_j": 0.5,
        }
    ] * 2
    assert round_energy(rows) == {
        "energy_j": 7.0,
        "energy_compute_j": 2.0,
        "energy_radio_j": 1.0,
        "energy_idle_j": 3.0,
        "energy_sleep_j": 1.0,
    }


def test_builtin_profiles_have_sourced_power():
    for name in ("rpi2b", "rpi3b", "rpi4", "rpi5", "jetson-nano"):
        p = builtin_profiles()[name]
        assert 0 < p.sleep_power_w < p.idle_power_w < p.active_power_w, name
        assert p.radio_tx_power_w is None  # no fixed transmit draw: the PA model
        assert (p.radio_pa_efficiency, p.radio_circuit_power_w) == (0.25, 0.2), name
        assert p.radio_tx_power_dbm == 20.0 and p.radio_rx_power_w == 0.3, name
        assert p.power_source.split(":")[0] in ("measured", "estimate"), name
        assert p.radio_power_source.startswith("estimate"), name
        assert p.sleep_power_source.split(":")[0].split(" ")[0] in ("measured", "guess"), name
    # the sources' figures (Pi Dramble; Jeff Geerling's sbc-reviews for the Pi 5; his
    # halted Pi 5, 1.2-1.6 W)
    pi = builtin_profiles()
    assert (pi["rpi2b"].idle_power_w, pi["rpi2b"].active_power_w) == (1.1, 2.1)
    assert (pi["rpi4"].idle_power_w, pi["rpi4"].active_power_w) == (2.7, 6.4)
    assert (pi["rpi5"].idle_power_w, pi["rpi5"].active_power_w) == (2.8, 9.7)
    assert pi["rpi5"].sleep_power_w == 1.4


def test_radio_transmit_power_from_the_radiated_power_by_hand():
    # P_radio_tx = P_tx / eta_PA + P_circuit, P_tx = 10^((dBm - 30) / 10) W:
    # 23 dBm = 10^-0.7 = 0.199526 W -> / 0.25 = 0.798105 W -> + 0.2 = 0.998105 W
    assert radio_tx_power_w(PI_PA, 23.0) == pytest.approx(0.998105, abs=1e-6)
    # 30 dBm = 1 W -> 4 W + 0.2 = 4.2 W (what KAPC's Table 4 upper bound costs the client)
    assert radio_tx_power_w(PI_PA, 30.0) == pytest.approx(4.2, rel=1e-12)
    # no dBm from the channel (fixed-rate, trace): the profile's 20 dBm = 0.1 W -> 0.6 W
    assert radio_tx_power_w(PI_PA) == pytest.approx(0.6, rel=1e-12)
    assert radio_tx_power_w(PI_PA, math.nan) == pytest.approx(0.6, rel=1e-12)
    # a measured draw is the figure, at any dBm; no figures at all: None (energy NaN)
    assert radio_tx_power_w(PI, 30.0) == 1.0
    assert radio_tx_power_w(DeviceProfile("bare", 1e9, 0.0, 2**30), 23.0) is None
    # through a client's round: upload 2.5e6 B at 4 Mbit/s = 5 s on the air at 23 dBm:
    # 0.998105 * 5 = 4.990525 J; download 2e6 B at 8 Mbit/s = 2 s at 0.3 W = 0.6 J
    trace = (Download(2_000_000), Compute(1e10, 0), Upload(2_500_000))
    spec = ClientSpec(0, 4e6, 8e6, 0.0, 1e9)
    tl = _timeline(2.0, 10.0, 5.0, 17.0)
    e = client_energy(PI_PA, tl, trace, spec, 17.0, idle_policy="idle", tx_power_dbm=23.0)
    assert e["energy_radio_j"] == pytest.approx(4.990525 + 0.6, abs=1e-6)
    # the built-in profiles carry the same model (rpi4 at 30 dBm: 4.2 W)
    assert radio_tx_power_w(builtin_profiles()["rpi4"], 30.0) == pytest.approx(4.2)


def test_sleep_after_the_clients_own_finish_by_hand():
    # download 2 s, compute 10 s, upload 5 s: the client finishes at 17 s; the round ends
    # at 20 s (a slower client). idle_policy sleep: 3 s asleep at 1.2 W = 3.6 J; idle
    # 2.7 W x (20 - 10 - 3) = 18.9 J (transfers); compute 64 J; radio 5.6 J
    trace = (Download(2_000_000), Compute(1e10, 0), Upload(2_500_000))
    spec = ClientSpec(0, 4e6, 8e6, 0.0, 1e9)
    e = client_energy(PI, _timeline(2.0, 10.0, 5.0, 17.0), trace, spec, 20.0, idle_policy="sleep")
    assert e == pytest.approx(
        {
            "energy_j": 64.0 + 5.6 + 18.9 + 3.6,
            "energy_compute_j": 64.0,
            "energy_radio_j": 5.6,
            "energy_idle_j": 18.9,
            "energy_sleep_j": 3.6,
        }
    )
    # the same round under idle: those 3 s idle instead (27 J idle, 0 sleep)
    idle = client_energy(PI, _timeline(2.0, 10.0, 5.0, 17.0), trace, spec, 20.0, idle_policy="idle")
    assert (idle["energy_idle_j"], idle["energy_sleep_j"]) == pytest.approx((27.0, 0.0))
    # the critical client (finish = round end) and a client dropped at a deadline (finish
    # 9 s after a 5 s round) never sleep
    crit = client_energy(
        PI, _timeline(2.0, 10.0, 5.0, 17.0), trace, spec, 17.0, idle_policy="sleep"
    )
    assert crit["energy_sleep_j"] == 0.0 and crit["energy_idle_j"] == pytest.approx(2.7 * 7)
    late = client_energy(PI, _timeline(0.0, 1.0, 8.0, 9.0), trace, spec, 5.0, idle_policy="sleep")
    assert late["energy_sleep_j"] == 0.0
    # an outage (never finishes) idles until the round ends
    stuck = client_energy(
        PI,
        _timeline(0.0, 1.0, math.inf, math.inf),
        trace,
        ClientSpec(0, 0.0, 1e6, 0.0, 1e9),
        30.0,
        idle_policy="sleep",
    )
    assert stuck["energy_sleep_j"] == 0.0 and stuck["energy_idle_j"] == pytest.approx(2.7 * 29)
    # a profile without a sleep figure cannot sleep: it idles
    awake = DeviceProfile(
        "awake", 1e9, 0.0, 2**30, active_power_w=6.4, idle_power_w=2.7,
        radio_tx_power_w=1.0, radio_rx_power_w=0.3,
    )  # fmt: skip
    e = client_energy(
        awake, _timeline(2.0, 10.0, 5.0, 17.0), trace, spec, 20.0, idle_policy="sleep"
    )
    assert (e["energy_idle_j"], e["energy_sleep_j"]) == pytest.approx((27.0, 0.0))


def test_broadcast_each_client_receives_at_its_own_rate():
    # one model of 1e6 B (8 Mbit) to two clients: A at 8 Mbit/s (1 s), B at 2 Mbit/s (4 s);
    # no compute, a 1-byte upload each at 8 Mbit/s (1e-6 s)
    traces = {c: (Download(1_000_000), Upload(1)) for c in (0, 1)}
    specs = {0: ClientSpec(0, 8e6, 8e6, 0.0, 1e9), 1: ClientSpec(1, 8e6, 2e6, 0.0, 1e9)}
    for shared, round_s in ((False, 4.000001), (True, 5.000001)):
        # dedicated (the Shannon downlink's full band): the round is B's 4 s; shared (one
        # medium, processor sharing): both at half their rate until A has its 8 Mbit at
        # 2 s (B has 2 Mbit), then B alone: 6 Mbit at 2 Mbit/s = 3 s -> 5 s
        t = time_round(traces, specs, [ServerSpec(1e9)], NetworkSpec(downlink_shared=shared))
        assert t.round_time_s == pytest.approx(round_s)
        e = {
            c.client_id: client_energy(
                PI, c, traces[c.client_id], specs[c.client_id], t.round_time_s, idle_policy="idle"
            )
            for c in t.clients
        }
        # each receives for its own air time at its own rate: A 1 s, B 4 s (0.3 W), and
        # sends 8 bits at 8 Mbit/s (1 W x 1e-6 s)
        assert e[0]["energy_radio_j"] == pytest.approx(0.3 * 1.0 + 1e-6)
        assert e[1]["energy_radio_j"] == pytest.approx(0.3 * 4.0 + 1e-6)
        # and waits the rest of the round idle (no compute)
        assert e[0]["energy_idle_j"] == pytest.approx(2.7 * round_s)


def test_loss_limited_air_time_by_hand():
    # a 10 Mbit/s link with 2 % loss and a 0.1 s round trip, MSS 1460 B:
    # Mathis bound 8 * 1460 * sqrt(1.5) / (0.1 * sqrt(0.02))
    #   = 14305.02 / 0.01414214 = 1,011,518 bit/s: the transfer runs at ~1.01 Mbit/s
    # on the air: the link rate with 1 / (1 - 0.02) transmissions per packet,
    #   0.98 * 10 Mbit/s = 9.8 Mbit/s
    mathis = 8 * 1460 * math.sqrt(1.5) / (0.1 * math.sqrt(0.02))
    assert mathis == pytest.approx(1_011_518, abs=1)
    goodput = min(10e6, mathis)
    assert air_rate_bps(goodput, 10e6, 0.02) == pytest.approx(9.8e6)
    # an upload of 1.25e6 B (10 Mbit): 10e6 / 1,011,518 = 9.886 s in transfer, of which
    # 10e6 / 9.8e6 = 1.0204 s on the air (1 W: 1.0204 J); the rest of the round idles
    trace = (Upload(1_250_000),)
    spec = ClientSpec(0, goodput, 10e6, 0.0, 1e9)
    t = time_round({0: trace}, {0: spec}, [ServerSpec(1e9)], NetworkSpec())
    assert t.round_time_s == pytest.approx(10e6 / mathis)
    air = float(air_rate_bps(goodput, 10e6, 0.02))
    e = client_energy(
        PI, t.clients[0], trace, spec, t.round_time_s, idle_policy="idle", air_rates_bps=(air, 10e6)
    )
    assert e["energy_radio_j"] == pytest.approx(10e6 / 9.8e6)
    assert e["energy_idle_j"] == pytest.approx(2.7 * 10e6 / mathis)
    # a link slower than the bound (1 Mbit/s < 1.0115 Mbit/s) transfers at its own rate:
    # the air time is the whole transfer (never more), 10 s
    assert air_rate_bps(min(1e6, mathis), 1e6, 0.02) == 1e6
    # no loss: the air rate is the goodput itself, to the bit
    assert air_rate_bps(3.7e6, 3.7e6, 0.0) == 3.7e6


def test_custom_profile_power_needs_a_source():
    base = {
        "flops_per_s": 1e9,
        "step_overhead_s": 0.01,
        "ram_bytes": 2**30,
        "flops_source": "x",
        "step_overhead_source": "y",
    }

    def profile(**fields):
        return scenario_from_dict({"devices": {"profiles": {"mine": {**base, **fields}}}}, "s.yaml")

    with pytest.raises(ScenarioError, match=r"devices.profiles.mine.power_source: say where"):
        profile(active_power_w=3.0, idle_power_w=1.0)
    with pytest.raises(ScenarioError, match=r"radio_rx_power_w: give it with the transmit"):
        profile(radio_tx_power_w=1.0, radio_power_source="z")
    with pytest.raises(ScenarioError, match=r"radio_circuit_power_w: give radio_pa_efficiency"):
        profile(radio_pa_efficiency=0.3, radio_rx_power_w=0.2, radio_power_source="z")
    with pytest.raises(ScenarioError, match=r"radio_pa_efficiency: give radio_pa_efficiency"):
        profile(radio_rx_power_w=0.2, radio_tx_power_dbm=15.0, radio_power_source="z")
    with pytest.raises(ScenarioError, match=r"radio_pa_efficiency"):
        profile(
            radio_pa_efficiency=1.5,
            radio_circuit_power_w=0.1,
            radio_rx_power_w=0.2,
            radio_power_source="z",
        )
    with pytest.raises(ScenarioError, match=r"radio_power_source: say where"):
        profile(radio_pa_efficiency=0.3, radio_circuit_power_w=0.1, radio_rx_power_w=0.2)
    with pytest.raises(ScenarioError, match=r"sleep_power_source: say where"):
        profile(sleep_power_w=0.5)
    with pytest.raises(ScenarioError, match=r"sleep_power_w: 2.0 W is above idle_power_w"):
        profile(
            active_power_w=3.0,
            idle_power_w=1.0,
            power_source="m",
            sleep_power_w=2.0,
            sleep_power_source="m",
        )
    ok = profile(
        active_power_w=3.0,
        idle_power_w=1.0,
        power_source="m",
        radio_pa_efficiency=0.3,
        radio_circuit_power_w=0.1,
        radio_rx_power_w=0.2,
        radio_tx_power_dbm=15.0,
        radio_power_source="m",
        sleep_power_w=0.4,
        sleep_power_source="m",
    )
    assert ok.devices.profiles["mine"].radio_pa_efficiency == 0.3


def test_idle_policy_is_validated():
    assert scenario_from_dict({}, "s.yaml").energy.idle_policy == "sleep"
    assert scenario_from_dict({"energy": {"idle_policy": "idle"}}, "s.yaml").energy.idle_policy == (
        "idle"
    )
    with pytest.raises(ScenarioError, match=r"energy.idle_policy"):
        scenario_from_dict({"energy": {"idle_policy": "doze"}}, "s.yaml")


def _tiny(tmp_path: Path | None = None, **extra):
    data = {
        "name": "tiny-energy",
        "rounds": 2,
        "seed": 3,
        "dataset": {"train_size": 400, "test_size": 100},
        "topology": {"clients": 4},
        "devices": {"clients": [{"profile": "rpi2b", "count": 2}, {"profile": "rpi5"}]},
        # the ideal transport (bits / rate) these hand numbers are worked for
        "channel": {
            "model": "fixed_rate",
            "uplink": {"rate_bps": 2e6, "transport": "ideal"},
            "downlink": {"rate_bps": 5e6, "transport": "ideal"},
        },
        "execution": {"backend": "local"},
        "metrics": {"enabled": False},
        **extra,
    }
    return scenario_from_dict(data, "tiny.yaml")


def test_run_records_energy_from_the_recorded_times(tmp_path):
    sc = _tiny()
    out = tmp_path / "run"
    rows = run_in_folder(sc, out).rows
    clients = pd.read_csv(out / "clients.csv")
    rounds = pd.read_csv(out / "rounds.csv")
    prof = builtin_profiles()
    sel = clients[clients["selected"]]
    assert len(sel) == 8
    for _, c in sel.iterrows():
        p = prof[c["device"]]
        round_s = float(rounds.loc[rounds["round"] == c["round"], "round_time_s"].iloc[0])
        # fixed rates, no sharing, no latency: air time = the recorded transfer time; the
        # fixed-rate channel gives no transmit power: the profile's 20 dBm, 0.1 W / 0.25 +
        # 0.2 W = 0.6 W; the client sleeps (the default policy) from its finish to the end
        sleep_s = round_s - c["finish_s"]
        expect = {
            "energy_compute_j": p.active_power_w * c["compute_s"],
            "energy_radio_j": 0.6 * c["upload_s"] + p.radio_rx_power_w * c["download_s"],
            "energy_idle_j": p.idle_power_w * (round_s - c["compute_s"] - sleep_s),
            "energy_sleep_j": p.sleep_power_w * sleep_s,
        }
        expect["energy_j"] = sum(expect.values())
        for k, v in expect.items():
            assert c[k] == pytest.approx(v, rel=1e-9), k
        # and the air time by hand: 8 * bytes / rate
        assert c["upload_s"] == pytest.approx(8 * c["bytes_up"] / 2e6)
    for _, r in rounds.iterrows():
        mine = sel[sel["round"] == r["round"]]
        for k in ENERGY_KEYS:
            assert r[k] == pytest.approx(mine[k].sum(), rel=1e-12)
    summary = (out / "summary.md").read_text()
    mean_j = sum(r["energy_j"] for r in rows) / len(rows)
    assert "Client energy (J)" in summary and f"{mean_j:.1f}" in summary
    assert "Client energy per round:" in summary


def test_sweep_energy_metric(tmp_path):
    import mecsim

    sc = _tiny()
    out = tmp_path / "rec"
    run_in_folder(sc, out)
    df = mecsim.sweep(out, {"devices.clients.0.profile": ["rpi2b", "rpi5"]})
    recorded = pd.read_csv(out / "rounds.csv")
    # the recorded point replays the recorded energy exactly
    assert df.loc[0, "energy_mean_j"] == pytest.approx(recorded["energy_j"].mean(), rel=1e-12)
    assert df.loc[0, "energy_total_j"] == pytest.approx(recorded["energy_j"].sum(), rel=1e-12)
    parts = df.loc[
        0,
        [
            "energy_compute_mean_j",
            "energy_radio_mean_j",
            "energy_idle_mean_j",
            "energy_sleep_mean_j",
        ],
    ].sum()
    assert parts == pytest.approx(df.loc[0, "energy_mean_j"], rel=1e-12)
    assert df.loc[1, "energy_mean_j"] != df.loc[0, "energy_mean_j"]
    # and from the command line, plotted
    from mecsim.interfaces.cli import main

    sw = tmp_path / "sw"
    assert (
        main(
            [
                "sweep",
                str(out),
                "--set",
                "devices.clients.0.profile=rpi2b,rpi5",
                "--metric",
                "energy_mean_j",
                "--out",
                str(sw),
                "--quiet",
            ]
        )
        == 0
    )
    cli = pd.read_csv(sw / "sweep.csv")
    assert cli["energy_mean_j"].tolist() == pytest.approx(df["energy_mean_j"].tolist())
    assert (sw / "sweep.png").stat().st_size > 0


def test_vectorised_round_energy_equals_the_per_client_sum():
    """What replays use (round_energy_arrays) equals summing client_energy exactly, on
    random rounds: dedicated and shared links, latency, loss (air rates above the
    goodput), rate schedules, outages, deadlines, profiles with and without power (and
    sleep) figures, measured and PA-model transmit draws, both idle policies."""
    import numpy as np

    from mecsim.emulation.energy import power_array, round_energy_arrays, transfer_arrays

    rng = np.random.default_rng(7)
    bare = DeviceProfile("bare", 1e9, 0.0, 2**30)
    checked_nan = checked_stuck = checked_sleep = 0
    for case in range(160):
        n = int(rng.integers(1, 12))
        policy = "sleep" if rng.random() < 0.6 else "idle"
        shared = bool(rng.random() < 0.3)
        traces, specs, profiles = {}, {}, []
        for c in range(n):
            ops = [
                Download(int(rng.integers(0, 3)) * 400_000),
                Compute(float(rng.uniform(1e8, 1e10)), 5),
                Upload(int(rng.integers(0, 3)) * 500_000),
            ]
            if rng.random() < 0.3:
                ops.append(Upload(int(rng.integers(1, 4)) * 100_000))
            traces[c] = tuple(ops)
            up = 0.0 if rng.random() < 0.05 else float(rng.uniform(1e5, 1e7))
            if not shared and rng.random() < 0.2:
                up = RateSchedule(
                    (0.0, float(rng.uniform(0.1, 2))),
                    (float(rng.uniform(1e5, 1e6)), float(rng.uniform(1e6, 1e7))),
                )
            specs[c] = ClientSpec(
                c,
                up,
                float(rng.uniform(1e6, 2e7)),
                0.01,
                0.0 if rng.random() < 0.03 else 1e9,
                uplink_latency_s=float(rng.uniform(0, 0.1)),
                downlink_latency_s=float(rng.uniform(0, 0.1)),
            )
            profiles.append(
                bare
                if rng.random() < 0.05
                else [PI, PI_PA, dataclasses.replace(PI_PA, sleep_power_w=None)][
                    int(rng.integers(0, 3))
                ]
            )
        # each client's channel dBm (NaN: the profile's) and air rates (the constant
        # links' rate with a loss rate's retransmissions, at least the goodput)
        dbm = [float(rng.uniform(23, 30)) if rng.random() < 0.5 else math.nan for _ in range(n)]
        loss = float(rng.choice([0.0, 0.01, 0.05]))
        air = {
            c: tuple(
                float(air_rate_bps(r, r * float(rng.uniform(1, 20)), loss))
                if isinstance(r, float) and r > 0
                else r
                for r in (specs[c].uplink_rate_bps, specs[c].downlink_rate_bps)
            )
            for c in range(n)
        }
        deadline = None if rng.random() < 0.5 else float(rng.uniform(1, 20))
        t = time_round(
            traces,
            specs,
            [ServerSpec(1e9)],
            NetworkSpec(uplink_shared=shared, deadline_s=deadline),
            aggregate_s=float(rng.uniform(0, 1)),
        )
        per_client = round_energy(
            client_energy(
                profiles[c.client_id],
                c,
                traces[c.client_id],
                specs[c.client_id],
                t.round_time_s,
                idle_policy=policy,
                tx_power_dbm=dbm[c.client_id],
                air_rates_bps=tuple(
                    a if isinstance(a, float) else math.nan for a in air[c.client_id]
                ),
            )
            for c in t.clients
        )
        bits, n_ops = transfer_arrays(traces.values())
        times = np.array(
            [
                (
                    c.download_s,
                    c.compute_s,
                    c.upload_s,
                    c.server_compute_s,
                    c.backhaul_s,
                    c.finish_s,
                )
                for c in t.clients
            ]
        )
        rates = np.array(
            [[r if isinstance(r, float) else np.nan for r in air[c]] for c in range(n)]
        )
        lat = np.array([(specs[c].uplink_latency_s, specs[c].downlink_latency_s) for c in range(n)])
        fast = round_energy_arrays(
            power_array(profiles, dbm), times, bits, n_ops, rates, lat, t.round_time_s, policy
        )
        for k in ENERGY_KEYS:
            a, b = per_client[k], fast[k]
            assert (math.isnan(a) and math.isnan(b)) or a == b, (case, k, a, b)
        checked_nan += math.isnan(per_client["energy_j"])
        checked_stuck += any(math.isinf(c.finish_s) for c in t.clients)
        checked_sleep += per_client["energy_sleep_j"] > 0
    # the random cases reached those branches
    assert checked_nan > 0 and checked_stuck > 0 and checked_sleep > 0


def test_run_with_loss_records_air_time_at_the_link_rate_and_replays_it(tmp_path):
    """A real run on a lossy uplink: each client's radio energy is its air time at the
    link rate with retransmissions (not the loss-limited transfer's time), and a replay
    (the sweep's vectorised path) gives the recorded energy; sweeping the idle policy
    moves the sleep joules into idle."""
    import mecsim

    sc = _tiny(
        channel={
            "model": "fixed_rate",
            # 2 Mbit/s with 2 % loss and a 0.1 s round trip: the Mathis bound is
            # 8 * 1460 * sqrt(1.5) / (0.1 * sqrt(0.02)) = 1,011,518 bit/s < 2 Mbit/s
            "uplink": {"rate_bps": 2e6, "loss_rate": 0.02, "latency_s": 0.05, "transport": "ideal"},
            "downlink": {"rate_bps": 5e6, "latency_s": 0.05, "transport": "ideal"},
        }
    )
    out = tmp_path / "lossy"
    run_in_folder(sc, out)
    clients = pd.read_csv(out / "clients.csv")
    sel = clients[clients["selected"]]
    mathis = 8 * 1460 * math.sqrt(1.5) / (0.1 * math.sqrt(0.02))
    for _, c in sel.iterrows():
        assert c["uplink_goodput_bps"] == pytest.approx(mathis)
        # the upload takes 0.05 s + 8 * bytes / 1,011,518 ...
        assert c["upload_s"] == pytest.approx(0.05 + 8 * c["bytes_up"] / mathis)
        # ... but is on the air 8 * bytes / (0.98 * 2 Mbit/s), at 0.6 W (20 dBm); the
        # download 8 * bytes / 5 Mbit/s at 0.3 W
        radio = 0.6 * 8 * c["bytes_up"] / (0.98 * 2e6) + 0.3 * 8 * c["bytes_down"] / 5e6
        assert c["energy_radio_j"] == pytest.approx(radio, rel=1e-12)
    recorded = pd.read_csv(out / "rounds.csv")
    df = mecsim.sweep(out, {"energy.idle_policy": ["sleep", "idle"]})
    for key in ("energy_mean_j", "energy_radio_mean_j", "energy_sleep_mean_j"):
        assert df.loc[0, key] == recorded[key.replace("_mean", "")].mean()
    assert df.loc[1, "energy_sleep_mean_j"] == 0.0
    assert df.loc[1, "energy_radio_mean_j"] == df.loc[0, "energy_radio_mean_j"]
    assert df.loc[1, "energy_mean_j"] > df.loc[0, "energy_mean_j"]  # idle draws more


def test_energy_section_at_its_default_keeps_older_runs_digest():
    """Runs recorded before the energy section existed keep their checkpoint digest (it
    is left out at its default); another idle policy is another run."""
    from mecsim.store.checkpoints import scenario_digest

    # the default scenario as recorded before transfers were TCP flows (its links ideal:
    # what a run folder without the field loads as), its digest as the code before the
    # energy section computed it
    ideal = {"transport": "ideal"}
    sc = scenario_from_dict(
        {"channel": {"model": "shannon", "uplink": ideal, "downlink": ideal}, "backhaul": ideal},
        "s.yaml",
    )
    assert scenario_digest(sc) == "fdd895b31d294df9aacc6effcc81e8b837e4de4471528217a0e60d4d120274ee"
    idle = scenario_from_dict(
        {
            "channel": {"model": "shannon", "uplink": ideal, "downlink": ideal},
            "backhaul": ideal,
            "energy": {"idle_policy": "idle"},
        },
        "s.yaml",
    )
    assert scenario_digest(idle) != scenario_digest(sc)
    # and a TCP run is another run
    assert scenario_digest(scenario_from_dict({}, "s.yaml")) != scenario_digest(sc)
