"""Interference from geometry (``channel.interference: {model: geometric, reuse}``):
channel groups of the reuse factors, one round's interference, SINR and rates worked by
hand, the refusals, the default (distribution draws) unchanged, a replay under another
reuse factor equal to a run of it, and the per-round approximation measured against the
exact per-instant interference (docs/mobility.md, "Interference from geometry").

The hand working uses the exponent path-loss model (KAPC Table 4: PL0 = −40 dB, γ = 4,
d0 = 1 m, so g(d) = 10^−4 · d^−4) and Python's math module, not mecsim's functions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.scenarios import tiny

from mecsim.analysis.replay import load_run, replay
from mecsim.emulation import geometry as geo
from mecsim.emulation import interference as itf
from mecsim.emulation.network import NetworkModel, build_channel, device_profiles
from mecsim.run.rows import REPLAY_COLUMNS
from mecsim.scenario import ScenarioError, load_scenario
from mecsim.scenario.loader import default_scenario_path
from mecsim.scenario.overrides import apply_overrides
from mecsim.store.checkpoints import scenario_digest
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder

SQ3 = math.sqrt(3.0)
P_UL_W = 10**2.3 / 1000  # 23 dBm
N0_W_PER_HZ = 10**-17.4 / 1000  # −174 dBm/Hz


def g(d_m: float) -> float:
    """The exponent model's gain: 10^(PL0/10)·(d/d0)^−γ = 10^−4 · d^−4."""
    return 1e-4 * d_m**-4


def _channel(interference):
    return {
        "model": "shannon",
        "uplink": {"bandwidth_hz": 10e6, "tx_power_dbm": 23.0},
        "downlink": {"bandwidth_hz": 20e6, "tx_power_dbm": 30.0, "mode": "full"},
        "interference": interference,
    }


def two_cells(reuse=1, **extra):
    """Sites A (100, 100) and B (600, 100); client 0 at (200, 100): 100 m from A, 400 m
    from B; client 1 at (400, 100): 300 m from A, 200 m from B. Nearest: 0 → A, 1 → B."""
    return tiny(
        topology={"clients": 2, "edge_servers": 2, "participation": 1.0},
        channel=_channel({"model": "geometric", "reuse": reuse}),
        geometry={
            "area": {"width_m": 700, "height_m": 200},
            "sites": {"layout": "explicit", "positions_m": [[100, 100], [600, 100]]},
            "clients": {"placement": "explicit", "positions_m": [[200, 100], [400, 100]]},
        },
        **extra,
    )


