"""Mobility: the models against hand-worked numbers and independent
statistics, the border rule, the time grid and its interpolation, determinism from the
seed, the four trace formats parsed from tiny hand-written files, every refusal of a bad
trace with its line, the size limit, the config's validation, and the shipped highway
trace read back. No Ray, no training: the whole file runs in a few seconds.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from support.paths import ROOT

from mecsim.emulation.mobility import (
    Area,
    GaussMarkov,
    RandomWalk,
    RandomWaypoint,
    Static,
    TraceError,
    TraceWarning,
    Trajectory,
    build_trajectory,
    check_trace,
    grid_points,
    load_trace,
    mobility_rng,
    trajectory,
)
from mecsim.emulation.mobility import traces as traces_module
from mecsim.emulation.mobility.traces import FORMATS
from mecsim.scenario.mobility import MobilityConfig, TraceConfig

HIGHWAY = ROOT / "scenarios" / "traces" / "highway-fcd.xml"
BIG = Area(-1e5, -1e5, 1e5, 1e5)  # nobody reaches a border in these tests


# --- the area and its border rule ---------------------------------------------------------
def test_fold_reflects_at_the_border_by_hand():
    area = Area.of_size(10.0, 10.0)
    # 13 is 3 past x = 10: back to 7; -3 is 3 before 0: to 3; 23 = 10 out, 10 back, 3 out:
    # 3; 20 is 10 out and 10 back: 0; -12 = 10 to x = 0... back up to 10, 2 back: 8
    unfolded = np.array([[13.0, -3.0], [23.0, 20.0], [-12.0, 31.0]])
    # 31: 10 up, 10 down, 10 up, 1 down: 9
    assert np.allclose(area.fold(unfolded), [[7, 3], [3, 0], [8, 9]], atol=1e-12)
    shifted = Area(5.0, 5.0, 15.0, 15.0)  # 18 is 3 past 15: 12
    assert np.allclose(shifted.fold(np.array([[18.0, 10.0]])), [[12.0, 10.0]])


def test_area_refuses_an_empty_or_infinite_rectangle():
    with pytest.raises(ValueError, match="x_max_m must exceed x_min_m"):
        Area(0.0, 0.0, 0.0, 10.0)
    with pytest.raises(ValueError, match="finite"):
        Area(0.0, 0.0, math.inf, 10.0)


# --- the time grid ------------------------------------------------------------------------
def test_grid_points_cover_the_horizon():
    assert grid_points(10.0, 0.1) == 101  # 10 / 0.1 = 100.00000000000001 is 100 steps
    assert grid_points(10.05, 0.1) == 102  # the last point just after the horizon
    assert grid_points(0.0, 1.0) == 1
    with pytest.raises(ValueError, match="step_s"):
        grid_points(10.0, 0.0)


def test_position_at_interpolates_half_a_step_and_holds_after_the_end():
    # one client: (0, 0) at t = 0, (10, 4) at t = 2, (10, 10) at t = 4 (step 2 s)
    p = np.array([[[0, 0], [10, 4], [10, 10]]], dtype=np.float32)
    traj = Trajectory(p, step_s=2.0)
    assert traj.end_s == 4.0
    assert np.allclose(traj.position_at(1.0), [[5.0, 2.0]])  # half of the first step
    assert np.allclose(traj.position_at(0.5), [[2.5, 1.0]])  # a quarter
    assert np.allclose(traj.position_at(3.0), [[10.0, 7.0]])  # half of the second
    assert np.allclose(traj.position_at(2.0), [[10.0, 4.0]])  # on a grid point
    assert np.allclose(traj.position_at(4.0), [[10.0, 10.0]])
    assert np.allclose(traj.position_at(1000.0), [[10.0, 10.0]])  # held after the end
    with pytest.raises(ValueError, match="t_s"):
        traj.position_at(-0.1)
    with pytest.raises(ValueError, match="float32"):
        Trajectory(p.astype(np.float64), step_s=2.0)


def test_piece_bounds_cut_an_interval_at_the_grid():
    traj = Trajectory(np.zeros((1, 5, 2), dtype=np.float32), step_s=1.0)  # grid 0..4 s
    assert list(traj.piece_bounds(0.5, 2.5)) == [0.5, 1.0, 2.0, 2.5]
    assert list(traj.piece_bounds(1.0, 2.0)) == [1.0, 2.0]
    assert list(traj.piece_bounds(3.5, 10.0)) == [3.5, 4.0, 10.0]  # one piece after the end
    assert list(traj.piece_bounds(7.0, 9.0)) == [7.0, 9.0]


# --- static -------------------------------------------------------------------------------
def test_static_clients_stay_and_cost_no_memory_per_step():
    initial = np.array([[1.0, 2.0], [3.0, 4.0]])
    traj = trajectory(Static(initial, Area.of_size(10, 10), 1.0), horizon_s=1000.0)
    assert traj.positions_m.shape == (2, 1001, 2)
    assert traj.positions_m.dtype == np.float32
    assert np.array_equal(traj.positions_m[:, 500], initial)
    assert traj.positions_m.strides[1] == 0  # one position broadcast over the grid


def test_initial_positions_outside_the_area_are_refused():
    with pytest.raises(ValueError, match="client 1 .*outside the area"):
        Static([[1.0, 1.0], [11.0, 1.0]], Area.of_size(10, 10), 1.0)


# --- random waypoint ----------------------------------------------------------------------
def test_random_waypoint_reaches_its_waypoint_at_distance_over_speed_and_pauses():
    """Speed fixed at 2 m/s ([2, 2]), pause fixed at 5 s, one client from (50, 50).

    By hand, with w the first waypoint: it arrives at t_a = |w − p0| / 2; before that
    p(t) = p0 + (w − p0) t / t_a; during [t_a, t_a + 5] it stays at w; after, it is
    2 (t − t_a − 5) metres from w. The grid (0.5 s) need not hit t_a: the events are
    exact between grid points."""
    area = Area.of_size(100.0, 100.0)
    p0 = np.array([50.0, 50.0])
    model = RandomWaypoint(
        [p0], area, 0.5, mobility_rng(3), speed_mps=(2.0, 2.0), pause_s=(5.0, 5.0)
    )
    traj = trajectory(model, horizon_s=200.0)
    pos = traj.positions_m[0].astype(np.float64)
    t = traj.times_s()
    # the first waypoint is the first draw of the mobility stream: uniform over the area
    w = mobility_rng(3).random((1, 2))[0] * 100.0
    t_a = float(np.hypot(*(w - p0))) / 2.0
    assert 0 < t_a < 200 - 10
    before = t <= t_a
    expected = p0 + np.outer(t[before] / t_a, w - p0)
    assert np.allclose(pos[before], expected, atol=1e-3)
    pausing = (t >= t_a) & (t <= t_a + 5.0)
    assert pausing.sum() >= 10  # 5 s at 0.5 s steps
    assert np.allclose(pos[pausing], w, atol=1e-3)
    k = int(np.flatnonzero(t > t_a + 5.0)[0])  # the first grid point after the pause
    assert np.hypot(*(pos[k] - w)) == pytest.approx(2.0 * (t[k] - t_a - 5.0), abs=1e-3)
    # and it keeps 2 m/s: one step is 1 m while it is on its way to the next waypoint
    assert np.hypot(*(pos[k + 1] - pos[k])) == pytest.approx(1.0, abs=1e-3)


def test_random_waypoint_speeds_stay_in_range_and_clients_in_the_area():
    area = Area.of_size(200.0, 100.0)
    initial = mobility_rng(0).random((300, 2)) * [200.0, 100.0]
    model = RandomWaypoint(
        initial, area, 1.0, mobility_rng(1), speed_mps=(1.0, 3.0), pause_s=(0.0, 2.0)
    )
    traj = trajectory(model, horizon_s=300.0)
    p = traj.positions_m.astype(np.float64)
    assert area.contains(p).all()
    step = np.hypot(*np.moveaxis(np.diff(p, axis=1), -1, 0))
    assert step.max() <= 3.0 + 1e-3  # never faster than the fastest speed
    assert (step > 0).mean() > 0.5  # and they do move


def test_random_waypoint_of_one_client_does_not_depend_on_the_step():
    """One client's events are exact between grid points: the positions at the common
    grid times (every 1 s) are the same with steps of 1 s and 0.25 s."""
    area = Area.of_size(50.0, 50.0)
    kw = {"speed_mps": (0.5, 4.0), "pause_s": (0.0, 3.0)}
    coarse = trajectory(RandomWaypoint([[1.0, 1.0]], area, 1.0, mobility_rng(9), **kw), 120.0)
    fine = trajectory(RandomWaypoint([[1.0, 1.0]], area, 0.25, mobility_rng(9), **kw), 120.0)
    assert np.allclose(coarse.positions_m, fine.positions_m[:, ::4], atol=1e-4)


def test_random_waypoint_refuses_a_zero_speed():
    with pytest.raises(ValueError, match="speed_mps"):
        RandomWaypoint([[0, 0]], BIG, 1.0, mobility_rng(0), speed_mps=(0.0, 1.0))


# --- Gauss–Markov -------------------------------------------------------------------------
def test_gauss_markov_with_alpha_1_keeps_its_speed_and_direction():
    # α = 1: s_n = s_{n−1}, d_n = d_{n−1} whatever σ: 3 m/s along +x, 3 · 10 s = 30 m
    gm = GaussMarkov(
        [[0.0, 0.0], [100.0, 100.0]],
        BIG,
        1.0,
        mobility_rng(0),
        mean_speed_mps=3.0,
        alpha=1.0,
        speed_std_mps=5.0,
        direction_std_rad=1.0,
        mean_direction_rad=0.0,
    )
    traj = trajectory(gm, horizon_s=10.0)
    assert np.allclose(traj.positions_m[:, 10], [[30.0, 0.0], [130.0, 100.0]], atol=1e-4)
    assert np.allclose(traj.positions_m[0, :, 0], 3.0 * np.arange(11), atol=1e-4)
    # each client's own mean direction (none given): straight lines at 3 m/s
    gm = GaussMarkov(
        np.zeros((50, 2)),
        BIG,
        1.0,
        mobility_rng(1),
        mean_speed_mps=3.0,
        alpha=1.0,
        speed_std_mps=5.0,
        direction_std_rad=1.0,
    )
    p = trajectory(gm, horizon_s=10.0).positions_m
    assert np.allclose(np.hypot(p[:, 10, 0], p[:, 10, 1]), 30.0, atol=1e-4)
    assert np.allclose(p[:, 5], p[:, 10] / 2, atol=1e-4)


def _gm_legs(alpha: float, clients: int, steps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Speed and direction of every leg (one per 1 s step) from the positions, in an area
    nobody leaves (so the step's displacement is the leg's velocity · 1 s)."""
    gm = GaussMarkov(
        np.zeros((clients, 2)),
        BIG,
        1.0,
        mobility_rng(seed),
        mean_speed_mps=10.0,
        alpha=alpha,
        speed_std_mps=2.0,
        direction_std_rad=0.3,
        mean_direction_rad=0.0,
    )
    d = np.diff(trajectory(gm, horizon_s=float(steps)).positions_m.astype(np.float64), axis=1)
    return np.hypot(d[..., 0], d[..., 1]), np.arctan2(d[..., 1], d[..., 0])


