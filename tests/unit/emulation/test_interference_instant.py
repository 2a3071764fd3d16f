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
