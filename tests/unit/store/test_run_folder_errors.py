"""A run folder that cannot be made or written is one line naming the path, exit 2, before
the run starts, with nothing half-written; a disk that cannot hold the run's checkpoints
is warned of before the start.

Real file systems where the machine allows it: a read-only and a full tmpfs mounted for
the test (root only; skipped with the reason elsewhere), /proc (a pseudo file system),
a file where a folder should be.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.scenarios import TINY

from mecsim.interfaces.cli import main


def _scenario(tmp_path: Path, **changes) -> Path:
    data = {**TINY, "rounds": 1, **changes}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@contextlib.contextmanager
def _tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or 'not root'})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _run(args: list[str], capsys) -> tuple[int, list[str]]:
    code = main(["run", *args, "--quiet", "--no-plots", "--no-metrics", "--backend", "local"])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


def test_a_read_only_file_system(tmp_path: Path, capsys) -> None:
    with _tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        code, lines = _run([str(_scenario(tmp_path)), "--out", str(ro / "runs")], capsys)
        assert code == 2 and len(lines) == 1, lines
        assert str(ro) in lines[0] and "outputs.dir" in lines[0]
        assert list(ro.iterdir()) == []


def test_a_full_disk(tmp_path: Path, capsys) -> None:
    with _tmpfs(tmp_path / "full", "size=64k") as full:
        with contextlib.suppress(OSError), (full / "filler").open("wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        code, lines = _run(
            [str(_scenario(tmp_path)), "--out", str(full / "runs"), "--run-id", "r"], capsys
        )
        assert code == 2, lines
        problems = [line for line in lines if "warning" not in line]
        assert len(problems) == 1 and "no space left on the device" in problems[0]
        assert str(full / "runs") in problems[0]
        assert sorted(p.name for p in full.iterdir()) == ["filler"]  # nothing half-written


def test_a_pseudo_file_system(tmp_path: Path, capsys) -> None:
    code, lines = _run([str(_scenario(tmp_path)), "--out", "/proc/mecsim-runs"], capsys)
    assert code == 2 and len(lines) == 1 and "/proc" in lines[0], lines
    assert not os.path.exists("/proc/mecsim-runs")


def test_a_file_where_the_folder_should_be(tmp_path: Path, capsys) -> None:
    (tmp_path / "taken").write_text("")
    code, lines = _run(
        [str(_scenario(tmp_path)), "--out", str(tmp_path / "taken" / "runs")], capsys
    )
    assert code == 2 and len(lines) == 1 and "taken" in lines[0], lines
    assert (tmp_path / "taken").read_text() == ""


def test_a_disk_too_small_for_the_checkpoints_is_warned_of(tmp_path: Path, capsys) -> None:
    """The tiny scenario keeps 2 checkpoints of 2 models (FedAvg's clients keep nothing):
    ~3.2 MiB; a 1 MiB disk gets the warning, and the run starts (it fails at the first
    checkpoint that does not fit, its finished round kept)."""
    with _tmpfs(tmp_path / "small", "size=1m") as small:
        code, lines = _run([str(_scenario(tmp_path)), "--out", str(small / "runs")], capsys)
        warnings = [line for line in lines if ": warning: checkpoint:" in line]
        assert len(warnings) == 1 and "GiB free" in warnings[0], lines
        assert code in (0, 1)  # the run started
