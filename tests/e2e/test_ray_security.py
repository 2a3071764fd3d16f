"""Ray, reachable from this machine only; attaching to a cluster with token authentication.

- A Ray instance started by mecsim listens on loopback only: every listening socket of
  its processes (GCS, raylet, workers, agents, and the driver's own core worker), read
  with psutil during a real run, is on 127.0.0.1 / ::1.
- The README's recipe for an existing cluster works with Ray's token authentication: a
  real head (``ray start --head`` on loopback, its own temp dir, ports and token file)
  takes a 2-round ``mecsim run --ray-address`` with ``RAY_AUTH_MODE=token`` and the
  token; without them the run is refused with one line naming the setting, exit 2.
  The test stops only the processes it started, by PID.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml
from support.scenarios import TINY, tiny

from mecsim.run.loop import run
from mecsim.run.observers import RunObserver

pytestmark = [pytest.mark.ray, pytest.mark.own_ray, pytest.mark.slow]

RAY_CLI = Path(sys.executable).with_name("ray")


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    if getattr(address, "ipv4_mapped", None) is not None:  # ::ffff:127.0.0.1
        address = address.ipv4_mapped
    return address.is_loopback


def _listeners(pids: set[int]) -> list[tuple[str, int, str]]:
    out = []
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            try:
                name = psutil.Process(c.pid).name()
            except psutil.Error:
                continue
            out.append((c.laddr.ip, c.laddr.port, name))
    return out


def _session_pids(session_name: str) -> set[int]:
    """The processes of one Ray session: those naming it, and their descendants (workers
    rename themselves 'ray::...', so they are found as the raylet's children)."""
    pids = set()
    for p in psutil.process_iter(["cmdline"]):
        if session_name in " ".join(p.info["cmdline"] or []):
            pids.add(p.pid)
            try:
                pids |= {c.pid for c in p.children(recursive=True)}
            except psutil.Error:
                pass
    return pids


class _ListenProbe(RunObserver):
    def __init__(self) -> None:
        self.listeners: list[tuple[str, int, str]] = []

    def on_round_end(self, info, round_row, client_rows, traces) -> None:
        import ray

        session = Path(ray._private.worker._global_node.get_session_dir_path()).name
        pids = _session_pids(session) | {os.getpid()}
        self.listeners = _listeners(pids)


def test_ray_started_by_mecsim_listens_on_loopback_only():
    import ray

    if ray.is_initialized():  # another test's instance: not one mecsim started
        ray.shutdown()
    probe = _ListenProbe()
    rows = run(
        tiny(rounds=1, execution={"backend": "ray", "hosts": 2}), "ray-loopback", None, [probe]
    )
    assert len(rows) == 1
    names = {name for _, _, name in probe.listeners}
    assert {"gcs_server", "raylet"} <= names, probe.listeners  # the probe saw Ray itself
    exposed = [lst for lst in probe.listeners if not _loopback(lst[0])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert not ray.is_initialized()  # mecsim shut down the instance it started


def test_the_service_s_ray_listens_on_loopback_only(tmp_path):
    """``mecsim serve`` starts its Ray through the function ``mecsim run`` uses: every
    port its processes (the server, Ray's GCS, raylet, workers) listen on is loopback."""
    from support.service import ServeProcess

    server = ServeProcess(tmp_path / "state").start()
    try:
        server.wait_ready()
        root = psutil.Process(server.proc.pid)
        pids = {root.pid} | {c.pid for c in root.children(recursive=True)}
        listeners = _listeners(pids)
    finally:
        assert server.stop() in (0, -15)  # graceful (uvicorn re-raises the signal)
    names = {name for _, _, name in listeners}
    assert {"gcs_server", "raylet"} <= names, listeners  # Ray itself was seen
    exposed = [lst for lst in listeners if not _loopback(lst[0])]
    assert not exposed, f"listening beyond loopback: {exposed}"


# --------------------------------------------------------------------------- a real head


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(head: subprocess.Popen, pids: set[int]) -> None:
    """Stop the head and the processes it started, by PID (never `ray stop`): SIGTERM,
    then SIGKILL to what is still running after a few seconds (the ``ray start --block``
    head, its GCS server and monitor were still running 15 s after a SIGTERM here)."""
    procs = []
    for pid in pids | {head.pid}:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    for p in _wait_ended(procs, 5):
        try:
            p.kill()
        except psutil.Error:
            pass
    _wait_ended(procs, 10)
    head.wait(timeout=10)


def _wait_ended(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each process has exited (a zombie, dead but not yet reaped by the head
    that started it, has exited too); those still running after ``timeout_s``."""

    def running(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in procs if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.mark.skipif(not RAY_CLI.exists(), reason="the `ray` command is not installed here")
def test_attach_to_a_token_authenticated_head_with_the_readme_recipe():
    work = Path(tempfile.mkdtemp(prefix="mray", dir="/tmp"))  # short: Ray's socket paths
    token = work / "token"
    token.write_text(secrets.token_hex(32))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    port = _free_port()
    head_cmd = [
        str(RAY_CLI),
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--temp-dir",
        str(work / "ray"),
        "--num-cpus",
        "2",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        "--node-manager-port",
        str(_free_port()),
        "--object-manager-port",
        str(_free_port()),
        "--dashboard-agent-listen-port",
        str(_free_port()),
        "--dashboard-agent-grpc-port",
        str(_free_port()),
        "--metrics-export-port",
        str(_free_port()),
        "--runtime-env-agent-port",
        str(_free_port()),
    ]
    # a head on loopback (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray from replacing
    # 127.0.0.1 by the machine's network address), with token authentication
    head = subprocess.Popen(
        head_cmd,
        env={**clean_env, **auth, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        stdout=(work / "head.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    pids: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and head.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        assert head.poll() is None, (work / "head.log").read_text()[-3000:]
        scenario = work / "tiny.yaml"
        scenario.write_text(
            yaml.safe_dump(
                {**TINY, "name": "attach", "rounds": 2, "execution": {"backend": "ray", "hosts": 2}}
            )
        )

        def mecsim_run(env: dict[str, str], run_id: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "mecsim",
                    "run",
                    str(scenario),
                    "--ray-address",
                    f"127.0.0.1:{port}",
                    "--out",
                    str(work / "runs"),
                    "--run-id",
                    run_id,
                    "--quiet",
                    "--no-plots",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                cwd=work,
            )

        ok = mecsim_run({**clean_env, **auth}, "with-token")
        pids = {p.pid for p in psutil.Process(head.pid).children(recursive=True)}
        assert ok.returncode == 0, ok.stderr[-3000:]
        rounds = (work / "runs" / "with-token" / "rounds.csv").read_text().splitlines()
        assert len(rounds) == 3  # header + 2 rounds
        # (Ray retries a refused connection for ~20 s; 2 attempts show the same refusal)
        refused = mecsim_run({**clean_env, "RAY_gcs_server_port_wait_time_s": "2"}, "without-token")
        lines = [ln for ln in refused.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr
        assert any("execution.ray_address" in ln and "RAY_AUTH_MODE=token" in ln for ln in lines), (
            lines
        )
        assert not (work / "runs" / "without-token").exists()
    finally:
        try:
            pids |= {p.pid for p in psutil.Process(head.pid).children(recursive=True)}
        except psutil.Error:
            pass
        _stop(head, pids)
        shutil.rmtree(work, ignore_errors=True)
