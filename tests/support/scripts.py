"""Running a Python script as ``python SCRIPT ARGS`` does, in a process of its own forked
from a server that has imported numpy, pandas, torch and mecsim already (multiprocessing's
``forkserver``): each script still starts from a clean interpreter state, but without
the seconds those imports take (half of a benchmark's ``--quick`` run on a 2-core
machine: 6.6 of 13.8 s for ``kapc_mu_sweep``).

The server only imports (no thread pool has started when it forks; a fork after OpenMP
or Ray threads ran could hang), one per test process, started by the first script run.
Scripts that start Ray are run by the caller in an interpreter of their own.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: what the server imports before it forks (the imports every benchmark pays)
PRELOAD = [
    "numpy",
    "pandas",
    "torch",
    "mecsim.api",
    "mecsim.run.loop",
    "mecsim.store.session",
]

_context: multiprocessing.context.ForkServerContext | None = None


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def _server() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def _as_main(script: str, argv: list[str], env: dict[str, str], cwd: str, out: str) -> None:
    """In the forked process: ``python script *argv`` with environment ``env`` in ``cwd``,
    stdout and stderr into ``out``.stdout / ``out``.stderr."""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR is read again (the server may have cached another)
    os.chdir(cwd)
    for fd, suffix in ((1, "stdout"), (2, "stderr")):
        f = os.open(f"{out}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).parent))  # as `python SCRIPT` puts it first
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # multiprocessing ends the process with os._exit
        sys.stdout.flush()
        sys.stderr.flush()


def run_script(
    script: Path, argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float
) -> Finished:
    """``python script *argv`` (exit code, stdout, stderr), forked from the server; its
    exit code is ``sys.exit``'s (an uncaught exception: 1, its traceback on stderr)."""
    out = Path(tempfile.mkdtemp(prefix="script-")) / "out"
    proc = _server().Process(target=_as_main, args=(str(script), argv, env, str(cwd), str(out)))
    proc.start()
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise AssertionError(f"{script.name} {' '.join(argv)} ran past {timeout_s:.0f} s")
    texts = [
        Path(f"{out}.{s}").read_text() if Path(f"{out}.{s}").exists() else ""
        for s in ("stdout", "stderr")
    ]
    for s in ("stdout", "stderr"):
        Path(f"{out}.{s}").unlink(missing_ok=True)
    out.parent.rmdir()
    assert proc.exitcode is not None
    return Finished(proc.exitcode, *texts)
