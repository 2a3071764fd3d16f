"""docs/extending.md's code blocks, run as written: the walk from `mecsim new` to a run,
a table and a sweep (the ``console`` blocks, each ``$`` line a command), then every
``python`` block in order in one namespace, in a scratch folder.

``pip install -e DIR`` is run as ``python -m pip install --no-deps --no-build-isolation
-e DIR`` (offline, into this environment) and uninstalled at the end, so the suite leaves
the environment as it found it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

import mecsim.registry as registry

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


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    if argv[:2] == ["pip", "install"]:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            *argv[2:],
        ]
    elif argv[0] == "mecsim":
        argv = [sys.executable, "-m", "mecsim", *argv[1:]]
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


@pytest.mark.slow
def test_every_code_block_of_docs_extending_runs(tmp_path, monkeypatch) -> None:
    names = {
        "algorithm": ["damped", "my_fedavg"],
        "model": ["tiny_cnn"],
        "dataset": ["stripes"],
        "channel": ["two_rate"],
        "device": ["lab-boards"],
    }
    installed = False
    try:
        for argv in commands():
            out = _run(argv, tmp_path)
            assert out.returncode == 0, f"{shlex.join(argv)}:\n{out.stdout}\n{out.stderr}"
            installed |= argv[:2] == ["pip", "install"]
            if argv[:2] == ["mecsim", "check"]:
                assert "FAIL" not in out.stdout, out.stdout
            if argv[:2] == ["mecsim", "plugins"]:
                assert '"name": "myfl"' in out.stdout
        assert (tmp_path / "reports" / "myfl").is_dir()
        assert (tmp_path / "sweeps" / "myfl" / "sweep.csv").is_file()
        # the python blocks, in a process that sees the package just installed
        monkeypatch.chdir(tmp_path)
        _rediscover()  # this process read the entry points before the package was installed
        namespace: dict = {"__name__": "docs_extending"}
        for i, code in enumerate(blocks("python")):
            try:
                exec(compile(code, f"docs/extending.md python block {i + 1}", "exec"), namespace)
            except Exception as exc:  # the block's number and what failed
                raise AssertionError(f"python block {i + 1} failed: {exc!r}\n{code}") from exc
    finally:
        for kind, kind_names in names.items():
            for name in kind_names:
                registry.registry(kind).unregister(name)
        if installed:
            subprocess.run(
                [sys.executable, "-m", "pip", "uninstall", "-y", "-q", "mecsim-myfl"],
                capture_output=True,
                timeout=120,
            )
        _rediscover()


def _rediscover() -> None:
    """Make this process read the installed distributions' entry points again (and see
    the paths of packages installed since it started: their .pth files)."""
    import importlib
    import site
    import sysconfig

    site.addsitedir(sysconfig.get_paths()["purelib"])
    importlib.invalidate_caches()
    registry._GROUPS = None
    for reg in registry.REGISTRIES.values():
        reg._entries = None
        reg._conflicts = {}
