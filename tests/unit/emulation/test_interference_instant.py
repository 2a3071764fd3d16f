"""Per-instant geometric interference (``channel.interference.timing: instant``;
docs/mobility.md, "Interference from geometry"): an uplink interferer counts while its
upload is on the air, the rates re-computed at each upload's start and end, against a
hand calculation on three clients.

The case (the exponent model, g(d) = 10^−4 · d^−4; 23 dBm = 0.199526 W, 10 MHz, N0 =
−174 dBm/Hz, reuse 1): sites A (100, 100) and B (600, 100); client 0 at (200, 100) is
served by A (100 m), clients 1 at (400, 100) and 2 at (500, 100) by B (200 m, 100 m).
Clients of one cell are orthogonal; each hears the other cell's clients that transmit:
at A, client 1 (300 m) and client 2 (400 m); at B, client 0 (400 m). Uploads of 30, 4
and 10 Mbit start at 0, 0.5 and 1.0 s:

    [0, 0.5)    0 alone:          r_0 = B log2(1 + S_0 / N)
    [0.5, 1.0)  0 and 1:          r_0 = B log2(1 + S_0 / (N + p g(300))),
                                  r_1 = B log2(1 + S_1 / (N + p g(400)))
    [1.0, t_0)  0, 1, 2:          r_0 with p g(300) + p g(400); r_1, r_2 with p g(400)
    [t_0, t_2)  1, 2 (0 is done): r_1 = B log2(1 + S_1 / N), r_2 = B log2(1 + S_2 / N)
    [t_2, t_1)  1 alone

with S_i = p g(d_i), N = N0 B; each end where the upload's bits are through (the order
checked on the way). Per round every interferer counts all the time: 0 at r_0 with both,
1 and 2 with client 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.scenarios import tiny

from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Compute, Upload
from mecsim.emulation.timing import emulate_round
from mecsim.scenario import ScenarioError

P_W = 10**2.3 / 1000
N_W = 10**-17.4 / 1000 * 10e6
B_HZ = 10e6
BITS = (30e6, 4e6, 10e6)
STARTS = (0.0, 0.5, 1.0)


def g(d_m: float) -> float:
    return 1e-4 * d_m**-4


def r(signal_w: float, interference_w: float) -> float:
    return B_HZ * math.log2(1.0 + signal_w / (N_W + interference_w))


S0, S1, S2 = P_W * g(100), P_W * g(200), P_W * g(100)
I_A_1, I_A_2, I_B_0 = P_W * g(300), P_W * g(400), P_W * g(400)


def by_hand() -> tuple[float, float, float]:
    left = list(BITS)
    left[0] -= r(S0, 0.0) * 0.5  # [0, 0.5): 0 alone
    left[0] -= r(S0, I_A_1) * 0.5  # [0.5, 1): 0 and 1
    left[1] -= r(S1, I_B_0) * 0.5
    r0, r1, r2 = r(S0, I_A_1 + I_A_2), r(S1, I_B_0), r(S2, I_B_0)  # [1, t_0)
    dt = left[0] / r0
    assert dt < left[1] / r1 and dt < left[2] / r2  # client 0 is through first
    t0 = 1.0 + dt
    left[1] -= r1 * dt
    left[2] -= r2 * dt
    r1, r2 = r(S1, 0.0), r(S2, 0.0)  # [t_0, t_2): 1 and 2, nobody in cell A
    dt = left[2] / r2
    assert dt < left[1] / r1  # then client 2
    t2 = t0 + dt
    left[1] -= r1 * dt
    t1 = t2 + left[1] / r1  # client 1 alone
    return t0, t1, t2


def three_clients(timing: str = "instant"):
    return tiny(
        topology={"clients": 3, "edge_servers": 2, "participation": 1.0},
        channel={
            "model": "shannon",
            "uplink": {"bandwidth_hz": B_HZ, "tx_power_dbm": 23.0, "transport": "ideal"},
            "downlink": {"bandwidth_hz": 20e6, "tx_power_dbm": 30.0, "transport": "ideal"},
            "interference": {"model": "geometric", "reuse": 1, "timing": timing},
        },
        geometry={
            "area": {"width_m": 700, "height_m": 200},
            "sites": {"layout": "explicit", "positions_m": [[100, 100], [600, 100]]},
            "clients": {
                "placement": "explicit",
                "positions_m": [[200, 100], [400, 100], [500, 100]],
            },
        },
    )


def test_the_uploads_solved_per_instant_equal_the_hand_calculation():
    sc = three_clients()
    net = NetworkModel(sc, device_profiles(sc))
    net.links(0, [0, 1, 2], 0.0)
    instant = net.instant_uplink
    assert instant is not None and net.edge_server.tolist() == [0, 1, 1]
    # the rates of each set of transmitters
    on = np.array([True, False, False])
    assert instant.rates_bps(on)[0] == pytest.approx(r(S0, 0.0), rel=1e-12)
    every = instant.rates_bps(np.ones(3, dtype=bool))
    want = [r(S0, I_A_1 + I_A_2), r(S1, I_B_0), r(S2, I_B_0)]
    assert every.tolist() == pytest.approx(want, rel=1e-12)
    end, schedules = instant.solve(np.array(STARTS), np.array(BITS))
    t0, t1, t2 = by_hand()
    assert end.tolist() == pytest.approx([t0, t1, t2], rel=1e-12)
    times, rates = schedules[0]
    assert times == pytest.approx((0.0, 0.5, 1.0), abs=0)
    assert rates == pytest.approx((r(S0, 0.0), r(S0, I_A_1), want[0]), rel=1e-12)


@pytest.mark.parametrize("timing", ["instant", "round"])
def test_the_engine_times_the_round_per_instant(timing):
    """The same uploads in a round: client c computes for its start's seconds, then
    uploads; the round's timing gives the hand calculation's ends (instant) or the
    per-round rates' (round: every interferer on all the time, later)."""
    sc = three_clients(timing)
    net = NetworkModel(sc, device_profiles(sc))
    em = emulate_round(net, None, np.ones(3), 0, [0, 1, 2], 0.0, (), ())
    f = {c: em.specs[c].flops_per_s for c in range(3)}
    traces = {c: (Compute(STARTS[c] * f[c], 0), Upload(int(BITS[c] / 8))) for c in range(3)}
    timing_ = em.time(traces)
    finish = [tl.finish_s for tl in sorted(timing_.clients, key=lambda c: c.client_id)]
    if timing == "instant":
        assert finish == pytest.approx(list(by_hand()), rel=1e-9)
    else:
        every = [r(S0, I_A_1 + I_A_2), r(S1, I_B_0), r(S2, I_B_0)]
        per_round = [STARTS[c] + BITS[c] / every[c] for c in range(3)]
        assert finish == pytest.approx(per_round, rel=1e-9)
        assert all(p > h for p, h in zip(per_round, by_hand(), strict=True))


