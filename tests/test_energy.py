"""Energy per client-round against numbers worked out by hand; through a real run, its
records, summary and report; and as a sweep metric."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from mecsim.emulation.devices import DeviceProfile, builtin_profiles
from mecsim.emulation.energy import ENERGY_KEYS, client_energy, round_energy
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
    radio_tx_power_w=1.0,
    radio_rx_power_w=0.3,
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
    e = client_energy(PI, _timeline(2.0, 10.0, 5.0, 17.0), trace, spec, 20.0)
    assert e == pytest.approx(
        {"energy_j": 96.6, "energy_compute_j": 64.0, "energy_radio_j": 5.6, "energy_idle_j": 27.0}
    )


def test_air_time_excludes_latency_and_sharing():
    # two 10 Mbit uploads share a 10 Mbit/s medium (2 s each elapsed, 1 s each on the air)
    # and arrive 0.5 s later; nothing else: 2.5 s round
    specs = {c: ClientSpec(c, 10e6, 10e6, 0.0, 1e9, uplink_latency_s=0.5) for c in (0, 1)}
    traces = {c: (Upload(1_250_000),) for c in (0, 1)}
    t = time_round(traces, specs, [ServerSpec(1e9)], NetworkSpec(uplink_shared=True))
    assert t.round_time_s == pytest.approx(2.5)
    for tl in t.clients:
        e = client_energy(PI, tl, traces[tl.client_id], specs[tl.client_id], t.round_time_s)
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
    e = client_energy(PI, t.clients[0], trace, spec, t.round_time_s)
    assert e["energy_radio_j"] == pytest.approx(2.0)  # 1.0 W x 2 s


def test_dropped_and_stuck_clients():
    trace = (Compute(1e9, 0), Upload(1_000_000))
    # dropped at a 5 s deadline but finishing at 9 s: counted until 9 s
    late = _timeline(0.0, 1.0, 8.0, 9.0)
    spec = ClientSpec(0, 1e6, 1e6, 0.0, 1e9)
    e = client_energy(PI, late, trace, spec, 5.0)
    assert e["energy_idle_j"] == pytest.approx(2.7 * 8) and e["energy_radio_j"] == 8.0
    # a link at 0 bit/s never finishes: idle until the round ends, nothing on the air
    stuck = _timeline(0.0, 1.0, math.inf, math.inf)
    e = client_energy(PI, stuck, trace, ClientSpec(0, 0.0, 1e6, 0.0, 1e9), 30.0)
    assert e == pytest.approx(
        {
            "energy_j": 6.4 + 2.7 * 29,
            "energy_compute_j": 6.4,
            "energy_radio_j": 0.0,
            "energy_idle_j": 2.7 * 29,
        }
    )
    # stuck computing (a CPU at 0 FLOP/s): active until the round ends
    e = client_energy(PI, _timeline(0.0, math.inf, 0.0, math.inf), trace, spec, 12.0)
    assert e["energy_compute_j"] == pytest.approx(6.4 * 12) and e["energy_idle_j"] == 0.0
    # a round that never ends has no energy
    assert all(math.isnan(v) for v in client_energy(PI, stuck, trace, spec, math.inf).values())


def test_profile_without_power_is_nan_and_round_sums():
    bare = DeviceProfile("bare", 1e9, 0.0, 2**30)
    e = client_energy(
        bare, _timeline(0, 1, 0, 1), (Compute(1e9, 0),), ClientSpec(0, 1e6, 1e6, 0.0, 1e9), 1.0
    )
    assert all(math.isnan(e[k]) for k in ENERGY_KEYS)
    rows = [
        {"energy_j": 3.0, "energy_compute_j": 1.0, "energy_radio_j": 0.5, "energy_idle_j": 1.5}
    ] * 2
    assert round_energy(rows) == {
        "energy_j": 6.0,
        "energy_compute_j": 2.0,
        "energy_radio_j": 1.0,
        "energy_idle_j": 3.0,
    }


def test_builtin_profiles_have_sourced_power():
    for name in ("rpi2b", "rpi3b", "rpi4", "rpi5", "jetson-nano"):
        p = builtin_profiles()[name]
        assert 0 < p.idle_power_w < p.active_power_w, name
        assert p.radio_tx_power_w > p.radio_rx_power_w > 0
        assert p.power_source.split(":")[0] in ("measured", "estimate"), name
        assert p.radio_power_source.startswith("estimate"), name
    # the sources' figures (Pi Dramble; Jeff Geerling's sbc-reviews for the Pi 5)
    pi = builtin_profiles()
    assert (pi["rpi2b"].idle_power_w, pi["rpi2b"].active_power_w) == (1.1, 2.1)
    assert (pi["rpi4"].idle_power_w, pi["rpi4"].active_power_w) == (2.7, 6.4)
    assert (pi["rpi5"].idle_power_w, pi["rpi5"].active_power_w) == (2.8, 9.7)


def test_custom_profile_power_needs_a_source():
    base = {
        "flops_per_s": 1e9,
        "step_overhead_s": 0.01,
        "ram_bytes": 2**30,
        "flops_source": "x",
        "step_overhead_source": "y",
    }
    with pytest.raises(ScenarioError, match=r"devices.profiles.mine.power_source: say where"):
        scenario_from_dict(
            {
                "devices": {
                    "profiles": {"mine": {**base, "active_power_w": 3.0, "idle_power_w": 1.0}}
                }
            },
            "s.yaml",
        )
    with pytest.raises(ScenarioError, match=r"radio_rx_power_w: give radio_tx_power_w and"):
        scenario_from_dict(
            {
                "devices": {
                    "profiles": {
                        "mine": {**base, "radio_tx_power_w": 1.0, "radio_power_source": "z"}
                    }
                }
            },
            "s.yaml",
        )


def _tiny(tmp_path: Path | None = None, **extra):
    data = {
        "name": "tiny-energy",
        "rounds": 2,
        "seed": 3,
        "dataset": {"train_size": 400, "test_size": 100},
        "topology": {"clients": 4},
        "devices": {"clients": [{"profile": "rpi2b", "count": 2}, {"profile": "rpi5"}]},
        "channel": {
            "model": "fixed_rate",
            "uplink": {"rate_bps": 2e6},
            "downlink": {"rate_bps": 5e6},
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
        # fixed rates, no sharing, no latency: air time = the recorded transfer time
        expect = {
            "energy_compute_j": p.active_power_w * c["compute_s"],
            "energy_radio_j": p.radio_tx_power_w * c["upload_s"]
            + p.radio_rx_power_w * c["download_s"],
            "energy_idle_j": p.idle_power_w * (round_s - c["compute_s"]),
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
    parts = df.loc[0, ["energy_compute_mean_j", "energy_radio_mean_j", "energy_idle_mean_j"]].sum()
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
    random rounds: dedicated and shared links, latency, rate schedules, outages,
    deadlines, profiles with and without power."""
    import numpy as np

    from mecsim.emulation.energy import power_array, round_energy_arrays, transfer_arrays

    rng = np.random.default_rng(7)
    bare = DeviceProfile("bare", 1e9, 0.0, 2**30)
    checked_nan = checked_stuck = 0
    for case in range(120):
        n = int(rng.integers(1, 12))
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
            profiles.append(bare if rng.random() < 0.05 else PI)
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
                profiles[c.client_id], c, traces[c.client_id], specs[c.client_id], t.round_time_s
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
            [
                [
                    r if isinstance(r, float) else np.nan
                    for r in (specs[c].uplink_rate_bps, specs[c].downlink_rate_bps)
                ]
                for c in range(n)
            ]
        )
        lat = np.array([(specs[c].uplink_latency_s, specs[c].downlink_latency_s) for c in range(n)])
        fast = round_energy_arrays(
            power_array(profiles), times, bits, n_ops, rates, lat, t.round_time_s
        )
        for k in ENERGY_KEYS:
            a, b = per_client[k], fast[k]
            assert (math.isnan(a) and math.isnan(b)) or a == b, (case, k, a, b)
        checked_nan += math.isnan(per_client["energy_j"])
        checked_stuck += any(math.isinf(c.finish_s) for c in t.clients)
    assert checked_nan > 0 and checked_stuck > 0  # the random cases reached those branches
