"""mecsim.simulate: mecsim run from Python, on the same code path (the run folder, its
records and checkpoints), with overrides by keyword."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from support.scenarios import TINY

import mecsim
from mecsim.scenario import ScenarioError


@pytest.mark.slow
def test_simulate_runs_a_scenario_into_a_run_folder_with_overrides(tmp_path: Path) -> None:
    outcome = mecsim.simulate(
        TINY,
        out=tmp_path,
        run_id="t1",
        rounds=3,
        training__lr=0.1,
        backend="local",
        progress=False,
        plots=False,
    )
    assert outcome.status == "finished" and len(outcome.rows) == 3
    assert outcome.run_dir == tmp_path / "t1"
    rounds = pd.read_csv(outcome.run_dir / "rounds.csv")
    assert rounds["round"].tolist() == [0, 1, 2]
    assert outcome.scenario.training.lr == 0.1
    assert json.loads((outcome.run_dir / "run.json").read_text())["status"] == "finished"
    assert sorted(p.name for p in (outcome.run_dir / "checkpoints").glob("*.pt"))


def test_simulate_refuses_bad_input_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="training.lr"):
        mecsim.simulate(TINY, out=tmp_path, training__lr=-1, progress=False)
    with pytest.raises(ScenarioError, match="nope"):
        mecsim.simulate(TINY, out=tmp_path, nope=1, progress=False)
    assert list(tmp_path.iterdir()) == []
    mecsim.simulate(
        TINY, out=tmp_path, run_id="same", rounds=1, backend="local", progress=False, plots=False
    )
    with pytest.raises(ScenarioError, match="outputs.run_id: .* already exists"):
        mecsim.simulate(TINY, out=tmp_path, run_id="same", rounds=1, progress=False)
