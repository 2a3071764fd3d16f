"""Spatially consistent LOS state and shadowing (3GPP TR 38.901 §7.6.3;
mecsim.channel.spatial; docs/channel.md, "Spatially consistent LOS state and shadowing").

References used: TR 38.901 Table 7.4.2-1's Pr_LOS (UMi: 18/d + exp(−d/36)(1 − 18/d)),
the exponential correlation exp(−Δ/d_corr) with Table 7.5-6's shadowing and Table
7.6.3.1-2's LOS-state correlation distances, and scipy's bivariate normal CDF for the
joint LOS probability of two points (a thresholded Gaussian field: LOS at both p and p'
is Z(p) < Φ⁻¹(Pr_LOS(d)) and Z(p') < Φ⁻¹(Pr_LOS(d')), corr(Z(p), Z(p')) = exp(−Δ/50)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multivariate_normal, norm
from support.scenarios import tiny

from mecsim.channel import Tr38901PathLoss
from mecsim.channel.pathloss import los_probability_umi, umi_los_db, umi_nlos_db
from mecsim.channel.spatial import (
    LOS_CORRELATION_DISTANCE_M,
    SHADOW_CORRELATION_DISTANCE_M,
    SpatialLargeScale,
    gaussian_field,
)
from mecsim.emulation.engine import plan_traces, time_round, time_round_columns
from mecsim.emulation.network import NetworkModel, device_profiles, spatially_consistent
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.scenario.loader import ScenarioError

UMI = Tr38901PathLoss(model="38.901-umi", carrier_ghz=3.5)


def test_the_tables_correlation_distances() -> None:
    assert SHADOW_CORRELATION_DISTANCE_M == {
        "38.901-umi": (10.0, 13.0),
        "38.901-uma": (37.0, 50.0),
    }
    assert LOS_CORRELATION_DISTANCE_M == {"38.901-umi": 50.0, "38.901-uma": 50.0}


@pytest.mark.parametrize("d_corr", [10.0, 13.0, 37.0, 50.0])
def test_a_field_s_autocorrelation_is_exp_minus_lag_over_d_corr(d_corr: float) -> None:
    """Over 500 fields, 4 pairs each (3·d_corr apart) at lag d_corr and 3·d_corr along x
    (grid points: the lags are exact): E[z z'] = e^−1 = 0.3679 and e^−3 = 0.0498, var 1.
    Standard error of each mean ≈ √(1.14 / 2000) = 0.024."""
    rng = np.random.default_rng(2026)
    area = (16 * d_corr, 2 * d_corr)
    x0 = np.arange(4) * 3 * d_corr + d_corr
    y = np.full(4, d_corr)
    at_1, at_3, var = [], [], []
    for _ in range(500):
        f = gaussian_field(area, d_corr, rng)
        assert f.spacing_m == pytest.approx(d_corr / 5)
        z0 = f.at(np.column_stack([x0, y]))
        at_1.append(z0 * f.at(np.column_stack([x0 + d_corr, y])))
        at_3.append(z0 * f.at(np.column_stack([x0 + 3 * d_corr, y])))
        var.append(z0**2)
    assert np.mean(at_1) == pytest.approx(math.exp(-1), abs=0.08)
    assert np.mean(at_3) == pytest.approx(math.exp(-3), abs=0.08)
    assert np.mean(var) == pytest.approx(1.0, abs=0.08)


def test_the_embedding_clips_nothing_of_note() -> None:
    f = gaussian_field((630.0, 580.0), 10.0, np.random.default_rng(0))
    assert f.clipped < 1e-3


def _walks(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n independent realisations of the issue's walk: UMi 3.5 GHz, a site at (0, 50),
    a client along y = 50 m from x = 20 m to 300 m, every 10 m (the LOS field's grid)."""
    rng = np.random.default_rng(seed)
    x = np.arange(20.0, 301.0, 10.0)
    path = np.column_stack([x, np.full(x.size, 50.0)])
    los, sf = [], []
    for _ in range(n):
        spatial = SpatialLargeScale(UMI, (320.0, 100.0), [[0.0, 50.0]], rng)
        _, l_, s_ = spatial.links(path, 0)
        los.append(l_)
        sf.append(s_)
    return x, np.array(los), np.array(sf)


def test_a_walker_los_at_20_m_mostly_turns_nlos_by_300_m() -> None:
    """The issue's case: Pr_LOS(20 m) = 0.95738, Pr_LOS(300 m) = 0.06023; 280 m apart
    the LOS-state field's correlation is exp(−280/50) = 0.0037, so of the walkers LOS at
    20 m about 6 % are LOS at 300 m (not all of them, as when the state was kept)."""
    x, los, sf = _walks(600, 44)
    start, end = los[:, 0], los[:, -1]
    assert los_probability_umi(20.0) == pytest.approx(0.957375, abs=1e-6)
    assert los_probability_umi(300.0) == pytest.approx(0.060226, abs=1e-6)
    assert start.mean() == pytest.approx(0.957375, abs=0.035)  # σ 0.0082
    still = end[start].mean()
    assert still == pytest.approx(0.0602, abs=0.035)  # σ ≈ 0.0099
    # its path loss at 300 m: NLOS 121.437 dB (+ shadowing) instead of LOS 98.244 dB
    assert float(umi_los_db(300.0, 3.5)) == pytest.approx(98.2443, abs=1e-4)
    assert float(umi_nlos_db(300.0, 3.5)) == pytest.approx(121.4372, abs=1e-4)
    pl = UMI.path_loss_db(np.full(len(end), 300.0), end, sf[:, -1])
    assert np.median(pl[start]) > 110.0


def test_los_along_the_walk_follows_pr_los_and_decorrelates_at_50_m() -> None:
    """Marginals: P(LOS at d) = Pr_LOS(d). Pairs: P(LOS at d and at d + lag) is the
    bivariate normal CDF at (Φ⁻¹(Pr_LOS(d)), Φ⁻¹(Pr_LOS(d + lag))) with correlation
    exp(−lag/50) (σ of each estimate ≤ 0.021 over 600 walks)."""
    x, los, _ = _walks(600, 7)
    for d in (50.0, 100.0, 200.0):
        k = int(np.flatnonzero(x == d)[0])
        assert los[:, k].mean() == pytest.approx(float(los_probability_umi(d)), abs=0.065)
    k = int(np.flatnonzero(x == 100.0)[0])
    for lag in (10.0, 50.0, 150.0):
        j = int(np.flatnonzero(x == 100.0 + lag)[0])
        p1, p2 = float(los_probability_umi(100.0)), float(los_probability_umi(100.0 + lag))
        rho = math.exp(-lag / 50.0)
        want = multivariate_normal(mean=[0, 0], cov=[[1, rho], [rho, 1]]).cdf(
            [norm.ppf(p1), norm.ppf(p2)]
        )
        assert (los[:, k] & los[:, j]).mean() == pytest.approx(want, abs=0.065)
        # the same state at both ends: 1 − p1 − p2 + 2·P(both LOS) (lag 10 m: 0.8564
        # against 0.6598 were the two independent; lag 150 m: 0.7341 against 0.7298)
        agree = 1.0 - p1 - p2 + 2.0 * want
        assert (los[:, k] == los[:, j]).mean() == pytest.approx(agree, abs=0.065)


def test_shadowing_scales_by_the_state_s_sigma_and_switches_field_with_it() -> None:
    spatial = SpatialLargeScale(UMI, (320.0, 100.0), [[0.0, 50.0]], np.random.default_rng(1))
    p = np.array([[40.0, 50.0], [200.0, 50.0], [260.0, 30.0]])
    _, los, sf = spatial.links(p, 0)
    z_los = spatial.sf_los_fields[0].at(p)
    z_nlos = spatial.sf_nlos_fields[0].at(p)
    np.testing.assert_array_equal(sf, np.where(los, 4.0 * z_los, 7.82 * z_nlos))


def test_sites_have_fields_of_their_own_and_the_seed_reproduces_them() -> None:
    sites = [[100.0, 100.0], [300.0, 100.0]]
    a = SpatialLargeScale(UMI, (400.0, 200.0), sites, np.random.default_rng(9))
    b = SpatialLargeScale(UMI, (400.0, 200.0), sites, np.random.default_rng(9))
    for fa, fb in zip(
        a.sf_nlos_fields + a.los_fields, b.sf_nlos_fields + b.los_fields, strict=True
    ):
        assert np.array_equal(fa.values, fb.values)
    # sites 0 and 1: independent fields (correlation of the NLOS shadowing over the area)
    z0, z1 = (f.values.ravel().astype(float) for f in a.sf_nlos_fields)
    assert abs(np.corrcoef(z0, z1)[0, 1]) < 0.1


# ------------------------------------------------------------------ in a run


def _scenario(**path_loss: object):
    return tiny(
        topology={"clients": 6, "edge_servers": 2},
        channel={
            "model": "shannon",
            "interference": None,
            "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5, **path_loss},
        },
        geometry={
            "area": {"width_m": 1000, "height_m": 400},
            "sites": {"layout": "explicit", "positions_m": [[250, 200], [750, 200]]},
            "mobility": {"model": "random_waypoint", "speed_mps": [20, 35]},
        },
    )


def test_a_moving_run_s_los_and_shadowing_are_the_fields_where_the_client_is() -> None:
    sc = _scenario()
    assert spatially_consistent(sc)
    net = NetworkModel(sc, device_profiles(sc))
    spatial = net.cells.spatial
    assert spatial is not None
    sel = [0, 1, 2, 3, 4, 5]
    seen = []
    t = 0.0
    for rnd in range(6):
        net.links(rnd, sel, t)
        rc = net.round_cells
        _, los, sf = spatial.links(rc.positions_m, rc.serving)
        np.testing.assert_array_equal(net.radio.los, los)
        np.testing.assert_array_equal(net.radio.shadow_fading_db, sf)
        seen.append(net.radio.shadow_fading_db.copy())
        t += 10.0  # cars at 20-35 m/s: 200-350 m a round
    # the shadowing changes as the cars move (it was fixed per link before)
    assert not np.array_equal(seen[0], seen[-1])
    # during the round the moving link's gain uses the fields along the path
    up, _ = net.moving_links
    j, tt = 2, t - 10.0 + 3.0
    p = net.moving.positions.clients_at(np.array([sel[j]]), np.array([tt]))
    site = int(net.edge_server[sel[j]])
    d, los_t, sf_t = spatial.links(p, site)
    want = UMI.path_loss_db(d, los_t, sf_t, net.radio.environment_u[[sel[j]]])
    got = up.gain(np.array([j]), d, p)
    np.testing.assert_allclose(got, 10.0 ** (-want / 10.0), rtol=1e-12)


def test_the_same_seed_gives_the_same_rounds() -> None:
    sc = _scenario()
    runs = []
    for _ in range(2):
        net = NetworkModel(sc, device_profiles(sc))
        rows = []
        for rnd, t in enumerate((0.0, 8.0, 16.0)):
            links = net.links(rnd, [0, 2, 4], t)
            rows.append((net.radio.los.copy(), links.uplink_goodput_bps.copy()))
        runs.append(rows)
    for (la, ga), (lb, gb) in zip(*runs, strict=True):
        assert np.array_equal(la, lb) and np.array_equal(ga, gb)


def test_old_behaviour_by_choice_and_for_static_clients() -> None:
    sc = _scenario(spatial_consistency=False)
    assert not spatially_consistent(sc)
    net = NetworkModel(sc, device_profiles(sc))
    assert net.cells.spatial is None
    net.links(0, [0, 1], 0.0)
    first = net.cells.large_scale.los.copy()
    net.links(1, [0, 1], 20.0)
    assert np.array_equal(net.cells.large_scale.los, first)  # drawn once per run
    static = tiny(
        topology={"clients": 6, "edge_servers": 2},
        channel={
            "model": "shannon",
            "interference": None,
            "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5},
        },
        geometry={
            "area": {"width_m": 1000, "height_m": 400},
            "sites": {"layout": "explicit", "positions_m": [[250, 200], [750, 200]]},
        },
    )
    assert not spatially_consistent(static)


def test_spatial_consistency_without_a_geometry_is_refused() -> None:
    with pytest.raises(ScenarioError, match="channel.path_loss.spatial_consistency: true"):
        tiny(
            channel={
                "model": "shannon",
                "path_loss": {
                    "model": "38.901-umi",
                    "carrier_ghz": 3.5,
                    "spatial_consistency": True,
                },
            }
        )


def test_every_engine_path_agrees_on_spatially_consistent_moving_links() -> None:
    """Cars over UMi fields, transfers of 0.1-40 MB spanning one to several batches of
    pieces: the closed form, events, media and the columns path give SimPy's times."""
    sc = _scenario()
    sc = sc.model_copy(update={"topology": sc.topology.model_copy(update={"clients": 12})})
    net = NetworkModel(sc, device_profiles(sc))
    assert net.cells.spatial is not None
    sel = list(range(12))
    net.links(0, sel, 0.0)
    specs, servers, network, _ = net.round(1, sel, 4.0, records=False)
    sizes = np.geomspace(1e5, 4e7, 12).astype(int).tolist()
    traces = {c: (Download(sizes[c] // 4), Compute(1e9, 5), Upload(sizes[c])) for c in sel}
    ref = time_round(traces, specs, servers, network, method="simpy")
    for method in ("closed_form", "events", "media"):
        assert time_round(traces, specs, servers, network, method=method) == ref, method
    links = net.links(1, sel, 4.0)
    cols = time_round_columns(plan_traces(traces), net.columns(links, sel), network)
    assert cols.timing() == ref
    assert all(c.completed for c in ref.clients)
