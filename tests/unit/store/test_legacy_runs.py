"""Run folders and checkpoints of mecsim 0.1 (before its packages were regrouped, when
``agents`` was a top-level package) load, resume, report and replay with this version.

``tests/data/legacy_runs/`` was written by mecsim 0.1.0 (commit 3663db5) on an AVX-512
machine, in-process with 2 hosts:

- ``fedavg-interrupted``: the tiny scenario (``conftest.tiny``) with 2 clients and 4
  rounds, stopped after round 3's records and before its checkpoint (``run.json`` says
  failed); its newest checkpoint, after round 2, names the dataclass of the hosts' step
  costs ``agents.training:StepCost``;
- ``fedavg-finished``: the tiny scenario, 3 rounds, finished (checkpoints deleted).

The resumed run is compared with the same scenario run from round 0 by this version as
:func:`mecsim.testing.assert_records_close` says (exact counts, bytes and op-traces;
floats within a stated tolerance, since the fixture's first rounds were computed on another
CPU).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support.paths import DATA
from support.scenarios import tiny

from mecsim.agents.state import decode
from mecsim.agents.training import StepCost
from mecsim.analysis.replay import load_run, replay, reproduces
from mecsim.analysis.tables import load_run as load_records
from mecsim.interfaces.cli import main
from mecsim.scenario import ScenarioError, load_recorded_scenario, load_scenario
from mecsim.store.checkpoints import scenario_digest
from mecsim.store.runfolder import prepare_resume
from mecsim.store.session import run_in_folder
from mecsim.testing import assert_records_close

LEGACY = DATA / "legacy_runs"


@pytest.fixture
def interrupted(tmp_path: Path) -> Path:
    out = tmp_path / "fedavg-interrupted"
    shutil.copytree(LEGACY / "fedavg-interrupted", out)
    return out


def test_a_legacy_checkpoint_names_agents_types_and_decodes_to_this_version_s() -> None:
    path = LEGACY / "fedavg-interrupted" / "checkpoints" / "round-000002.pt"
    payload = torch.load(path, weights_only=True)
    assert "agents.training:StepCost" in json.dumps(payload["costs"], default=str)
    costs = decode(payload["costs"])
    assert costs and all(isinstance(c, StepCost) for c in costs.values())


def test_a_legacy_interrupted_run_resumes_to_the_records_of_a_fresh_run(
    interrupted: Path, tmp_path: Path
) -> None:
    target = prepare_resume(interrupted)
    assert target.rounds_done == 2  # its newest checkpoint
    outcome = run_in_folder(None, resume=target)
    assert outcome.status == "finished" and len(outcome.rows) == 4
    meta = json.loads((interrupted / "run.json").read_text())
    assert meta["status"] == "finished" and [r["from_round"] for r in meta["resumes"]] == [2]
    fresh = tmp_path / "fresh" / "fedavg-interrupted"
    # the same scenario as its run folder holds it (links without transport: ideal)
    run_in_folder(load_recorded_scenario(interrupted / "scenario.yaml"), fresh)
    # rounds 0-1 were recorded by 0.1: their energy and aggregation figures are 0.1's,
    # and energy_sleep_j, added since, is empty there (run.json says so)
    assert_records_close(fresh, interrupted, old_rounds=2)
    # its rounds 0-1 aggregated at the edge server's flops_per_s (0.1 had no aggregation
    # rate), rounds 2-3 at the rate the resume recorded: a replay re-times each as it ran
    assert meta["resumes"][0]["aggregate_flops_per_s"] == 1.7e9
    assert load_run(interrupted).aggregated_at_flops_per_s_until == 2
    assert reproduces(load_run(interrupted))
    assert meta["resumes"][0]["added_columns"] == {
        "rounds.csv": ["energy_sleep_j"],
        "clients.csv": ["energy_sleep_j"],
    }


def test_mecsim_run_resume_continues_a_legacy_folder(interrupted: Path, capsys) -> None:
    assert main(["run", "--resume", str(interrupted), "--quiet", "--no-plots", "--no-metrics"]) == 0
    assert json.loads((interrupted / "run.json").read_text())["rounds_done"] == 4


def test_a_legacy_finished_run_reports_and_replays(tmp_path: Path, capsys) -> None:
    folder = LEGACY / "fedavg-finished"
    assert load_records(folder).rounds["round"].tolist() == [0, 1, 2]
    recorded = load_run(folder)
    assert reproduces(recorded)  # re-timing its op-traces gives its recorded times
    slower = replay(recorded, {"channel.uplink.bandwidth_hz": 1e6})
    assert slower.exact and (slower.rounds["ul_time_s"] > 0).all()
    # its aggregation ran at the edge server's 200 GFLOP/s flops_per_s, unless a replay
    # sets the aggregation rate: 1e6 FLOP/s makes its 1,600,080 FLOPs (4 uploads of
    # 200,010 parameters, 2 FLOPs each) 1.60008 s a round
    assert recorded.aggregated_at_flops_per_s_until == 3
    slow = {
        "flops_per_s": 200e9,
        "flops_source": "test",
        "step_overhead_s": 0.0,
        "step_overhead_source": "test",
        "ram_bytes": 2**34,
        "aggregate_flops_per_s": 1e6,
        "aggregate_flops_source": "test",
    }
    overrides = {"devices.profiles": {"edge-server-x86": slow}}
    slow_server = replay(recorded, overrides)
    assert slow_server.rounds["server_time_s"].tolist() == pytest.approx([1.60008] * 3)
    out = tmp_path / "report"
    assert main(["report", str(folder), "--out", str(out), "--no-plots", "--quiet"]) == 0
    assert (out / "tables.md").read_text().count("fedavg") >= 1


def test_a_run_folder_from_before_uplink_access_loads_as_it_ran(tmp_path: Path) -> None:
    # Before channel.uplink.access existed, shared: true with per-client bands ran as
    # each client's own band, time-shared; such a scenario is refused now unless it says
    # so, but a run folder written then still reports, replays and keeps its checkpoints'
    # digest. The folder is written today with access: shared_own_band, then the line
    # is removed, which is what the older version wrote.
    channel = {
        "model": "shannon",
        "uplink": {"bandwidth_hz": [10e6, 30e6], "shared": True, "access": "shared_own_band"},
    }
    scenario = tiny(channel=channel, rounds=2)
    folder = tmp_path / "own-bands"
    run_in_folder(scenario, folder)
    path = folder / "scenario.yaml"
    text = path.read_text()
    assert text.count("access: shared_own_band") == 1
    path.write_text("".join(ln for ln in text.splitlines(True) if "access:" not in ln))
    # ... and whose run.json did not record the scenario's sha256 (a version before it)
    meta = json.loads((folder / "run.json").read_text())
    del meta["scenario_sha256"], meta["records_format"]
    (folder / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ScenarioError, match=r"channel\.uplink\.access: .*say which you mean"):
        load_scenario(path)
    legacy = load_recorded_scenario(path)
    assert legacy.channel.uplink.access == "shared_own_band" and legacy.channel.uplink.shared
    assert scenario_digest(legacy) == scenario_digest(scenario)
    assert load_records(folder).rounds["round"].tolist() == [0, 1]
    recorded = load_run(folder)
    assert reproduces(recorded)  # re-timed as it ran: the bands time-shared
    dedicated = replay(
        recorded, {"channel.uplink.access": "dedicated", "channel.uplink.shared": False}
    )
    ran = load_records(folder).rounds["ul_time_s"].to_numpy()
    assert (dedicated.rounds["ul_time_s"].to_numpy() < ran).all()


def test_a_scenario_with_its_own_profiles_keeps_the_digest_its_checkpoints_carry() -> None:
    # The MTFL testbed scenario as shipped before profiles gained the energy states' and
    # the aggregation rate's fields: its digest, computed by that version's code, must be
    # what this version computes, or an interrupted run of it would find no checkpoint of
    # its own and start over
    path = DATA / "digest" / "profiles-before-energy-states.yaml"
    digest_then = "58a176bad4fca1921e1e091028dc9fc545db7272ae42a916018530e7c9dc3433"
    # as a resume reads it: a run folder's scenario (links without transport: ideal)
    scenario = load_recorded_scenario(path)
    assert scenario.devices.profiles  # the case: a scenario with profiles of its own
    assert scenario_digest(scenario) == digest_then
