"""Geometry (``geometry:``): hexagonal sites, client placement, distances, association
(nearest, strongest, SINR; A3 hysteresis and time-to-trigger), how a run uses them, and
bad input refused.

Hand working is in each test's docstring or comments; 38.901 path losses were evaluated
with a 30-digit decimal calculator (``Decimal(x).log10()``) from Table 7.4.1-1's formulas,
not with the code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.paths import ROOT
from support.scenarios import tiny

from mecsim.analysis.replay import association_changes, load_run, replay
from mecsim.analysis.whatif_sweep import sweep
from mecsim.channel import ShannonChannel, Tr38901PathLoss
from mecsim.channel.pathloss import LargeScaleDraw
from mecsim.emulation import geometry as geo
from mecsim.emulation.network import (
    GEOMETRY_KEYS,
    NetworkModel,
    build_channel,
    client_record_keys,
    device_profiles,
)
from mecsim.run.rows import REPLAY_COLUMNS
from mecsim.scenario import ScenarioError, load_scenario, scenario_from_dict
from mecsim.scenario.loader import default_scenario_path
from mecsim.scenario.overrides import OverrideError, apply_overrides
from mecsim.store.checkpoints import scenario_digest
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder
from mecsim.testing import check_scenario_data

SQ3 = math.sqrt(3.0)


# --- hexagonal sites -------------------------------------------------------------------
@pytest.mark.parametrize("rings,count", [(0, 1), (1, 7), (2, 19), (3, 37), (5, 91)])
def test_hex_site_count_is_1_plus_3r_r_plus_1(rings, count):
    # 1 + 3R(R+1): 1, 7, 19, 37, 91
    assert geo.hex_site_count(rings) == count
    assert len(geo.hex_grid_sites(rings, 100.0)) == count


def test_hex_ring_1_by_hand():
    """Ring 1 of D = 200 m: the six corners 200·(cos 60°j, sin 60°j), j = 0..5, from +x
    counter-clockwise: (200, 0), (100, 173.205...), (−100, 173.205...), (−200, 0),
    (−100, −173.205...), (100, −173.205...)."""
    d = 200.0
    sites = geo.hex_grid_sites(1, d)
    want = [
        (0, 0),
        (d, 0),
        (d / 2, d * SQ3 / 2),
        (-d / 2, d * SQ3 / 2),
        (-d, 0),
        (-d / 2, -d * SQ3 / 2),
        (d / 2, -d * SQ3 / 2),
    ]
    np.testing.assert_allclose(sites, want, atol=1e-9)
    np.testing.assert_allclose(np.hypot(*sites[1:].T), d, rtol=1e-12)


def test_hex_ring_2_corners_at_2d_and_midpoints_at_root3_d():
    """Ring 2 (sites 7..18): corners 2D·(cos 60°j, sin 60°j) at even positions, edge
    midpoints at odd ones: the midpoint of (2D, 0) and (D, √3·D) is (1.5·D, √3/2·D), at
    D·√(2.25 + 0.75) = √3·D, angle 30°."""
    d = 150.0
    ring2 = geo.hex_grid_sites(2, d)[7:]
    assert len(ring2) == 12
    r = np.hypot(*ring2.T)
    np.testing.assert_allclose(r[0::2], 2 * d, rtol=1e-12)
    np.testing.assert_allclose(r[1::2], SQ3 * d, rtol=1e-12)
    np.testing.assert_allclose(ring2[1], (1.5 * d, SQ3 / 2 * d), atol=1e-9)
    angles = np.degrees(np.arctan2(ring2[:, 1], ring2[:, 0])) % 360
    np.testing.assert_allclose(angles, np.arange(12) * 30.0, atol=1e-9)
    # every site's nearest other site is D away
    dist = geo.distances_m(geo.hex_grid_sites(2, d), geo.hex_grid_sites(2, d))
    np.fill_diagonal(dist, np.inf)
    np.testing.assert_allclose(dist.min(axis=1), d, rtol=1e-12)


def test_hex_grid_is_centred_in_its_derived_area():
    """Rings 1, D = 200, no area: the sites span x ∈ [−200, 200], y ∈ [−173.2, 173.2];
    the default margin is the cell circumradius D/√3 = 115.47 m, so the area is
    (400 + 230.94, 346.41 + 230.94) and the centre site is at its middle."""
    sc = _geo_scenario(n=7, sites={"layout": "hex", "rings": 1})
    w, h = sc.geometry.area_m()
    assert w == pytest.approx(400 + 2 * 200 / SQ3, rel=1e-12)
    assert h == pytest.approx(200 * SQ3 + 2 * 200 / SQ3, rel=1e-12)
    assert sc.geometry.sites_m()[0] == pytest.approx((w / 2, h / 2))


# --- distances and placement -----------------------------------------------------------
def test_distances_by_hand():
    # 3-4-5 and 6-8-10 triangles; rows are clients, columns sites
    d = geo.distances_m([[3.0, 4.0], [0.0, 0.0]], [[0.0, 0.0], [6.0, 8.0]])
    np.testing.assert_array_equal(d, [[5.0, 5.0], [0.0, 10.0]])


def _placements(seed):
    sites = geo.hex_grid_sites(1, 200.0, (300.0, 300.0))
    area = (600.0, 600.0)
    rng = np.random.default_rng(seed)
    return (
        sites,
        area,
        geo.place_uniform(500, area, sites, 30.0, rng),
        geo.place_per_cell([10, 20, 30, 40, 50, 60, 70], area, sites, 30.0, rng),
        geo.place_hotspots(
            [100, 50], [[100.0, 100.0], [590.0, 300.0]], [60.0, 40.0], area, sites, 30.0, rng
        ),
    )


def test_placement_is_reproducible_and_inside_the_area_and_the_cells():
    sites, area, uni, cell, hot = _placements(7)
    for a, b in zip(_placements(7)[2:], (uni, cell, hot), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(_placements(8)[2], uni)
    for pts in (uni, cell, hot):
        assert ((pts >= 0) & (pts <= 600)).all()
        assert geo.distances_m(pts, sites).min() >= 30.0
    # per cell: each site's share, in site order, all nearest to their site
    owner = np.repeat(np.arange(7), [10, 20, 30, 40, 50, 60, 70])
    np.testing.assert_array_equal(geo.nearest_site(cell, sites), owner)
    # hotspots: in their discs (the second one's disc is cut by the area's edge x = 600)
    assert (np.hypot(*(hot[:100] - [100, 100]).T) <= 60).all()
    assert (np.hypot(*(hot[100:] - [590, 300]).T) <= 40).all()


def test_uniform_placement_is_uniform():
    """20,000 points over a 1000 × 500 m area with one site far in a corner (no exclusion
    zone): the share in the left half is 0.5 ± 5 standard errors (σ = √(0.25/20000) =
    0.00354), the mean of y is 250 ± 5·(500/√12)/√20000 = 250 ± 5.1."""
    pts = geo.place_uniform(20_000, (1000.0, 500.0), [[0.0, 0.0]], 1e-9, np.random.default_rng(1))
    assert abs((pts[:, 0] < 500).mean() - 0.5) < 5 * math.sqrt(0.25 / 20_000)
    assert abs(pts[:, 1].mean() - 250) < 5 * (500 / math.sqrt(12)) / math.sqrt(20_000)


def test_a_placement_that_cannot_fit_is_refused():
    with pytest.raises(ValueError, match="min_distance_m"):
        geo.place_uniform(3, (10.0, 10.0), [[5.0, 5.0]], 100.0, np.random.default_rng(0))


# --- received power, SINR, association -------------------------------------------------
# Two sites A at (0, 0) and B at (1000, 0), one client at (400, 0): A is 400 m away, B 600 m.
# UMi-Street Canyon at 3.5 GHz, h_BS 10 m, h_UT 1.5 m: d'_BP = 210 m, both links LOS beyond
# it: PL2 = 32.4 + 40 log10(d_3D) + 20 log10(3.5) − 9.5 log10(210² + 8.5²)
#   A: d_3D = 400.090302306866718 m, PL2 = 103.238761422984830 dB
#   B: d_3D = 600.060205312766929 m, PL2 = 110.280233483362642 dB
# Shadowing +10 dB on A, −5 dB on B: PL_A = 113.238761422984830, PL_B = 105.280233483362642;
# downlink 30 dBm: P_A = −83.238761422984830 dBm, P_B = −75.280233483362642 dBm.
_A_B_SITES = [[0.0, 0.0], [1000.0, 0.0]]
_PL_A, _PL_B = 113.238761422984830, 105.280233483362642


def _umi_channel(**kw):
    pl = Tr38901PathLoss(model="38.901-umi", carrier_ghz=3.5, **kw)
    return ShannonChannel(path_loss=pl, interference=False, server_tx_power_dbm=30.0)


def test_nearest_and_strongest_differ_when_shadowing_differs():
    d = geo.distances_m([[400.0, 0.0]], _A_B_SITES)
    ls = LargeScaleDraw(np.array([[True, True]]), np.array([[10.0, -5.0]]))
    loss = geo.path_loss_db(d, _umi_channel(), ls)
    np.testing.assert_allclose(loss, [[_PL_A, _PL_B]], atol=1e-9)
    rx = geo.received_power_dbm(30.0, loss)
    np.testing.assert_allclose(rx, [[30 - _PL_A, 30 - _PL_B]], atol=1e-9)
    assert geo.associate(geo.association_metric("nearest", d)).tolist() == [0]
    assert geo.associate(geo.association_metric("strongest", d, rx)).tolist() == [1]
    # without the shadowing the nearer site is the stronger one
    flat = geo.path_loss_db(d, _umi_channel(), LargeScaleDraw(ls.los, np.zeros((1, 2))))
    rx0 = geo.received_power_dbm(30.0, flat)
    assert geo.associate(geo.association_metric("strongest", d, rx0)).tolist() == [0]


def test_exponent_path_loss_by_hand():
    # Table 4: PL = 40 + 40 log10(d): 100 m -> 120 dB, 1000 m -> 160 dB
    loss = geo.path_loss_db([[100.0, 1000.0]], ShannonChannel())
    np.testing.assert_allclose(loss, [[120.0, 160.0]], atol=1e-12)


def test_sinr_by_hand():
    """P_A = −70, P_B = −73 dBm, N = −97 dBm. In mW: 1e-7, 10^-7.3 = 5.0118723e-8,
    10^-9.7 = 1.9952623e-10.
    SINR_A = 1e-7 / (10^-7.3 + 10^-9.7) = 1 / 0.503182496 -> 2.98274 dB;
    SINR_B = 10^-7.3 / (1e-7 + 10^-9.7) = 0.501187234 / 1.001995262 -> −3.00866 dB."""
    got = geo.sinr_db([[-70.0, -73.0]], -97.0)
    want_a = -10 * math.log10(10**-0.3 + 10**-2.7)
    want_b = -3.0 - 10 * math.log10(1 + 10**-2.7)
    np.testing.assert_allclose(got, [[want_a, want_b]], atol=1e-12)
    assert got[0, 0] == pytest.approx(2.98274, abs=1e-5)
    assert got[0, 1] == pytest.approx(-3.00866, abs=1e-5)
    # every other site co-channel: the best SINR is the strongest site
    rng = np.random.default_rng(0)
    rx = rng.uniform(-110, -60, size=(200, 5))
    np.testing.assert_array_equal(geo.associate(geo.sinr_db(rx, -97.0)), geo.associate(rx))


def test_a3_hysteresis_keeps_the_old_site_until_better_by_h_for_ttt():
    """H = 3 dB, TTT = 2 s, one evaluation a second, serving A (site 0).

    t=0: B 2 dB better (not > 3): no entry; t=1: B 4 dB better: enters, held 0 s;
    t=2: held 1 s < 2; t=3: held 2 s >= 2: hand over to B. Back on B, A 0.5 dB better
    stays B (no ping-pong)."""
    held = np.full((1, 2), np.nan)
    serving = np.array([0])
    steps = [([-70.0, -68.0], 0, np.nan), ([-70.0, -66.0], 0, 0.0), ([-70.0, -66.0], 0, 1.0)]
    for metric, want, want_held in steps:
        serving, held = geo.a3_handover([metric], serving, held, 1.0, 3.0, 2.0)
        assert serving.tolist() == [want]
        np.testing.assert_array_equal(held[0, 1], want_held)
    serving, held = geo.a3_handover([[-70.0, -66.0]], serving, held, 1.0, 3.0, 2.0)
    assert serving.tolist() == [1] and np.isnan(held).all()
    serving, held = geo.a3_handover([[-66.0, -66.5]], serving, held, 1.0, 3.0, 2.0)
    assert serving.tolist() == [1]


def test_a3_condition_must_hold_without_a_break_and_strictly():
    # exactly H better does not enter; a break restarts the timer
    args = (1.0, 3.0, 2.0)
    s, h = geo.a3_handover([[-70.0, -67.0]], [0], np.full((1, 2), np.nan), *args)
    assert s.tolist() == [0] and np.isnan(h[0, 1])
    s, h = geo.a3_handover([[-70.0, -66.0]], s, h, *args)  # enters: 0 s
    s, h = geo.a3_handover([[-70.0, -66.0]], s, h, *args)  # 1 s
    s, h = geo.a3_handover([[-70.0, -68.0]], s, h, *args)  # breaks
    assert np.isnan(h[0, 1])
    s, h = geo.a3_handover([[-70.0, -66.0]], s, h, *args)  # enters again: 0 s
    assert s.tolist() == [0] and h[0, 1] == 0.0
    # TTT 0: the first evaluation at which it holds hands over; among several sites that
    # triggered, the best one
    s, h = geo.a3_handover([[-70.0, -60.0, -62.0]], [0], np.full((1, 3), np.nan), 1.0, 3.0, 0.0)
    assert s.tolist() == [1]
    # nearest with a hysteresis in metres: 250 m vs 100 m + 100 m
    m = geo.association_metric("nearest", [[250.0, 100.0]])
    assert geo.a3_handover(m, [0], np.full((1, 2), np.nan), 1.0, 100.0, 0.0)[0].tolist() == [1]
    assert geo.a3_handover(m, [0], np.full((1, 2), np.nan), 1.0, 160.0, 0.0)[0].tolist() == [0]


# --- a scenario ------------------------------------------------------------------------
def _geo_scenario(n=4, channel=None, **geometry):
    sites = geometry.get("sites", {"layout": "explicit", "positions_m": [[100, 200], [600, 200]]})
    n_sites = len(geo_sites(sites))
    data = {
        "topology": {"clients": n, "edge_servers": n_sites},
        "geometry": {"area": {"width_m": 700, "height_m": 400}, **geometry},
    }
    if sites.get("layout", "hex") == "hex":
        data["geometry"].pop("area")
    data["geometry"]["sites"] = sites
    if channel is not None:
        data["channel"] = channel
    return tiny(**data)


def geo_sites(sites):
    if sites.get("layout", "hex") == "explicit":
        return sites["positions_m"]
    return geo.hex_grid_sites(sites.get("rings", 1), sites.get("inter_site_distance_m", 200))


def test_a_scenario_places_and_associates_from_its_seed():
    sc = _geo_scenario(n=6)
    a, b = (NetworkModel(sc, device_profiles(sc)) for _ in range(2))
    np.testing.assert_array_equal(a.cells.positions_m, b.cells.positions_m)
    np.testing.assert_array_equal(a.edge_server, b.edge_server)
    other = apply_overrides(sc, {"seed": 4})
    assert not np.array_equal(
        NetworkModel(other, device_profiles(other)).cells.positions_m, a.cells.positions_m
    )
    # nearest: the serving site is the nearer one, at the distance the radio has
    d = geo.distances_m(a.cells.positions_m, [[100, 200], [600, 200]])
    np.testing.assert_array_equal(a.edge_server, d.argmin(axis=1))
    np.testing.assert_array_equal(a.radio.distance_m, d.min(axis=1))


def test_geometry_keeps_the_other_client_draws():
    """Bandwidth and power are the numbers a scenario without geometry draws (the distance
    draw is made and replaced); with one site and a 38.901 model the LOS states and
    shadowing are the per-client draws of a run without geometry too."""
    umi = {"model": "shannon", "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5}}
    plain = tiny(channel=umi)
    one_site = _geo_scenario(n=4, channel=umi, sites={"layout": "hex", "rings": 0})
    a, b = (
        NetworkModel(plain, device_profiles(plain)),
        NetworkModel(one_site, device_profiles(one_site)),
    )
    np.testing.assert_array_equal(a.radio.bandwidth_hz, b.radio.bandwidth_hz)
    np.testing.assert_array_equal(a.radio.tx_power_dbm, b.radio.tx_power_dbm)
    assert not np.array_equal(a.radio.distance_m, b.radio.distance_m)
    # U[0,1) per client then N(0,1) per client: the same z, scaled by each state's σ
    z_a = a.radio.shadow_fading_db / np.where(a.radio.los, 4.0, 7.82)
    z_b = b.radio.shadow_fading_db / np.where(b.radio.los, 4.0, 7.82)
    np.testing.assert_allclose(z_a, z_b, rtol=1e-12)
    # the radio's path loss is the serving link's, by 38.901 of the position's distance
    pl = build_channel(one_site.channel).path_loss
    want = pl.path_loss_db(b.radio.distance_m, b.radio.los, b.radio.shadow_fading_db)
    np.testing.assert_array_equal(b.radio.path_loss_db, want)


def test_strongest_follows_the_shadowing_of_each_link():
    """16 clients uniform between two UMi sites: the serving site is the argmax of
    30 − PL(d, LOS, shadowing) over the drawn links, with PL worked from the table's
    formulas here; and at least one client is served by the farther site."""
    umi = {
        "model": "shannon",
        "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5},
        "downlink": {"tx_power_dbm": 30.0, "bandwidth_hz": 50e6},
    }
    sc = _geo_scenario(n=16, channel=umi, association={"rule": "strongest"})
    net = NetworkModel(sc, device_profiles(sc))
    cells = net.cells
    d = cells.distance_m
    d3 = np.hypot(d, 8.5)
    bp = 4 * 9 * 0.5 * 3.5e9 / 3e8  # 210 m
    los = np.where(
        d <= bp,
        32.4 + 21 * np.log10(d3) + 20 * np.log10(3.5),
        32.4 + 40 * np.log10(d3) + 20 * np.log10(3.5) - 9.5 * np.log10(bp**2 + 8.5**2),
    )
    nlos = np.maximum(los, 35.3 * np.log10(d3) + 22.4 + 21.3 * np.log10(3.5))
    pl = np.where(cells.large_scale.los, los, nlos) + cells.large_scale.shadow_fading_db
    np.testing.assert_allclose(cells.path_loss_db, pl, atol=1e-9)
    np.testing.assert_array_equal(net.edge_server, np.argmax(30 - pl, axis=1))
    assert (net.edge_server != d.argmin(axis=1)).any()
    rows = np.arange(16)
    np.testing.assert_allclose(net.radio.path_loss_db, pl[rows, net.edge_server], atol=1e-9)


def test_the_default_scenario_is_unchanged():
    """No geometry: distances drawn from channel.distance_m, edge servers in blocks, no
    new columns (the records of the default and PHSFL scenarios were compared with main
    byte for byte: docs/mobility.md)."""
    sc = load_scenario(default_scenario_path())
    assert sc.geometry is None
    net = NetworkModel(sc, device_profiles(sc))
    assert net.cells is None
    want = build_channel(sc.channel).draw_clients(10, np.random.default_rng([sc.seed, 2]))
    np.testing.assert_array_equal(net.radio.distance_m, want.distance_m)
    np.testing.assert_array_equal(net.radio.bandwidth_hz, want.bandwidth_hz)
    assert client_record_keys(sc) == ()
    phsfl = load_scenario("scenarios/phsfl-mnist-4x25.yaml")
    blocks = [c // 25 for c in range(100)]
    assert [phsfl.edge_server_of(c) for c in range(100)] == blocks
    np.testing.assert_array_equal(NetworkModel(phsfl, device_profiles(phsfl)).edge_server, blocks)


def test_a_checkpoint_digest_sees_a_geometry_but_not_its_absence():
    sc = load_scenario(default_scenario_path())
    explicit = apply_overrides(sc, {"geometry": None})
    assert scenario_digest(explicit) == scenario_digest(sc)
    cells = apply_overrides(sc, {"geometry": {"sites": {"rings": 1}}, "topology.edge_servers": 7})
    other = apply_overrides(cells, {"geometry.sites.inter_site_distance_m": 300.0})
    assert len({scenario_digest(sc), scenario_digest(cells), scenario_digest(other)}) == 3


def test_edge_server_of_needs_the_association_with_a_geometry():
    sc = _geo_scenario()
    with pytest.raises(RuntimeError, match="with_association"):
        sc.edge_server_of(0)
    bound = sc.with_association([1, 1, 0, 1])
    assert [bound.edge_server_of(c) for c in range(4)] == [1, 1, 0, 1]
    assert bound.model_dump() == sc.model_dump()


# --- a run, its records, and a sweep ---------------------------------------------------
def test_a_run_records_positions_and_the_association_and_a_sweep_agrees(tmp_path):
    """Four clients, two sites 500 m apart, FedAvg: clients.csv has each client's x_m, y_m
    and its serving site as edge_server; a replay under another uplink band gives, bit
    for bit, the rounds of a run of that scenario."""
    base = _geo_scenario(n=4, clients={"placement": "uniform"})
    run_in_folder(base, tmp_path / "a")
    net = NetworkModel(base, device_profiles(base))
    clients = read_csv_exact(tmp_path / "a" / "clients.csv")
    assert list(clients.columns[-2:]) == list(GEOMETRY_KEYS)
    for _, row in clients.iterrows():
        c = int(row["client_id"])
        assert (row["x_m"], row["y_m"]) == tuple(net.cells.positions_m[c])
        assert row["edge_server"] == net.edge_server[c]
        assert row["distance_m"] == net.radio.distance_m[c]
    point = {"channel.uplink.bandwidth_hz": 5e6}
    run_in_folder(apply_overrides(base, point), tmp_path / "b")
    got = replay(load_run(tmp_path / "a"), point).rounds
    want = read_csv_exact(tmp_path / "b" / "rounds.csv")[REPLAY_COLUMNS]
    for col in REPLAY_COLUMNS:
        assert np.array_equal(got[col].to_numpy(), want[col].to_numpy(), equal_nan=True), col
    # a replay with no override reproduces the run
    same = replay(load_run(tmp_path / "a")).rounds
    first = read_csv_exact(tmp_path / "a" / "rounds.csv")[REPLAY_COLUMNS]
    assert np.array_equal(same["round_time_s"].to_numpy(), first["round_time_s"].to_numpy())


def test_a_replay_that_moves_clients_between_edge_servers_is_refused(tmp_path):
    umi = {"model": "shannon", "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5}}
    base = _geo_scenario(n=16, channel=umi, association={"rule": "strongest"})
    run = tmp_path / "r"
    run_in_folder(apply_overrides(base, {"rounds": 1}), run)
    # without shadowing the strongest site is the nearest one: clients the shadowing
    # gave to the farther site (test_strongest_follows_the_shadowing_of_each_link) move
    point = {"channel.path_loss.shadowing": False}
    assert geo_moved(base, point)
    with pytest.raises(OverrideError, match="geometry.association"):
        replay(load_run(run), point)
    with pytest.raises(OverrideError, match="geometry.association"):
        sweep(run, {"channel.path_loss.shadowing": [True, False]})
    # a timing path that keeps the association replays
    assert not geo_moved(base, {"channel.uplink.bandwidth_hz": 5e6})
    assert replay(load_run(run), {"channel.uplink.bandwidth_hz": 5e6}).exact


def geo_moved(sc, point):
    return association_changes(sc, apply_overrides(sc, point))


# --- bad input -------------------------------------------------------------------------
_EXPLICIT = {"layout": "explicit", "positions_m": [[100, 200], [600, 200]]}


@pytest.mark.parametrize(
    "topology,geometry,channel,field",
    [
        ({"edge_servers": 1}, {"sites": {"rings": 1}}, None, "topology.edge_servers"),
        (
            {"edge_servers": 2},
            {"sites": {"layout": "explicit"}},
            None,
            "geometry.sites.positions_m",
        ),
        (
            {"edge_servers": 2},
            {"sites": _EXPLICIT, "area": {"width_m": 500, "height_m": 400}},
            None,
            "geometry.sites.positions_m.1",
        ),
        ({"edge_servers": 2}, {"sites": _EXPLICIT}, None, "geometry.area"),
        (
            {"edge_servers": 7},
            {"sites": {"rings": 1}, "area": {"width_m": 100, "height_m": 100}},
            None,
            "geometry.area",
        ),
        (
            {"edge_servers": 2},
            {
                "sites": _EXPLICIT,
                "margin_m": 50,
                "clients": {"placement": "explicit", "positions_m": [[1, 1]]},
            },
            None,
            "geometry.clients.positions_m",
        ),
        (
            {"edge_servers": 2},
            {
                "sites": _EXPLICIT,
                "margin_m": 50,
                "clients": {
                    "placement": "explicit",
                    "positions_m": [[1, 1], [2, 2], [900, 1], [5, 5], [6, 6], [7, 7], [8, 8]],
                },
            },
            None,
            "geometry.clients.positions_m.2",
        ),
        (
            {"edge_servers": 2},
            {
                "sites": _EXPLICIT,
                "margin_m": 50,
                "clients": {
                    "placement": "explicit",
                    "positions_m": [[1, 1], [2, 2], [105, 200], [5, 5], [6, 6], [7, 7], [8, 8]],
                },
            },
            None,
            "geometry.clients.positions_m.2",
        ),
        (
            {"edge_servers": 2},
            {"sites": _EXPLICIT, "margin_m": 50, "clients": {"placement": "hotspots"}},
            None,
            "geometry.clients.hotspots",
        ),
        (
            {"edge_servers": 2},
            {
                "sites": _EXPLICIT,
                "margin_m": 50,
                "clients": {
                    "placement": "hotspots",
                    "hotspots": [{"centre_m": [10, 10], "radius_m": 5, "clients": 3}],
                },
            },
            None,
            "geometry.clients.hotspots",
        ),
        (
            {"edge_servers": 2},
            {
                "sites": _EXPLICIT,
                "margin_m": 50,
                "clients": {
                    "placement": "hotspots",
                    "hotspots": [{"centre_m": [9000, 10], "radius_m": 5}],
                },
            },
            None,
            "geometry.clients.hotspots.0.centre_m",
        ),
        (
            {"edge_servers": 2},
            {"sites": _EXPLICIT, "margin_m": 50, "association": {"rule": "strongest"}},
            {"model": "fixed_rate", "uplink": {"rate_bps": 1e6}, "downlink": {"rate_bps": 1e6}},
            "geometry.association.rule",
        ),
        (
            {"edge_servers": 2},
            {
                "sites": _EXPLICIT,
                "margin_m": 50,
                "association": {"rule": "nearest", "hysteresis_db": 3},
            },
            None,
            "geometry.association.hysteresis_db",
        ),
        (
            {"edge_servers": 2},
            {"sites": _EXPLICIT, "margin_m": 50, "association": {"rule": "closest"}},
            None,
            "geometry.association.rule",
        ),
        (
            {"edge_servers": 2},
            {"sites": _EXPLICIT, "margin_m": 50, "min_distance_m": 5},
            {"model": "shannon", "path_loss": {"model": "38.901-uma", "carrier_ghz": 3.5}},
            "geometry.min_distance_m",
        ),
        (
            {"edge_servers": 7},
            {"sites": {"rings": 1, "inter_site_distance_m": -5}},
            None,
            "geometry.sites.inter_site_distance_m",
        ),
        (
            {"edge_servers": 7},
            {"sites": {"rings": 1, "positions_m": [[0, 0]]}},
            None,
            "geometry.sites.positions_m",
        ),
        (
            {"edge_servers": 7},
            {"sites": {"rings": 1}, "area": {"width_m": 1e9, "height_m": 5}},
            None,
            "geometry.area.width_m",
        ),
        (
            {"edge_servers": 7},
            {"sites": {"rings": 1}, "wind_m_per_s": 3},
            None,
            "geometry.wind_m_per_s",
        ),
    ],
)
def test_bad_geometry_is_refused_naming_the_field(topology, geometry, channel, field):
    data = {"topology": {"clients": 7, **topology}, "geometry": geometry}
    if channel is not None:
        data["channel"] = channel
    with pytest.raises(ScenarioError) as err:
        tiny(**data)
    assert f"tiny: {field}: " in str(err.value), str(err.value)


def test_the_docs_example_is_a_valid_scenario():
    """docs/mobility.md's first YAML block, as written, is a scenario that places 21
    clients in 7 hexagonal cells, 3 per cell."""
    import re

    import yaml

    text = (ROOT / "docs" / "mobility.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    sc = tiny(**yaml.safe_load(block))
    assert len(sc.geometry.sites_m()) == 7 and sc.topology.edge_servers == 7
    cells = NetworkModel(sc, device_profiles(sc)).cells
    owner = geo.nearest_site(cells.positions_m, cells.sites_m)
    assert np.bincount(owner).tolist() == [3] * 7


@pytest.mark.slow
def test_a_hierarchical_run_groups_clients_by_the_association(tmp_path):
    """PHSFL on two sites: client 0 is placed next to site 1, the others next to site 0,
    so the groups are {1, 2, 3} and {0} (the topology's blocks would be {0, 1}, {2, 3});
    with every client next to site 0, edge server 1 serves no one and the run still runs."""
    data = check_scenario_data("phsfl")
    data["rounds"] = 1
    data["geometry"] = {
        "area": {"width_m": 700, "height_m": 400},
        "sites": {"layout": "explicit", "positions_m": [[100, 200], [600, 200]]},
        "clients": {
            "placement": "explicit",
            "positions_m": [[620, 200], [150, 200], [120, 250], [80, 100]],
        },
    }
    run_in_folder(scenario_from_dict(data, "x"), tmp_path / "a")
    clients = read_csv_exact(tmp_path / "a" / "clients.csv")
    assert clients.sort_values("client_id")["edge_server"].tolist() == [1, 0, 0, 0]
    # d = |(620, 200) − (600, 200)| = 20 m; |(80, 100) − (100, 200)| = √(400 + 10000)
    by_id = clients.set_index("client_id")
    assert by_id.loc[0, "distance_m"] == 20.0
    assert by_id.loc[3, "distance_m"] == pytest.approx(math.sqrt(10_400), rel=1e-15)
    data["geometry"]["clients"]["positions_m"] = [[150, 200], [120, 250], [80, 100], [90, 210]]
    run_in_folder(scenario_from_dict(data, "x"), tmp_path / "b")
    clients = read_csv_exact(tmp_path / "b" / "clients.csv")
    assert set(clients["edge_server"]) == {0} and (clients["status"] == "completed").all()