# --- one round worked by hand ----------------------------------------------------------
def test_two_cells_two_clients_by_hand():
    """p = 23 dBm = 0.199526 W each, N0·B_U = 3.98107e-14 W (10 MHz), reuse 1.

    Uplink, at A (client 0's site): client 1 of cell B, 300 m from A:
      I_0 = p·g(300) = 0.199526 · 10^−4 / 8.1e9 = 2.46329e-15 W;
      S_0 = p·g(100) = 1.99526e-13 W; SINR_0 = S_0 / (I_0 + N0·B) = 4.71983 (6.739 dB);
      r_0 = 10 MHz · log2(1 + 4.71983) = 25.1597 Mb/s (25.8781 without interference).
    At B (client 1's site): client 0, 400 m from B: I_1 = p·g(400) = 7.79399e-16 W;
      S_1 = p·g(200) = 1.24704e-14 W; SINR_1 = 0.307227 (−5.125 dB); r_1 = 3.86510 Mb/s.
    Downlink (1 W, 20 MHz): client 0 hears B at 400 m: I = g(400) = 3.90625e-15 W,
      SINR = g(100) / (I + N0·20 MHz) = 11.9721; client 1 hears A at 300 m:
      I = g(300) = 1.23457e-14 W, SINR = g(200) / (I + N0·20 MHz) = 0.679591."""
    sc = two_cells()
    net = NetworkModel(sc, device_profiles(sc))
    assert net.edge_server.tolist() == [0, 1]
    _, _, _, rows = net.round(0, [0, 1])
    ul = {0: (P_UL_W * g(300), P_UL_W * g(100)), 1: (P_UL_W * g(400), P_UL_W * g(200))}
    dl = {0: (g(400), g(100)), 1: (g(300), g(200))}
    for c in (0, 1):
        i_w, s_w = ul[c]
        sinr = s_w / (i_w + N0_W_PER_HZ * 10e6)
        assert rows[c]["ul_interference_w"] == pytest.approx(i_w, rel=1e-9, abs=0)
        assert rows[c]["uplink_snr_db"] == pytest.approx(10 * math.log10(sinr), rel=1e-9)
        assert rows[c]["uplink_rate_bps"] == pytest.approx(10e6 * math.log2(1 + sinr), rel=1e-9)
        i_w, s_w = dl[c]
        sinr = s_w / (i_w + N0_W_PER_HZ * 20e6)
        assert rows[c]["dl_interference_w"] == pytest.approx(i_w, rel=1e-9, abs=0)
        assert rows[c]["downlink_rate_bps"] == pytest.approx(20e6 * math.log2(1 + sinr), rel=1e-9)
    # the literal numbers of the docstring
    assert rows[0]["ul_interference_w"] == pytest.approx(2.46329e-15, rel=1e-5, abs=0)
    assert rows[0]["uplink_rate_bps"] == pytest.approx(25.1597e6, rel=1e-5)
    assert rows[1]["uplink_rate_bps"] == pytest.approx(3.86510e6, rel=1e-5)
    # alone in a round, nobody interferes: client 0's rate is the interference-free one
    _, _, _, alone = net.round(0, [0])
    assert alone[0]["ul_interference_w"] == 0.0 and alone[0]["dl_interference_w"] == 0.0
    want = 10e6 * math.log2(1 + P_UL_W * g(100) / (N0_W_PER_HZ * 10e6))
    assert alone[0]["uplink_rate_bps"] == pytest.approx(want, rel=1e-9)


def test_two_cells_on_different_channels_do_not_interfere():
    """reuse 3 on two explicit sites: the greedy colouring puts them in groups 0 and 1."""
    sc = two_cells(reuse=3)
    net = NetworkModel(sc, device_profiles(sc))
    assert net.cells.groups.tolist() == [0, 1]
    _, _, _, rows = net.round(0, [0, 1])
    assert [rows[c]["ul_interference_w"] for c in (0, 1)] == [0.0, 0.0]
    assert [rows[c]["dl_interference_w"] for c in (0, 1)] == [0.0, 0.0]


# --- channel groups --------------------------------------------------------------------
def test_reuse_groups_of_a_7_site_hex_grid_by_hand():
    """Ring 1 from +x counter-clockwise is, in axial (q, r) with a site at
    q·D·(1, 0) + r·D·(½, √3/2): (1, 0), (0, 1), (−1, 1), (−1, 0), (0, −1), (1, −1).
    Reuse 3, (q − r) mod 3: 1, 2, 1, 2, 1, 2 (the centre 0): the ring alternates, no two
    neighbours share a group. Reuse 7, (q + 3r) mod 7: 1, 3, 2, 6, 4, 5: all 7 differ."""
    sites = geo.hex_grid_sites(1, 200.0, (500.0, 400.0))
    axial = itf.hex_axial(sites, sites[0], 200.0)
    assert axial.tolist() == [[0, 0], [1, 0], [0, 1], [-1, 1], [-1, 0], [0, -1], [1, -1]]
    assert itf.hex_reuse_groups(axial, 1).tolist() == [0] * 7
    assert itf.hex_reuse_groups(axial, 3).tolist() == [0, 1, 2, 1, 2, 1, 2]
    assert itf.hex_reuse_groups(axial, 7).tolist() == [0, 1, 3, 2, 6, 4, 5]
    # a scenario's hexagonal geometry gets these groups
    sc = tiny(
        topology={"clients": 7, "edge_servers": 7},
        channel=_channel({"model": "geometric", "reuse": 3}),
        geometry={"sites": {"layout": "hex", "rings": 1, "inter_site_distance_m": 200}},
    )
    assert NetworkModel(sc, device_profiles(sc)).cells.groups.tolist() == [0, 1, 2, 1, 2, 1, 2]


