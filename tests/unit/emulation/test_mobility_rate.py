"""A moving client's rate during a round (``geometry.mobility.rate: step``;
docs/mobility.md, "Mobility in a run"): the mid* rule against an independent fine
integral and a case worked by hand, the same times on every engine, ``rate: round``
keeping the round-start rates, outages, energy, and a replay of a moving run.

The channel of the integral checks is benchmarks/approximations/mobility_piecewise.py's: 10 MHz,
SNR = 87 − 40 log10 d dB (PL0 = −40 dB at 1 m, exponent 4, k = 10^12.7 so that
k · 10^−4 · d^−4 = 10^8.7 d^−4).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.moving import BANDWIDTH_HZ, moving_links, straight_track
from support.scenarios import tiny

from mecsim.analysis.replay import load_run, replay
from mecsim.analysis.whatif_sweep import sweep
from mecsim.emulation.engine import (
    ClientSpec,
    NetworkSpec,
    ServerSpec,
    engine_path,
    plan_traces,
    time_round,
    time_round_columns,
)
from mecsim.emulation.faults import with_outages
from mecsim.emulation.moving_rate import MovingRate
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.run.preflight import find_problems
from mecsim.run.setup import moving_rate_refusal
from mecsim.scenario import scenario_from_dict
from mecsim.scenario.loader import ScenarioError
from mecsim.scenario.overrides import OverrideError
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder
from mecsim.testing import check_scenario_data


def _fine_transfer_s(bits: float, distance, t0_s: float, dt_s: float = 1e-4) -> float:
    """The continuous integral, independently: the rate B log2(1 + 10^8.7 d^−4) at the
    exact distance, on pieces of 0.1 ms, the end interpolated in its piece."""
    t = t0_s + np.arange(0.0, 60.0, dt_s)
    d = distance(t + dt_s / 2)
    rate = BANDWIDTH_HZ * np.log2(1.0 + 10**8.7 * d**-4.0)
    sent = np.concatenate([[0.0], np.cumsum(rate * dt_s)])
    k = int(np.searchsorted(sent, bits)) - 1
    assert k < len(t), "the transfer outlasts the reference horizon"
    return float(k * dt_s + (bits - sent[k]) / rate[k])


WALK_AWAY = ((100.0, 0.0), (1.5, 0.0), lambda t: 100.0 + 1.5 * t)
CAR_PASSING = ((-300.0, 50.0), (30.0, 0.0), lambda t: np.hypot(50.0, -300.0 + 30.0 * t))
CAR_AWAY = ((100.0, 0.0), (30.0, 0.0), lambda t: 100.0 + 30.0 * t)
#: the documented error of mid* at 1 s steps (docs/mobility.md, "Mobility in a run")
TOLERANCE_1S = {"walk": 1e-4, "car passing": 0.006, "car away": 0.021}
MOTIONS = {"walk": WALK_AWAY, "car passing": CAR_PASSING, "car away": CAR_AWAY}


@pytest.mark.parametrize(
    "motion, bits",
    [
        *[(m, b) for m in ("walk", "car passing") for b in (6.4e6, 64e6, 357.6e6)],
        ("car away", 6.4e6),  # out of range before 8 MB are through
    ],
)
@pytest.mark.parametrize(
    "round_start_s, start_s", [(0.0, 0.0), (3.0, 0.0), (2.6, 0.37)], ids=["t0", "R3", "mid-step"]
)
def test_mid_star_is_within_the_documented_error_of_the_continuous_integral(
    motion, bits, round_start_s, start_s
):
    """At 1 s steps, the transfer starting at 0 s, 3 s or 2.97 s (inside a step: a
    shorter first piece): within 0.01 % for the walk, 0.6 % for the car passing, 2.1 %
    for the car driving away (0.8 MB from 190 m at 3 s: the worst measured); at 0.1 s
    steps within 0.03 % for all."""
    xy, v, distance = MOTIONS[motion]
    t0 = round_start_s + start_s
    exact = _fine_transfer_s(bits, distance, t0)
    for step_s, tolerance in ((1.0, TOLERANCE_1S[motion]), (0.1, 3e-4)):
        rate = MovingRate(moving_links(straight_track(xy, v), (0.0, 0.0), step_s, round_start_s), 0)
        got = rate.transfer_time_s(bits, start_s)
        assert got == pytest.approx(exact, rel=tolerance), (step_s, got, exact)
    # the rate frozen at the transfer's start: wrong by far more for the cars
    frozen = bits / (BANDWIDTH_HZ * math.log2(1 + 10**8.7 * distance(t0) ** -4))
    if motion != "walk" and t0 == 0.0:
        assert abs(frozen / exact - 1) > 0.05, frozen / exact


def test_a_transfer_worked_by_hand():
    """A client walks away from its site at (0, 0): d(t) = 100 + 10 t m; B = 1 MHz,
    exponent 2, PL0 = 0 dB: SNR(d) = k / d² with k = 3 · 105² = 33,075, steps of 1 s,
    3 Mbit from t = 0:

    piece [0, 1]: midpoint 0.5 s, d = 105 m, SNR = 3, r1 = 1e6 · log2(4) = 2 Mb/s:
    2 Mbit moved, 1 Mbit left.
    piece [1, 2]: midpoint 1.5 s, d = 115 m, SNR = 33075 / 13225 = 2.500945,
    r2 = 1e6 · log2(3.500945) = 1.807744 Mb/s > 1 Mbit left: the transfer ends here.
    mid*: x0 = 1 + 1e6 / r2 = 1.553176 s; then x ← 1 + 1e6 / r((1 + x) / 2) three times:
    (1 + 1.553176) / 2 = 1.276588 s, d = 112.7659 m, SNR = 2.601025,
    r = 1.848407 Mb/s, x1 = 1.541006 s; x2 = 1.540677 s; x3 = 1.540668 s.
    (The rate frozen at the start, 2.106851 Mb/s (SNR 3.3075 at 100 m): 1.423926 s.)"""
    k = 3 * 105.0**2
    rate = MovingRate(
        moving_links(
            straight_track((100.0, 0.0), (10.0, 0.0)),
            (0.0, 0.0),
            1.0,
            k=k,
            bandwidth_hz=1e6,
            exponent=2.0,
            path_loss_db=0.0,
        ),
        0,
    )

    def r(t: float) -> float:
        return 1e6 * math.log2(1 + k / (100 + 10 * t) ** 2)

    assert r(0.5) == 2e6
    x = 1 + 1e6 / r(1.5)
    assert x == pytest.approx(1.553176, abs=1e-6)
    for expected in (1.541006, 1.540677, 1.540668):
        x = 1 + 1e6 / r((1 + x) / 2)
        assert x == pytest.approx(expected, abs=1e-6)
    assert rate.transfer_time_s(3e6, 0.0) == pytest.approx(x, rel=1e-12)
    # 1 Mbit, all in the first piece: x ← 1e6 / r(x / 2) from x0 = 1e6 / r(0.5) = 0.5 s
    y = 0.5
    for _ in range(3):
        y = 1e6 / r(y / 2)
    assert rate.transfer_time_s(1e6, 0.0) == pytest.approx(y, rel=1e-12)
    assert y == pytest.approx(0.486888, abs=1e-6)  # nearer than at 0.5 s: faster


def test_the_mathis_cap_applies_per_piece():
    """Capped at 1.9 Mb/s: the first piece (2 Mb/s) is capped, the second (1.81) is not."""
    k = 3 * 105.0**2
    links = moving_links(
        straight_track((100.0, 0.0), (10.0, 0.0)),
        (0.0, 0.0),
        1.0,
        k=k,
        bandwidth_hz=1e6,
        exponent=2.0,
        path_loss_db=0.0,
        cap_bps=1.9e6,
    )
    got = MovingRate(links, 0).transfer_time_s(3e6, 0.0)

    def r(t: float) -> float:
        return min(1e6 * math.log2(1 + k / (100 + 10 * t) ** 2), 1.9e6)

    left = 3e6 - 1.9e6
    x = 1 + left / r(1.5)
    for _ in range(3):
        x = 1 + left / r((1 + x) / 2)
    assert got == pytest.approx(x, rel=1e-12)


def test_outages_stop_the_transfer_and_it_resumes_after():
    """Down over [0.2, 0.7) s: the bits of [0, 0.2) at the first piece's rate, nothing
    for 0.5 s, the rest from 0.7 s."""
    k = 3 * 105.0**2
    links = moving_links(
        straight_track((100.0, 0.0), (10.0, 0.0)),
        (0.0, 0.0),
        1.0,
        k=k,
        bandwidth_hz=1e6,
        exponent=2.0,
        path_loss_db=0.0,
    )
    down = with_outages(MovingRate(links, 0), [(0.2, 0.7)])
    assert isinstance(down, MovingRate)
    plain = MovingRate(links, 0)
    # before the outage starts: unchanged
    assert down.transfer_time_s(1e5, 0.0) == plain.transfer_time_s(1e5, 0.0)
    # across it: [0, 0.2) moves r(0.1) · 0.2 bits (the part's midpoint); the rest from 0.7 s
    r01 = 1e6 * math.log2(1 + k / 101.0**2)
    rest = 1e6 - r01 * 0.2
    assert down.transfer_time_s(1e6, 0.0) == pytest.approx(
        0.7 + plain.transfer_time_s(rest, 0.7), rel=1e-12
    )
    assert with_outages(MovingRate(links, 0), [(0.0, math.inf)]).transfer_time_s(1, 0) == math.inf


# ------------------------------------------------------------------ in NetworkModel


def _moving_scenario(**mobility):
    return tiny(
        topology={"clients": 6, "edge_servers": 2},
        channel={"model": "shannon", "interference": None},
        geometry={
            "area": {"width_m": 1000, "height_m": 400},
            "sites": {"layout": "explicit", "positions_m": [[250, 200], [750, 200]]},
            "mobility": {"model": "random_waypoint", "speed_mps": [20, 35], **mobility},
        },
    )


def test_rate_step_gives_moving_rates_that_start_at_the_rounds_rate_and_round_keeps_floats():
    step = NetworkModel(_moving_scenario(), device_profiles(_moving_scenario()))
    sel = [0, 2, 3, 5]
    step.links(0, sel, 0.0)  # round 0 first (the A3 timers)
    links = step.links(1, sel, 7.5)
    specs, *_ = step.round(1, sel, 7.5, records=False)
    assert all(isinstance(specs[c].uplink_rate_bps, MovingRate) for c in sel)
    cols = step.columns(links, sel)  # the links time the transfers, all at once
    assert cols.uplink_moving[0] is step.moving_links[0]
    assert cols.uplink_moving[1].tolist() == [0, 1, 2, 3]
    up, down = step.moving_links
    # at the round's start, the round's own goodputs (one rounding apart)
    at_start = [up.goodput_bps(j, np.array([7.5]))[0] for j in range(len(sel))]
    np.testing.assert_allclose(at_start, links.uplink_goodput_bps, rtol=1e-14)
    at_start = [down.goodput_bps(j, np.array([7.5]))[0] for j in range(len(sel))]
    np.testing.assert_allclose(at_start, links.downlink_goodput_bps, rtol=1e-14)
    # energy: the air time of such a link is the transfer's duration (NaN air rates)
    assert np.isnan(step.round_links[0]).all()

    sc = _moving_scenario(rate="round")
    frozen = NetworkModel(sc, device_profiles(sc))
    frozen.links(0, sel, 0.0)
    links_r = frozen.links(1, sel, 7.5)
    specs_r, *_ = frozen.round(1, sel, 7.5, records=False)
    assert frozen.moving_links is None and frozen.columns(links_r, sel) is not None
    assert [specs_r[c].uplink_rate_bps for c in sel] == links_r.uplink_goodput_bps.tolist()
    assert links_r.uplink_goodput_bps.tolist() == links.uplink_goodput_bps.tolist()


@pytest.mark.parametrize("method", ["closed_form", "events", "media", "auto"])
def test_every_engine_times_moving_rates_as_the_simpy_model_does(method):
    sc = _moving_scenario()
    net = NetworkModel(sc, device_profiles(sc))
    sel = list(range(6))
    net.links(0, sel, 0.0)
    specs, servers, network, _ = net.round(1, sel, 11.0, records=False)
    traces = {
        c: (Download(200_000 + 10_000 * c), Compute(2e9, 10), Upload(800_000 + 5_000 * c))
        for c in sel
    }
    ref = time_round(traces, specs, servers, network, 0.01, method="simpy")
    assert time_round(traces, specs, servers, network, 0.01, method=method) == ref
    assert ref.round_time_s > 0 and all(c.completed for c in ref.clients)


def test_every_engine_agrees_on_transfers_spanning_many_pieces():
    """30 cars, transfers of 0.1-40 MB: some end in the first batch of 8 pieces, some
    several batches later; the media engine's links timed together equal SimPy's alone."""
    sc = _moving_scenario()
    sc = sc.model_copy(update={"topology": sc.topology.model_copy(update={"clients": 30})})
    net = NetworkModel(sc, device_profiles(sc))
    sel = list(range(30))
    net.links(0, sel, 0.0)
    specs, servers, network, _ = net.round(1, sel, 4.0, records=False)
    sizes = np.geomspace(1e5, 4e7, 30).astype(int).tolist()
    traces = {c: (Download(sizes[c] // 4), Compute(1e9, 5), Upload(sizes[c])) for c in sel}
    ref = time_round(traces, specs, servers, network, method="simpy")
    for method in ("closed_form", "events", "media"):
        assert time_round(traces, specs, servers, network, method=method) == ref, method
    assert engine_path(traces, specs, servers, network) == "closed_form"
    # as columns (what replays and sweeps time): the same numbers
    links = net.links(1, sel, 4.0)
    cols = time_round_columns(plan_traces(traces), net.columns(links, sel), network)
    assert cols.timing() == ref
    uploads = sorted(c.upload_s for c in ref.clients)
    assert uploads[0] < 1.0 and uploads[-1] > 40.0, uploads  # 1 piece ... > 4 batches


def test_a_link_timed_alone_is_the_link_timed_with_the_others():
    """What makes the engines agree to the bit: the SimPy model asks one link at a
    time (MovingRate.transfer_time_s), the closed form all at once."""
    sc = _moving_scenario()
    sc = sc.model_copy(update={"topology": sc.topology.model_copy(update={"clients": 30})})
    net = NetworkModel(sc, device_profiles(sc))
    sel = list(range(30))
    net.links(0, sel, 0.0)
    specs, *_ = net.round(1, sel, 4.0, records=False)
    rng = np.random.default_rng(5)
    bits = 8 * np.geomspace(1e4, 4e7, 30) * rng.uniform(0.5, 1.5, 30)
    starts = rng.uniform(0.0, 20.0, 30)
    up = net.moving_links[0]
    together = up.transfer_times_s(np.arange(30), bits, starts)
    alone = [
        specs[c].uplink_rate_bps.transfer_time_s(b, t)
        for c, b, t in zip(sel, bits, starts, strict=True)
    ]
    assert together.tolist() == alone
    assert len(set(np.round(together, 3))) == 30 and together.max() > 40  # several batches


def test_positions_of_one_client_are_those_of_everyone_at_that_time():
    sc = _moving_scenario()
    net = NetworkModel(sc, device_profiles(sc))
    positions = net.moving.positions
    times = np.array([0.25, 3.0, 77.7, 400.2])  # past the first block of 64 grid points
    for c in (0, 4):
        one = positions.client_at(c, times)
        assert one.tolist() == [positions.at(float(t))[c].tolist() for t in times]


def test_a_moving_clients_radio_energy_is_its_transfers_duration():
    """Air time of a moving link = the transfer's elapsed time minus its latency (the
    rate changes during it: no single air rate), P_tx × that."""
    from mecsim.emulation.devices import all_profiles
    from mecsim.emulation.energy import client_energy

    sc = _moving_scenario()
    net = NetworkModel(sc, device_profiles(sc))
    net.links(0, [0], 0.0)
    specs, *_ = net.round(1, [0], 3.0, records=False)
    spec = specs[0]
    trace = (Download(100_000), Compute(1e9, 5), Upload(2_000_000))
    timing = time_round({0: trace}, specs, [ServerSpec(1e9)], NetworkSpec(), method="simpy")
    tl = timing.clients[0]
    up_s = spec.uplink_rate_bps.transfer_time_s(16e6, tl.download_s + tl.compute_s)
    assert tl.upload_s == pytest.approx(up_s + spec.uplink_latency_s, rel=1e-12)
    profile = all_profiles()["rpi4"]
    nan2 = (math.nan, math.nan)
    e = client_energy(profile, tl, trace, spec, tl.finish_s, idle_policy="idle", air_rates_bps=nan2)
    e_const = client_energy(
        profile,
        tl,
        trace,
        ClientSpec(0, 1e6, 1e6, 0.0, 1e9),
        tl.finish_s,
        idle_policy="idle",
        air_rates_bps=(16e6 / up_s, 8e5 / (tl.download_s - spec.downlink_latency_s)),
    )
    # the same radio energy as a constant link at the transfer's mean goodput
    assert e["energy_radio_j"] == pytest.approx(e_const["energy_radio_j"], rel=1e-12)
    assert e["energy_radio_j"] > 0


def test_moving_rates_on_a_shared_medium_are_refused_only_with_capped_flows_naming_the_field():
    """A shared medium re-rates its flows where a moving client's rate changes
    (engine.sharing.VaryingSharing), so ``step`` on a shared cell runs; what is not built
    is water-filling with such rates (flows capped below their link rates: a loss rate
    under ``transport: ideal``), refused before anything starts, naming the fields."""
    data = check_scenario_data("fedavg")
    data["channel"] = {
        "model": "shannon",
        "interference": None,
        "uplink": {"shared": True, "access": "shared_own_band"},
    }
    data["geometry"] = {
        "sites": {"layout": "explicit", "positions_m": [[100, 100], [300, 100]]},
        "margin_m": 100,
        "mobility": {"model": "random_walk"},
    }
    data["topology"] = {"clients": 4, "edge_servers": 2}
    sc = scenario_from_dict(data, "x")
    assert moving_rate_refusal(sc) is None
    assert "geometry.mobility.rate" not in [p.field for p in find_problems(sc).problems]
    data["channel"]["uplink"].update(transport="ideal", loss_rate=0.01, latency_s=0.01)
    sc = scenario_from_dict(data, "x")
    refusal = moving_rate_refusal(sc)
    assert "the uplink is a shared medium whose flows channel.uplink.loss_rate caps" in refusal
    assert [p.field for p in find_problems(sc).problems] == ["geometry.mobility.rate"]
    data["channel"]["uplink"]["transport"] = "tcp"  # TCP recovers its losses: no cap
    assert moving_rate_refusal(scenario_from_dict(data, "x")) is None
    data["channel"]["uplink"]["transport"] = "ideal"
    data["geometry"]["mobility"]["rate"] = "round"
    assert moving_rate_refusal(scenario_from_dict(data, "x")) is None
    data["geometry"]["mobility"] = {"model": "static"}
    assert moving_rate_refusal(scenario_from_dict(data, "x")) is None
    with pytest.raises(ScenarioError, match="geometry.mobility.rate: Input should be 'step'"):
        data["geometry"]["mobility"] = {"model": "random_walk", "rate": "instant"}
        scenario_from_dict(data, "x")


def test_a_replay_of_a_moving_step_run_reproduces_its_times_bit_for_bit(tmp_path):
    """Cars at 20-35 m/s, 2 rounds: under step the times differ from round's (the rate
    follows the car), and a replay without override gives the recorded ones exactly."""
    data = check_scenario_data("fedavg")
    data.update(rounds=2, topology={"clients": 4, "edge_servers": 2})
    data["channel"] = {"model": "shannon", "interference": None, "uplink": {"bandwidth_hz": 1e6}}
    data["geometry"] = {
        "area": {"width_m": 1000, "height_m": 400},
        "sites": {"layout": "explicit", "positions_m": [[250, 200], [750, 200]]},
        "mobility": {"model": "random_waypoint", "speed_mps": [20, 35]},
    }
    run_in_folder(scenario_from_dict(data, "x"), tmp_path / "step")
    data["geometry"]["mobility"]["rate"] = "round"
    run_in_folder(scenario_from_dict(data, "x"), tmp_path / "round")
    step = read_csv_exact(tmp_path / "step" / "rounds.csv")
    frozen = read_csv_exact(tmp_path / "round" / "rounds.csv")
    assert step["round_time_s"].tolist() != frozen["round_time_s"].tolist()
    same = replay(load_run(tmp_path / "step"))
    assert same.exact
    for col in ("round_time_s", "elapsed_s", "ul_time_s", "dl_time_s", "energy_j"):
        assert same.rounds[col].tolist() == step[col].tolist(), col
    # rate is a what-if axis of a flat algorithm's moving run: replayed as round, the step
    # run gives the round run's times (FedAvg trains the same either way), bit for bit
    as_round = replay(load_run(tmp_path / "step"), {"geometry.mobility.rate": "round"})
    assert as_round.exact
    for col in ("round_time_s", "elapsed_s", "ul_time_s", "dl_time_s", "energy_j"):
        assert as_round.rounds[col].tolist() == frozen[col].tolist(), col
    grid = sweep(tmp_path / "step", {"geometry.mobility.rate": ["step", "round"]}, workers=1)
    assert grid["total_time_s"].tolist() == [
        step["elapsed_s"].iloc[-1],
        frozen["elapsed_s"].iloc[-1],
    ]
    # a what-if that puts the moving rates on a shared medium: each car's upload now
    # shares its cell with the others there (never faster), and a sweep takes the point
    shared = replay(load_run(tmp_path / "step"), {"channel.uplink.shared": True})
    assert (shared.rounds["ul_time_s"] >= step["ul_time_s"]).all()
    assert shared.rounds["round_time_s"].tolist() != step["round_time_s"].tolist()
    grid = sweep(tmp_path / "step", {"channel.uplink.shared": [False, True]}, workers=1)
    assert grid["total_time_s"].tolist() == [
        step["elapsed_s"].iloc[-1],
        shared.rounds["elapsed_s"].iloc[-1],
    ]
    # with a loss rate capping the flows (transport: ideal) it is refused before any work
    capped = {
        "channel.uplink.shared": True,
        "channel.uplink.transport": "ideal",
        "channel.uplink.loss_rate": 0.01,
        "channel.uplink.latency_s": 0.01,
    }
    with pytest.raises(OverrideError, match="geometry.mobility.rate: rate: step makes"):
        replay(load_run(tmp_path / "step"), capped)


def test_after_the_horizon_the_client_is_held_and_the_rest_is_sent_at_once():
    """The round's deadline is the links' horizon (MovingLinks.horizon_s): a car driving
    away from 100 m at 30 m/s, 1 s steps, a horizon at 5 s. By hand: the 5 whole pieces
    before it at their midpoints' rates (d = 115, 145, 175, 205, 235 m), then the rest at
    the rate of the held position (d = 250 m): end = 5 + (bits - sent) / r(250). A
    transfer that ends before the horizon is the same number as without one, and one
    that does not end computes no positions past the horizon."""
    import dataclasses

    start, velocity, _ = CAR_AWAY

    def rate(d: float) -> float:
        return BANDWIDTH_HZ * math.log2(1.0 + 10**8.7 * d**-4.0)

    bits = 50e6
    sent = sum(rate(100.0 + 30.0 * (k + 0.5)) for k in range(5))
    assert sent < bits  # the transfer is still going at the horizon
    by_hand = 5.0 + (bits - sent) / rate(250.0)
    links = dataclasses.replace(
        moving_links(straight_track(start, velocity), (0.0, 0.0), 1.0), horizon_s=5.0
    )
    got = float(links.transfer_times_s(np.array([0]), np.array([bits]), np.array([0.0]))[0])
    assert got == pytest.approx(by_hand, rel=1e-9)
    assert MovingRate(links, 0).transfer_time_s(bits, 0.0) == got  # the scalar path too
    assert links.positions._filled <= 64  # one block: nothing computed past the horizon

    # a transfer through before the horizon: the horizon changes nothing
    free = moving_links(straight_track(start, velocity), (0.0, 0.0), 1.0)
    small = np.array([0.8e6 * 8])
    args = (np.array([0]), small, np.array([0.0]))
    assert links.transfer_times_s(*args)[0] == free.transfer_times_s(*args)[0] < 5.0

    # without a horizon, a transfer that never ends walks every client's grid far ahead
    free.transfer_times_s(np.array([0]), np.array([1e15]), np.array([0.0]))
    assert free.positions._filled > 1000
