"""Clients that move and hand over between edge servers at round granularity
(docs/mobility.md, "Handover"): positions at each round's start, the association
re-evaluated with A3 hysteresis and time-to-trigger, the records, replay against run
(hierarchical algorithms: tests/integration/test_handover_hierarchical.py).

The hand-worked case: sites A = (200, 100) m (edge server 0) and B = (800, 100) m (edge
server 1); client 0 walks along y = 130 m from x = 300 m towards +x at 10 m/s (an ns-2
trace: x(t) = 300 + 10 t), client 1 stands at (150, 100). Rule ``nearest``, hysteresis
H = 20 m: B enters when d_A − d_B > 20 m with d_A = √((x − 200)² + 30²),
d_B = √((800 − x)² + 30²). At the evaluation points:

    t (s)   x (m)   d_A (m)    d_B (m)    d_A − d_B
    0       300     104.403    502.892    −398.5
    10      400     202.237    401.123    −198.9
    20      500     301.496    301.496       0      (not > 20)
    25      550     351.283    251.794     99.5   (enters)
    30      600     401.123    202.237    198.9   (enters)
    38      680     480.937    122.474    358.5
    40      700     500.899    102.956    397.9
    41      710     510.882     93.005    417.9
    50      800     600.750     30.000    570.7

Evaluations every 10 s, time-to-trigger T = 15 s: B enters at 30 s (held 0), holds
10 s at 40 s, 20 s ≥ 15 s at 50 s: the client hands over in round 5 (t = 50 s). T = 0:
at 30 s, round 3. Evaluations at 0, 25, 38, 41 s with T = 15 s: held 0, 13, 16 s: the
handover is in round 3 (t = 41 s), not round 2 (13 s < 15 s).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.helpers import interrupted_then_resumed
from support.scenarios import tiny

from mecsim.analysis.replay import geometry_axis_refusal, load_run, replay
from mecsim.analysis.whatif_sweep import sweep
from mecsim.emulation.network import (
    NetworkModel,
    client_record_keys,
    device_profiles,
    round_record_keys,
)
from mecsim.interfaces.metrics import MetricsExporter
from mecsim.run.preflight import find_problems
from mecsim.run.setup import moving_hierarchy
from mecsim.scenario import scenario_from_dict
from mecsim.scenario.overrides import OverrideError, apply_overrides, is_timing_path
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder
from mecsim.testing import assert_same_records, check_scenario_data

NS2 = """\
$node_(0) set X_ 300.0
$node_(0) set Y_ 130.0
$node_(1) set X_ 150.0
$node_(1) set Y_ 100.0
$ns_ at 0.0 "$node_(0) setdest 900.0 130.0 {speed}"
"""


def _geometry(trace_path, ttt_s: float, h_m: float = 20.0) -> dict:
    return {
        "area": {"width_m": 1000, "height_m": 200},
        "sites": {"layout": "explicit", "positions_m": [[200, 100], [800, 100]]},
        "association": {"rule": "nearest", "hysteresis_m": h_m, "time_to_trigger_s": ttt_s},
        "mobility": {"model": "trace", "trace": {"format": "ns2", "path": str(trace_path)}},
    }


def _walk(tmp_path, ttt_s: float, speed: float = 10.0, **extra) -> NetworkModel:
    path = tmp_path / "walk.tcl"
    path.write_text(NS2.format(speed=speed))
    sc = tiny(topology={"clients": 2, "edge_servers": 2}, geometry=_geometry(path, ttt_s), **extra)
    return NetworkModel(sc, device_profiles(sc))


def _at(net: NetworkModel, times_s: list[float]) -> tuple[list[int], list[int], list[float]]:
    """Client 0's serving edge server, handover flag and distance at each round's start."""
    serving, handed, dist = [], [], []
    for rnd, t in enumerate(times_s):
        net.links(rnd, [0, 1], t)
        rc = net.round_cells
        serving.append(int(net.edge_server[0]))
        handed.append(int(rc.handovers[0]))
        dist.append(float(net.radio.distance_m[0]))
        assert rc.positions_m[0].tolist() == [300.0 + 10.0 * min(t, 60.0), 130.0]
        assert int(net.edge_server[1]) == 0 and not rc.handovers[1]  # client 1 stands
    return serving, handed, dist


def test_a_walking_client_hands_over_once_the_condition_held_for_the_time_to_trigger(tmp_path):
    net = _walk(tmp_path, ttt_s=15.0)
    assert net.edge_server.tolist() == [0, 0]  # at the start: x = 300, nearer A
    serving, handed, dist = _at(net, [0, 10, 20, 30, 40, 50, 60])
    assert serving == [0, 0, 0, 0, 0, 1, 1]
    assert handed == [0, 0, 0, 0, 0, 1, 0]
    # the serving link's distance: to A until round 5, then to B (x = 800: 30 m; x = 900
    # at 60 s: √(100² + 30²)); back on B, A never enters (no ping-pong)
    xs = [300, 400, 500, 600, 700]
    assert dist[:5] == pytest.approx([math.hypot(x - 200, 30) for x in xs], rel=1e-12)
    assert dist[5] == pytest.approx(30.0, rel=1e-12)
    assert dist[6] == pytest.approx(math.hypot(100, 30), rel=1e-12)


def test_without_time_to_trigger_the_first_evaluation_past_the_hysteresis_hands_over(tmp_path):
    net = _walk(tmp_path, ttt_s=0.0)
    serving, handed, _ = _at(net, [0, 10, 20, 30, 40])
    assert serving == [0, 0, 0, 1, 1] and handed == [0, 0, 0, 1, 0]


def test_the_time_held_is_emulated_time_between_evaluations(tmp_path):
    net = _walk(tmp_path, ttt_s=15.0)
    serving, handed, _ = _at(net, [0, 25, 38, 41])
    assert serving == [0, 0, 0, 1] and handed == [0, 0, 0, 1]
    held = [rc.held_s[0, 1] for rc in net.moving.history]
    assert np.isnan(held[0]) and held[1:3] == [0.0, 13.0] and np.isnan(held[3])


def test_a_round_asked_again_keeps_the_cells_of_its_start(tmp_path):
    net = _walk(tmp_path, ttt_s=15.0)
    _at(net, [0, 25, 38])
    first = net.moving.history[2]
    net.links(2, [0, 1], 38.0)  # a round re-executed after an actor died
    assert net.moving.history[2] is first
    net.links(2, [0, 1], 41.0)  # a Flower app's follow-up batch after the aggregation
    assert net.round_cells is first and int(net.edge_server[0]) == 0
    assert len(net.moving.history) == 3
    with pytest.raises(ValueError, match="catch_up"):
        _walk(tmp_path, ttt_s=15.0).links(3, [0], 41.0)


def test_3gpp_links_keep_their_draws_and_take_the_path_loss_at_the_new_distance(tmp_path):
    """Under UMi without spatial consistency (``spatial_consistency: false``; with it:
    tests/unit/channel/test_spatial_consistency.py) the serving link's LOS state and shadowing are
    the per-link draws of the start; the path loss is TR 38.901's at the round's
    distance."""
    pl = {"model": "38.901-umi", "carrier_ghz": 3.5, "spatial_consistency": False}
    net = _walk(tmp_path, ttt_s=0.0, channel={"model": "shannon", "path_loss": pl})
    ls = net.cells.large_scale
    for rnd, t in enumerate([0.0, 10.0, 30.0]):
        net.links(rnd, [0, 1], t)
        s = int(net.edge_server[0])
        assert net.radio.los[0] == ls.los[0, s]
        assert net.radio.shadow_fading_db[0] == ls.shadow_fading_db[0, s]
        d = net.radio.distance_m[0]
        expected = net.channel.path_loss.path_loss_db(
            np.array([d]), ls.los[0:1, s], ls.shadow_fading_db[0:1, s]
        )[0]
        assert net.radio.path_loss_db[0] == expected


def test_synthetic_models_are_deterministic_and_moving_clients_change_their_distance():
    geometry = {
        "sites": {"layout": "hex", "rings": 1, "inter_site_distance_m": 200.0},
        "clients": {"placement": "per_cell"},
        "mobility": {"model": "random_waypoint", "speed_mps": [20, 30]},
    }

    def walk() -> tuple[np.ndarray, np.ndarray]:
        sc = tiny(topology={"clients": 14, "edge_servers": 7}, geometry=geometry)
        net = NetworkModel(sc, device_profiles(sc))
        d0 = net.radio.distance_m.copy()
        serving = []
        for rnd, t in enumerate([0.0, 7.3, 15.1, 30.0]):
            net.links(rnd, list(range(14)), t)
            serving.append(net.edge_server.copy())
        assert net.radio.distance_m.tolist() != d0.tolist()
        return np.array(serving), net.round_cells.positions_m

    (s1, p1), (s2, p2) = walk(), walk()
    assert s1.tolist() == s2.tolist() and p1.tolist() == p2.tolist()
    assert (s1[-1] != s1[0]).any()  # 20-30 m/s for 30 s in 200 m cells: someone moved on


def test_records_of_static_geometry_and_of_no_geometry_keep_their_columns():
    static = tiny(geometry={"sites": {"layout": "hex", "rings": 0, "inter_site_distance_m": 200}})
    assert round_record_keys(static) == () and round_record_keys(tiny()) == ()
    assert client_record_keys(static)[-2:] == ("x_m", "y_m")
    moving = tiny(
        geometry={
            "sites": {"layout": "hex", "rings": 0, "inter_site_distance_m": 200},
            "mobility": {"model": "random_walk"},
        }
    )
    assert round_record_keys(moving) == ("handovers",)
    assert client_record_keys(moving)[-3:] == ("x_m", "y_m", "handovers")


def test_hierarchical_algorithms_run_with_clients_that_move(tmp_path):
    """No longer refused (tests/integration/test_handover_hierarchical.py: their edge
    servers regroup each round and the state moves): the pre-flight finds nothing, and only a
    hierarchical algorithm whose clients move regroups."""
    data = check_scenario_data("phsfl")
    data["geometry"] = {
        "sites": {"layout": "explicit", "positions_m": [[100, 100], [300, 100]]},
        "margin_m": 100,
        "mobility": {"model": "random_walk"},
    }
    sc = scenario_from_dict(data, "x")
    assert moving_hierarchy(sc)
    # PHSFL's personalised downloads share the downlink: with rate: step (the default) a
    # moving client's rate there follows it at the grid's times (docs/mobility.md,
    # "Moving clients on a shared medium"), and rate: round freezes it; both run
    assert find_problems(sc).problems == []
    data["geometry"]["mobility"] = {"model": "random_walk", "rate": "round"}
    assert find_problems(scenario_from_dict(data, "x")).problems == []
    data["geometry"]["mobility"] = {"model": "static"}
    assert not moving_hierarchy(scenario_from_dict(data, "x"))
    data["algorithm"] = {"name": "fedavg", "params": {}}
    data["geometry"]["mobility"] = {"model": "random_walk"}
    assert not moving_hierarchy(scenario_from_dict(data, "x"))


def test_a_bad_trace_is_refused_by_the_preflight_with_file_and_line(tmp_path):
    path = tmp_path / "bad.tcl"
    path.write_text(NS2.format(speed=10.0) + "$node_(0) set X_ 1.0 2.0\n")
    sc = tiny(topology={"clients": 2, "edge_servers": 2}, geometry=_geometry(path, 0.0))
    problems = find_problems(sc).problems
    assert [p.field for p in problems] == ["geometry.mobility.trace"], problems
    assert f"{path}:6:" in problems[0].message


def _moving_run(tmp_path, speed: float):
    path = tmp_path / "walk.tcl"
    path.write_text(NS2.format(speed=speed))
    data = check_scenario_data("fedavg")
    data.update(rounds=4, topology={"clients": 2, "edge_servers": 2})
    data["geometry"] = _geometry(path, ttt_s=0.0)
    sc = scenario_from_dict(data, "x")
    run_in_folder(sc, tmp_path / "run")
    return tmp_path / "run"


def test_a_moving_run_records_positions_serving_edge_servers_and_handovers(tmp_path):
    """A FedAvg run of the walk at 300 m/s (the rounds last a fraction of a second):
    each round's start t is the elapsed time of the rounds before; client 0 is at
    x = min(300 + 300 t, 900) (it stops at 2 s, a grid point) and, with T = 0, served by
    B from the first round whose start has d_A − d_B > 20 m (the table above: x > 500 m
    and a little)."""
    folder = _moving_run(tmp_path, speed=300.0)
    rounds = read_csv_exact(folder / "rounds.csv")
    clients = read_csv_exact(folder / "clients.csv")
    assert "handovers" in rounds.columns and "handovers" in clients.columns
    starts = [0.0, *rounds["elapsed_s"].tolist()[:-1]]
    c0 = clients[clients["client_id"] == 0].sort_values("round")
    xs = [min(300.0 + 300.0 * t, 900.0) for t in starts]
    assert c0["x_m"].tolist() == pytest.approx(xs, abs=1e-3)  # float32 grid, 1 ms steps
    assert (c0["y_m"] == 130.0).all()

    def better_b(x: float) -> bool:
        return math.hypot(x - 200, 30) - math.hypot(800 - x, 30) > 20.0

    expected, serving = [], 0
    for x in xs:
        moved = serving == 0 and better_b(x)
        serving = 1 if moved else serving
        expected.append((serving, int(moved)))
    assert list(zip(c0["edge_server"], c0["handovers"], strict=True)) == expected
    assert sum(h for _, h in expected) == 1, (starts, xs)  # the case does hand over
    assert rounds["handovers"].tolist() == [h for _, h in expected]


def test_a_replay_of_a_moving_run_agrees_with_the_run_and_follows_its_own_times(tmp_path):
    folder = _moving_run(tmp_path, speed=300.0)
    run = load_run(folder)
    same = replay(run)
    recorded = read_csv_exact(folder / "rounds.csv")
    assert same.exact
    for col in ("round_time_s", "elapsed_s", "energy_j"):
        assert same.rounds[col].tolist() == recorded[col].tolist(), col
    # a slower uplink: the rounds last longer, the client is farther at each start (the
    # replay recomputes positions and the association from its own elapsed times)
    slower = replay(run, {"channel.uplink.bandwidth_hz": 1e5})
    assert slower.exact  # FedAvg's training does not depend on who serves whom
    assert (slower.rounds["elapsed_s"] > recorded["elapsed_s"]).all()
    # mecsim sweep: the recorded band is the run, to the bit; another band is exact too
    band = run.scenario.channel.uplink.bandwidth_hz
    frame = sweep(run, {"channel.uplink.bandwidth_hz": [band, 1e5]})
    assert frame["exact"].tolist() == [True, True]
    assert frame["total_time_s"].tolist() == [
        recorded["elapsed_s"].iloc[-1],
        slower.rounds["elapsed_s"].iloc[-1],
    ]


BONNMOTION = "0.0 300.0 130.0 10.0 400.0 130.0\n0.0 150.0 100.0 10.0 150.0 100.0\n"


@pytest.mark.parametrize("after_end", ["hold", "refuse"])
def test_a_run_past_its_traces_end_holds_the_last_positions_or_is_refused(tmp_path, after_end):
    """A BonnMotion trace of 10 s: client 0 from (300, 130) to (400, 130). Asked at 20 s,
    it stays at (400, 130) with a warning, or the round is refused."""
    from mecsim.emulation.mobility import TraceError, TraceWarning

    path = tmp_path / "walk.movements"
    path.write_text(BONNMOTION)
    geometry = _geometry(path, 0.0)
    geometry["mobility"]["trace"].update(format="bonnmotion", after_end=after_end)
    sc = tiny(topology={"clients": 2, "edge_servers": 2}, geometry=geometry)
    net = NetworkModel(sc, device_profiles(sc))
    net.links(0, [0, 1], 0.0)
    net.links(1, [0, 1], 5.0)
    assert net.round_cells.positions_m[0].tolist() == [350.0, 130.0]
    if after_end == "refuse":
        with pytest.raises(TraceError, match="ends at 10 s but the run needs positions at 20 s"):
            net.links(2, [0, 1], 20.0)
    else:
        with pytest.warns(TraceWarning, match="stays at its last position"):
            net.links(2, [0, 1], 20.0)
        assert net.round_cells.positions_m[0].tolist() == [400.0, 130.0]


def test_the_handovers_counter_is_served_for_geometry_runs_only():
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    moving = tiny(
        geometry={
            "sites": {"layout": "hex", "rings": 0, "inter_site_distance_m": 200},
            "mobility": {"model": "random_walk"},
        }
    )
    for sc, rows, expected in ((moving, [3, 0, 2], 5.0), (tiny(), [None], None)):
        registry = CollectorRegistry()
        exporter = MetricsExporter(registry=registry)
        info = SimpleNamespace(run_id="r", scenario=sc, extra={})
        exporter.on_run_start(info)
        for h in rows:
            row = {"algorithm": sc.algorithm.name, "round_time_s": 1.0, "bytes_up": 0}
            row.update(bytes_down=0, client_gflops=0.0, server_gflops=0.0, host_wall_s=0.0)
            if h is not None:
                row["handovers"] = h
            exporter._count(info, row)
        page = generate_latest(registry).decode()
        value = registry.get_sample_value(
            "mecsim_handovers_total", {"run": "r", "algorithm": sc.algorithm.name}
        )
        assert value == expected, page


def test_the_cells_gauges_count_the_selected_clients_per_serving_cell():
    """Round 0: clients 0, 1 in cell 0 and client 2 in cell 1 (client 3 not selected);
    round 1: client 0 handed over to cell 1 and only clients 0 and 3 are selected. The
    counts are the last round's (cell 0: 1 (client 3), cell 1: 1 (client 0)); each client
    keeps the cell of the last round it was selected in (client 1: cell 0 of round 0,
    client 2: cell 1). Over 100 clients there is no per-client series; without a
    geometry there is neither family."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from mecsim.interfaces.metrics import MAX_CLIENT_SERIES

    geometry = {
        "area": {"width_m": 1000, "height_m": 200},
        "sites": {"layout": "explicit", "positions_m": [[200, 100], [800, 100]]},
        "mobility": {"model": "random_walk"},
    }
    rounds = [
        [(0, 0, True), (1, 0, True), (2, 1, True), (3, 0, False)],
        [(0, 1, True), (3, 0, True), (1, 0, False)],
    ]
    cases = (
        (4, geometry, {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0}),
        (MAX_CLIENT_SERIES + 1, geometry, {}),
        (4, None, {}),
    )
    for clients, geo, per_client in cases:
        sc = tiny(topology={"clients": clients, "edge_servers": 2}, geometry=geo)
        registry = CollectorRegistry()
        exporter = MetricsExporter(registry=registry)
        info = SimpleNamespace(run_id="r", scenario=sc, extra={})
        exporter.on_run_start(info)
        lab = {"run": "r", "algorithm": sc.algorithm.name}
        for rnd, members in enumerate(rounds):
            client_rows = [
                {"client_id": c, "edge_server": e, "selected": sel} for c, e, sel in members
            ]
            if geo is not None:
                exporter._cells(info, lab, client_rows)
            counts = {
                e: registry.get_sample_value("mecsim_cell_clients", {**lab, "edge_server": str(e)})
                for e in (0, 1)
            }
            want = {0: 2.0, 1: 1.0} if rnd == 0 else {0: 1.0, 1: 1.0}
            assert counts == (want if geo is not None else {0: None, 1: None})
        served = {
            c: registry.get_sample_value(
                "mecsim_client_edge_server_index", {**lab, "client": str(c)}
            )
            for c in range(4)
        }
        assert {c: v for c, v in served.items() if v is not None} == per_client


