"""The paper-table benchmarks' run folders (benchmarks/seeds.py): a finished run of the
same scenario is reused, a killed one resumes from its checkpoint and ends with the
records of an uninterrupted run, a run of another scenario is run again, and only a
finished run's newest checkpoint is kept."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from conftest import tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import seeds  # noqa: E402

from mecsim.run.observers import RunObserver
from mecsim.store.session import run_in_folder


def _checkpoints(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "checkpoints").glob("round-*.pt"))


def _emulated(df: pd.DataFrame) -> pd.DataFrame:
    """Without the run's name and the host's wall-clock and memory columns."""
    return df.drop(
        columns=[c for c in df.columns if c.startswith("host_") or c in ("server_rss_mb", "run_id")]
    )


def test_a_killed_run_resumes_a_finished_one_is_reused_and_another_scenario_reruns(
    tmp_path, capsys
):
    scenario = tiny(rounds=4, faults={"crash_prob": 0.2})
    ref_rounds, ref_clients = seeds.run_or_reuse(scenario, tmp_path / "ref", "ref")
    assert len(ref_rounds) == 4 and _checkpoints(tmp_path / "ref") == ["round-000004.pt"]

    # killed after its second round (stopped there, its checkpoint written)
    path = tmp_path / "killed"
    done = []

    class Count(RunObserver):
        def on_round_end(self, info, round_row, client_rows, traces) -> None:
            done.append(1)

    # (the stop check is also asked between host calls in a round: it counts rounds done)
    run_in_folder(
        scenario,
        path,
        observers=[Count()],
        should_stop=lambda: "interrupted" if len(done) == 2 else False,
    )
    assert len(pd.read_csv(path / "rounds.csv")) == 2
    assert (path / "checkpoints").is_dir()
    first_walls = pd.read_csv(path / "rounds.csv")["host_wall_s"].tolist()
    capsys.readouterr()
    rounds, clients = seeds.run_or_reuse(scenario, path, "killed")
    assert "resuming after round 2" in capsys.readouterr().out
    # the two rounds before the kill were not run again; the records are the whole run's
    assert rounds["host_wall_s"].tolist()[:2] == first_walls
    pd.testing.assert_frame_equal(_emulated(rounds), _emulated(ref_rounds))
    pd.testing.assert_frame_equal(_emulated(clients), _emulated(ref_clients))
    assert _checkpoints(path) == ["round-000004.pt"]  # the newest only

    # finished: reused as it is
    again, _ = seeds.run_or_reuse(scenario, path, "killed")
    assert "reusing" in capsys.readouterr().out
    pd.testing.assert_frame_equal(again, rounds)

    # another scenario in the same folder (other epochs): run again, not reused
    other = tiny(rounds=4, faults={"crash_prob": 0.2}, training={"epochs": 2})
    redone, _ = seeds.run_or_reuse(other, path, "killed")
    assert "another scenario" in capsys.readouterr().out
    assert len(redone) == 4 and not redone["train_loss"].equals(rounds["train_loss"])
    assert seeds.same_scenario(path, other) and not seeds.same_scenario(path, scenario)


def test_a_run_another_process_is_running_is_neither_deleted_nor_run_twice(tmp_path):
    """Two benchmark processes on one output folder: the second stops with the reason
    when it comes to a run the first holds, instead of deleting it from under it."""
    import pytest

    from mecsim.store.runfolder import RunLock

    scenario = tiny(rounds=2)
    path = tmp_path / "busy"
    calls = []
    run_in_folder(scenario, path, should_stop=lambda: (calls.append(1), "interrupted")[1])
    lock = RunLock(path).acquire()  # as the first process holds it while it runs
    before = sorted(p.name for p in path.rglob("*"))
    try:
        with pytest.raises(SystemExit, match="in use"):
            seeds.run_or_reuse(scenario, path, "busy")
    finally:
        lock.release()
    assert sorted(p.name for p in path.rglob("*")) == before
