"""`mecsim report` on real runs, one synchronous and one asynchronous of the same tiny
scenario: its time-to-accuracy table agrees with docs/async.md's table script
(benchmarks/papers/async_table.py, written apart from the report), and the run's
summary has no per-round split of server versions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest
from support.scenarios import tiny_async_dict

from mecsim.interfaces.cli import main
from mecsim.scenario import scenario_from_dict
from mecsim.store.session import run_in_folder

ROOT = Path(__file__).resolve().parents[2]


def _async_table():
    path = ROOT / "benchmarks" / "papers" / "async_table.py"
    spec = importlib.util.spec_from_file_location("async_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_report_time_to_accuracy_of_real_sync_and_async_runs(tmp_path: Path) -> None:
    dirs = []
    for mode, rounds in (("sync", 3), ("async", 12)):
        data = tiny_async_dict(mode=mode)
        data["rounds"] = rounds
        data["evaluation"] = {"every": 1}
        out = tmp_path / mode
        run_in_folder(scenario_from_dict(data, mode), out)
        dirs.append(out)
    report = tmp_path / "report"
    argv = ["report", *map(str, dirs), "--target", "0.5", "--no-plots", "--quiet"]
    assert main([*argv, "--out", str(report)]) == 0
    table = pd.read_csv(report / "time_to_accuracy.csv")
    assert list(table["mode"]) == ["sync", "async"]
    script = _async_table()
    for k, run_dir in enumerate(dirs):
        expected = script.row(run_dir, [0.5])
        got = table.iloc[k]
        assert expected["s to 50%"] != "X", f"{run_dir.name} never reached 50 %"
        assert f"{got['time_to_target_s']:.1f}" == expected["s to 50%"]
        assert f"{got['energy_to_target_j']:.0f}" == expected["J to 50%"]
        assert int(got["updates"]) == expected["updates"]
    text = (report / "tables.md").read_text()
    assert text.count("Not shown: fedavg (async) (asynchronous") == 4
    summary = (dirs[1] / "summary.md").read_text()
    assert "12 versions" in summary and "%)" not in summary.split("## Communication")[0]
