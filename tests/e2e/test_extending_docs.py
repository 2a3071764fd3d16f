"""docs/extending.md's code blocks, run as written: the walk from `mecsim new` to a run,
a table and a sweep (the ``console`` blocks, each ``$`` line a command), then every
``python`` block in order in one namespace, in a scratch folder.

Every command runs in the session's throwaway venv (tests/e2e/conftest.py): ``pip install
-e DIR`` as ``python -m pip install --no-deps --no-build-isolation -e DIR`` (offline), so
the suite's own environment is left as it was; the package is uninstalled at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from support.paths import ROOT
from support.venv import PluginVenv

DOC = ROOT / "docs" / "extending.md"


def blocks(kind: str) -> list[str]:
    """The fenced code blocks of ``kind`` (console, python) in the page, in order."""
    return re.findall(rf"^```{kind}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def commands() -> list[list[str]]:
    out = []
    for block in blocks("console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                out.append(shlex.split(line[2:]))
    return out


def _run(venv: PluginVenv, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    if argv[:2] == ["pip", "install"]:
        argv = [
            venv.python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            *argv[2:],
        ]
    elif argv[0] == "mecsim":
        argv = [venv.python, "-m", "mecsim", *argv[1:]]
    return subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def test_the_page_has_the_walk_and_the_examples() -> None:
    argvs = commands()
    assert [a[:2] for a in argvs[:6]] == [
        ["mecsim", "new"],
        ["pip", "install"],
        ["mecsim", "run"],
        ["mecsim", "check"],
        ["mecsim", "report"],
        ["mecsim", "sweep"],
    ]
    assert len(blocks("python")) >= 7


#: runs the python blocks (a JSON list, argv[1]) in order in one namespace, in a fresh
#: process of the venv the package was installed into
_BLOCKS = """
import json, sys
namespace = {"__name__": "docs_extending"}
for i, code in enumerate(json.load(open(sys.argv[1]))):
    try:
        exec(compile(code, f"docs/extending.md python block {i + 1}", "exec"), namespace)
    except Exception as exc:  # the block's number and what failed
        print(f"python block {i + 1} failed: {exc!r}\\n{code}")
        raise
"""


@pytest.mark.slow
def test_every_code_block_of_docs_extending_runs(tmp_path, plugin_venv: PluginVenv) -> None:
    installed = False
    try:
        for argv in commands():
            out = _run(plugin_venv, argv, tmp_path)
            assert out.returncode == 0, f"{shlex.join(argv)}:\n{out.stdout}\n{out.stderr}"
            installed |= argv[:2] == ["pip", "install"]
            if argv[:2] == ["mecsim", "check"]:
                assert "FAIL" not in out.stdout, out.stdout
            if argv[:2] == ["mecsim", "plugins"]:
                assert '"name": "myfl"' in out.stdout
        assert (tmp_path / "reports" / "myfl").is_dir()
        assert (tmp_path / "sweeps" / "myfl" / "sweep.csv").is_file()
        # the python blocks, in a fresh process that sees the package just installed
        code = tmp_path.parent / f"{tmp_path.name}-blocks.json"
        code.write_text(json.dumps(blocks("python")))
        out = subprocess.run(
            [plugin_venv.python, "-c", _BLOCKS, str(code)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    finally:
        if installed:
            plugin_venv.uninstall("mecsim-myfl")