@pytest.mark.parametrize("reuse, distance", [(3, SQ3), (7, math.sqrt(7.0))])
def test_hex_reuse_keeps_co_channel_sites_root_n_d_apart(reuse, distance):
    """On 37 sites (3 rings): neighbours (D apart) never share a group, and the nearest
    co-channel sites are √N·D apart (the pattern's reuse distance)."""
    sites = geo.hex_grid_sites(3, 1.0)
    grp = itf.hex_reuse_groups(itf.hex_axial(sites, sites[0], 1.0), reuse)
    assert sorted(set(grp.tolist())) == list(range(reuse))
    d = geo.distances_m(sites, sites)
    same = (grp[:, None] == grp[None, :]) & ~np.eye(len(sites), dtype=bool)
    assert d[same].min() == pytest.approx(distance, rel=1e-12)


def test_greedy_groups_of_explicit_sites_by_hand():
    """Four sites on a line at x = 0, 100, 200, 300, reuse 3: sites 0, 1, 2 take the empty
    groups 0, 1, 2; site 3's nearest co-channel site would be 300 m (group 0), 200 m
    (group 1) or 100 m (group 2) away: it takes group 0. Reuse 1: one group."""
    line = [[0, 0], [100, 0], [200, 0], [300, 0]]
    assert itf.greedy_reuse_groups(line, 3).tolist() == [0, 1, 2, 0]
    assert itf.greedy_reuse_groups(line, 7).tolist() == [0, 1, 2, 3]
    assert itf.greedy_reuse_groups(line, 1).tolist() == [0, 0, 0, 0]


def test_sinr_association_hears_only_co_channel_sites():
    """Three sites' powers at a client −60, −63, −64 dBm, noise −100 dBm. All co-channel:
    SINR_0 = 1e-6 / (5.012e-7 + 3.981e-7 + 1e-10) mW → 0.46 dB. Groups [0, 1, 1]: site
    0 hears nobody (60 − (−100) = 40 dB), site 1 hears site 2 only:
    10·log10(5.012e-7 / (3.981e-7 + 1e-10)) = 0.9989 dB."""
    rx = np.array([[-60.0, -63.0, -64.0]])
    mw = 10 ** (rx[0] / 10)
    all_co = geo.sinr_db(rx, -100.0)
    assert all_co[0, 0] == pytest.approx(10 * math.log10(mw[0] / (mw[1] + mw[2] + 1e-10)))
    grouped = geo.sinr_db(rx, -100.0, [0, 1, 1])
    assert grouped[0, 0] == pytest.approx(10 * math.log10(mw[0] / 1e-10), rel=1e-12)
    assert grouped[0, 1] == pytest.approx(10 * math.log10(mw[1] / (mw[2] + 1e-10)), rel=1e-12)
    assert grouped[0, 1] == pytest.approx(0.9989, abs=1e-4)


# --- validation and the default --------------------------------------------------------
def test_geometric_without_a_geometry_is_refused_naming_the_field():
    with pytest.raises(ScenarioError, match="channel.interference.model: geometric"):
        tiny(channel=_channel({"model": "geometric"}))


WALK_NS2 = """\
$node_(0) set X_ 200.0
$node_(0) set Y_ 100.0
$node_(1) set X_ 500.0
$node_(1) set Y_ 100.0
$node_(2) set X_ 250.0
$node_(2) set Y_ 100.0
$ns_ at 0.0 "$node_(2) setdest 690.0 100.0 10.0"
"""


