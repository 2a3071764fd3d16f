"""A server whose aggregation makes its model NaN or inf fails the run, naming the
algorithm and the round, before that round is recorded or checkpointed: the last good
checkpoint is kept and the run resumes from it (issue 41, item 6). What each resume ran
with — the plugin files' sha256, mecsim's and the libraries' versions, the backend — is
recorded in its entry of run.json, and a plugin file changed at a resume is said
(item 7; docs/reliability.md, "Provenance of a resume").

The plugin is FedAvg whose aggregate_fit spoils the new global model (all NaN, one inf,
NaN in one layer only) from a given round on; "fixed" is the same file without the
spoiling.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from support.scenarios import TINY

import mecsim.registry as registry
from mecsim.agents.algorithms import AlgorithmError
from mecsim.agents.algorithms.base import check_models
from mecsim.agents.models import build_model, model_layout
from mecsim.interfaces.cli import main

PLUGIN = """
import numpy as np

from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer
from mecsim.api import register

NAME, MODE, FROM = {name!r}, {mode!r}, {start!r}


class SpoilingServer(FedAvgServer):
    def aggregate_fit(self, rnd, results):
        stats = super().aggregate_fit(rnd, results)
        if MODE != "fixed" and rnd >= FROM:
            w = self.weights.copy()
            if MODE == "nan":
                w[:] = np.nan
            elif MODE == "inf":
                w[7] = -np.inf
            elif MODE == "layer":  # NaN in the last layer only
                for part in self.layout.layer_slices(self.layout.num_layers - 1):
                    w[part] = np.nan
            self.weights = w
        return stats


register("algorithm", NAME, (SpoilingServer, FedAvgClient))
"""


def _write(tmp_path: Path, name: str, mode: str, start: int, rounds: int = 4) -> Path:
    plugin = tmp_path / f"{name}-{mode}.py"
    plugin.write_text(PLUGIN.format(name=name, mode=mode, start=start))
    data = {**json.loads(json.dumps(TINY)), "rounds": rounds, "algorithm": {"name": name}}
    data["outputs"] = {"dir": str(tmp_path / "runs")}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return plugin


def _forget(name: str) -> None:
    if name in registry.ALGORITHMS._registered:
        registry.ALGORITHMS.unregister(name)


def _run(tmp_path: Path, name: str, plugin: Path, run_id: str, *extra: str) -> int:
    args = ["run", str(tmp_path / f"{name}.yaml"), "--plugin", str(plugin), "--run-id", run_id]
    return main([*args, "--quiet", "--no-plots", "--no-metrics", *extra])


def _failed_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "the run failed" in line]


@pytest.mark.parametrize(
    "mode, start, says",
    [
        ("nan", 0, "NaN in layers"),
        ("inf", 1, "inf in layer"),
        ("layer", 2, "NaN in layer"),
        ("nan", 2, "NaN in layers"),
    ],
)
def test_a_model_made_non_finite_fails_the_run_at_that_round_keeping_the_last_good_checkpoint(
    tmp_path: Path, capfd, mode: str, start: int, says: str
) -> None:
    name = f"spoil_{mode}_{start}"
    plugin = _write(tmp_path, name, mode, start)
    try:
        code = _run(tmp_path, name, plugin, "r")
    finally:
        _forget(name)
    err = capfd.readouterr().err
    assert code == 1, err
    (line,) = _failed_lines(err)
    assert f"algorithm {name!r}: aggregate_fit of round {start + 1} left the server's model" in line
    assert says in line and "Traceback" not in err
    folder = tmp_path / "runs" / "r"
    meta = json.loads((folder / "run.json").read_text())
    assert (meta["status"], meta["rounds_done"]) == ("failed", start)
    # the spoilt round is neither recorded nor checkpointed
    assert len(pd.read_csv(folder / "rounds.csv")) == start
    assert len((folder / "optraces.jsonl").read_text().splitlines()) == start
    kept = sorted(p.name for p in (folder / "checkpoints").glob("round-*.pt"))
    assert kept[-1:] == ([f"round-{start:06d}.pt"] if start else [])


@pytest.mark.slow
def test_a_failed_run_resumes_from_its_last_good_checkpoint_with_a_fixed_plugin_recorded(
    tmp_path: Path, capfd
) -> None:
    name = "spoil_resume"
    broken = _write(tmp_path, name, "nan", 2)
    fixed = tmp_path / "fixed.py"
    fixed.write_text(PLUGIN.format(name=name, mode="fixed", start=2))
    sha = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (broken, fixed)}
    folder = tmp_path / "runs" / "r"
    try:
        assert _run(tmp_path, name, broken, "r") == 1
    finally:
        _forget(name)
    capfd.readouterr()
    try:
        code = main(["run", "--resume", str(folder), "--plugin", str(fixed), "--quiet"])
        code |= main(["run", "--resume", str(folder), "--plugin", str(fixed), "--quiet"]) != 2
        fresh = _run(tmp_path, name, fixed, "fresh")
    finally:
        _forget(name)
    err = capfd.readouterr().err
    assert code == 0 and fresh == 0, err
    meta = json.loads((folder / "run.json").read_text())
    assert (meta["status"], meta["rounds_done"]) == ("finished", 4)
    # the run's start keeps the file it started with; the resume names its own
    assert [p["sha256"] for p in meta["plugins"]] == [sha[broken]]
    (resume,) = meta["resumes"]
    assert resume["from_round"] == 2
    assert [(p["name"], p["sha256"], p["origin"]) for p in resume["plugins"]] == [
        (name, sha[fixed], "file")
    ]
    assert resume["mecsim_version"] == meta["mecsim_version"] != ""
    assert resume["backend"] == "local" and resume["torch_version"]
    (changed,) = resume["plugins_changed"]
    assert f"algorithm {name!r} changed at the resume" in changed and sha[fixed][:12] in changed
    assert f"warning: {changed}" in err
    # rounds 1-2 kept, rounds 3-4 run from round 2's checkpoint: the fixed plugin's run
    a, b = (pd.read_csv(tmp_path / "runs" / rid / "rounds.csv") for rid in ("r", "fresh"))
    for col in ("round", "mean_accuracy", "round_time_s", "bytes_up", "energy_j"):
        assert a[col].tolist() == b[col].tolist(), col


def test_a_resume_with_the_same_plugin_file_says_nothing_changed(tmp_path: Path, capfd) -> None:
    name = "spoil_same"
    plugin = _write(tmp_path, name, "fixed", 0, rounds=2)
    folder = tmp_path / "runs" / "r"
    try:
        assert _run(tmp_path, name, plugin, "r", "--rounds", "2") == 0
        meta = json.loads((folder / "run.json").read_text())
        meta["status"] = "interrupted"  # as a kill leaves it, after its last round
        (folder / "run.json").write_text(json.dumps(meta))
        # the same file under another name and path is the same plugin
        copy = tmp_path / "elsewhere" / "copy.py"
        copy.parent.mkdir()
        copy.write_bytes(plugin.read_bytes())
        _forget(name)
        assert main(["run", "--resume", str(folder), "--plugin", str(copy), "--quiet"]) == 0
    finally:
        _forget(name)
    err = capfd.readouterr().err
    (resume,) = json.loads((folder / "run.json").read_text())["resumes"]
    assert "plugins_changed" not in resume and "changed at the resume" not in err
    assert resume["plugins"][0]["sha256"] == hashlib.sha256(plugin.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.ray
def test_on_ray_the_server_actor_s_non_finite_model_fails_the_run_in_one_line(
    tmp_path: Path, capfd
) -> None:
    name = "spoil_ray"
    plugin = _write(tmp_path, name, "layer", 1, rounds=3)
    try:
        code = _run(tmp_path, name, plugin, "r", "--backend", "ray")
    finally:
        _forget(name)
    err = capfd.readouterr().err
    assert code == 1, err
    (line,) = _failed_lines(err)
    assert f"algorithm {name!r}: aggregate_fit of round 2 left the server's model" in line
    assert "NaN in layer" in line and "Traceback" not in err and "\x1b[" not in err
    meta = json.loads((tmp_path / "runs" / "r" / "run.json").read_text())
    assert (meta["status"], meta["rounds_done"]) == ("failed", 1)


def test_check_models_names_the_model_and_the_layers() -> None:
    layout = model_layout(build_model("mlp_2nn", (1, 28, 28), 10))
    w = np.zeros(layout.size, dtype=np.float32)
    check_models("a", {"weights": w}, "aggregate_fit of round 1", layout)  # finite: nothing
    check_models("a", {}, "aggregate_fit of round 1", layout)
    last = layout.num_layers - 1
    for part in layout.layer_slices(last):
        w[part] = np.nan
    with pytest.raises(AlgorithmError) as info:
        check_models("a", {"weights": w}, "aggregate_fit of round 3", layout)
    text = str(info.value)
    assert text.startswith("algorithm 'a': aggregate_fit of round 3 left the server's model")
    assert f"NaN in layer {layout.layer_names[last]} " in text and "\n" not in text
    with pytest.raises(AlgorithmError, match=r"model 'cluster 1' not finite"):
        check_models("a", {"weights": np.zeros(3), "cluster 1": {"x": [np.inf]}}, "x", layout)


EDGE_PLUGIN = """
import numpy as np

