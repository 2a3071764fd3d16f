"""Faults: emulated ones against hand-computed times, the NaN/inf guard, replay and
resume of faulted runs, and real Ray actors killed with SIGKILL mid-run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.helpers import run_killing_actors
from support.scenarios import tiny

from mecsim.agents.algorithms import ClientResult
from mecsim.agents.models import build_model, get_flat, model_layout
from mecsim.agents.server import CentralServer
from mecsim.analysis import replay
from mecsim.emulation import faults
from mecsim.emulation.engine import RateSchedule
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder
from mecsim.testing import SimulatedKill, StopAfter, assert_same_records, resume_run

UNIT = {
    "flops_per_s": 1e9,
    "step_overhead_s": 0.0,
    "ram_bytes": 2**32,
    "flops_source": "test",
    "step_overhead_source": "test",
}
# the ideal transport (bits / rate) the hand numbers below are worked for
FIXED = {
    "model": "fixed_rate",
    "uplink": {"rate_bps": 1e6, "transport": "ideal"},
    "downlink": {"rate_bps": 2e6, "transport": "ideal"},
}


def _faulted(tmp_path: Path, faults_cfg: dict, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    kw.setdefault("channel", FIXED)
    kw.setdefault("devices", {"clients": [{"profile": "unit"}], "profiles": {"unit": UNIT}})
    sc = tiny(faults=faults_cfg, **kw)
    out = tmp_path / "run"
    run_in_folder(sc, out)
    return read_csv_exact(out / "rounds.csv"), read_csv_exact(out / "clients.csv")


def approx(x: float):
    return pytest.approx(x, rel=1e-12, abs=1e-12)


# --------------------------------------------------------------------------- pure parts


def test_outage_intervals_cut_a_rate_to_zero() -> None:
    # 2 Mb/s with the link down in [1, 3) s: 8e6 bits take 1 s + 2 s down + 3 s = 6 s
    sched = faults.with_outages(2e6, [(1.0, 3.0)])
    assert sched == RateSchedule((0.0, 1.0, 3.0), (2e6, 0.0, 2e6))
    assert sched.transfer_time_s(8e6, 0.0) == approx(6.0)
    # an interval that started before the round and one after it; a trace's own steps
    trace = RateSchedule((0.0, 2.0), (1e6, 4e6))
    cut = faults.with_outages(trace, [(-5.0, 0.5), (3.0, 4.0)])
    assert cut == RateSchedule((0.0, 0.5, 2.0, 3.0, 4.0), (0.0, 1e6, 4e6, 0.0, 4e6))
    assert faults.with_outages(5e6, [(-3.0, -1.0)]) == 5e6  # over before the round


def test_crash_and_dropout_traces() -> None:
    trace = (Download(100), Compute(1e9, 10), Compute(3e9, 30), Upload(50))
    # 60 % of 4 GFLOPs = 2.4 GFLOPs: the first Compute whole, 1.4 of the second's 3
    assert faults.crash_trace(trace, 0.6) == (Download(100), Compute(1e9, 10), Compute(1.4e9, 14))
    assert faults.dropout_trace(trace) == trace[:3]
    assert faults.outage_trace(0) == (Download(1),)


def test_fault_draws_are_seeded_and_kinds_independent() -> None:
    sc = tiny(faults={"crash_prob": 0.5, "dropout_prob": 0.5, "outage_prob": 0.3})
    a = faults.draw_round(sc.faults, 3, 7, list(range(50)))
    b = faults.draw_round(sc.faults, 3, 7, list(range(50)))
    assert a == b and a.outage and a.crash_at and a.dropout
    assert not (a.outage & set(a.crash_at)) and not (set(a.crash_at) & a.dropout)
    # switching drop-outs off leaves the outages and crashes where they were
    sc2 = tiny(faults={"crash_prob": 0.5, "dropout_prob": 0.0, "outage_prob": 0.3})
    c = faults.draw_round(sc2.faults, 3, 7, list(range(50)))
    assert c.outage == a.outage and c.crash_at == a.crash_at and not c.dropout
    f = faults.slowdown_factors(
        tiny(faults={"straggler": {"fraction": 0.25, "slowdown": [2, 3]}}).faults, 0, 40
    )
    assert (f > 1).sum() == 10 and ((f == 1) | ((f >= 2) & (f <= 3))).all()


# --------------------------------------------------------------------------- runs


def test_stragglers_and_a_link_outage_by_hand(tmp_path: Path) -> None:
    rounds, clients = _faulted(
        tmp_path,
        {
            "straggler": {"fraction": 1.0, "slowdown": 3.0},
            "link_outages": [
                {"start_s": 1.0, "duration_s": 2.0, "clients": [0], "direction": "downlink"}
            ],
        },
        rounds=1,
    )
    for c in clients.itertuples():
        # bits / rate; client 0's download pauses 2 s in [1, 3)
        down_s = 8 * c.bytes_down / 2e6 + (2.0 if c.client_id == 0 else 0.0)
        assert c.download_s == approx(down_s)
        assert c.compute_s == approx(3 * c.gflops)  # 1e9 FLOP/s slowed down 3x
        assert c.upload_s == approx(8 * c.bytes_up / 1e6)
        assert c.status == "completed"
    assert rounds["completed"].iloc[0] == 4


def test_crashes_lose_the_work_and_change_nothing(tmp_path: Path) -> None:
    clean_rounds, clean = _faulted(tmp_path / "clean", {}, rounds=1)
    rounds, clients = _faulted(tmp_path / "crash", {"crash_prob": 1.0}, rounds=2)
    assert set(clients["status"]) == {"crashed"}
    assert (clients["bytes_up"] == 0).all() and (clients["upload_s"] == 0).all()
    r0 = clients[clients["round"] == 0].set_index("client_id")
    full = clean.set_index("client_id")
    assert (r0["compute_s"] <= full["compute_s"]).all()
    assert (r0["gflops"] <= full["gflops"]).all()
    assert r0["compute_s"].to_numpy() == approx(r0["gflops"].to_numpy())  # 1e9 FLOP/s
    # nothing aggregated: the global model, and so every client's accuracy, stays put
    assert rounds["completed"].tolist() == [0, 0] and rounds["crashed"].tolist() == [4, 4]
    assert rounds["mean_accuracy"].iloc[0] == rounds["mean_accuracy"].iloc[1]
    assert rounds["server_gflops"].tolist() == [0.0, 0.0]


def test_a_crashed_clients_private_state_is_put_back(tmp_path: Path) -> None:
    # local training keeps each client's model in its private state: after crashed rounds
    # it is the initial model, so accuracy is the same in every round
    rounds, clients = _faulted(tmp_path, {"crash_prob": 1.0}, rounds=2, algorithm={"name": "local"})
    acc = clients.pivot(index="client_id", columns="round", values="accuracy")
    assert (acc[0] == acc[1]).all()
    _, kept = _faulted(
        tmp_path / "dropout", {"dropout_prob": 1.0}, rounds=2, algorithm={"name": "local"}
    )
    acc = kept.pivot(index="client_id", columns="round", values="accuracy")
    assert (acc[0] != acc[1]).any()  # a drop-out trained: its model moved on


def test_dropouts_train_but_do_not_upload(tmp_path: Path) -> None:
    _, clean = _faulted(tmp_path / "clean", {}, rounds=1)
    rounds, clients = _faulted(tmp_path / "drop", {"dropout_prob": 1.0}, rounds=1)
    assert set(clients["status"]) == {"dropped_out"}
    assert (clients["bytes_up"] == 0).all() and (clients["upload_s"] == 0).all()
    assert clients["compute_s"].tolist() == clean["compute_s"].tolist()
    assert clients["finish_s"].tolist() == pytest.approx(
        (clean["download_s"] + clean["compute_s"]).tolist(), rel=1e-12
    )
    assert rounds["dropped_out"].iloc[0] == 4 and rounds["completed"].iloc[0] == 0


def test_outages_never_complete_and_round_times_stay_finite(tmp_path: Path) -> None:
    rounds, clients = _faulted(tmp_path, {"outage_prob": 1.0}, rounds=1)
    assert set(clients["status"]) == {"outage"} and rounds["outage"].iloc[0] == 4
    assert clients["gflops"].isna().all()  # a client cut off all round does not train
    assert math.isfinite(rounds["round_time_s"].iloc[0])
    # a trace that holds client 1's link at 0 b/s for ever, no deadline
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,client_id,uplink_mbps,downlink_mbps\n0,*,1,2\n0,1,0,0\n")
    rounds, clients = _faulted(
        tmp_path / "t", {}, rounds=1, channel={"model": "trace", "path": str(trace)}
    )
    status = clients.set_index("client_id")["status"]
    assert status[1] == "outage" and (status.drop(1) == "completed").all()
    assert math.isfinite(rounds["round_time_s"].iloc[0])
    done = clients[clients["status"] == "completed"]
    assert rounds["round_time_s"].iloc[0] == approx(
        done["finish_s"].max() + rounds["server_time_s"].iloc[0]
    )


def test_wait_for_a_fraction_drops_the_slowest(tmp_path: Path) -> None:
    slow = {**UNIT, "flops_per_s": 1e6}
    rounds, clients = _faulted(
        tmp_path,
        {"wait_for_fraction": 0.5},
        rounds=1,
        devices={
            "clients": [{"profile": "unit", "count": 2}, {"profile": "slow"}],
            "profiles": {"unit": UNIT, "slow": slow},
        },
    )
    status = clients.set_index("client_id")["status"].to_dict()
    assert status == {0: "completed", 1: "completed", 2: "dropped_deadline", 3: "dropped_deadline"}
    fast = clients[clients["client_id"] < 2]
    r = rounds.iloc[0]
    assert r["round_time_s"] == approx(
        fast["finish_s"].max() + r["aggregate_time_s"]
        if "aggregate_time_s" in r
        else fast["finish_s"].max() + r["server_time_s"]
    )
    assert r["dropped_deadline"] == 2


@pytest.mark.slow
def test_a_faulted_run_replays_exactly_and_resumes_exactly(tmp_path: Path) -> None:
    cfg = {
        "crash_prob": 0.25,
        "dropout_prob": 0.25,
        "outage_prob": 0.2,
        "straggler": {"fraction": 0.5, "slowdown": [1.5, 4.0]},
        "link_outages": [{"start_s": 5.0, "duration_s": 30.0, "clients": [2]}],
        "wait_for_fraction": 0.75,
    }
    sc = tiny(
        rounds=5, faults=cfg, channel=FIXED, topology={"clients": 8}, algorithm={"name": "kapc"}
    )
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full)
    clients = read_csv_exact(full / "clients.csv")
    seen = set(clients["status"].dropna())
    assert {"crashed", "dropped_out", "outage", "completed"} <= seen
    rep = replay.replay(full)
    assert rep.exact
    recorded = read_csv_exact(full / "rounds.csv")
    assert rep.rounds["round_time_s"].tolist() == recorded["round_time_s"].tolist()
    out = tmp_path / "cut" / "r"
    with pytest.raises(SimulatedKill):
        run_in_folder(sc, out, observers=[StopAfter(2)])
    resume_run(out)
    assert_same_records(full, out)


# --------------------------------------------------------------------------- NaN guard


def _result(cid: int, weights: np.ndarray, n: int, extra=None) -> ClientResult:
    return ClientResult(
        cid, weights, weights.nbytes, n, 0.0, (), 0.0, 1, 0, extra=dict(extra or {})
    )


def test_updates_with_nan_or_inf_are_rejected_not_averaged() -> None:
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    layout = model_layout(model)
    w0 = get_flat(model, layout)
    server = CentralServer("fedavg", layout, w0, {0: 10, 1: 30, 2: 5, 3: 5}, 1.0, {}, 0)
    a, b = w0 + 1.0, w0 - 2.0
    bad = w0.copy()
    bad[17] = np.nan
    worse = w0.copy()
    worse[3] = np.inf
    report = server.aggregate(
        0,
        [
            _result(0, a, 10),
            _result(1, b, 30),
            _result(2, bad, 5),
            _result(3, worse, 5, {"loss": 1.0}),
        ],
    )
    assert report.rejected == (2, 3)
    # FedAvg's mean of the two kept: n-weighted sum in float64, divided once, then float32
    kept = (10 * a.astype(np.float64) + 30 * b.astype(np.float64)) / 40
    np.testing.assert_array_equal(server.algorithm.weights, kept.astype(np.float32))
    # a NaN only in what else the client uploaded is rejected too
    report = server.aggregate(1, [_result(0, a, 10, {"loss": float("nan")})])
    assert report.rejected == (0,)
    # every update rejected: the model stays as it was
    before = server.algorithm.weights.copy()
    report = server.aggregate(2, [_result(2, bad, 5)])
    assert report.rejected == (2,) and report.flops == 0.0
    np.testing.assert_array_equal(server.algorithm.weights, before)


def test_a_diverging_run_is_flagged_and_its_model_untouched(tmp_path: Path, capsys) -> None:
    from mecsim.interfaces.cli import main

    path = tmp_path / "lr.yaml"
    data = tiny(rounds=2, training={"lr": 1000.0}).model_dump(mode="json")
    path.write_text(__import__("json").dumps(data))
    code = main(["run", str(path), "--out", str(tmp_path / "runs"), "--run-id", "d", "--no-plots"])
    out = capsys.readouterr().err
    assert code == 0
    assert "round 1: 4 update(s) with NaN or inf rejected" in out
    assert "no update was aggregated, the model is unchanged" in out
    clients = read_csv_exact(tmp_path / "runs" / "d" / "clients.csv")
    assert set(clients["status"]) == {"rejected_nonfinite"}
    rounds = read_csv_exact(tmp_path / "runs" / "d" / "rounds.csv")
    assert rounds["rejected"].tolist() == [4, 4]
    assert rounds["mean_accuracy"].iloc[0] == rounds["mean_accuracy"].iloc[1]


# --------------------------------------------------------------------------- real Ray


@pytest.mark.ray
@pytest.mark.slow
def test_killed_ray_actors_are_recreated_and_the_records_unchanged(tmp_path: Path) -> None:
    """kill -9 a client-host actor after round 1 and the central-server actor after
    round 3 of a real Ray run: it finishes, records the two faults, and its records equal
    those of an undisturbed run (the local backend gives the same records as Ray).
    tests/integration/test_edge_actors.py kills an edge-server actor of a hierarchical run."""
    sc = tiny(rounds=5)
    ref = tmp_path / "ref" / "r"
    run_in_folder(sc, ref)
    out = run_killing_actors(sc, tmp_path, [(1, "ClientHostActor"), (3, "CentralServerActor")])
    assert_same_records(ref, out, ignore=("faults",))