def _walking_cells(tmp_path, reuse=1):
    """Sites A (100, 100) and B (600, 100) as in ``two_cells``; clients 0 at (200, 100)
    and 1 at (500, 100) stand, client 2 walks from (250, 100) along y = 100 m at 10 m/s
    (an ns-2 trace: x(t) = 250 + 10 t). Rule nearest, no hysteresis, no time to trigger."""
    path = tmp_path / "walk.tcl"
    path.write_text(WALK_NS2)
    return tiny(
        topology={"clients": 3, "edge_servers": 2, "participation": 1.0},
        channel=_channel({"model": "geometric", "reuse": reuse}),
        geometry={
            "area": {"width_m": 700, "height_m": 200},
            "sites": {"layout": "explicit", "positions_m": [[100, 100], [600, 100]]},
            "association": {"rule": "nearest", "hysteresis_m": 0.0, "time_to_trigger_s": 0.0},
            "mobility": {"model": "trace", "trace": {"format": "ns2", "path": str(path)}},
        },
    )


def test_geometric_interference_follows_clients_that_move(tmp_path):
    """p = 23 dBm = 0.199526 W, g(d) = 10^−4·d^−4, reuse 1, all three selected.

    Round 0 (t = 0): client 2 at x = 250: 150 m from A, 350 m from B: served by A
    (clients 0 → A, 1 → B: 100 m each).
      Uplink at A (clients 0, 2) from cell B's client 1, 400 m from A:
        I = p·g(400) = 0.199526 · 3.90625e-15 = 7.79399e-16 W;
      at B (client 1) from clients 0 (400 m) and 2 (350 m from B):
        I = p·(g(400) + g(350)) = 0.199526 · (3.90625e-15 + 6.66389e-15) = 2.10902e-15 W.
      Downlink (1 W): clients 0 and 2 hear B at 400 m / 350 m: 3.90625e-15, 6.66389e-15 W;
      client 1 hears A at 400 m: 3.90625e-15 W.
    Round 1 (t = 20 s): client 2 at x = 450: 350 m from A, 150 m from B: hands over to B.
      Uplink at A (client 0) from cell B's clients 1 (400 m) and 2 (350 m):
        I_0 = p·(g(400) + g(350)) = 2.10902e-15 W;
      at B (clients 1, 2) from client 0, 400 m from B: I_1 = I_2 = p·g(400) = 7.79399e-16 W.
      Downlink: client 0 hears B at 400 m: 3.90625e-15 W; clients 1 and 2 hear A at
      400 m and 350 m: 3.90625e-15 and 6.66389e-15 W.
    With the start's path losses and cells (what geometric interference did before it
    followed moving clients) round 1 would repeat round 0's numbers."""
    sc = _walking_cells(tmp_path)
    net = NetworkModel(sc, device_profiles(sc))
    p_g400, p_g350 = 7.793993e-16, 1.329621e-15
    want = {
        0: ([0, 1, 0], [p_g400, p_g400 + p_g350, p_g400], [g(400), g(400), g(350)]),
        20.0: ([0, 1, 1], [p_g400 + p_g350, p_g400, p_g400], [g(400), g(400), g(350)]),
    }
    for rnd, t in enumerate(want):
        _, _, _, rows = net.round(rnd, [0, 1, 2], t)
        serving, ul_w, dl_w = want[t]
        assert net.edge_server.tolist() == serving
        assert rows[2]["x_m"] == 250.0 + 10.0 * t
        got_ul = [rows[c]["ul_interference_w"] for c in (0, 1, 2)]
        got_dl = [rows[c]["dl_interference_w"] for c in (0, 1, 2)]
        assert got_ul == pytest.approx(ul_w, rel=1e-6, abs=0)
        assert got_dl == pytest.approx(dl_w, rel=1e-12, abs=0)
        # and exactly the formula's numbers (math, not mecsim's functions)
        assert got_ul[1 - rnd] == pytest.approx(P_UL_W * (g(400) + g(350)), rel=1e-12, abs=0)
    assert net.round_cells.handovers.tolist() == [False, False, True]
    # reuse 3 on the two sites (groups 0 and 1): nobody interferes, moved or not
    sc3 = _walking_cells(tmp_path, reuse=3)
    net3 = NetworkModel(sc3, device_profiles(sc3))
    for rnd, t in enumerate((0.0, 20.0)):
        _, _, _, rows = net3.round(rnd, [0, 1, 2], t)
        assert [rows[c]["ul_interference_w"] for c in (0, 1, 2)] == [0.0] * 3


