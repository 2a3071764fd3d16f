"""A real Ray cluster of two nodes on this machine, started with ``ray start`` as a lab would.

The head and the worker node are two ``ray start --block`` processes, each with its own
temp dir, ports, CPUs and raylet, both on 127.0.0.1, with Ray's token authentication (the
README's recipe). Everything is stopped by PID — the ``ray start`` process and what it
started, found as its descendants — never with ``ray stop``, which would stop every Ray
on the machine.

By hand, ``python tests/support/cluster.py [SCENARIO] [--rounds N]`` times a run on a
one-node and on a two-node cluster (the figures in docs/cluster.md).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from support.procs import wait_gone

RAY_CLI = Path(sys.executable).with_name("ray")
RAY_START = [str(RAY_CLI), "start"]
#: ``ray start`` for a worker node joining a head on 127.0.0.1 of this machine. Ray refuses
#: to start a worker node with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and without it replaces
#: a loopback ``--address`` by the machine's network address, where a head on loopback does
#: not listen; so this ``ray start`` keeps the address as given (on separate machines a
#: lab gives the head's real address and needs none of this).
WORKER_RAY_START = [
    sys.executable,
    "-c",
    "import sys; import ray._private.services as s; "
    "s.resolve_ip_for_localhost = lambda host: host; "
    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())",
    "start",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ports() -> list[str]:
    """The ports of one node, each chosen free (two nodes on one machine may not share)."""
    out = []
    for flag in (
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
    ):
        out += [flag, str(free_port())]
    return out


def stop_processes(procs: list[psutil.Process], timeout_s: float = 15) -> None:
    """SIGKILL (the node is gone at once, as when a machine dies) and reap."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    wait_gone(procs, timeout_s)


class Node:
    """One ``ray start --block`` process: a head or a worker node."""

    def __init__(self, cluster: LocalCluster, name: str, cpus: int, head: bool) -> None:
        self.name, self.cpus, self.head = name, cpus, head
        self.temp_dir = cluster.work / name
        self.log = cluster.work / f"{name}.log"
        cmd = [
            *(RAY_START if head else WORKER_RAY_START),
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--temp-dir",
            str(self.temp_dir),
            "--num-cpus",
            str(cpus),
            "--disable-usage-stats",
            *_ports(),
        ]
        if head:
            cmd += ["--head", "--port", str(cluster.port), "--include-dashboard", "false"]
        else:
            cmd += ["--address", cluster.address]
        env = cluster.head_env if head else cluster.worker_env
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.node_id: str | None = None  # read from its raylet's command line

    def processes(self) -> list[psutil.Process]:
        """The ``ray start`` process and every process under it (raylet, GCS, agents,
        workers)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def raylet_node_id(self) -> str | None:
        for p in self.processes():
            try:
                cmd, name = p.cmdline(), p.name()
            except psutil.Error:
                continue
            if name == "raylet" or (cmd and cmd[0].endswith("/raylet")):
                for arg in cmd:
                    if arg.startswith("--node_id="):
                        return arg.split("=", 1)[1]
        return None

    def kill(self) -> list[int]:
        """SIGKILL the node: its ``ray start`` process, raylet, agents and workers."""
        procs = self.processes()
        stop_processes(procs)
        self.proc.wait(timeout=10)
        return [p.pid for p in procs]


#: The GCS declares a node dead after this many failed health checks, one a second (Ray's
#: defaults, 5 every 3 s, took ~30 s here): a test's killed node is noticed in ~3 s.
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


class LocalCluster:
    """A head (``head_cpus``) and a worker node (``worker_cpus``; 0: none) on loopback,
    with token authentication.

    ``head_env`` adds to the head's environment (e.g. :data:`FAST_NODE_DEATH`)."""

    def __init__(
        self,
        work: Path,
        head_cpus: int = 1,
        worker_cpus: int = 1,
        head_env: dict[str, str] | None = None,
    ) -> None:
        self.work = work
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.token = work / "token"
        self.token.write_text(secrets.token_hex(32))
        base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        #: what the README tells every node and every driver to set
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token)}
        # on loopback: Ray would otherwise replace 127.0.0.1 by the machine's address
        self.head_env = {
            **base,
            **self.auth,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            **(head_env or {}),
        }
        self.worker_env = {**base, **self.auth}
        self.driver_env = {**base, **self.auth}
        self.nodes: list[Node] = []
        self.head = self._add("head", head_cpus, head=True)
        self._wait_for_port()
        self.worker = self._add("worker", worker_cpus, head=False) if worker_cpus else None

    def _add(self, name: str, cpus: int, head: bool) -> Node:
        node = Node(self, name, cpus, head)
        self.nodes.append(node)
        return node

    def _wait_for_port(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.head.proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"the head did not start:\n{self.head.log.read_text()[-3000:]}")

    def wait_for_nodes(self, timeout_s: float = 120) -> dict[str, str]:
        """Both raylets up: ``{node name: node id}``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"{node.name} exited:\n{node.log.read_text()[-3000:]}")
                node.node_id = node.node_id or node.raylet_node_id()
            if all(n.node_id for n in self.nodes):
                return {n.name: n.node_id for n in self.nodes}  # type: ignore[misc]
            time.sleep(0.3)
        raise RuntimeError(
            "the raylets did not start: "
            + " | ".join(n.log.read_text()[-1500:] for n in self.nodes)
        )

    def stop(self) -> None:
        """Every process of both nodes, by PID, with SIGKILL (a throwaway cluster: nothing
        of it needs a clean shutdown; its temp dirs are the caller's to remove)."""
        for node in reversed(self.nodes):
            stop_processes(node.processes())
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.proc.kill()


def _measure(argv: list[str] | None = None) -> None:
    """Wall time of one ``mecsim run --ray-address`` on a one-node cluster (a head with 2
    CPUs) and on a two-node cluster (head and worker with 1 CPU each), 2 hosts each."""
    import argparse
    import csv
    import shutil
    import statistics
    import tempfile

    parser = argparse.ArgumentParser(description=_measure.__doc__)
    parser.add_argument("scenario", nargs="?", default="scenarios/fedavg-mnist-10.yaml")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    print("load before:", os.getloadavg())
    for label, cpus in (("one node, 2 CPUs", (2, 0)), ("two nodes, 1 + 1 CPUs", (1, 1))):
        work = Path(tempfile.mkdtemp(prefix="mclm", dir="/tmp"))
        cluster = LocalCluster(work, head_cpus=cpus[0], worker_cpus=cpus[1])
        try:
            cluster.wait_for_nodes()
            started = time.monotonic()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "mecsim",
                    "run",
                    args.scenario,
                    "--ray-address",
                    cluster.address,
                    "--rounds",
                    str(args.rounds),
                    "--hosts",
                    "2",
                    "--out",
                    str(work / "runs"),
                    "--run-id",
                    "m",
                    "--quiet",
                    "--no-plots",
                    "--no-metrics",
                ],
                env=cluster.driver_env,
                check=True,
            )
            wall = time.monotonic() - started
            with (work / "runs" / "m" / "rounds.csv").open() as f:
                rounds = [float(r["host_wall_s"]) for r in csv.DictReader(f)]
            print(
                f"{label}: {wall:.1f} s end to end, median round {statistics.median(rounds):.3f}"
                f" s (host_wall_s), load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
        finally:
            cluster.stop()
            shutil.rmtree(work, ignore_errors=True)
    print("load after:", os.getloadavg())


if __name__ == "__main__":  # by hand: python tests/support/cluster.py [SCENARIO] [--rounds N]
    _measure()
