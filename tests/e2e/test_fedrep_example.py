"""The second external plugin example, ``examples/fedrep`` (distribution ``mecsim-fedrep``):
installed as a real distribution into the session's throwaway venv (tests/e2e/conftest.py),
checked by ``mecsim check`` and run by ``mecsim run`` from that venv, its bytes checked by
hand. One install, one check, one short run: the example's own tests
(``examples/fedrep/tests``) work its maths and FLOPs out by hand."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
from support.paths import ROOT
from support.venv import PluginVenv

EXAMPLE = ROOT / "examples" / "fedrep"
SCENARIO = EXAMPLE / "scenarios" / "fedrep.yaml"

#: MTFL's 2NN on MNIST: 200,010 float32 values; FedRep's head, its last Linear layer
#: (200 x 10 + 10), stays on the client: the body, 198,000 values, goes down and up
BODY_BYTES = 4 * (200_010 - 2_010)


def _run(venv: PluginVenv, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [venv.python, "-m", "mecsim", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(ROOT),
        check=False,
    )


@pytest.mark.slow
def test_installs_passes_the_kit_and_sends_the_body_only(
    plugin_venv: PluginVenv, tmp_path: Path
) -> None:
    plugin_venv.install(EXAMPLE)
    # the kit in-process (the Ray comparison is the example's own slow test): every
    # property, among them resume (the head is the client's checkpointed state), optraces
    # (the body's bytes) and flops (the two phases' steps under their own cost keys)
    check = _run(plugin_venv, "check", "fedrep", "--no-ray", "--json")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    report = json.loads(check.stdout)
    assert report["ok"], report
    checked = {r["name"] for r in report["results"] if r["passed"] and not r["skipped"]}
    assert {"params", "determinism", "resume", "streaming", "optraces", "flops"} <= checked

    proc = _run(
        plugin_venv,
        "run",
        str(SCENARIO),
        "--rounds",
        "1",
        "--backend",
        "local",
        "--out",
        str(tmp_path),
        "--no-plots",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run_dir / "run.json").read_text())
    (plugin,) = [p for p in meta["plugins"] if p["name"] == "fedrep"]
    assert (plugin["distribution"], plugin["version"]) == ("mecsim-fedrep", "0.1.0")
    assert plugin["origin"] == "entry point"
    with (run_dir / "rounds.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    # 6 clients, each the body down and up: 6 x 792,000 bytes each way
    assert int(row["bytes_up"]) == int(row["bytes_down"]) == 6 * BODY_BYTES == 4_752_000


def test_the_plugin_imports_only_the_public_api() -> None:
    """Written as a user writes one: of mecsim, only ``mecsim.api``."""
    source = (EXAMPLE / "mecsim_fedrep" / "__init__.py").read_text()
    imports = [
        line.split()[1]
        for line in source.splitlines()
        if line.startswith(("import ", "from ")) and "mecsim" in line.split()[1]
    ]
    assert imports == ["mecsim.api"], imports