@pytest.mark.slow
def test_a_resumed_moving_run_continues_the_a3_timers(tmp_path):
    """The walk at 400 m/s with T = 1 s: B enters at round 1's start (x = 300 + 400 t
    passes 510 m at 0.53 s; round 1 starts later) and the handover comes at a later
    round's start, once 1 s has been held. A run stopped after round 1 and resumed from
    its checkpoint re-evaluates rounds 0 and 1 at their recorded starts first: its
    records are the uninterrupted run's (without that, round 2 would see the condition
    for the first time and not hand over)."""

    path = tmp_path / "walk.tcl"
    path.write_text(NS2.format(speed=400.0))
    data = check_scenario_data("fedavg")
    data.update(rounds=4, topology={"clients": 2, "edge_servers": 2})
    data["geometry"] = _geometry(path, ttt_s=1.0)
    # rates frozen at each round's start: under rate: step the client, 600 m from its
    # serving site within 1.5 s, would make round 0 last minutes (the timers are the point)
    data["geometry"]["mobility"]["rate"] = "round"
    sc = scenario_from_dict(data, "x")
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full)
    rounds = read_csv_exact(full / "rounds.csv")
    starts = [0.0, *rounds["elapsed_s"].tolist()[:-1]]
    assert 0.53 < starts[1] < 1.0 and starts[2] - starts[1] >= 1.0, starts
    assert rounds["handovers"].tolist() == [0, 0, 1, 0]
    out = interrupted_then_resumed(sc, tmp_path, stop_at=2)
    assert_same_records(full, out)