from mecsim.agents.algorithms.phsfl import PHSFLClient, PHSFLEdge, PHSFLServer
from mecsim.api import register


class SpoilingEdge(PHSFLEdge):
    def aggregate_fit(self, rnd, results):
        report = super().aggregate_fit(rnd, results)
        if self.edge_server == 1 and self.model is not None:
            self.model = np.full_like(self.model, np.nan)
        return report


class Server(PHSFLServer):
    Edge = SpoilingEdge


register("algorithm", "spoil_edge", (Server, PHSFLClient))
"""


def test_an_edge_server_whose_model_turns_nan_fails_the_run_naming_it(
    tmp_path: Path, capfd
) -> None:
    plugin = tmp_path / "edge.py"
    plugin.write_text(EDGE_PLUGIN)
    data = json.loads(json.dumps(TINY))
    data.update(
        rounds=2,
        model={"name": "phsfl_cnn"},
        topology={"clients": 4, "edge_servers": 2},
        algorithm={
            "name": "spoil_edge",
            "params": {"edge_rounds": 2, "finetune_steps": 2, "batches_per_epoch": 2},
        },
        outputs={"dir": str(tmp_path / "runs")},
    )
    (tmp_path / "spoil_edge.yaml").write_text(yaml.safe_dump(data))
    try:
        code = _run(tmp_path, "spoil_edge", plugin, "r")
    finally:
        _forget("spoil_edge")
    err = capfd.readouterr().err
    assert code == 1, err
    (line,) = _failed_lines(err)
    assert (
        "algorithm 'spoil_edge': aggregate_fit of edge server 1 of round 1 left the server's "
        "model 'model' not finite: NaN in layers"
    ) in line, line
    meta = json.loads((tmp_path / "runs" / "r" / "run.json").read_text())
    assert (meta["status"], meta["rounds_done"]) == ("failed", 0)