def test_static_clients_keep_the_interference_of_the_start(tmp_path):
    """The trace with client 2 standing (no setdest) is the static case: every round's
    interference is round 0's, and equal to a scenario with explicit static positions."""
    path = tmp_path / "still.tcl"
    path.write_text("".join(WALK_NS2.splitlines(keepends=True)[:6]))
    still = _walking_cells(tmp_path).model_dump(mode="json")
    still["geometry"]["mobility"]["trace"]["path"] = str(path)
    sc = type(_walking_cells(tmp_path)).model_validate(still)
    static = still | {}
    static["geometry"] = {
        **still["geometry"],
        "mobility": {"model": "static"},
        "clients": {"placement": "explicit", "positions_m": [[200, 100], [500, 100], [250, 100]]},
    }
    sc_static = type(sc).model_validate(static)
    net, net_static = (NetworkModel(s, device_profiles(s)) for s in (sc, sc_static))
    for rnd, t in enumerate((0.0, 20.0, 40.0)):
        _, _, _, rows = net.round(rnd, [0, 1, 2], t)
        _, _, _, rows_static = net_static.round(rnd, [0, 1, 2], t)
        for c in (0, 1, 2):
            for key in ("ul_interference_w", "dl_interference_w", "uplink_rate_bps"):
                assert rows[c][key] == rows_static[c][key], (rnd, c, key)


@pytest.mark.parametrize(
    "interference, field",
    [
        ({"model": "geometric", "unit": "noise"}, "channel.interference.unit"),
        ({"model": "geometric", "uplink_std": 1.0}, "channel.interference.uplink_std"),
        ({"unit": "noise", "reuse": 3}, "channel.interference.reuse"),
        ({"model": "geometric", "reuse": 4}, "channel.interference.reuse"),
        ({"uplink_mean": 1.0}, "channel.interference.unit"),
    ],
)
def test_fields_of_the_other_model_are_refused(interference, field):
    with pytest.raises(ScenarioError) as err:
        tiny(
            topology={"clients": 2, "edge_servers": 2},
            channel=_channel(interference),
            geometry={
                "area": {"width_m": 700, "height_m": 200},
                "sites": {"layout": "explicit", "positions_m": [[100, 100], [600, 100]]},
            },
        )
    assert f"tiny: {field}: " in str(err.value), str(err.value)


def test_the_default_is_the_distribution_and_unchanged():
    """Old YAML (no model:) loads as the distribution draws; its digest is the one of a
    scenario that states model: distribution; a round's interference is the draw of
    N(1, 4) / N(1, 9) in units of the noise, as the channel draws it alone."""
    sc = load_scenario(default_scenario_path())
    assert sc.channel.interference.model == "distribution"
    stated = apply_overrides(sc, {"channel.interference.model": "distribution"})
    assert scenario_digest(stated) == scenario_digest(sc)
    net = NetworkModel(sc, device_profiles(sc))
    _, _, _, rows = net.round(0, [0, 3, 5])
    ch = build_channel(sc.channel)
    radio = ch.draw_clients(10, np.random.default_rng([sc.seed, 2]))
    want = ch.draw_round(radio, [0, 3, 5], np.random.default_rng([sc.seed, 3, 0]))
    for i, c in enumerate((0, 3, 5)):
        assert rows[c]["ul_interference_w"] == want.ul_interference_w[i]
        assert rows[c]["uplink_rate_bps"] == want.uplink_rate_bps[i]
        assert rows[c]["downlink_rate_bps"] == want.downlink_rate_bps[i]