def test_gauss_markov_with_alpha_0_draws_the_noise_afresh():
    """α = 0: s_n = s̄ + σ_s w_n, d_n = d̄ + σ_d w'_n, independent draws. 400 clients × 49
    legs (leg 0 is s̄, d̄ exactly) = 19,600 samples: the sample mean is within
    4 σ / √N of the mean (σ_s = 2: 0.057 m/s; σ_d = 0.3: 0.0086 rad) and the sample
    standard deviation within 4 σ / √(2N) (0.040 m/s, 0.0061 rad). (s̄ = 10 is 5 σ_s above
    0: the clip at 0 m/s never acts.)"""
    speed, direction = _gm_legs(alpha=0.0, clients=400, steps=50, seed=11)
    assert np.allclose(speed[:, 0], 10.0, atol=1e-4) and np.allclose(direction[:, 0], 0.0)
    s, d = speed[:, 1:].ravel(), direction[:, 1:].ravel()
    n = s.size
    assert n == 19_600
    assert abs(s.mean() - 10.0) < 4 * 2.0 / math.sqrt(n)
    assert abs(s.std() - 2.0) < 4 * 2.0 / math.sqrt(2 * n)
    assert abs(d.mean() - 0.0) < 4 * 0.3 / math.sqrt(n)
    assert abs(d.std() - 0.3) < 4 * 0.3 / math.sqrt(2 * n)