@pytest.mark.ray
@pytest.mark.slow
def test_a_moving_run_gives_the_same_records_in_process_and_on_ray(tmp_path):
    """Same seed, every backend: clients that walk fast between two cells (random
    waypoint at 50-80 m/s over 1 km, so that some hand over within 4 rounds) give the
    same positions, associations, handovers and records in-process and under Ray."""

    sc = tiny(
        rounds=4,
        topology={"clients": 6, "edge_servers": 2},
        geometry={
            "area": {"width_m": 1000, "height_m": 200},
            "sites": {"layout": "explicit", "positions_m": [[200, 100], [800, 100]]},
            "association": {"rule": "nearest", "hysteresis_m": 0, "time_to_trigger_s": 0},
            "mobility": {"model": "random_waypoint", "speed_mps": [50, 80], "step_s": 0.1},
        },
    )
    run_in_folder(sc, tmp_path / "local", backend="local", hosts=2)
    run_in_folder(sc, tmp_path / "ray", backend="ray", hosts=2)
    assert_same_records(tmp_path / "local", tmp_path / "ray")
    clients = read_csv_exact(tmp_path / "local" / "clients.csv")
    rounds = read_csv_exact(tmp_path / "local" / "rounds.csv")
    # the case is not trivial: the clients moved, and some changed cell
    assert clients.groupby("client_id")["x_m"].nunique().min() > 1
    assert rounds["handovers"].sum() > 0 and clients["edge_server"].nunique() == 2