# --- replay ----------------------------------------------------------------------------
def test_a_replay_under_another_reuse_factor_is_a_run_of_it(tmp_path):
    """14 clients in 7 hexagonal cells 150 m apart (interference matters at this
    density), FedAvg: a replay of the reuse-1 run with reuse 7 gives, bit for bit, the
    rounds of a run with reuse 7; and reuse 7's rounds are shorter (no interference)."""
    base = tiny(
        topology={"clients": 14, "edge_servers": 7},
        channel=_channel({"model": "geometric", "reuse": 1}),
        geometry={"sites": {"layout": "hex", "rings": 1, "inter_site_distance_m": 150}},
    )
    point = {"channel.interference.reuse": 7}
    run_in_folder(base, tmp_path / "a")
    run_in_folder(apply_overrides(base, point), tmp_path / "b")
    got = replay(load_run(tmp_path / "a"), point)
    assert got.exact
    want = read_csv_exact(tmp_path / "b" / "rounds.csv")[REPLAY_COLUMNS]
    for col in REPLAY_COLUMNS:
        assert np.array_equal(got.rounds[col].to_numpy(), want[col].to_numpy(), equal_nan=True)
    first = read_csv_exact(tmp_path / "a" / "rounds.csv")
    assert (want["round_time_s"].to_numpy() < first["round_time_s"].to_numpy()).all()
    clients = read_csv_exact(tmp_path / "b" / "clients.csv")
    assert (clients["ul_interference_w"] == 0.0).all()


# --- per round, not per instant --------------------------------------------------------
def exact_finish_s(start_s, bits, signal_w, cross_w, noise_w, bandwidth_hz):
    """Per-instant uploads, exactly: between consecutive events (a start or a finish)
    the set of transmitters is fixed, so each one's rate is constant:
    r_i = B·log2(1 + S_i / (Σ_{j active, j ≠ i} X_ji + N)); advance to the next event.
    ``cross_w[j][i]``: what transmitter j puts into receiver i's site."""
    n = len(bits)
    left = [float(b) for b in bits]
    done = [math.inf] * n
    t = 0.0
    while any(math.isinf(d) for d in done):
        active = [i for i in range(n) if start_s[i] <= t and math.isinf(done[i])]
        finish = {}
        for i in active:
            inter = sum(cross_w[j][i] for j in active if j != i)
            finish[i] = t + left[i] / (
                bandwidth_hz * math.log2(1 + signal_w[i] / (inter + noise_w))
            )
        nxt = min([start_s[i] for i in range(n) if start_s[i] > t] + list(finish.values()))
        for i in active:
            if finish[i] == nxt:
                done[i], left[i] = nxt, 0.0
            else:
                left[i] *= (finish[i] - nxt) / (finish[i] - t)  # the bits still to send
        t = nxt
    return done