def test_gauss_markov_memory_is_the_lag_one_autocorrelation():
    """For 0 < α < 1 the speed is an AR(1) process: corr(s_n, s_{n−1}) = α and its
    stationary standard deviation is σ_s (the √(1 − α²) factor). After 10 legs the start
    at s̄ is forgotten to α^20 ≈ 1e-6 of the variance; 400 clients × 39 pairs: the
    estimate of ρ has a standard error ≈ (1 − ρ²)/√N = 0.0038."""
    speed, _ = _gm_legs(alpha=0.5, clients=400, steps=50, seed=12)
    s = speed[:, 10:]
    a, b = s[:, 1:].ravel(), s[:, :-1].ravel()
    assert np.corrcoef(a, b)[0, 1] == pytest.approx(0.5, abs=0.03)
    assert s.std() == pytest.approx(2.0, abs=0.06)


def test_gauss_markov_reflects_at_the_border_by_hand():
    # from x = 8 at 3 m/s along +x in [0, 10]: the wall at t = 2/3 s, back at 3 m/s;
    # t = 1: 11 -> 9; t = 2: 14 -> 6; t = 5: 15 m travelled = 2 to the wall, 10 across,
    # 3 back from x = 0: 3
    gm = GaussMarkov(
        [[8.0, 5.0]],
        Area.of_size(10.0, 10.0),
        1.0,
        mobility_rng(0),
        mean_speed_mps=3.0,
        alpha=1.0,
        speed_std_mps=0.0,
        direction_std_rad=0.0,
        mean_direction_rad=0.0,
    )
    x = trajectory(gm, horizon_s=5.0).positions_m[0, :, 0]
    assert np.allclose(x, [8, 9, 6, 3, 0, 3], atol=1e-5)


def test_gauss_markov_refuses_alpha_outside_0_1():
    with pytest.raises(ValueError, match="alpha"):
        GaussMarkov(
            [[0, 0]],
            BIG,
            1.0,
            mobility_rng(0),
            mean_speed_mps=1.0,
            alpha=1.5,
            speed_std_mps=0.0,
            direction_std_rad=0.0,
        )


# --- random walk --------------------------------------------------------------------------
def test_random_walk_step_length_is_speed_times_interval():
    """4 m/s, a new direction every 2.5 s, grid 0.5 s: each grid step is 4 · 0.5 = 2 m,
    each leg (5 grid steps) is one straight line of 4 · 2.5 = 10 m."""
    rw = RandomWalk(
        np.zeros((20, 2)), BIG, 0.5, mobility_rng(5), speed_mps=(4.0, 4.0), interval_s=2.5
    )
    p = trajectory(rw, horizon_s=25.0).positions_m.astype(np.float64)
    step = np.diff(p, axis=1)
    assert np.allclose(np.hypot(step[..., 0], step[..., 1]), 2.0, atol=1e-4)
    legs = p[:, ::5]  # t = 0, 2.5, 5, ...
    leg = np.diff(legs, axis=1)
    assert np.allclose(np.hypot(leg[..., 0], leg[..., 1]), 10.0, atol=1e-4)
    assert np.allclose(leg, 5 * step[:, ::5], atol=1e-4)  # straight within a leg
    # and the directions change between legs
    assert not np.allclose(leg[:, 0], leg[:, 1], atol=1.0)


def test_leg_changes_between_grid_points_are_exact():
    """Legs of 1.5 s on grids of 1 s and 0.5 s: the same positions at whole seconds (a
    leg change at 1.5 s falls between two points of the coarse grid)."""
    for cls, kw in [
        (RandomWalk, {"speed_mps": (1.0, 3.0), "interval_s": 1.5}),
        (
            GaussMarkov,
            {
                "mean_speed_mps": 2.0,
                "alpha": 0.5,
                "speed_std_mps": 1.0,
                "direction_std_rad": 1.0,
                "update_interval_s": 1.5,
            },
        ),
    ]:
        area = Area.of_size(30.0, 30.0)
        start = np.full((10, 2), 15.0)
        coarse = trajectory(cls(start, area, 1.0, mobility_rng(4), **kw), 30.0)
        fine = trajectory(cls(start, area, 0.5, mobility_rng(4), **kw), 30.0)
        assert np.allclose(coarse.positions_m, fine.positions_m[:, ::2], atol=1e-4), cls