# --- what-if axes of the geometry (docs/mobility.md, "Replays") ------------------------
def _waypoint_run(tmp_path, algorithm="fedavg", speed=1.0, rounds=4):
    """14 clients walking by random waypoint over 7 hexagonal cells 60 m apart, nearest
    site without hysteresis: a handover whenever a client crosses a cell border."""
    data = check_scenario_data(algorithm)
    data.update(rounds=rounds, topology={"clients": 14, "edge_servers": 7})
    data["geometry"] = {
        "sites": {"layout": "hex", "rings": 1, "inter_site_distance_m": 60.0},
        "association": {"rule": "nearest", "hysteresis_m": 0.0, "time_to_trigger_s": 0.0},
        "mobility": {"model": "random_waypoint", "speed_mps": speed}
        if speed is not None
        else {"model": "static"},
    }
    sc = scenario_from_dict(data, "x")
    run_in_folder(sc, tmp_path / algorithm)
    return tmp_path / algorithm


def _handovers_at(scenario, elapsed_s):
    """The handovers of each round when its rounds end at ``elapsed_s`` (a network model
    moved round by round to those starts, as a run or a replay does)."""
    net = NetworkModel(scenario, device_profiles(scenario))
    starts = [0.0, *elapsed_s[:-1]]
    return [int(net.move_to(r, t).handovers.sum()) for r, t in enumerate(starts)]


