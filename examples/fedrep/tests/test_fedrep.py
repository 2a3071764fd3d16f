"""Tests of the algorithm fedrep: mecsim's conformance checks, and its scenario run
end to end.

Run them with ``pip install -e ".[test]"`` then ``python -m pytest -q tests``.
"""

from __future__ import annotations

import json
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
SCENARIO = PACKAGE / "scenarios" / "fedrep.yaml"


def test_passes_the_conformance_checks() -> None:
    """What `mecsim check fedrep` runs: determinism, checkpoints, Ray, the class
    flags (mecsim.testing)."""
    from mecsim.testing import check_algorithm

    report = check_algorithm("fedrep")  # runs the algorithm several times over
    report.assert_ok()


def test_runs_its_scenario(tmp_path: Path) -> None:
    import mecsim.api

    run = mecsim.api.simulate(
        SCENARIO, out=tmp_path, backend="local", rounds=2, progress=False, plots=False
    )
    assert run.status == "finished"
    info = json.loads((run.run_dir / "run.json").read_text())
    plugin = info["plugins"][0]  # what the run used that is not mecsim's own
    assert (plugin["kind"], plugin["name"]) == ("algorithm", "fedrep")