def test_reflection_keeps_everyone_inside_the_area():
    area = Area(-20.0, 10.0, 20.0, 30.0)
    start = np.column_stack([np.linspace(-19, 19, 100), np.linspace(11, 29, 100)])
    models = [
        RandomWalk(start, area, 1.0, mobility_rng(1), speed_mps=(10.0, 50.0), interval_s=3.0),
        GaussMarkov(
            start,
            area,
            1.0,
            mobility_rng(2),
            mean_speed_mps=30.0,
            alpha=0.8,
            speed_std_mps=10.0,
            direction_std_rad=1.0,
        ),
        RandomWaypoint(start, area, 1.0, mobility_rng(3), speed_mps=(10.0, 50.0)),
    ]
    for model in models:
        traj = trajectory(model, horizon_s=500.0)
        assert area.contains(traj.positions_m).all(), type(model).__name__
        assert traj.positions_m.std() > 1.0  # they did move (and bounce: 30 m/s in 40 m)


# --- determinism --------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["static", "random_waypoint", "gauss_markov", "random_walk"])
def test_same_seed_same_positions_other_seed_other_positions(model: str):
    config = MobilityConfig(model=model, step_s=0.5)
    area = Area.of_size(100.0, 100.0)
    start = np.random.default_rng(0).random((50, 2)) * 100.0
    a = build_trajectory(config, start, area, seed=7, horizon_s=60.0)
    b = build_trajectory(config, start, area, seed=7, horizon_s=60.0)
    c = build_trajectory(config, start, area, seed=8, horizon_s=60.0)
    assert np.array_equal(a.positions_m, b.positions_m)
    assert np.array_equal(a.positions_m, c.positions_m) == (model == "static")


def test_advancing_in_parts_gives_the_same_grid():
    area = Area.of_size(100.0, 100.0)
    start = np.full((5, 2), 50.0)
    whole = trajectory(
        RandomWaypoint(start, area, 1.0, mobility_rng(2), speed_mps=(1, 5), pause_s=(0, 4)), 40.0
    )
    model = RandomWaypoint(start, area, 1.0, mobility_rng(2), speed_mps=(1, 5), pause_s=(0, 4))
    parts = np.empty((5, 40, 2), dtype=np.float32)
    model.advance(parts[:, :15])
    model.advance(parts[:, 15:])
    assert np.array_equal(whole.positions_m[:, 1:], parts)


# --- the config ---------------------------------------------------------------------------
def test_config_defaults_are_filled_per_model():
    assert MobilityConfig().model == "static" and MobilityConfig().step_s == 1.0
    rwp = MobilityConfig(model="random_waypoint")
    assert rwp.speed_mps == (0.5, 1.5) and rwp.pause_s == 0.0 and rwp.alpha is None
    gm = MobilityConfig(model="gauss_markov", alpha=0.9)
    assert gm.parameters() == {
        "mean_speed_mps": 1.0,
        "alpha": 0.9,
        "speed_std_mps": 0.5,
        "direction_std_rad": 0.5,
        "mean_direction_rad": None,
        "update_interval_s": 1.0,
    }
    rw = MobilityConfig(model="random_walk", speed_mps=2)
    assert rw.parameters() == {"speed_mps": 2.0, "interval_s": 10.0}
    # a dump (every field, None for other models') validates back to the same config
    for config in (rwp, gm, rw):
        assert MobilityConfig.model_validate(config.model_dump(mode="json")) == config


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"model": "gauss_markov", "pause_s": 3}, "pause_s", "not of model gauss_markov"),
        ({"model": "random_waypoint", "alpha": 0.5}, "alpha", "a parameter of gauss_markov"),
        ({"model": "gauss_markov", "alpha": 1.5}, "alpha", "less than or equal to 1"),
        ({"model": "random_waypoint", "speed_mps": [2, 1]}, "speed_mps", "lo 2 > hi 1"),
        ({"model": "random_waypoint", "speed_mps": 0}, "speed_mps", "above 0"),
        ({"model": "random_waypoint", "pause_s": -1}, "pause_s", "at least 0"),
        ({"model": "random_walk", "speed_mps": [1, 2, 3]}, "speed_mps", "pair"),
        ({"model": "random_walk", "interval_s": 0}, "interval_s", "greater than 0"),
        ({"model": "gauss_markov", "mean_speed_mps": float("nan")}, "mean_speed_mps", "finite"),
        ({"step_s": 0}, "step_s", "greater than 0"),
        ({"model": "teleport"}, "model", "static"),
        ({"model": "trace"}, "trace", "needs the trace file"),
        ({"model": "trace", "trace": {"format": "gpx", "path": "a"}}, "format", "sumo_fcd"),
        ({"model": "trace", "trace": {"format": "ns2", "path": ""}}, "path", "at least 1"),
        (
            {"model": "trace", "trace": {"format": "ns2", "path": "a", "node_map": {1: 0, 2: 0}}},
            "node_map",
            "client 0 is given two nodes",
        ),
        ({"model": "static", "colour": "red"}, "colour", "Extra inputs"),
    ],
)
def test_config_refuses_bad_values_naming_the_field(data, field, words):
    with pytest.raises(ValidationError) as info:
        MobilityConfig.model_validate(data)
    text = str(info.value)
    assert field in text and words in text, text


def test_trace_config_reads_integer_node_ids_as_strings():
    cfg = TraceConfig(format="ns2", path="x.tcl", node_map={0: 1, "7": 0})
    assert cfg.node_map == {"0": 1, "7": 0}


