"""An asynchronous run stopped and resumed gives the records of an uninterrupted one.

A checkpoint of an asynchronous run is taken at a version boundary (docs/async.md,
"Checkpoints"): the server (model, version, FedBuff's buffer), the versions in-flight
cycles trained on, the uploads of cycles already trained and not yet taken, and the
result of every training so far, from which a resume re-plays the clock up to the
version. In-process (an observer stops the run after a version's records are written,
before its checkpoint) for the three modes; in a subprocess with SIGKILL, at a chaos
point and at a moment nobody chose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from support.kills import killed_at, killed_once_rows, resumed_equals
from support.scenarios import tiny_async_dict

from mecsim.scenario import load_scenario, scenario_from_dict
from mecsim.store.reader import read_csv_exact
from mecsim.store.runfolder import prepare_resume, run_status
from mecsim.store.session import run_in_folder
from mecsim.testing import SimulatedKill, StopAfter, assert_same_records

MODES = {
    "fedasync": {"mode": "async", "alpha": 0.5},
    "fedbuff": {"mode": "buffered", "buffer_size": 2},
    "semi_sync": {"mode": "semi_sync", "period_s": 2.0},
}


def _stopped_then_resumed(sc, tmp_path: Path, stop_at: int, done: int) -> Path:
    out = tmp_path / "cut" / "r"
    with pytest.raises(SimulatedKill):
        run_in_folder(sc, out, observers=[StopAfter(stop_at)])
    assert len(pd.read_csv(out / "rounds.csv")) == stop_at + 1
    target = prepare_resume(out)
    try:
        # cut back to the newest checkpoint: its versions' rows and their updates' rows
        assert target.rounds_done == done
        assert len(pd.read_csv(out / "rounds.csv")) == done
        versions = pd.read_csv(out / "updates.csv")["version"]
        assert versions.max() == done and versions.is_monotonic_increasing
        run_in_folder(None, resume=target)
    finally:
        target.lock.release()
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "finished" and meta["resumes"][0]["from_round"] == done
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_resumes_exactly(mode: str, tmp_path: Path) -> None:
    sc = scenario_from_dict(tiny_async_dict(**MODES[mode]), "async-tiny")
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full)
    out = _stopped_then_resumed(sc, tmp_path, stop_at=2, done=2)
    assert_same_records(full, out)
    # the cut came while clients were in flight: the resumed run took updates whose
    # training the first process had executed, and others it executed itself
    updates = read_csv_exact(full / "updates.csv")
    assert (updates["version"] > 2).any() and (updates["start_s"] > 0).any()
    assert read_csv_exact(full / "rounds.csv")["in_flight"].iloc[1] > 0


@pytest.mark.ray
@pytest.mark.slow
def test_a_ray_run_stopped_and_resumed_on_ray_gives_the_in_process_records(
    tmp_path: Path,
) -> None:
    """FedAsync on Ray (the process's shared instance, tests/conftest.py), stopped after
    version 2 and resumed on Ray: the records of an uninterrupted in-process run (the
    clients in flight at the cut were trained by the first run's actors, the resumed
    run's actors train the rest)."""
    data = tiny_async_dict(**MODES["fedasync"])
    full = tmp_path / "full" / "r"
    run_in_folder(scenario_from_dict(data, "async-tiny"), full)
    data["execution"] = {**data["execution"], "backend": "ray"}
    out = _stopped_then_resumed(scenario_from_dict(data, "async-tiny"), tmp_path, 2, 2)
    assert json.loads((out / "run.json").read_text())["backend"] == "ray"
    assert_same_records(full, out)


def test_fedbuff_resumes_from_an_older_checkpoint(tmp_path: Path) -> None:
    """Checkpoints every 2 versions, stopped after the 5th: the resume starts from the
    4th (FedBuff's buffer of 2 is then empty, the 5th version's first update was being
    buffered when the run stopped) and the records come out as an uninterrupted run's."""
    data = tiny_async_dict(mode="buffered", buffer_size=2)
    data["checkpoint"] = {"every": 2}
    sc = scenario_from_dict(data, "async-tiny")
    full = tmp_path / "full" / "r"
    run_in_folder(sc, full)
    out = _stopped_then_resumed(sc, tmp_path, stop_at=4, done=4)
    assert_same_records(full, out)
    assert (read_csv_exact(out / "rounds.csv")["completed"] == 2).all()


def test_records_are_fsynced_before_each_checkpoint_not_after_each_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An asynchronous run gives each version's rows to the OS (a killed process loses
    none: the kill tests below) and fsyncs them before every checkpoint, which refers to
    them, and every SYNC_EVERY_S seconds (here never: set beyond the run), not after every
    version. FedAsync, 6 versions, a checkpoint every 3: updates.csv and rounds.csv are
    fsync'ed 3 times (the header at the start, then before each of the 2 checkpoints)
    and optraces.jsonl twice, where each was fsync'ed after every version (7, 7 and 6
    times), and each checkpoint file is fsync'ed after the 3 or 6 versions it holds are
    on disk in all three."""
    import os

    import mecsim.store.records as records

    monkeypatch.setattr(records, "SYNC_EVERY_S", 1e9)
    data = tiny_async_dict(mode="async", alpha=0.5)
    data["checkpoint"] = {"every": 3}
    sc = scenario_from_dict(data, "async-tiny")
    out = tmp_path / "r"
    synced: list[tuple[str, int]] = []  # (file name, its lines on disk then)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        lines = path.read_bytes().count(b"\n") if path.is_file() else 0
        synced.append((path.name, lines))

    monkeypatch.setattr(os, "fsync", fsync)
    run_in_folder(sc, out)
    names = ("updates.csv", "rounds.csv", "optraces.jsonl")
    counts = {n: sum(name == n for name, _ in synced) for n in names}
    assert counts == {"updates.csv": 3, "rounds.csv": 3, "optraces.jsonl": 2}, synced
    updates = read_csv_exact(out / "updates.csv")
    for done in (3, 6):  # the checkpoint's temporary file is fsync'ed before its rename
        at = next(i for i, (name, _) in enumerate(synced) if f"round-{done:06d}.pt" in name)
        before = {n: max((k for name, k in synced[:at] if name == n), default=0) for n in names}
        assert before == {
            "rounds.csv": 1 + done,
            "updates.csv": 1 + int((updates["version"] <= done).sum()),
            "optraces.jsonl": done,
        }


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("points_every", [2, 32])
def test_killed_ray_actors_are_recreated_and_the_async_records_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, points_every: int
) -> None:
    """kill -9 a client-host actor after version 2 and the central-server actor after
    version 4 of a FedAsync run on real Ray: the actors are re-created, given the hosts'
    state of the last recovery point (every 2 batches: one taken in memory; every 32:
    none yet, new hosts), the batches since are executed again, and the run finishes
    with the two faults recorded and the records of an undisturbed in-process run. The
    algorithm is FedProx evaluating each client's own last trained model, which lives in
    the client's state on its host: a host restored to a point without the batches since
    executed again would evaluate other models."""
    from support.helpers import run_killing_actors

    import mecsim.run.async_run as async_run

    monkeypatch.setattr(async_run, "RECOVERY_POINT_BATCHES", points_every)
    data = tiny_async_dict(**MODES["fedasync"])
    data["evaluation"] = {"every": 1}  # a call to the hosts at every version
    data["algorithm"] = {"name": "fedprox", "params": {"eval_model": "local"}}
    sc = scenario_from_dict(data, "async-tiny")
    ref = tmp_path / "ref" / "r"
    run_in_folder(sc, ref)
    out = run_killing_actors(sc, tmp_path, [(2, "ClientHostActor"), (4, "CentralServerActor")])
    assert_same_records(ref, out, ignore=("faults",))
    updates = read_csv_exact(out / "updates.csv")
    assert (updates["version"] > 2).sum() >= 4  # updates trained after the first kill


# --------------------------------------------------------------------------- subprocess


def _scenario_file(tmp_path: Path, rounds: int) -> Path:
    data = tiny_async_dict(mode="async", alpha=0.5)
    data["rounds"] = rounds
    data["outputs"] = {"dir": str(tmp_path / "runs")}
    path = tmp_path / "async.yaml"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow
def test_kill_9_at_a_version_boundary_then_resume(tmp_path: Path) -> None:
    """SIGKILL (the chaos hook) after version 3's records are written and before its
    checkpoint, and after every version while the Parquet copies are written."""
    scenario = _scenario_file(tmp_path, rounds=6)
    ref = tmp_path / "ref" / "r"
    run_in_folder(load_scenario(scenario), ref)
    for point, rows_left in (("round-end:2", 3), ("finish", 6)):
        out = killed_at(scenario, tmp_path / "runs", point, rows_left)
        resumed_equals(ref, out, 6)
        assert len(pd.read_csv(out / "rounds.csv")) == 6  # every version, once


@pytest.mark.slow
def test_kill_9_at_a_moment_nobody_chose_then_resume(tmp_path: Path) -> None:
    """``kill -9`` from outside once a few versions are on disk, wherever the run is then
    (training, timing, writing records or a checkpoint)."""
    rounds = 40
    scenario = _scenario_file(tmp_path, rounds=rounds)
    out = tmp_path / "runs" / "k"
    killed_once_rows(scenario, out, 6)
    status = run_status(out)
    assert status["status"] == "interrupted" and 5 <= status["rounds_done"] < rounds
    ref = tmp_path / "ref" / "r"
    run_in_folder(load_scenario(scenario), ref)
    resumed_equals(ref, out, rounds)