def test_instant_timing_is_refused_where_it_is_not_built():
    with pytest.raises(ScenarioError, match=r"channel\.interference\.timing"):
        tiny(channel={"model": "shannon", "interference": {"unit": "noise", "timing": "instant"}})
    sc = three_clients().model_dump(mode="json")
    sc["channel"]["uplink"]["shared"] = True
    sc["channel"]["uplink"]["access"] = "shared_cell"
    from mecsim.scenario import scenario_from_dict

    with pytest.raises(ScenarioError, match=r"channel\.interference\.timing: .*shared"):
        scenario_from_dict(sc, "t")


def test_a_scenario_at_the_default_timing_dumps_as_before():
    sc = three_clients("round")
    assert "timing" not in sc.model_dump(mode="json")["channel"]["interference"]
    assert three_clients().model_dump(mode="json")["channel"]["interference"]["timing"] == (
        "instant"
    )


def test_a_run_charges_each_upload_its_air_time_per_instant(tmp_path):
    """A one-round run of the three clients: each client's radio energy is its uploads'
    and downloads' air time (the transfer's duration on a rate schedule) at its powers:
    finite, and below the per-round run's (its uploads are shorter)."""
    from mecsim.store.reader import read_csv_exact
    from mecsim.store.session import run_in_folder

    energy = {}
    for timing in ("instant", "round"):
        sc = three_clients(timing).model_copy(update={"rounds": 1})
        run_in_folder(sc, tmp_path / timing)
        rows = read_csv_exact(tmp_path / timing / "clients.csv")
        energy[timing] = rows["energy_radio_j"].to_numpy()
        assert np.isfinite(energy[timing]).all() and (energy[timing] > 0).all()
    assert (energy["instant"] <= energy["round"] + 1e-12).all()
    assert (energy["instant"] < energy["round"]).any()


def test_timing_is_an_override_path():
    """Left out of a dump at its default, ``timing`` can still be set by an override (a
    sweep's axis: ``--set channel.interference.timing=round,instant``)."""
    from mecsim.scenario.overrides import apply_overrides, is_timing_path

    sc = apply_overrides(three_clients("round"), {"channel.interference.timing": "instant"})
    assert sc.channel.interference.timing == "instant"
    assert is_timing_path("channel.interference.timing")