# --- traces: the four formats, by hand ----------------------------------------------------
def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


FCD = """<?xml version="1.0" encoding="UTF-8"?>
<fcd-export>
    <timestep time="0.00">
        <vehicle id="a" x="0.00" y="0.00" angle="90.00" speed="5.00"/>
        <vehicle id="b" x="100.00" y="50.00" angle="0.00" speed="0.00"/>
    </timestep>
    <timestep time="2.00">
        <vehicle id="a" x="20.00" y="10.00"/>
    </timestep>
    <timestep time="4.00">
        <vehicle id="a" x="20.00" y="30.00"/>
        <person id="c" x="5" y="5"/>
    </timestep>
</fcd-export>
"""


def test_sumo_fcd_by_hand(tmp_path: Path):
    trace = load_trace(_write(tmp_path, "t.xml", FCD), "sumo_fcd", area=Area.of_size(200, 100))
    assert trace.node_ids == ["a", "b", "c"]  # order of first appearance
    assert trace.end_s == 4.0
    with pytest.warns(TraceWarning, match="ends at 4 s but the run needs positions until 6 s"):
        traj = trace.trajectory(3, step_s=1.0, horizon_s=6.0)
    p = traj.positions_m
    # a: (0,0) at 0 s, (20,10) at 2 s, (20,30) at 4 s: half-way at 1 s and 3 s, then held
    assert np.allclose(p[0], [[0, 0], [10, 5], [20, 10], [20, 20], [20, 30], [20, 30], [20, 30]])
    assert np.allclose(p[1], [100, 50])  # one sample: there all along
    assert np.allclose(p[2], [5, 5])  # first seen at 4 s: there before too
    # by an explicit map
    with pytest.warns(TraceWarning):
        mapped = trace.trajectory(2, 1.0, 6.0, node_map={"c": 0, "a": 1})
    assert np.allclose(mapped.positions_m[0], [5, 5])
    assert np.allclose(mapped.positions_m[1, 1], [10, 5])
    # starting 2 s into the trace: emulated 1 s is trace time 3 s
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        late = trace.trajectory(1, 1.0, 2.0, start_s=2.0)
    assert np.allclose(late.positions_m[0], [[20, 10], [20, 20], [20, 30]])


NS2 = """# two nodes
$node_(0) set X_ 10.0
$node_(0) set Y_ 20.0
$node_(0) set Z_ 0.0
$node_(1) set X_ 0
$node_(1) set Y_ 0
$node_(1) set Z_ 0
$god_ set-dist 0 1 1
$ns_ at 2.0 "$node_(0) setdest 40.0 60.0 5.0"
$ns_ at 1.0 "$node_(1) setdest 30.0 0.0 10.0"
$ns_ at 2.0 "$node_(1) setdest 0.0 0.0 4.0"
$ns_ at 3.0 "$god_ set-dist 0 1 2"
"""


def test_ns2_setdest_by_hand(tmp_path: Path):
    """Node 0 waits at (10, 20) until 2 s, then heads for (40, 60) at 5 m/s: 50 m, so it
    arrives at 12 s; at 4.5 s it has gone 12.5 m = 1/4 of the way: (17.5, 30); at 7 s
    half: (25, 40). Node 1 leaves (0, 0) at 1 s for (30, 0) at 10 m/s; at 2 s, mid-way at
    (10, 0), a new setdest sends it back to (0, 0) at 4 m/s: (6, 0) at 3 s, home at 4.5 s."""
    trace = load_trace(_write(tmp_path, "m.tcl", NS2), "ns2", area=Area.of_size(100, 100))
    assert trace.node_ids == ["0", "1"]
    assert trace.end_s == math.inf  # a node stays at its last destination
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "trace too short" for ns-2
        traj = trace.trajectory(2, step_s=0.5, horizon_s=20.0)
    at = traj.position_at
    assert np.allclose(at(1.0)[0], [10, 20]) and np.allclose(at(2.0)[0], [10, 20])
    assert np.allclose(at(4.5)[0], [17.5, 30]) and np.allclose(at(7.0)[0], [25, 40])
    assert np.allclose(at(12.0)[0], [40, 60]) and np.allclose(at(20.0)[0], [40, 60])
    assert np.allclose(at(1.0)[1], [0, 0]) and np.allclose(at(1.5)[1], [5, 0])
    assert np.allclose(at(2.0)[1], [10, 0]) and np.allclose(at(3.0)[1], [6, 0])
    assert np.allclose(at(4.5)[1], [0, 0]) and np.allclose(at(9.0)[1], [0, 0])


ONE = """100 200 1000 2000 500 1000
# time id x y
100 n1 1010 510
100 n2 1020 520
110 n1 1110 510
110 n2 1020 620
120 n1 1110 610
"""


def test_one_by_hand(tmp_path: Path):
    """Times from minTime (100), positions from (minX, minY) = (1000, 500), as the ONE
    normalises: n1 (10, 10) at 0 s, (110, 10) at 10 s, (110, 110) at 20 s; n2 (20, 20) at
    0 s, (20, 120) at 10 s, held after."""
    trace = load_trace(_write(tmp_path, "one.txt", ONE), "one", area=Area.of_size(1000, 500))
    assert trace.node_ids == ["n1", "n2"] and trace.end_s == 20.0
    traj = trace.trajectory(2, step_s=5.0, horizon_s=20.0)
    assert np.allclose(traj.positions_m[0], [[10, 10], [60, 10], [110, 10], [110, 60], [110, 110]])
    assert np.allclose(traj.positions_m[1], [[20, 20], [20, 70], [20, 120], [20, 120], [20, 120]])