def test_mobility_speed_is_a_sweep_axis_without_retraining_for_a_flat_algorithm(tmp_path):
    """FedAvg, walking at 1 m/s: a sweep over speed replays the run. At the recorded
    speed it gives the recorded times bit for bit; at 100 m/s the clients cross cell
    borders between rounds (cells 60 m apart, rounds of tenths of a second: 1 m/s moves a
    client centimetres, 100 m/s tens of metres), so there are more handovers and the
    links (distances, media) differ, while training is what was recorded (exact)."""
    folder = _waypoint_run(tmp_path)
    run = load_run(folder)
    recorded = read_csv_exact(folder / "rounds.csv")
    frame = sweep(run, {"geometry.mobility.speed_mps": [1.0, 100.0]})
    assert frame["exact"].tolist() == [True, True]
    assert frame["total_time_s"].iloc[0] == recorded["elapsed_s"].iloc[-1]
    same = replay(run, {"geometry.mobility.speed_mps": 1.0})
    for col in ("round_time_s", "elapsed_s", "energy_j"):
        assert same.rounds[col].tolist() == recorded[col].tolist(), col
    fast = replay(run, {"geometry.mobility.speed_mps": 100.0})
    assert fast.exact
    assert fast.rounds["round_time_s"].tolist() != recorded["round_time_s"].tolist()
    assert frame["total_time_s"].iloc[1] == fast.rounds["elapsed_s"].iloc[-1]
    # the handovers: the recorded ones are the network model's at the recorded times
    # (a check of the counting), and 100 m/s hands over more
    slow = _handovers_at(run.scenario, recorded["elapsed_s"].tolist())
    assert slow == recorded["handovers"].tolist()
    quick = _handovers_at(
        apply_overrides(run.scenario, {"geometry.mobility.speed_mps": 100.0}),
        fast.rounds["elapsed_s"].tolist(),
    )
    assert sum(quick) > sum(slow), (quick, slow)
    # the inter-site distance is an axis too (the positions are drawn in the new cells)
    wide = sweep(run, {"geometry.sites.inter_site_distance_m": [60.0, 120.0]})
    assert wide["exact"].tolist() == [True, True]
    assert wide["total_time_s"].iloc[0] == recorded["elapsed_s"].iloc[-1]
    assert wide["total_time_s"].iloc[1] != recorded["elapsed_s"].iloc[-1]