def test_a_replay_per_instant_of_a_per_round_run_is_a_run_per_instant(tmp_path):
    """Two rounds of the three clients' cells with reuse 1: a replay of the per-round run
    with ``timing: instant`` gives the rounds of a run per instant, bit for bit (its
    energy included); they are shorter."""
    from mecsim.analysis.replay import load_run, replay
    from mecsim.run.rows import REPLAY_COLUMNS
    from mecsim.scenario.overrides import apply_overrides
    from mecsim.store.reader import read_csv_exact
    from mecsim.store.session import run_in_folder

    base = three_clients("round")
    point = {"channel.interference.timing": "instant"}
    run_in_folder(base, tmp_path / "a")
    run_in_folder(apply_overrides(base, point), tmp_path / "b")
    got = replay(load_run(tmp_path / "a"), point)
    want = read_csv_exact(tmp_path / "b" / "rounds.csv")[REPLAY_COLUMNS]
    for col in REPLAY_COLUMNS:
        assert np.array_equal(got.rounds[col].to_numpy(), want[col].to_numpy(), equal_nan=True), col
    first = read_csv_exact(tmp_path / "a" / "rounds.csv")
    assert (want["round_time_s"].to_numpy() < first["round_time_s"].to_numpy()).all()


# ----------------------------------------------------------------------------- a walker
#
# The same three clients, but client 0 walks from (200, 100) towards B along +x at
# V = 20 m/s (an ns-2 trace; clients 1 and 2 stand), on a 0.5 s mobility grid
# (geometry.mobility.rate: step). Over grid step k ([0.5 k, 0.5 k + 0.5) s) every client
# is where it is at the step's midpoint: client 0 at x = 200 + 20 · (0.5 k + 0.25) =
# 205 + 10 k (whole metres: exact), so its own link is 105 + 10 k m long (to A) and
# what it puts into B comes from 395 − 10 k m; clients 1 and 2 put into A what they did.
# The rates change at grid times and at uploads' starts and ends:
#
#     [0, 0.5)     step 0   0 alone
#     [0.5, 1.0)   step 1   0 and 1
#     [1.0, t_2)   step 2   0, 1, 2        (2 is through first: 10 Mbit at ~25.6 Mb/s)
#     [t_2, 1.5)   step 2   0 and 1        (neither through by the grid time)
#     [1.5, t_1)   step 3   0 and 1        (1 is through)
#     [t_1, t_0)   step 3   0 alone
#
# each order asserted on the way, as above.

V_MPS = 20.0
GRID_S = 0.5
WALK = """\
$node_(0) set X_ 200.0
$node_(0) set Y_ 100.0
$node_(1) set X_ 400.0
$node_(1) set Y_ 100.0
$node_(2) set X_ 500.0
$node_(2) set Y_ 100.0
$ns_ at 0.0 "$node_(0) setdest 650.0 100.0 {speed}"
"""


def x0(k: int) -> float:
    """Client 0's x over grid step k (m): at the step's midpoint."""
    return 200.0 + V_MPS * (GRID_S * k + GRID_S / 2)


def by_hand_walking() -> tuple[float, float, float]:
    def s0(k: int) -> float:
        return P_W * g(x0(k) - 100.0)

    def i_b0(k: int) -> float:
        return P_W * g(600.0 - x0(k))

    left = list(BITS)
    left[0] -= r(s0(0), 0.0) * 0.5  # [0, 0.5)
    left[0] -= r(s0(1), I_A_1) * 0.5  # [0.5, 1.0)
    left[1] -= r(S1, i_b0(1)) * 0.5
    r0, r1, r2 = r(s0(2), I_A_1 + I_A_2), r(S1, i_b0(2)), r(S2, i_b0(2))  # [1.0, t_2)
    dt = left[2] / r2
    assert dt < left[0] / r0 and dt < left[1] / r1 and 1.0 + dt < 1.5
    t2 = 1.0 + dt
    left[0] -= r0 * dt
    left[1] -= r1 * dt
    r0, r1 = r(s0(2), I_A_1), r(S1, i_b0(2))  # [t_2, 1.5): 2 is done
    dt = 1.5 - t2
    assert dt < left[0] / r0 and dt < left[1] / r1
    left[0] -= r0 * dt
    left[1] -= r1 * dt
    r0, r1 = r(s0(3), I_A_1), r(S1, i_b0(3))  # [1.5, t_1): step 3
    dt = left[1] / r1
    assert dt < left[0] / r0
    t1 = 1.5 + dt
    left[0] -= r0 * dt
    r0 = r(s0(3), 0.0)  # [t_1, t_0): 0 alone
    dt = left[0] / r0
    assert t1 + dt < 2.0
    return t1 + dt, t1, t2


