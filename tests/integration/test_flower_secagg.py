"""Flower's secure aggregation (SecAgg+) on mecsim: ``SecAggPlusWorkflow`` and
``secaggplus_mod`` run, every stage of a round (setup, share keys, collect masked
vectors, unmask: four batches of train messages under one ``group_id``) is charged on the
emulated network in the round's own columns, the aggregate is Flower's own, and a client
dropped in a stage is left out by Flower's threshold.

The app is tests/data/flower_secagg_app: the classic test app
(tests/data/flower_classic_app) under SecAgg+ (classicapp/secagg.py), 4 clients, every
client a neighbour of every other, reconstruction threshold 2; its ClientApp seeds
numpy per node and round before SecAgg+ quantises (stochastic rounding), so Flower's
simulation rounds the same way.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from support.paths import DATA, TESTS

pytest.importorskip("flwr", reason='Flower is not installed: pip install "mecsim[flower]"')

APP = DATA / "flower_secagg_app"
CLASSIC = DATA / "flower_classic_app"
#: the MLP's values: 784 * 32 + 32 + 32 * 10 + 10
VALUES = 25_450
#: SecAgg+'s quantisation step (its defaults: clipping range 8, quantisation range 2**22)
STEP = 2 * 8.0 / 2**22
#: each client's weight in SecAgg+'s masked sum: its examples / max_weight (1000)
RATIO = 200 / 1000


def run(tmp_path: Path, app: Path, name: str, *args: str, env=None, **over) -> Path:
    """``mecsim run`` of ``app`` (4 clients, 2 rounds) in this process, in-process unless
    ``args`` name a backend, the app's environment switches set for the while; the
    run's folder."""
    if "--backend" not in args:
        args = (*args, "--backend", "local")
    data = {
        "name": name,
        "seed": 0,
        "rounds": 2,
        "topology": {"clients": 4},
        "algorithm": {"name": "flower", "params": {"app": str(app)}},
        "checkpoint": {"every": 0},
        "metrics": {"enabled": False},
        "outputs": {"dir": str(tmp_path / name)},
        **over,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    from mecsim.interfaces.cli import main

    err = io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stderr(err):
            code = main(["run", str(path), "--quiet", "--no-plots", *args])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert code == 0, err.getvalue()[-2000:]
    folders = sorted((tmp_path / name).iterdir())
    return folders[-1]


def traces(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "optraces.jsonl").read_text().splitlines()]


def trace_bytes(ops: list[dict]) -> tuple[int, int]:
    """(up, down) bytes of a client's ops as optraces.jsonl holds them."""
    from mecsim.emulation.ops import op_from_dict
    from mecsim.emulation.ops import trace_bytes as of_trace

    return of_trace([op_from_dict(op) for op in ops])


