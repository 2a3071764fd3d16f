"""Killing a real ``mecsim run`` process and resuming it: the sequence the synchronous and
asynchronous kill -9 tests share (tests/integration/test_resume.py,
tests/integration/test_async_resume.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from mecsim.store.runfolder import run_status
from mecsim.testing import assert_same_records

#: how long a ``mecsim`` command of these tests may take (a loaded 2-core machine)
TIMEOUT_S = 240


def mecsim_cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """``python -m mecsim ARGS`` in a process of its own, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "mecsim", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **(env or {})},
        **kw,
    )


def killed_at(scenario: Path, runs: Path, point: str, rows_left: int) -> Path:
    """Run ``scenario`` (its ``outputs.dir`` is ``runs``) until the chaos hook SIGKILLs it
    at ``point`` (``MECSIM_KILL_AT``, mecsim.run.chaos); checks that it died of the
    signal, that the folder reads as interrupted and holds ``rows_left`` round rows.
    Returns the run's folder."""
    run_id = point.replace(":", "-")
    killed = mecsim_cli(
        "run",
        str(scenario),
        "--run-id",
        run_id,
        "--quiet",
        "--no-plots",
        env={"MECSIM_KILL_AT": point},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = runs / run_id
    assert run_status(out)["status"] == "interrupted"  # "running", but nobody holds it
    assert len(pd.read_csv(out / "rounds.csv")) == rows_left  # header always there
    return out


def killed_once_rows(scenario: Path, out: Path, rows: int) -> str:
    """Start ``mecsim run scenario --run-id <out's name>`` and SIGKILL it from outside
    once its ``rounds.csv`` has more than ``rows`` lines, wherever the run is then;
    checks that it died of the signal; returns its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mecsim", "run", str(scenario), "--run-id", out.name, "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            table = out / "rounds.csv"
            if table.exists() and len(table.read_text().splitlines()) > rows:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL, err
    return err


def resumed_equals(ref: Path, out: Path, rounds: int) -> None:
    """``mecsim run --resume out`` finishes cleanly, with the records of the undisturbed
    run in ``ref`` and ``rounds`` rounds (versions) done."""
    resumed = mecsim_cli("run", "--resume", str(out), "--quiet", "--no-plots")
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert_same_records(ref, out)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "finished" and meta["rounds_done"] == rounds


def resumed_in_process_equals(ref: Path, out: Path, rounds: int) -> None:
    """:func:`resumed_equals` with ``mecsim run --resume out`` run by mecsim's ``main`` in
    this process, not in an interpreter of its own (~3 s fewer per resume): the killed run
    was a process of its own, and what resumes it reads nothing but its folder."""
    from mecsim.interfaces.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", "--resume", str(out), "--quiet", "--no-plots"])
    assert code == 0, err.getvalue()
    assert "Traceback" not in err.getvalue()
    assert_same_records(ref, out)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "finished" and meta["rounds_done"] == rounds