BONN = """0.0 0.0 0.0 10.0 30.0 40.0 20.0 30.0 40.0 30.0 0.0 40.0
0.0 5.0 5.0 100.0 5.0 5.0
"""


def test_bonnmotion_by_hand(tmp_path: Path):
    """Node 0: (0, 0) → (30, 40) over 10 s, paused to 20 s, → (0, 40) by 30 s: at 5 s
    (15, 20), at 15 s (30, 40), at 25 s (15, 40). Node 1 stays at (5, 5)."""
    trace = load_trace(_write(tmp_path, "b.movements", BONN), "bonnmotion", area=BIG)
    assert trace.node_ids == ["0", "1"] and trace.end_s == 100.0
    traj = trace.trajectory(2, step_s=5.0, horizon_s=30.0)
    assert np.allclose(traj.position_at(5.0)[0], [15, 20])
    assert np.allclose(traj.position_at(15.0)[0], [30, 40])
    assert np.allclose(traj.position_at(25.0)[0], [15, 40])
    assert np.allclose(traj.position_at(12.5)[1], [5, 5])


def test_gzip_traces_are_read(tmp_path: Path):
    path = tmp_path / "b.movements.gz"
    path.write_bytes(gzip.compress(BONN.encode()))
    assert load_trace(path, "bonnmotion").node_ids == ["0", "1"]


# --- traces: refused with file and line ---------------------------------------------------
AREA = Area.of_size(200.0, 200.0)

BAD = [
    # SUMO FCD
    (
        "sumo_fcd",
        FCD.replace('time="4.00"', 'time="1.00"'),
        10,
        "timestep time 1 s is not after the previous timestep's 2 s",
    ),
    (
        "sumo_fcd",
        FCD.replace('<person id="c"', '<vehicle id="a"'),
        12,
        "id 'a' twice in the timestep of time 4 s (first on line 11)",
    ),
    ("sumo_fcd", FCD.replace('x="20.00" y="10.00"', 'x="nan" y="10.00"'), 8, "not a finite"),
    ("sumo_fcd", FCD.replace('x="100.00"', 'x="300.00"'), 5, "outside the area"),
    ("sumo_fcd", FCD.replace('x="100.00" ', ""), 5, "without its x attribute"),
    ("sumo_fcd", FCD.replace('y="10.00"/>', 'y="10.00">'), 9, "not well-formed XML (mismatched"),
    (
        "sumo_fcd",
        FCD.replace(
            "<fcd-export>",
            '<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>\n'
            "<fcd-export>",
        ),
        2,
        "document type declaration",
    ),
    # ns-2
    ("ns2", NS2.replace('at 2.0 "$node_(1)', 'at 0.5 "$node_(1)'), 11, "times must be sorted"),
    ("ns2", NS2.replace("$node_(1) set Y_ 0", "$node_(0) set Y_ 0"), 6, "set twice"),
    ("ns2", NS2.replace("setdest 40.0 60.0 5.0", "setdest 40.0 60.0 nan"), 9, "speed 'nan'"),
    ("ns2", NS2.replace("setdest 40.0 60.0", "setdest 400.0 60.0"), 9, "outside the area"),
    ("ns2", NS2 + "$node_(0) start\n", 13, "not an ns-2 mobility line"),
    ("ns2", NS2 + '$ns_ at 5.0 "$node_(7) setdest 1 1 1"\n', 13, "no initial position"),
    # the ONE
    ("one", ONE.replace("120 n1", "105 n1"), 7, "times must be sorted"),
    ("one", ONE.replace("110 n2", "110 n1"), 6, "appears twice at time 10 s (first on line 5)"),
    ("one", ONE.replace("1110 610", "2500 610"), 7, "outside the header's bounds"),
    ("one", ONE.replace("100 200 1000 2000 500 1000", "100 200 1000"), 1, "the header"),
    ("one", ONE.replace("1110 510", "1110 inf"), 5, "not a finite"),
    ("one", ONE.replace("500 1000", "500 1000 0 0").replace("1110 610", "1110 610 7"), 7, "got 5"),
    # BonnMotion
    ("bonnmotion", BONN.replace("20.0 30.0", "5.0 30.0"), 1, "times must be sorted"),
    ("bonnmotion", BONN.replace("100.0 5.0 5.0", "100.0 5.0"), 2, "not a multiple of 3"),
    ("bonnmotion", BONN.replace("100.0 5.0 5.0", "100.0 NaN 5.0"), 2, "not a finite"),
    ("bonnmotion", BONN.replace("30.0 0.0 40.0", "30.0 -1.0 40.0"), 1, "outside the area"),
    ("bonnmotion", BONN.replace("20.0 30.0 40.0", "10.0 31.0 40.0"), 1, "two places at time 10"),
]


@pytest.mark.parametrize(("fmt", "text", "line", "words"), BAD)
def test_bad_traces_are_refused_with_file_and_line(tmp_path: Path, fmt, text, line, words):
    path = _write(tmp_path, "bad.trace", text)
    with pytest.raises(TraceError) as info:
        load_trace(path, fmt, area=AREA)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert words in message, message


def test_the_hand_written_traces_themselves_pass_the_checks(tmp_path: Path):
    # the bad cases above are each one edit of these: the edit is what is refused
    for fmt, text in [("sumo_fcd", FCD), ("ns2", NS2), ("one", ONE), ("bonnmotion", BONN)]:
        trace = load_trace(_write(tmp_path, f"ok.{fmt}", text), fmt, area=AREA)
        assert trace.format == fmt and trace.nodes, fmt
        for node in trace.nodes:  # every sample read, in time order, inside the area
            assert len(node.times_s) == len(node.xy_m) > 0, (fmt, node.node_id)
            assert (np.diff(node.times_s) >= 0).all(), (fmt, node.node_id)
            assert np.isfinite(node.xy_m).all(), (fmt, node.node_id)