@pytest.mark.slow
def test_every_secagg_stage_is_charged_in_its_round(tmp_path: Path) -> None:
    """A round is the setup batch plus three stages; the round's bytes are the four
    batches' (clients.csv's too), its time theirs one after the other; the training
    stage does the plain app's training (same FLOPs, same first-round loss), and its
    upload is the masked vector: SecAgg+'s integers, 8 bytes a value."""
    from flwr.common import ndarray_to_bytes

    secagg = run(tmp_path, APP, "secagg")
    plain = run(tmp_path, CLASSIC, "plain")
    rounds = pd.read_csv(secagg / "rounds.csv")
    clients = pd.read_csv(secagg / "clients.csv")
    base = pd.read_csv(plain / "rounds.csv")
    records = traces(secagg)
    assert [len(r["stages"]) for r in records] == [3, 3]
    assert "stages" not in traces(plain)[0]  # one train batch a round: as before
    for rnd, rec in enumerate(records):
        row = rounds.iloc[rnd]
        batches = [rec["clients"]] + [st["clients"] for st in rec["stages"]]
        up = sum(trace_bytes(ops)[0] for b in batches for ops in b.values())
        down = sum(trace_bytes(ops)[1] for b in batches for ops in b.values())
        assert (row["bytes_up"], row["bytes_down"]) == (up, down)
        mine = clients[clients["round"] == rnd].set_index("client_id")
        for cid in range(4):
            sent = [trace_bytes(b[str(cid)]) for b in batches]
            assert mine.loc[cid, "bytes_up"] == sum(u for u, _ in sent)
            assert mine.loc[cid, "bytes_down"] == sum(d for _, d in sent)
        # the stages run one after the other: the round ends with the last
        last = rec["stages"][-1]
        assert row["round_time_s"] == pytest.approx(last["start_s"] + last["time_s"], rel=1e-12)
        assert rec["stages"][0]["start_s"] > 0 and row["completed"] == 4
    # the masked-vectors stage (the third batch): each reply holds the masked model as
    # int64 arrays (and the weight), np.save'd: their bytes and at most 1 KB of the rest
    shapes = [(32, 784), (32,), (10, 32), (10,), (1,)]
    masked = sum(len(ndarray_to_bytes(np.zeros(s, np.int64))) for s in shapes)
    assert masked == 8 * (VALUES + 1) + 5 * 128
    for rec in records:
        for ops in rec["stages"][1]["clients"].values():
            assert masked < trace_bytes(ops)[0] < masked + 1000
    # SecAgg+'s aggregate is dequantised to float64: from round 2 the model goes down at
    # 8 bytes a value, 4 more than the float32 model of round 1, to each client
    collect = [[trace_bytes(ops)[1] for ops in r["stages"][1]["clients"].values()] for r in records]
    assert [b - a for a, b in zip(*collect, strict=True)] == [4 * VALUES] * 4
    # the training stage trains as the plain app does: from the same model in round 1,
    # the same loss; SecAgg+'s own arithmetic (numpy, cryptography) is not counted
    assert rounds["train_loss"].iloc[0] == pytest.approx(base["train_loss"].iloc[0], rel=1e-9)
    assert rounds["client_gflops"].to_numpy() == pytest.approx(base["client_gflops"].to_numpy())
    assert (rounds["bytes_up"] > 2 * base["bytes_up"]).all()  # masked int64 vs float32
    assert (rounds["energy_j"] > 0).all() and (rounds["round_time_s"] > 0).all()
    # a replay re-times a round's first batch only: a run with stages is refused, saying so
    from mecsim.analysis.replay import RunLoadError, load_run

    with pytest.raises(RunLoadError, match="round 1's training has 3 further stages"):
        load_run(secagg)
    assert len(load_run(plain).rounds) == 2


@pytest.mark.slow
def test_secagg_records_are_the_same_in_process_and_on_ray(tmp_path: Path) -> None:
    from mecsim.testing import first_difference

    local = run(tmp_path, APP, "local")
    ray = run(tmp_path, APP, "ray", "--backend", "ray")
    assert first_difference(local, ray) is None
    assert len(traces(ray)[0]["stages"]) == 3


@pytest.mark.slow
def test_the_secagg_aggregate_equals_flowers_simulation(tmp_path: Path) -> None:
    """Full participation (Flower's strategy waits for the 4 nodes): mecsim's global
    arrays after every round are those of Flower's run_simulation of the same app. The
    masked sum is integer arithmetic, the masks cancel exactly, and the quantisation's
    random rounding is seeded per node and round on both sides: equal to the bit
    (measured 0.0; 1e-12 allowed for the order of FedAvg's float sum)."""
    theirs = tmp_path / "flower.npz"
    sim = subprocess.run(
        [sys.executable, str(TESTS / "support" / "flower_secagg_sim.py"), "4", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, "CLASSICAPP_OUT": str(theirs)},
        timeout=600,
    )
    assert sim.returncode == 0, sim.stderr[-2000:]
    ours = tmp_path / "mecsim.npz"
    run(tmp_path, APP, "ours", env={"CLASSICAPP_OUT": str(ours)})
    a, b = np.load(theirs), np.load(ours)
    assert sorted(a.files) == sorted(b.files) == ["round0", "round1", "round2"]
    for r in (1, 2):
        assert np.abs(b[f"round{r}"] - b[f"round{r - 1}"]).max() > 1e-2  # it trained
        np.testing.assert_allclose(b[f"round{r}"], a[f"round{r}"], rtol=0, atol=1e-12)


def _fedavg_by_hand(partitions: tuple[int, ...]) -> np.ndarray:
    """Round 1's FedAvg of ``partitions`` (200 images each), trained here as their
    ClientApps train (from the initial model, seed 1000 * partition + 1)."""
    sys.path.insert(0, str(CLASSIC))
    try:
        from classicapp.client_app import get_weights
        from classicapp.task import load_data, make_net, train
    finally:
        sys.path.remove(str(CLASSIC))
    models = []
    for pid in partitions:
        net = make_net()
        train(net, load_data(pid, 4)[0], 1, 0.1, 1000 * pid + 1)
        models.append(np.concatenate([w.ravel() for w in get_weights(net)]).astype(np.float64))
    return np.mean(models, axis=0)


