"""Resuming an interrupted run gives the records of an uninterrupted one, value for value.

In-process for every registered algorithm (an observer stops the run after a round's
records are written and before its checkpoint, the worst moment); in a subprocess with a
real SIGKILL at three points (during round 0, mid-run, while the final files are being
written) and with SIGTERM, for FedAvg and for MTFL with FedAvg-Adam (private patches,
client and server Adam moments).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from support.helpers import DCPFL_E2E, DCPFL_FAST, interrupted_then_resumed
from support.kills import TIMEOUT_S, killed_at, resumed_in_process_equals
from support.scenarios import BUILTIN_ALGORITHMS, tiny

from mecsim.analysis.replay import load_run, reproduces
from mecsim.run import interrupts
from mecsim.scenario import load_scenario
from mecsim.store.checkpoints import CheckpointStore
from mecsim.store.runfolder import RunFolderError, prepare_resume
from mecsim.store.session import run_in_folder
from mecsim.testing import SimulatedKill, StopAfter, assert_same_records, resume_run


def _algorithm_scenario(name: str, rounds: int):
    extra: dict = {}
    params: dict = {}
    if name in ("phsfl", "hsfl"):
        extra = dict(model={"name": "phsfl_cnn"}, topology={"clients": 4, "edge_servers": 2})
        params = {"edge_rounds": 2, "finetune_steps": 2, "batches_per_epoch": 2}
    elif name == "mtfl":
        params = {"strategy": "fedavg_adam"}
        extra = dict(training={"optimizer": "adam", "lr": 0.001, "batch_size": 16})
    elif name.startswith("dcpfl"):
        params = (
            dict(DCPFL_FAST)
            if name != "dcpfl_nodc"
            else {k: v for k, v in DCPFL_FAST.items() if k != "gamma_step"}
        )
        extra = dict(DCPFL_E2E)
    elif name == "kmeans_cluster":
        params = {"warmup_rounds": 2, "clusters": 2}
    elif name == "kapc_bls":
        params = {"mu": 0.3}
    elif name == "perfedavg":
        extra = dict(evaluation={"every": 1, "clients": "all"})
    return tiny(rounds=rounds, algorithm={"name": name, "params": params}, **extra)


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN_ALGORITHMS)
def test_every_algorithm_resumes_exactly(name: str, tmp_path: Path) -> None:
    rounds = 11 if name.startswith("dcpfl") else 5
    stop_at = 7 if name.startswith("dcpfl") else 2
    sc = _algorithm_scenario(name, rounds)
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full)
    out = interrupted_then_resumed(sc, tmp_path, stop_at)
    assert_same_records(full, out)
    # the strict reader reads every algorithm's resumed folder, and it re-times exactly
    assert reproduces(load_run(out))


@pytest.mark.slow
def test_resume_with_another_number_of_hosts(tmp_path: Path) -> None:
    # client state is checkpointed per client, so the hosts may be re-arranged
    sc = _algorithm_scenario("kapc_bls", 4)
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full, hosts=2)
    out = interrupted_then_resumed(sc, tmp_path, 1, hosts=(2, 3))
    assert_same_records(full, out)


def test_a_finished_or_busy_folder_is_not_resumed(tmp_path: Path) -> None:
    out = tmp_path / "r"
    run_in_folder(tiny(rounds=1), out)
    with pytest.raises(RunFolderError, match="finished"):
        prepare_resume(out)
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    target = prepare_resume(out)  # a "running" run nobody holds: it was killed
    try:
        with pytest.raises(RunFolderError, match="in use"):
            prepare_resume(out)
    finally:
        target.lock.release()
    with pytest.raises(RunFolderError, match="not a run folder"):
        prepare_resume(tmp_path)


def test_an_unreadable_newest_checkpoint_falls_back_to_an_older_one(tmp_path: Path) -> None:
    sc = tiny(rounds=4)
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full)
    out = tmp_path / "cut" / "r"
    with pytest.raises(SimulatedKill):
        run_in_folder(sc, out, observers=[StopAfter(3)])
    ckpts = sorted((out / "checkpoints").glob("*.pt"))
    assert [p.name for p in ckpts] == ["round-000002.pt", "round-000003.pt"]
    ckpts[-1].write_bytes(ckpts[-1].read_bytes()[:1000])  # torn by a disk fault
    warnings: list[str] = []
    target = prepare_resume(out, warn=warnings.append)
    try:
        assert target.rounds_done == 2 and "unreadable" in warnings[0]
        run_in_folder(None, resume=target)
    finally:
        target.lock.release()
    assert_same_records(full, out)


def test_checkpoints_are_kept_as_configured_and_hold_no_code(tmp_path: Path) -> None:
    sc = tiny(rounds=5, checkpoint={"every": 2, "keep": 2})
    out = tmp_path / "r"
    run_in_folder(sc, out)
    names = sorted(p.name for p in (out / "checkpoints").glob("*.pt"))
    assert names == ["round-000004.pt", "round-000005.pt"]  # every 2, and after the last
    meta = json.loads((out / "run.json").read_text())
    assert meta["checkpoint"]["rounds_done"] == 5 and meta["checkpoint"]["bytes"] > 800_000
    # a file that would run code when unpickled is refused, not executed
    evil = out / "checkpoints" / "round-000006.pt"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    import pickle

    evil.write_bytes(pickle.dumps({"format": 1, "x": Boom()}))
    store = CheckpointStore(out, "r", "unused")
    with pytest.raises(Exception, match="unreadable"):
        store.load(evil)
    assert not (tmp_path / "pwned").exists()


# --------------------------------------------------------------------------- subprocess


def _scenario_file(tmp_path: Path, algorithm: dict, rounds: int = 5) -> Path:
    data = tiny(
        rounds=rounds,
        algorithm=algorithm,
        **(
            {"training": {"optimizer": "adam", "lr": 0.001, "batch_size": 16}}
            if algorithm.get("name") == "mtfl"
            else {}
        ),
    ).model_dump(mode="json")
    data["outputs"]["dir"] = str(tmp_path / "runs")
    path = tmp_path / f"{algorithm['name']}.yaml"
    path.write_text(json.dumps(data))
    return path


def _reference(tmp_path: Path, scenario: Path) -> Path:
    """The undisturbed run of ``scenario``, in this process: its records are those of a
    ``mecsim run`` of the file (the killed and resumed runs below stay real processes).
    One interpreter start fewer per case."""
    ref = tmp_path / "ref" / "r"
    run_in_folder(load_scenario(scenario), ref)
    return ref


KILL_POINTS = (("round-start:0", 0), ("round-end:2", 3), ("finish", 5))


@pytest.mark.parametrize(
    ("algorithm", "points"),
    [
        ({"name": "fedavg"}, KILL_POINTS),
        # the points before any checkpoint and after the last round do not depend on the
        # algorithm; mid-run, the private patches and Adam moments must come back exactly
        ({"name": "mtfl", "params": {"strategy": "fedavg_adam"}}, KILL_POINTS[1:2]),
    ],
    ids=["fedavg", "mtfl-adam"],
)
@pytest.mark.slow
def test_kill_9_then_resume(algorithm: dict, points, tmp_path: Path) -> None:
    scenario = _scenario_file(tmp_path, algorithm)
    ref = _reference(tmp_path, scenario)
    for point, rows_left in points:
        out = killed_at(scenario, tmp_path / "runs", point, rows_left)
        if point == "finish":
            assert (out / "rounds.parquet").exists() and not (out / "summary.md").exists()
        resumed_in_process_equals(ref, out, 5)


@pytest.mark.slow
def test_sigterm_keeps_the_rounds_says_how_to_resume_and_exits_143(tmp_path: Path) -> None:
    scenario = _scenario_file(tmp_path, {"name": "fedavg"}, rounds=40)
    out = tmp_path / "runs" / "t"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mecsim",
            "run",
            str(scenario),
            "--run-id",
            "t",
            "--quiet",
            "--no-plots",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        rounds = out / "rounds.csv"
        if rounds.exists() and len(rounds.read_text().splitlines()) > 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "mecsim run --resume" in err
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted" and 3 <= meta["rounds_done"] < 40
    summary = (out / "summary.md").read_text()
    assert f"interrupted after {meta['rounds_done']} of 40 rounds" in summary
    assert len(pd.read_csv(out / "rounds.csv")) == meta["rounds_done"]


def test_an_interrupt_waits_for_the_write_in_progress() -> None:

    restore = interrupts.install()
    try:
        done = []
        with pytest.raises(interrupts.Terminated):
            with interrupts.atomic_section():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler has run by now: it must not raise here
                done.append("written")
        assert done == ["written"]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    finally:
        restore()


def test_report_and_summary_say_how_far_a_stopped_run_got(tmp_path: Path, capsys) -> None:
    from mecsim.interfaces.cli import main

    out = tmp_path / "r"
    with pytest.raises(SimulatedKill):
        run_in_folder(tiny(rounds=4), out, observers=[StopAfter(1)])
    assert "**Run failed after 2 of 4 rounds.**" in (out / "summary.md").read_text()
    meta = json.loads((out / "run.json").read_text())
    # what a kill -9 leaves: "running", with nobody holding the folder's lock
    (out / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    assert main(["report", str(out), "--no-plots", "--out", str(tmp_path / "rep")]) == 0
    assert "(fedavg, interrupted after 2 of 4 rounds)" in capsys.readouterr().out


def test_a_checkpoint_writes_only_what_changed(tmp_path: Path) -> None:
    # local training, half the clients a round: each round changes the models of the two
    # selected clients only (the global model never moves), so a checkpoint writes two
    # 800,040-byte models and a small index, and the folder keeps the blobs the two
    # newest checkpoints refer to: the global model, the 4 clients' models, and the
    # previous versions of the 2 that trained last
    sc = tiny(rounds=4, topology={"clients": 4, "participation": 0.5}, algorithm={"name": "local"})
    out = tmp_path / "r"
    run_in_folder(sc, out)
    model_bytes = json.loads((out / "run.json").read_text())["model_bytes"]
    written = json.loads((out / "run.json").read_text())["checkpoint"]["bytes"]
    assert 2 * model_bytes < written < 2 * model_bytes + 100_000
    blobs = list((out / "checkpoints" / "blobs").glob("*.pt"))
    assert len(blobs) == 7
    full = tmp_path / "f"
    run_in_folder(sc, full)
    cut = tmp_path / "c" / "r"
    with pytest.raises(SimulatedKill):
        run_in_folder(sc, cut, observers=[StopAfter(2)])
    resume_run(cut)
    assert_same_records(full, cut)


def test_a_run_killed_twice_resumes_twice_with_other_settings(tmp_path: Path) -> None:
    # the second process runs with other metrics/execution settings (as `mecsim run
    # --resume ... --metrics-port N --hosts 3` would): its checkpoints still belong to
    # the run, so the third process resumes from the second's newest, not from round 0
    sc = tiny(rounds=5)
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full)
    out = tmp_path / "twice" / "r"
    with pytest.raises(SimulatedKill):
        run_in_folder(sc, out, observers=[StopAfter(1)])
    target = prepare_resume(out)
    other = tiny(
        rounds=5,
        metrics={"enabled": False, "port": 9999},
        execution={"backend": "local", "hosts": 3},
        checkpoint={"keep": 3},
    )
    target.scenario = other  # other metrics, execution and checkpoint settings
    try:
        with pytest.raises(SimulatedKill):
            run_in_folder(None, resume=target, observers=[StopAfter(3)])
    finally:
        target.lock.release()
    target = prepare_resume(out)
    try:
        assert target.rounds_done == 3
        run_in_folder(None, resume=target)
    finally:
        target.lock.release()
    assert_same_records(full, out)
    assert [r["from_round"] for r in json.loads((out / "run.json").read_text())["resumes"]] == [
        1,
        3,
    ]