@pytest.mark.slow
def test_geometry_axes_are_refused_for_a_hierarchical_algorithm_with_the_reason(tmp_path):
    """PHSFL (static clients: hierarchical algorithms refuse clients that move): the
    inter-site distance can move clients between edge servers, whose models PHSFL
    aggregates per edge server, so replaying is refused; a channel axis is not."""
    folder = _waypoint_run(tmp_path, algorithm="phsfl", speed=None, rounds=1)
    run = load_run(folder)
    why = (
        r"'geometry.sites.inter_site_distance_m': algorithm 'phsfl' is hierarchical \(each "
        r"edge server aggregates the models of the clients it serves\)"
    )
    with pytest.raises(OverrideError, match="grid path " + why):
        sweep(run, {"geometry.sites.inter_site_distance_m": [60.0, 90.0]})
    with pytest.raises(OverrideError, match="override " + why):
        replay(run, {"geometry.sites.inter_site_distance_m": 90.0})
    # (a static run has no speed to override: the scenario's validation says so; the
    # reason is the same for a speed axis)
    assert "'phsfl' is hierarchical" in geometry_axis_refusal(
        run.scenario, ["geometry.mobility.speed_mps"]
    )
    assert geometry_axis_refusal(run.scenario, ["channel.interference.reuse"]) is None
    assert replay(run, {"channel.interference": None}).exact
    # other geometry fields stay untimed paths for every algorithm
    assert is_timing_path("geometry.mobility.speed_mps.1")
    assert not is_timing_path("geometry.mobility.pause_s")
    assert not is_timing_path("geometry.association.rule")