@pytest.mark.slow
def test_clients_dropped_in_a_secagg_stage_are_left_out_when_the_threshold_allows(
    tmp_path: Path,
) -> None:
    """A 1 s deadline: clients 1 and 2, whose masked vectors (207 KB) take 0.76 s and
    1.5 s to go up, miss it in the masked-vectors stage (the setup and key stages take
    0.03 s). Mecsim gives the workflow an error reply for each; with threshold 2 the two
    others unmask, and round 1's model is the FedAvg of clients 0 and 3 alone, to
    SecAgg+'s quantisation: each client's weighted vector is rounded to a step, so the
    average is off by less than 2 steps / (2 x 0.2) (the weights)."""
    out = tmp_path / "dl.npz"
    folder = run(tmp_path, APP, "dl", env={"CLASSICAPP_OUT": str(out)}, deadline_s=1.0)
    rounds = pd.read_csv(folder / "rounds.csv")
    clients = pd.read_csv(folder / "clients.csv")
    assert rounds["completed"].tolist() == [2, 2]
    assert rounds["dropped_deadline"].tolist() == [2, 2]
    dropped = clients[clients["status"] == "dropped_deadline"]
    assert sorted(set(dropped["client_id"])) == [1, 2]
    for rec in traces(folder):  # the unmask stage goes only to the clients still there
        assert sorted(rec["stages"][2]["clients"]) == ["0", "3"]
    assert rounds["round_time_s"].max() < 1.1  # the stages before, then the deadline
    arrays = np.load(out)
    bound = 2 * STEP / (2 * RATIO)
    assert np.abs(arrays["round1"] - _fedavg_by_hand((0, 3))).max() < bound
    assert np.abs(arrays["round1"] - _fedavg_by_hand((0, 1, 2, 3))).max() > 100 * bound


@pytest.mark.slow
def test_too_few_clients_left_for_the_threshold_leave_the_model_as_flower_does(
    tmp_path: Path,
) -> None:
    """The same two drops with threshold 3: Flower's workflow halts the round's secure
    aggregation after the masked-vectors stage (its log: "Insufficient available
    nodes"), sends no unmask stage and keeps the global model; the run goes on, as on
    Flower."""
    out = tmp_path / "dl3.npz"
    env = {"CLASSICAPP_OUT": str(out), "CLASSICAPP_THRESHOLD": "3"}
    folder = run(tmp_path, APP, "dl3", env=env, deadline_s=1.0)
    assert [len(r["stages"]) for r in traces(folder)] == [2, 2]  # no unmask stage
    arrays = np.load(out)
    assert np.array_equal(arrays["round2"], arrays["round0"])


@pytest.mark.slow
def test_flowers_fl_dp_sa_example_runs_with_only_its_data_loading_changed(
    tmp_path: Path,
) -> None:
    """Flower's fl-dp-sa example (tests/data/flower_fl_dp_sa: client-side DP clipping and
    SecAgg+, 20 nodes of which FedAvg samples 4 a round, 3 rounds): every round has its
    three SecAgg+ stages, sent to the sampled clients only, and each masked-vectors reply
    holds the CNN's 61,610 values (and the weight) as int64 arrays."""
    from flwr.common import ndarray_to_bytes

    folder = run(tmp_path, DATA / "flower_fl_dp_sa", "dpsa", rounds=3, topology={"clients": 20})
    rounds = pd.read_csv(folder / "rounds.csv")
    assert rounds["selected"].tolist() == rounds["completed"].tolist() == [4, 4, 4]
    assert np.isfinite(rounds["train_loss"]).all() and (rounds["client_gflops"] > 0).all()
    shapes = [(6, 1, 3, 3), (6,), (16, 6, 5, 5), (16,), (120, 400), (120,)]
    shapes += [(84, 120), (84,), (10, 84), (10,), (1,)]
    assert sum(int(np.prod(s)) for s in shapes) == 61_610 + 1
    masked = sum(len(ndarray_to_bytes(np.zeros(s, np.int64))) for s in shapes)
    for rec in traces(folder):
        assert len(rec["stages"]) == 3
        assert all(sorted(st["clients"]) == sorted(rec["clients"]) for st in rec["stages"])
        for ops in rec["stages"][1]["clients"].values():
            assert masked < trace_bytes(ops)[0] < masked + 1000
