"""Waiting for processes to end, where a dead process may not be reaped yet."""

from __future__ import annotations

import time
from collections.abc import Iterable

import psutil


def wait_gone(procs: Iterable[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process of ``procs`` has ended; those still running after
    ``timeout_s``. A zombie has ended (it runs nothing; only its parent has not reaped it):
    :func:`psutil.wait_procs` waits out its whole timeout on one that is not this process's
    child (it polls whether the PID exists, and a zombie's does), as the processes a killed
    server or Ray node leaves behind are. This process's own children are reaped."""
    deadline = time.monotonic() + timeout_s
    alive = list(procs)
    while True:
        running = []
        for p in alive:
            try:
                if not p.is_running():  # gone, or its PID reused by another process
                    continue
                if p.status() == psutil.STATUS_ZOMBIE:
                    try:
                        p.wait(timeout=0)  # reaps it when it is this process's child
                    except (psutil.TimeoutExpired, psutil.Error):
                        pass
                    continue
            except psutil.NoSuchProcess:
                continue
            running.append(p)
        alive = running
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)
