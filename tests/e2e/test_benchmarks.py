"""Every benchmark still runs: each script under benchmarks/ with ``--quick``, in a process
of its own.

Benchmarks are run by hand and their full runs take minutes to hours, so nothing else
would notice one that no longer starts. A benchmark is any ``benchmarks/*/*.py`` with a
``if __name__ == "__main__":`` block (helper modules such as kapc_common.py have none), so
a new one is picked up without touching this file; it must accept ``--quick`` (seconds,
not minutes), exit 0 and print its figures. One whose quick run needs Ray says so with a
line ``QUICK_USES_RAY = True`` and is marked ``ray``.

The quick runs record into a fresh temporary directory (``MECSIM_BENCH_DIR``, ``TMPDIR``),
as on a fresh clone, so the recording paths are exercised too. A script runs as ``python
SCRIPT --quick`` would, forked from a server that has imported torch and mecsim once
(tests/support/scripts.py: half a quick run's time was its imports); one that starts Ray
runs in an interpreter of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import ROOT
from support.scripts import run_script

BENCHMARKS = ROOT / "benchmarks"


def discover() -> list[Path]:
    return sorted(
        p
        for p in BENCHMARKS.glob("*/*.py")
        if re.search(r"^if __name__ == .__main__.:", p.read_text(), re.M)
    )


def _uses_ray(path: Path) -> bool:
    return re.search(r"^QUICK_USES_RAY = True", path.read_text(), re.M) is not None


def _param(path: Path):
    marks = [pytest.mark.slow]
    if _uses_ray(path):
        marks += [pytest.mark.ray, pytest.mark.own_ray]  # in the benchmark's own process
    return pytest.param(path, id=path.stem, marks=marks)


def test_discovery_finds_the_benchmarks_and_not_the_helpers():
    names = {p.name for p in discover()}
    assert {"engine.py", "sweep.py", "kapc_table1.py", "overhead.py"} <= names
    assert "kapc_common.py" not in names


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path (Ray's socket paths under it must stay below
    the 107 bytes AF_UNIX allows, which pytest's tmp_path can exceed)."""
    path = Path(tempfile.mkdtemp(prefix="mecsim-quick-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("script", [_param(p) for p in discover()])
def test_benchmark_quick_run(script: Path, short_tmp: Path) -> None:
    env = {
        **os.environ,
        "MECSIM_BENCH_DIR": str(short_tmp / "records"),
        "TMPDIR": str(short_tmp),
        "PYTHONUNBUFFERED": "1",
    }
    if _uses_ray(script):  # Ray's threads and processes: an interpreter of its own
        proc = subprocess.run(
            [sys.executable, str(script), "--quick"],
            cwd=short_tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
    else:
        proc = run_script(script, ["--quick"], env, short_tmp, timeout_s=540)
    tail = f"\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, tail
    figures = re.findall(r"\d+\.\d+", proc.stdout)
    assert len(figures) >= 3, f"{script.name} printed no figures{tail}"


def test_ab_figures_are_matched_by_place_and_read_with_thousands_separators():
    sys.path.insert(0, str(BENCHMARKS / "tools"))
    import ab

    text = "clients  mecsim  ratio\n      10   0.040   0.63\n    1000   1,234.5  0.69 (x3)\n"
    assert ab.figures(text) == {
        (0, 0): 10,
        (0, 1): 0.04,
        (0, 2): 0.63,
        (1, 0): 1000,
        (1, 1): 1234.5,
        (1, 2): 0.69,
    }


def test_ab_runs_each_revision_on_its_own_code(tmp_path: Path) -> None:
    """A revision whose pyproject installs agents/ as mecsim.agents imports that folder of
    its own worktree (not the installed checkout's) through the link tree ab.py makes."""
    sys.path.insert(0, str(BENCHMARKS / "tools"))
    import ab

    tree = tmp_path / "tree"
    (tree / "mecsim").mkdir(parents=True)
    (tree / "agents").mkdir()
    (tree / "mecsim" / "__init__.py").write_text("")
    (tree / "agents" / "__init__.py").write_text("WHERE = 'the worktree'\n")
    (tree / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"mecsim" = "mecsim"\n"mecsim.agents" = "agents"\n'
    )
    root = ab._import_root(tree, tmp_path / "scratch")
    proc = subprocess.run(
        [sys.executable, "-c", "import mecsim.agents as a; print(a.WHERE)"],
        env={**os.environ, "PYTHONPATH": str(root)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.stdout.strip() == "the worktree", proc.stderr