@pytest.mark.parametrize(
    "sites_m, clients_m, start_1_s, error",
    [
        # the hand case (two_cells): both start together; client 0 (25.2 Mb/s) is done
        # after 0.32 s and client 1 (3.87 Mb/s) then uploads alone
        ((100, 600), (200, 400), 0.0, (0.0, 0.01446)),
        # near the cell edge: sites 200 m apart, client 0 80 m from A (120 m from B),
        # client 1 90 m from B (110 m from A); client 1 starts when client 0 is half done
        # (per round): client 0 sends most of its bits alone, at 37.7 Mb/s instead of 19.1
        ((0, 200), (80, 110), None, (0.9007, 0.8015)),
    ],
)
def test_per_round_against_per_instant_interference(sites_m, clients_m, start_1_s, error):
    """Two cells on a line, one client each, 1 MB (8e6 bit) uploads at 23 dBm on 10 MHz.
    Per round, each client hears the other for its whole upload:
    t_i = bits / r_i(interfered). Exactly, it hears the other only while both transmit.
    The per-round time is never shorter (every instant's interferers are a subset of
    the round's) and longer by at most r_alone / r_interfered − 1; the measured relative
    errors of the upload times are docs/mobility.md's."""
    own, pos = sites_m, clients_m
    bits = (8e6, 8e6)
    noise = N0_W_PER_HZ * 10e6
    signal = [P_UL_W * g(abs(pos[i] - own[i])) for i in range(2)]
    cross = [[0.0, P_UL_W * g(abs(pos[0] - own[1]))], [P_UL_W * g(abs(pos[1] - own[0])), 0.0]]
    rate_i = [10e6 * math.log2(1 + signal[i] / (cross[1 - i][i] + noise)) for i in range(2)]
    starts = [0.0, bits[0] / rate_i[0] / 2 if start_1_s is None else start_1_s]
    per_round = [starts[i] + bits[i] / rate_i[i] for i in range(2)]
    exact = exact_finish_s(starts, bits, signal, cross, noise, 10e6)
    # brute force: 10 µs steps agree with the event-by-event integration
    brute = _stepped_finish_s(starts, bits, signal, cross, noise, 10e6, 1e-5)
    np.testing.assert_allclose(brute, exact, atol=2e-5)
    err = [(per_round[i] - exact[i]) / (exact[i] - starts[i]) for i in range(2)]
    for i in range(2):
        assert per_round[i] >= exact[i] - 1e-12
        alone = 10e6 * math.log2(1 + signal[i] / noise)
        assert err[i] <= alone / rate_i[i] - 1 + 1e-12
        assert err[i] == pytest.approx(error[i], abs=5e-5), err
    # mecsim's per-round interference is the one used above
    if own == (100, 600):
        sc = two_cells()
        _, _, _, rows = NetworkModel(sc, device_profiles(sc)).round(0, [0, 1])
        assert rows[0]["uplink_rate_bps"] == pytest.approx(rate_i[0], rel=1e-9)
        assert rows[1]["uplink_rate_bps"] == pytest.approx(rate_i[1], rel=1e-9)


def _stepped_finish_s(start_s, bits, signal_w, cross_w, noise_w, bandwidth_hz, dt):
    left = list(bits)
    done = [math.nan] * len(bits)
    t = 0.0
    while any(math.isnan(d) for d in done):
        active = [i for i in range(len(bits)) if start_s[i] <= t and math.isnan(done[i])]
        for i in active:
            inter = sum(cross_w[j][i] for j in active if j != i)
            r = bandwidth_hz * math.log2(1 + signal_w[i] / (inter + noise_w))
            if left[i] <= r * dt:
                done[i] = t + left[i] / r
            left[i] -= r * dt
        t += dt
    return done


def test_a_sinr_association_uses_the_reuse_groups():
    """21 clients uniform over 7 hexagonal UMi cells, rule sinr, reuse 3: each client's
    edge server maximises P_s / (Σ_{s' ≠ s in s's group} P_s' + N), worked here with
    loops over the groups of the 7-site table [0, 1, 2, 1, 2, 1, 2]."""
    sc = tiny(
        topology={"clients": 21, "edge_servers": 7},
        channel={
            **_channel({"model": "geometric", "reuse": 3}),
            "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5},
        },
        geometry={
            "sites": {"layout": "hex", "rings": 1, "inter_site_distance_m": 200},
            "clients": {"placement": "uniform"},
            "association": {"rule": "sinr"},
        },
    )
    cells = NetworkModel(sc, device_profiles(sc)).cells
    groups = [0, 1, 2, 1, 2, 1, 2]
    noise_mw = 10 ** (-174 / 10) * 20e6
    picks = []
    for c in range(21):
        mw = [10 ** (p / 10) for p in cells.rx_power_dbm[c]]
        sinr = [
            mw[s] / (sum(mw[t] for t in range(7) if t != s and groups[t] == groups[s]) + noise_mw)
            for s in range(7)
        ]
        picks.append(int(np.argmax(sinr)))
    assert cells.serving.tolist() == picks
    # all co-channel, the SINR's best site is the strongest; with the groups it need not be
    strongest = np.argmax(cells.rx_power_dbm, axis=1)
    assert (cells.serving != strongest).any()


def test_the_digest_tells_reuse_factors_apart():
    a = two_cells(reuse=1)
    b = two_cells(reuse=3)
    assert scenario_digest(a) != scenario_digest(b)
