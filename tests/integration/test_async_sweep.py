"""A replay cannot re-time an asynchronous run: the times decided what was trained."""

from __future__ import annotations

import pytest

from mecsim.analysis.replay import RunLoadError, load_run
from mecsim.scenario import resolved_yaml, scenario_from_dict


@pytest.mark.parametrize("mode", ["async", "buffered", "semi_sync"])
def test_replay_and_sweep_refuse_an_async_run_saying_why(tmp_path, mode):
    sc = scenario_from_dict({"topology": {"clients": 4}, "aggregation": {"mode": mode}})
    (tmp_path / "scenario.yaml").write_text(resolved_yaml(sc))
    with pytest.raises(RunLoadError) as err:
        load_run(tmp_path)
    text = str(err.value)
    assert f"aggregation.mode {mode}" in text and "cannot re-time" in text
    assert "--set" in text  # what to do instead
