"""Handover for hierarchical algorithms (docs/mobility.md, "Handover"): each round's edge
servers group the clients served at its start, and a client that changed edge server
has what its old edge server kept for it moved to the new one over the backhaul.

The hand-worked walk (as tests/integration/test_handover.py's): sites A = (200, 100) m (edge server
0) and B = (800, 100) m (edge server 1); client 0 walks along y = 130 m from x = 300 m
towards +x at 300 m/s (an ns-2 trace; it stops at x = 900 m, 2 s), client 1 stands at
(150, 100) (A), client 2 at (850, 100) (B). Rule ``nearest``, hysteresis H = 20 m, no
time to trigger: B takes client 0 at the first round start t with d_A − d_B > 20 m,
d_A = √((x − 200)² + 30²), d_B = √((800 − x)² + 30²), x = 300 + 300 t. That is x > 510.7 m
(at x = 510: d_A = 311.45, d_B = 291.55, difference 19.9 m), t > 0.702 s. PHSFL with
kappa_1 = 2 (the tests' check scenario): round 0 lasts 0.7519 s (recorded), so client 0
is at x = 525.58 m at round 1's start (d_A = 326.96 m, d_B = 276.06 m: 50.9 m) and
hands over there, in the last edge round of global round 0.

What moves (PHSFLEdge.handover_state_nbytes): the client's label set, which belongs to
the ES (the paper's Section II-A): D_u labels of 8 bytes (int64). Client 0 has 70
training samples: 560 bytes. Its time on the backhaul (the scenario's default backhaul:
1 Gb/s, 5 ms, no jitter or loss), old ES up to the central server then down to the new
ES: 2 × (0.005 + 8 · 560 / 10⁹) = 2 × 0.00500448 = 0.01000896 s, before its download.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.helpers import interrupted_then_resumed

from mecsim.analysis.replay import load_run, replay
from mecsim.analysis.whatif_sweep import sweep
from mecsim.emulation.engine import time_round
from mecsim.emulation.engine.specs import ClientSpec, NetworkSpec, ServerSpec
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Download, Handoff, op_from_dict, op_to_dict
from mecsim.run.round import run_round
from mecsim.run.setup import prepare
from mecsim.scenario import scenario_from_dict
from mecsim.scenario.overrides import OverrideError
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder
from mecsim.testing import assert_same_records, check_scenario_data

NS2 = """\
$node_(0) set X_ 300.0
$node_(0) set Y_ 130.0
$node_(1) set X_ 150.0
$node_(1) set Y_ 100.0
$node_(2) set X_ 850.0
$node_(2) set Y_ 100.0
$ns_ at 0.0 "$node_(0) setdest 900.0 130.0 300.0"
"""

HOP_S = 0.005 + 8 * 560 / 1e9  # one backhaul hop of client 0's 560 bytes
EDGE_MODEL_UP_S = 0.005 + 8 * 2934824 / 1e9  # round 1's Backhaul(edge_model, up)


def _scenario(tmp_path, rounds: int = 4, backend: str = "local", algorithm: str = "phsfl"):
    trace = tmp_path / "walk.tcl"
    trace.write_text(NS2)
    data = check_scenario_data("phsfl")
    data.update(rounds=rounds, topology={"clients": 3, "edge_servers": 2})
    data["algorithm"]["name"] = algorithm
    data["execution"]["backend"] = backend
    # links and backhaul timed as bits / rate: the recorded round time and the hops above
    for link in (
        data["channel"].setdefault("uplink", {}),
        data["channel"].setdefault("downlink", {}),
    ):
        link["transport"] = "ideal"
    data.setdefault("backhaul", {})["transport"] = "ideal"
    data["geometry"] = {
        "area": {"width_m": 1000, "height_m": 200},
        "sites": {"layout": "explicit", "positions_m": [[200, 100], [800, 100]]},
        "association": {"rule": "nearest", "hysteresis_m": 20, "time_to_trigger_s": 0},
        # rate: round: each client's rate frozen at the round's start, so that the
        # round times are the hand calculations below (step re-rates the shared downlink
        # as the client walks: docs/mobility.md, "Moving clients on a shared medium")
        "mobility": {
            "model": "trace",
            "trace": {"format": "ns2", "path": str(trace)},
            "rate": "round",
        },
    }
    return scenario_from_dict(data, "walk")


def _traces(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "optraces.jsonl").read_text().splitlines()]


def test_the_handoff_op_takes_both_backhaul_hops_one_after_the_other():
    """Edge server 0: 1 Mb/s, 10 ms; edge server 1: 2 Mb/s, 20 ms. 1,000 bytes from 0 to
    1: (0.01 + 0.008) + (0.02 + 0.004) = 0.042 s, then the 1,000-byte download at 1 Mb/s
    (0.008 s): 0.05 s. The client without the op finishes at 0.008 s."""
    servers = [ServerSpec(1e9, 0.0, 1e6, 0.01), ServerSpec(1e9, 0.0, 2e6, 0.02)]
    clients = {c: ClientSpec(c, 1e6, 1e6, 0.0, 1e9, 1) for c in (0, 1)}
    traces = {0: (Handoff(1000, 0), Download(1000)), 1: (Download(1000),)}
    for method in ("auto", "simpy"):
        t = time_round(traces, clients, servers, NetworkSpec(), method=method)
        c0, c1 = t.clients
        assert c0.backhaul_s == pytest.approx(0.042, rel=1e-12)
        assert c0.finish_s == pytest.approx(0.05, rel=1e-12)
        assert c1.finish_s == pytest.approx(0.008, rel=1e-12)
    assert op_from_dict(op_to_dict(Handoff(5, 1))) == Handoff(5, 1)
    with pytest.raises(ValueError, match="no edge server 2"):
        time_round({0: (Handoff(1, 2),)}, {0: clients[0]}, servers, NetworkSpec())


@pytest.mark.slow
def test_a_phsfl_client_that_walks_across_the_border_takes_its_labels_along(tmp_path):
    sc = _scenario(tmp_path)
    folder = tmp_path / "run"
    run_in_folder(sc, folder)
    rounds = read_csv_exact(folder / "rounds.csv")
    clients = read_csv_exact(folder / "clients.csv")
    assert rounds["round_time_s"].iloc[0] == pytest.approx(0.7519, abs=1e-4)
    assert rounds["handovers"].tolist() == [0, 1, 0, 0]
    assert rounds["handover_bytes"].tolist() == [0, 560, 0, 0]
    c0 = clients[clients["client_id"] == 0]
    assert c0["edge_server"].tolist() == [0, 1, 1, 1]
    assert c0["handover_bytes"].tolist() == [0, 560, 0, 0]
    assert c0["num_samples"].iloc[1] == 70  # 70 labels of 8 bytes
    assert clients[clients["client_id"] != 0]["handover_bytes"].eq(0).all()
    # the op-trace: round 1's client 0 starts with the move from edge server 0; nobody
    # else carries one
    records = _traces(folder)
    ops = {
        (rec["round"], int(c)): [op for op in t if op["op"] == "handoff"]
        for rec in records
        for c, t in rec["clients"].items()
    }
    assert ops.pop((1, 0)) == [
        {"op": "handoff", "nbytes": 560, "from_edge_server": 0, "what": "client_state"}
    ]
    assert records[1]["clients"]["0"][0]["op"] == "handoff"
    assert not any(ops.values())
    # the engine's time for it: round 1's network, the recorded traces, SimPy: client 0's
    # backhaul time is the two hops plus the round's edge-model upload to the CS
    net = NetworkModel(sc, device_profiles(sc))
    net.round(0, [0, 1, 2], 0.0)
    specs, servers, network, _ = net.round(1, [0, 1, 2], float(rounds["elapsed_s"].iloc[0]))
    assert [specs[c].edge_server for c in (0, 1, 2)] == [1, 0, 1]
    traces = {int(c): tuple(map(op_from_dict, t)) for c, t in records[1]["clients"].items()}
    timing = time_round(traces, specs, servers, network, method="simpy")
    assert timing.clients[0].backhaul_s == pytest.approx(2 * HOP_S + EDGE_MODEL_UP_S, rel=1e-12)
    assert 2 * HOP_S == pytest.approx(0.01000896, rel=1e-12)
    assert timing.round_time_s <= rounds["round_time_s"].iloc[1]  # + the aggregation


def test_each_round_s_edge_servers_group_the_clients_served_at_its_start(tmp_path):
    """The executor and the central server are told round 1's association before its
    plan: client 0 is planned, trained and aggregated at edge server 1 from round 1 on;
    every edge server of the topology has a process (a client may come to any)."""
    rs = prepare(_scenario(tmp_path, rounds=2), "r", tmp_path / "out")
    try:
        assert rs.hierarchy_moves and sorted(rs.executor.edges) == [0, 1]
        row, _, _ = run_round(rs, 0, 0.0)
        assert rs.executor.clients.edge_of == {0: 0, 1: 0, 2: 1}
        _, tasks = rs.executor.plan(1)  # not yet told: round 0's groups
        assert {t.client_id: t.config["edge_server"] for t in tasks} == {0: 0, 1: 0, 2: 1}
    finally:
        rs.executor.close()
    rs = prepare(_scenario(tmp_path, rounds=2), "r2", tmp_path / "out2")
    try:
        row, _, _ = run_round(rs, 0, 0.0)
        _, client_rows, _ = run_round(rs, 1, row["elapsed_s"])
        assert rs.executor.clients.edge_of == {0: 1, 1: 0, 2: 1}
        assert rs.executor.server.algorithm.edge_server_of == {0: 1, 1: 0, 2: 1}
        assert [r["edge_server"] for r in client_rows] == [1, 0, 1]
        # the edge model of ES 1 after round 1 is the sample-weighted mean of clients 0
        # and 2 (Eq. 15), that of ES 0 client 1's: ES 1 aggregated the newcomer
        w1 = rs.executor.edges[1].algorithm.model
        w0 = rs.executor.edges[0].algorithm.model
        assert not np.array_equal(w0, w1)
    finally:
        rs.executor.close()


@pytest.mark.slow
def test_a_resumed_phsfl_walk_keeps_its_groups(tmp_path):

    sc = _scenario(tmp_path)
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full)
    out = interrupted_then_resumed(sc, tmp_path, stop_at=2)
    assert_same_records(full, out)


@pytest.mark.slow
def test_a_replay_that_keeps_the_groups_is_exact_one_that_regroups_is_refused(tmp_path):
    """A narrower uplink band makes round 0 longer: client 0 is still past the border at round
    1's start (same groups every round): exact. A wider one ends round 0 before
    t = 0.702 s: client 0 would still be at A in round 1, so the replay, and a sweep
    point, are refused without --retrain."""
    folder = tmp_path / "run"
    run_in_folder(_scenario(tmp_path), folder)
    run = load_run(folder)
    recorded = read_csv_exact(folder / "rounds.csv")
    same = replay(run)
    assert same.exact
    assert same.rounds["round_time_s"].tolist() == recorded["round_time_s"].tolist()
    slower = replay(run, {"channel.uplink.bandwidth_hz": 5e6})  # 10-30 MHz recorded
    assert slower.rounds["round_time_s"].iloc[0] > recorded["round_time_s"].iloc[0]
    assert slower.exact  # client 0 hands over in round 1 all the same
    with pytest.raises(OverrideError, match="round 2: client 0 is served by edge server 0"):
        replay(run, {"channel.uplink.bandwidth_hz": 1e9})
    with pytest.raises(OverrideError, match="round 2: client 0"):
        sweep(run, {"channel.uplink.bandwidth_hz": [5e6, 1e9]})


@pytest.mark.slow
@pytest.mark.ray
def test_a_moving_phsfl_run_gives_the_same_records_in_process_and_on_ray(tmp_path):

    local, ray = tmp_path / "local", tmp_path / "ray"
    run_in_folder(_scenario(tmp_path, rounds=2), local)
    run_in_folder(_scenario(tmp_path, rounds=2, backend="ray"), ray)
    assert read_csv_exact(ray / "rounds.csv")["handover_bytes"].tolist() == [0, 560]
    assert_same_records(local, ray)


@pytest.mark.slow
def test_hsfl_moves_the_same_labels(tmp_path):
    """HSFL keeps the labels at the ES as PHSFL does (it trains the head too): round 0
    lasts 0.75193 s there as well, and client 0's 70 labels move in round 1."""
    run_in_folder(_scenario(tmp_path, rounds=2, algorithm="hsfl"), tmp_path / "run")
    rounds = read_csv_exact(tmp_path / "run" / "rounds.csv")
    assert rounds["round_time_s"].iloc[0] > 0.702
    assert rounds["handover_bytes"].tolist() == [0, 560]
