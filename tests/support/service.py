"""Helpers of the service tests: a real ``mecsim serve`` in a subprocess, an in-process
uvicorn for the API layer, tiny scenarios, and the record comparison."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from mecsim.testing import first_difference
from support.procs import wait_gone
from support.scenarios import TINY

TOKEN = "test-token-0123456789abcdef"


def tiny_yaml(**overrides: Any) -> str:
    """The tests' tiny scenario as YAML text, metrics on, top-level keys replaced."""
    data = copy.deepcopy(TINY)
    data["metrics"] = {"enabled": True}
    data.update(overrides)
    return yaml.safe_dump(data, sort_keys=False)


def wait_for(check: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.2):
    """Poll ``check`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except (httpx.TransportError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def same_records(a: Path, b: Path) -> None:
    """rounds.csv and clients.csv of two run folders are equal but for host columns and
    run ids (:func:`mecsim.testing.first_difference`)."""
    diff = first_difference(a, b, ("rounds.csv", "clients.csv"))
    assert diff is None, diff


class ServeProcess:
    """``mecsim serve`` in a subprocess on a free loopback port."""

    def __init__(
        self, state: Path, *args: str, log: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.state = state
        self.args = args
        self.log_path = log or state.with_name(state.name + ".log")
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.children: list[psutil.Process] = []

    def start(self, timeout_s: float = 60) -> ServeProcess:
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mecsim",
                "serve",
                "--port",
                "0",
                "--state",
                str(self.state),
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env,
        )
        log.close()
        line = _readline(self.proc, timeout_s)
        m = re.search(r"listening on (http://\S+?)/ ", line)
        assert m, f"no URL in {line!r}; log:\n{self.log_text()}"
        self.url = m.group(1)
        return self

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_ready(self, headers: dict[str, str] | None = None, timeout_s: float = 120) -> None:
        wait_for(
            lambda: (
                httpx.get(f"{self.url}/readyz", headers=headers, timeout=5).status_code == 200
                or self._died()
            ),
            timeout_s,
            "the service's Ray",
        )
        assert self.proc is not None and self.proc.poll() is None, self.log_text()

    def _died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def _remember_children(self) -> None:
        try:
            self.children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            self.children = []

    def kill9(self) -> None:
        """SIGKILL the server; then end what Ray left behind (by PID, never by name): its
        processes outlive the server (all 9 were still running 10 s after it here), so
        they are sent SIGTERM at once rather than waited for, and SIGKILL after 2 s (its
        dashboard and runtime-env agents were still running 5 s after a SIGTERM)."""
        self._remember_children()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        for p in self.children:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        self._reap_children(grace_s=2)

    def stop(self, timeout_s: float = 90) -> int:
        """SIGTERM (a graceful stop) and wait; SIGKILL if it does not end in time."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self._remember_children()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._reap_children()
        return self.proc.returncode

    def _reap_children(self, grace_s: float = 10) -> None:
        alive = wait_gone(self.children, grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        wait_gone(alive, 10)


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout_s)
    if not out:
        proc.kill()
        raise AssertionError(f"mecsim serve printed nothing in {timeout_s:.0f} s")
    return out[0]


class ThreadServer:
    """The service app on a real uvicorn in a thread of this process (loopback)."""

    def __init__(self, app, **settings: Any) -> None:
        import uvicorn

        from mecsim.interfaces.service.connections import server_config

        self.server = uvicorn.Server(server_config(app, **settings))
        from mecsim.interfaces.cli.service import _listen

        self.sock = _listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "uvicorn to start", 0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