def test_a_trace_next_to_the_scenario_file_is_found_from_any_directory(tmp_path, monkeypatch):
    """A relative trace path not found from the working directory is looked for next to
    the scenario file, and the scenario then names it by its absolute path (the run's
    scenario.yaml too); one found from the working directory is kept as written; the
    service's loader (beside_file=False) does not look."""
    import yaml

    from mecsim.scenario.loader import load_scenario

    folder = tmp_path / "study"
    (folder / "traces").mkdir(parents=True)
    (folder / "traces" / "walk.tcl").write_text(NS2.format(speed=10.0))
    data = check_scenario_data("fedavg")
    data.update(topology={"clients": 2, "edge_servers": 2})
    data["geometry"] = _geometry("traces/walk.tcl", ttt_s=0.0)
    (folder / "walk.yaml").write_text(yaml.safe_dump(data))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sc = load_scenario(folder / "walk.yaml")
    assert sc.geometry.mobility.trace.path == str(folder / "traces" / "walk.tcl")
    assert find_problems(sc).problems == []
    problems = find_problems(load_scenario(folder / "walk.yaml", beside_file=False)).problems
    assert [p.field for p in problems] == ["geometry.mobility.trace"], problems
    assert "cannot read the trace" in str(problems[0])
    monkeypatch.chdir(folder)  # found from the working directory: kept as written
    assert load_scenario(folder / "walk.yaml").geometry.mobility.trace.path == "traces/walk.tcl"
