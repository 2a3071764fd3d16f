"""The paper-table benchmarks' run folders (benchmarks/papers/seeds.py): a finished run of the
same scenario is reused, a killed one resumes from its checkpoint and ends with the
records of an uninterrupted run, a run of another scenario is run again, and only a
finished run's newest checkpoint is kept."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from support.paths import ROOT
from support.scenarios import tiny

sys.path.insert(0, str(ROOT / "benchmarks" / "papers"))
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


@pytest.mark.slow
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


def _spread(mean: float, std: float) -> list[float]:
    """Three values whose mean and sample std (ddof 1) are ``mean`` and ``std``."""
    return [mean - std, mean, mean + std]


def test_ordering_compares_every_pair_not_only_neighbours() -> None:
    # neighbours level (A ≈ B, B ≈ C), yet A beyond the spread of C
    values = {"A": _spread(10, 1), "B": _spread(8.5, 1), "C": _spread(7, 1)}
    assert seeds.ordering(values) == "A > C; level: A ≈ B, B ≈ C"
    assert seeds.ordering({"A": _spread(1, 1), "B": _spread(1.5, 1)}) == (
        "no pair beyond the spread (B, A); level: B ≈ A"
    )
    # lower is better: times
    assert seeds.ordering({"fast": _spread(3, 1), "slow": _spread(6, 1)}, False) == "fast < slow"


def test_k1s_figures_put_fedprox_above_kapc_beyond_the_spread() -> None:
    """docs/fidelity.md K1 (seeds 0-2): the neighbours-only ordering printed 'FedProx ≈
    Local ≈ ... ≈ KAPC > FedAvg'; FedProx 88.85 ± 1.55 against KAPC 82.96 ± 2.95 is not
    level (87.30 > 85.91)."""
    k1 = {
        "Local": _spread(87.71, 2.29),
        "FedAvg": _spread(73.76, 1.71),
        "FedProx": _spread(88.85, 1.55),
        "KAPC": _spread(82.96, 2.95),
        "KAPC+BLS": _spread(83.93, 2.28),
    }
    c = seeds.compare_all(k1)
    assert c.order == ["FedProx", "Local", "KAPC+BLS", "KAPC", "FedAvg"]
    assert c.ahead["FedProx"] == ["KAPC+BLS", "KAPC", "FedAvg"]
    assert not c.is_level("FedProx", "KAPC") and c.is_level("Local", "KAPC")
    assert c.level == [["FedProx", "Local"], ["Local", "KAPC+BLS", "KAPC"]]
    assert seeds.ordering(k1) == (
        "FedProx > KAPC+BLS, KAPC, FedAvg; Local > FedAvg; KAPC+BLS > FedAvg; "
        "KAPC > FedAvg; level: FedProx ≈ Local, Local ≈ KAPC+BLS ≈ KAPC"
    )
    # D1's time to 90 % (s, lower is better): k-means faster than DC-PFL beyond the spread
    d1 = {
        "FedAvg": _spread(126, 10),
        "Per-FedAvg": _spread(117, 13),
        "k-means": _spread(106, 6),
        "DC-PFL": _spread(130, 13),
    }
    assert seeds.compare_all(d1, higher_is_better=False).ahead["k-means"] == ["FedAvg", "DC-PFL"]