def test_an_xml_bomb_is_refused_before_any_expansion(tmp_path: Path):
    """The billion laughs: ten levels of ten references, 10^9 'lol's if expanded. The
    DOCTYPE is refused as the parser meets it, before any entity is declared."""
    levels = ['<!ENTITY lol0 "lol">'] + [
        f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">' for i in range(1, 10)
    ]
    bomb = (
        '<?xml version="1.0"?>\n<!DOCTYPE fcd-export [\n'
        + "\n".join(levels)
        + '\n]>\n<fcd-export><timestep time="0"><vehicle id="&lol9;" x="1" y="1"/>'
        "</timestep></fcd-export>\n"
    )
    with pytest.raises(TraceError, match=r":2: a document type declaration"):
        load_trace(_write(tmp_path, "bomb.xml", bomb), "sumo_fcd")
    # an external entity has nothing to be declared by either
    ext = '<?xml version="1.0"?>\n<fcd-export>&xxe;</fcd-export>\n'
    with pytest.raises(TraceError, match=r":2: not well-formed XML \(undefined entity\)"):
        load_trace(_write(tmp_path, "xxe.xml", ext), "sumo_fcd")


def test_the_size_limit(tmp_path: Path):
    path = _write(tmp_path, "b.movements", BONN)
    size = path.stat().st_size
    load_trace(path, "bonnmotion", max_bytes=size)  # at the limit: read
    with pytest.raises(TraceError, match=rf"{size:,} bytes, over the limit of {size - 1:,}"):
        load_trace(path, "bonnmotion", max_bytes=size - 1)
    # a .gz is limited by what it decompresses to, too (a zip bomb stops at the limit)
    bomb = tmp_path / "zeros.movements.gz"
    bomb.write_bytes(gzip.compress(b"0 " * 5_000_000))
    assert bomb.stat().st_size < 100_000
    with pytest.raises(TraceError, match="decompresses to over the limit of 1,000,000"):
        load_trace(bomb, "bonnmotion", max_bytes=1_000_000)
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(tmp_path / "missing.xml", "sumo_fcd")


def test_mapping_refusals(tmp_path: Path):
    trace = load_trace(_write(tmp_path, "t.xml", FCD), "sumo_fcd")
    with pytest.raises(TraceError, match="3 trace nodes for 4 clients"):
        trace.assign(4)
    with pytest.raises(TraceError, match=r"node_map: names node 'z', which .*t.xml does not"):
        trace.assign(2, {"a": 0, "z": 1})
    with pytest.raises(TraceError, match="names no node for clients 1"):
        trace.assign(2, {"a": 0})
    with pytest.raises(TraceError, match="client 5, but the clients are 0..1"):
        trace.assign(2, {"a": 0, "b": 5})
    with pytest.raises(TraceError, match=r"ends at 4 s .* \(trace.after_end: refuse\)"):
        trace.trajectory(2, 1.0, 10.0, after_end="refuse")


def test_build_and_check_a_trace_from_its_config(tmp_path: Path):
    _write(tmp_path, "m.tcl", NS2)
    config = MobilityConfig(
        model="trace", step_s=0.5, trace={"format": "ns2", "path": "m.tcl", "node_map": {1: 0}}
    )
    area = Area.of_size(100, 100)
    assert check_trace(config, 1, area, base_dir=tmp_path) is not None
    assert check_trace(MobilityConfig(), 1, area) is None
    traj = build_trajectory(
        config, np.zeros((1, 2)), area, seed=0, horizon_s=5.0, base_dir=tmp_path
    )
    assert np.allclose(traj.position_at(3.0), [[6.0, 0.0]])  # node 1 of the ns-2 test
    with pytest.raises(TraceError, match="2 trace nodes for 3 clients"):
        check_trace(
            config.model_copy(update={"trace": TraceConfig(format="ns2", path="m.tcl")}),
            3,
            area,
            base_dir=tmp_path,
        )