def walking(tmp_path, speed_mps: float = V_MPS, timing: str = "instant", clients: int = 3):
    path = tmp_path / "walk.tcl"
    lines = WALK.format(speed=speed_mps).splitlines()
    keep = [ln for ln in lines if not any(f"node_({c})" in ln for c in range(clients, 3))]
    path.write_text("\n".join(keep) + "\n")
    sc = three_clients(timing).model_dump(mode="json", exclude_none=True)
    sc["topology"]["clients"] = clients
    sc["topology"]["edge_servers"] = 2 if clients > 1 else 1
    geometry = sc["geometry"]
    geometry["clients"]["positions_m"] = geometry["clients"]["positions_m"][:clients]
    if clients == 1:
        geometry["sites"]["positions_m"] = geometry["sites"]["positions_m"][:1]
    geometry["association"] = {"rule": "nearest", "hysteresis_m": 0.0}
    geometry["mobility"] = {
        "model": "trace",
        "step_s": GRID_S,
        "rate": "step",
        "trace": {"format": "ns2", "path": str(path)},
    }
    from mecsim.scenario import scenario_from_dict

    return scenario_from_dict(sc, "walking")


def test_a_walker_per_instant_equals_the_hand_calculation(tmp_path):
    """The solver's ends are the hand calculation's (1e-9 relative); the round timed
    (``EmulatedRound.time``) finishes there too; the standing case's ends (the walker where it
    started) are not these."""
    sc = walking(tmp_path)
    net = NetworkModel(sc, device_profiles(sc))
    em = emulate_round(net, None, np.ones(3), 0, [0, 1, 2], 0.0, (), ())
    instant = net.instant_uplink
    assert instant is not None and instant.motion is not None
    assert net.edge_server.tolist() == [0, 1, 1]
    end, schedules = instant.solve(np.array(STARTS), np.array(BITS))
    want = by_hand_walking()
    assert end.tolist() == pytest.approx(list(want), rel=1e-9)
    # client 0's rate: a step at 0.5, 1.0 (1 and 2 start), t_2, 1.5 (the grid), t_1
    times, _ = schedules[0]
    assert times == pytest.approx((0.0, 0.5, 1.0, want[2], 1.5, want[1]), rel=1e-12)
    # the round: each client computes until its upload's start, then uploads
    f = {c: em.specs[c].flops_per_s for c in range(3)}
    traces = {c: (Compute(STARTS[c] * f[c], 0), Upload(int(BITS[c] / 8))) for c in range(3)}
    finish = sorted(em.time(traces).clients, key=lambda c: c.client_id)
    assert [c.finish_s for c in finish] == pytest.approx(list(want), rel=1e-9)
    # standing where it started (the hand calculation of the standing case) is not it
    assert not np.allclose(end, by_hand(), rtol=1e-6)


def test_a_walker_at_speed_0_is_the_standing_case_exactly():
    """The solver with gains that are the same at every grid step gives the numbers of
    the solver without motion, bit for bit (a grid time whose gains did not change is
    no event)."""
    from dataclasses import replace

    sc = three_clients()
    net = NetworkModel(sc, device_profiles(sc))
    net.links(0, [0, 1, 2], 0.0)
    standing = net.instant_uplink
    assert standing is not None and standing.motion is None

    class Still:
        step_s, round_start_s = GRID_S, 0.0

        def last_step(self) -> int:
            return 3600

        def at_step(self, k: int) -> tuple[np.ndarray, np.ndarray]:
            return standing.gain.copy(), standing.heard_w.copy()

    still = replace(standing, motion=Still())
    for starts in (np.array(STARTS), np.array([0.3, np.nan, 0.3]), np.array([2.2, 0.0, 1.7])):
        e1, s1 = standing.solve(starts, np.array(BITS))
        e2, s2 = still.solve(starts, np.array(BITS))
        assert np.array_equal(e1, e2, equal_nan=True) and s1 == s2