# --- the shipped highway trace ------------------------------------------------------------
def _highway_script():
    spec = importlib.util.spec_from_file_location(
        "make_highway_fcd", ROOT / "scenarios" / "traces" / "make_highway_fcd.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_highway_trace_reads_back():
    assert HIGHWAY.stat().st_size < 1_000_000
    trace = load_trace(HIGHWAY, "sumo_fcd", area=Area.of_size(2000.0, 200.0))
    assert len(trace.nodes) == 30 and trace.end_s == 120.0
    for node in trace.nodes:
        dt = np.diff(node.times_s)
        assert np.all(dt == 1.0)  # 1 s steps while on the road
        v = np.hypot(*np.diff(node.xy_m, axis=0).T) / dt
        assert np.all((v >= 20.0 - 1e-6) & (v <= 35.0 + 1e-6)), node.node_id
        assert set(node.xy_m[:, 1]) <= {98.4, 101.6}  # one lane each way
    assert {n.node_id.split(".")[0] for n in trace.nodes} == {"east", "west"}
    # the file is what the script writes from its default seed (deterministic, up to date)
    script = _highway_script()
    assert HIGHWAY.read_text() == script.fcd_xml(script.vehicles(30, 28, 2.0), 120)
    assert script.fcd_xml(script.vehicles(30, 5, 2.0), 120) != HIGHWAY.read_text()


# --- traces: memory bounded by what the scenario uses --------------------------------------
def _one_sample_bonnmotion(n: int) -> str:
    return "".join(f"0 {1 + i % 50} {1 + i % 7}\n" for i in range(n))


def _many_nodes(fmt: str, n: int) -> str:
    """A trace of ``n`` nodes, one sample each, in each format."""
    if fmt == "bonnmotion":
        return _one_sample_bonnmotion(n)
    if fmt == "one":
        return "0 10 0 100 0 100\n" + "".join(f"0 n{i} 1 2\n" for i in range(n))
    if fmt == "ns2":
        return "".join(f"$node_({i}) set X_ 1\n$node_({i}) set Y_ 2\n" for i in range(n))
    steps = "".join(f'<vehicle id="v{i}" x="1" y="2"/>\n' for i in range(n))
    return f'<fcd-export>\n<timestep time="0">\n{steps}</timestep>\n</fcd-export>\n'


@pytest.mark.parametrize(
    ("fmt", "line"), [("bonnmotion", 51), ("one", 52), ("ns2", 101), ("sumo_fcd", 53)]
)
def test_a_trace_of_more_nodes_than_the_limit_is_refused_at_the_first_one_over(
    tmp_path: Path, fmt, line
):
    path = _write(tmp_path, "many.trace", _many_nodes(fmt, 60))
    load_trace(path, fmt, area=AREA, max_nodes=60)  # at the limit: read
    with pytest.raises(TraceError) as info:
        load_trace(path, fmt, area=AREA, max_nodes=50)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert "node number 51: a trace may have at most 50 nodes" in message, message


def test_the_node_limit_applies_to_a_scenario_s_trace(tmp_path: Path, monkeypatch):
    path = _write(tmp_path, "many.movements", _one_sample_bonnmotion(30))
    config = MobilityConfig(model="trace", trace={"format": "bonnmotion", "path": str(path)})
    assert len(check_trace(config, 4, AREA).nodes) == 4
    monkeypatch.setattr(traces_module, "MAX_TRACE_NODES", 20)
    with pytest.raises(TraceError, match=r"many.movements:21: .*at most 20 nodes"):
        check_trace(config, 4, AREA)


def _peak_bytes(call) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_many_one_sample_nodes_are_read_in_memory_bounded_by_the_clients(tmp_path: Path):
    """The issue's case, scaled down: one-sample BonnMotion nodes (8.7 M in 52 MB took
    > 4.4 GB before). A scenario of 4 clients keeps 4 nodes: the parse holds about the
    file's bytes, not tens of times them."""
    text = _one_sample_bonnmotion(90_000)
    path = _write(tmp_path, "flood.movements", text)
    size = len(text)
    config = MobilityConfig(model="trace", trace={"format": "bonnmotion", "path": str(path)})
    peak = _peak_bytes(lambda: check_trace(config, 4, AREA))
    assert peak < 2 * size + 2**20, (peak, size)
    # one followed node of many samples (a single 3 MB line): kept as float64 triples
    waypoints = 100_000
    line = " ".join(f"{t} 5 5" for t in range(waypoints)) + "\n"
    long_path = _write(tmp_path, "long.movements", line + "0 1 1\n")
    peak = _peak_bytes(lambda: load_trace(long_path, "bonnmotion", area=AREA, keep=1))
    assert peak < 2 * len(line) + 24 * waypoints * 3 + 2**20, (peak, len(line))


@pytest.mark.parametrize("fmt", FORMATS)
def test_keeping_the_clients_nodes_only_gives_the_same_positions(tmp_path: Path, fmt):
    text = {"sumo_fcd": FCD, "ns2": NS2, "one": ONE, "bonnmotion": BONN}[fmt]
    path = _write(tmp_path, "t.trace", text)
    area = Area.of_size(1000, 1000)
    full = load_trace(path, fmt, area=area)
    for keep in (1, frozenset({full.node_ids[-1]})):
        part = load_trace(path, fmt, area=area, keep=keep)
        assert part.n_nodes == full.n_nodes and part.end_s == full.end_s
        for node in part.nodes:
            same = full.nodes[full.node_ids.index(node.node_id)]
            assert node.first_line == same.first_line
            assert np.array_equal(node.times_s, same.times_s)
            assert np.array_equal(node.xy_m, same.xy_m) and node.xy_m.dtype == np.float64
    one = load_trace(path, fmt, area=area, keep=1)
    with pytest.raises(TraceError, match="names node 'nope', which"):
        one.assign(1, {"nope": 0})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0 1 1 0 10 2 2 0\n", "two places at time 0 s"),
        ("0 1 1 9 10 5 5 0\n", "8 numbers, not a multiple of 3"),
        ("0 1 1 0 10 2 2 0 20 3 3 0\n", "two places at time 0 s"),
        ("0 1 1 5 10 2 2 5 20 3 3 5 30 4 4 5\n", "times must be sorted"),
    ],
)
def test_a_3d_bonnmotion_trace_is_refused_as_3d(tmp_path: Path, text, words):
    path = _write(tmp_path, "3d.movements", text)
    with pytest.raises(TraceError) as info:
        load_trace(path, "bonnmotion", area=AREA)
    message = str(info.value)
    assert message.startswith(f"{path}:1: ") and words in message, message
    assert "reads as 3-D waypoints" in message and "2-D BonnMotion traces only" in message


def test_a_bad_2d_bonnmotion_line_is_not_called_3d(tmp_path: Path):
    path = _write(tmp_path, "b.movements", "0 1 1 5 2 2 3 3 3\n")  # 9 numbers: 2-D only
    with pytest.raises(TraceError) as info:
        load_trace(path, "bonnmotion", area=AREA)
    assert "times must be sorted" in str(info.value) and "3-D" not in str(info.value)