def test_a_standing_trace_per_instant_is_the_standing_case(tmp_path):
    """The whole round: clients on a trace that stand (speed 0), rate: step, give the
    standing case's ends (the gains at the grid's times are those of the start)."""
    sc = walking(tmp_path, speed_mps=0.0)
    net = NetworkModel(sc, device_profiles(sc))
    net.links(0, [0, 1, 2], 0.0)
    assert net.instant_uplink is not None and net.instant_uplink.motion is not None
    end, _ = net.instant_uplink.solve(np.array(STARTS), np.array(BITS))
    assert end.tolist() == pytest.approx(list(by_hand()), rel=1e-12)


def test_one_walker_alone_per_instant_is_its_moving_rate_on_the_grid(tmp_path):
    """One client: no interferer, so its upload per instant is its moving link's rate
    over the grid's steps, each at the step's midpoint (the rule of a walker alone on a
    shared cell: MovingRate.segments) — and, by hand, Σ over steps."""
    sc = walking(tmp_path, clients=1)
    net = NetworkModel(sc, device_profiles(sc))
    net.links(0, [0], 0.0)
    instant, moving = net.instant_uplink, net.moving_links
    assert instant is not None and moving is not None
    bits = 60e6
    end, _ = instant.solve(np.array([0.2]), np.array([bits]))
    # the moving link's own steps (interference 0: one client)
    left, t = bits, 0.2
    for rate, until in moving[0].rate(0).segments(0.2):
        if left <= rate * (until - t):
            break
        left -= rate * (until - t)
        t = until
    assert end[0] == pytest.approx(t + left / rate, rel=1e-12)
    # by hand: client 0 over step k at 105 + 10 k m from A, alone
    left, t, k = bits, 0.2, 0
    while left > r(P_W * g(x0(k) - 100.0), 0.0) * (GRID_S * (k + 1) - t):
        left -= r(P_W * g(x0(k) - 100.0), 0.0) * (GRID_S * (k + 1) - t)
        t, k = GRID_S * (k + 1), k + 1
    assert k >= 3  # the upload spans several steps
    assert end[0] == pytest.approx(t + left / r(P_W * g(x0(k) - 100.0), 0.0), rel=1e-9)


def test_instant_timing_with_handover_during_rounds_is_refused(tmp_path):
    sc = walking(tmp_path).model_dump(mode="json", exclude_none=True)
    sc["geometry"]["handover"] = {}
    from mecsim.scenario import scenario_from_dict

    with pytest.raises(ScenarioError, match=r"channel\.interference\.timing: .*geometry\.handover"):
        scenario_from_dict(sc, "t")


def test_a_walkers_grid_path_losses_are_the_associations(tmp_path):
    """Under TR 38.901 with spatially consistent LOS and shadowing, the path losses the
    per-instant solver takes at a grid step are those the association evaluates with the
    clients there (the same model, the same fields), to the bit."""
    from mecsim.emulation.geometry import distances_m, link_metric

    sc = walking(tmp_path).model_dump(mode="json", exclude_none=True)
    sc["channel"]["path_loss"] = {"model": "38.901-umi", "carrier_ghz": 3.5}
    sc["geometry"]["min_distance_m"] = 10.0
    from mecsim.scenario import scenario_from_dict

    sc = scenario_from_dict(sc, "umi walker")
    net = NetworkModel(sc, device_profiles(sc))
    net.links(0, [0, 1, 2], 0.0)
    motion = net.instant_uplink.motion
    assert motion is not None and net.cells.spatial is not None
    p = net.moving.positions.at(1.75)  # step 3's midpoint
    cells = net.cells
    want, _, _ = link_metric(
        "nearest", distances_m(p, cells.sites_m), net.channel, cells.large_scale_at(p)
    )
    assert np.array_equal(motion.path_loss_db(p), want)
    gain, heard = motion.at_step(3)
    p_w = 10 ** (23 / 10) / 1e3
    assert heard == pytest.approx(p_w * 10.0 ** (-want / 10.0), rel=1e-12)
    assert not np.array_equal(heard, motion.at_step(2)[1])  # client 0 moved


def test_a_run_with_a_walker_per_instant(tmp_path):
    """A one-round run of the walker's cells per instant: every client's upload and
    radio energy finite."""
    from mecsim.store.reader import read_csv_exact
    from mecsim.store.session import run_in_folder

    sc = walking(tmp_path).model_copy(update={"rounds": 1})
    run_in_folder(sc, tmp_path / "run")
    rows = read_csv_exact(tmp_path / "run" / "clients.csv")
    assert len(rows) == 3
    assert np.isfinite(rows["upload_s"].to_numpy()).all()
    assert (rows["energy_radio_j"].to_numpy() > 0).all()
