"""mecsim on a real two-node Ray cluster: hosts spread over the nodes, a node killed mid-run.

A head and a worker node, each started with ``ray start`` (its own temp dir, ports and
one CPU, on 127.0.0.1, with the README's token authentication), take a tiny 5-round
scenario through ``mecsim run --ray-address`` in a subprocess. One run shows both
claims (a second run would double the test's time):

- until the kill, the two host actors run one on each node (run.json ``placement``
  names both node ids);
- the worker node is killed with SIGKILL (its ``ray start`` process, raylet, agents and
  workers, by PID) once 2 rounds are recorded: the run records the fault, re-creates the
  host actors on the head alone (half a CPU each: the head has one) and finishes;
- its records — rounds 1-2 from both nodes, the others from the head — equal those of
  an undisturbed in-process run of the same scenario (the local backend gives the
  records Ray gives), but for the columns that measure the machine and ``faults``.

Everything is stopped by PID at the end; ``ray stop`` is never used.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.cluster import FAST_NODE_DEATH, RAY_CLI, LocalCluster
from support.scenarios import TINY, tiny

from mecsim.run.backends import placement, ray_start
from mecsim.run.loop import run
from mecsim.run.setup import RunFailed
from mecsim.store.reader import read_csv_exact
from mecsim.store.session import run_in_folder
from mecsim.testing import assert_same_records

needs_ray_cli = pytest.mark.skipif(not RAY_CLI.exists(), reason="no `ray` command here")

ROUNDS = 5
#: the node is killed once this many rounds are recorded (so in round 3 of 5, 0-based 2)
KILL_AFTER = 2


# --------------------------------------------------------------------------- CPUs per host


@pytest.mark.parametrize(
    "node_cpus, hosts, share",
    [
        ([1, 1], 2, 1.0),  # one host per node
        ([16], 2, 1.0),  # room to spare: never more than one CPU
        ([1], 2, 0.5),  # the worker node died: both hosts on the 1-CPU head
        ([1], 3, 0.3333),  # 1/3, rounded down to Ray's 1/10,000
        ([1, 1], 3, 0.5),  # 2 + 1 (2/3 would hold only one host per node)
        ([1, 2], 4, 0.6666),  # 1 + 3 hosts of 2/3 CPU; 3/4 would hold 1 + 2
        ([4, 0], 3, 1.0),  # a head without CPUs holds no host
    ],
)
def test_cpus_per_host_fit_the_live_nodes(node_cpus, hosts, share) -> None:
    assert placement.host_cpus(node_cpus, hosts) == share
    # the share fits: the nodes hold floor(c / share) hosts each
    assert sum(int(c // share) for c in node_cpus) >= hosts


def test_no_cpu_no_share() -> None:
    with pytest.raises(ValueError, match="no CPU for 2 host actor"):
        placement.host_cpus([0, 0], 2)


@pytest.mark.ray
@pytest.mark.own_ray
@pytest.mark.slow
def test_a_cluster_without_room_stops_the_run_instead_of_hanging(monkeypatch) -> None:
    """Ray with no CPU at all: the run fails after the placement timeout, saying why."""
    import ray

    if ray.is_initialized():  # another test's instance
        ray.shutdown()
    monkeypatch.setattr(placement, "PLACEMENT_TIMEOUT_S", 3.0)
    ray_start.init_on_loopback(
        ray, dict(num_cpus=0, include_dashboard=False, configure_logging=False)
    )
    try:
        started = time.monotonic()
        with pytest.raises(
            RunFailed,
            match=r"no room for 2 host actor\(s\) within 3 s "
            r"\(its live nodes and their CPUs: [0-9a-f]{8}: 0\)",
        ):
            run(tiny(rounds=1, execution={"backend": "ray", "hosts": 2}), "r")
        assert time.monotonic() - started < 60
    finally:
        ray.shutdown()


# --------------------------------------------------------------------------- two nodes


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    work = Path(tempfile.mkdtemp(prefix="mclu", dir="/tmp"))  # short: Ray's socket paths
    c = None
    try:
        c = LocalCluster(work, head_env=FAST_NODE_DEATH)
        c.wait_for_nodes()
        yield c
    finally:
        if c is not None:
            c.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same scenario in-process: the local backend gives the records Ray gives."""
    out = tmp_path_factory.mktemp("ref") / "r"
    run_in_folder(tiny(rounds=ROUNDS), out)
    return out


def _start_run(cluster: LocalCluster, run_id: str) -> tuple[subprocess.Popen, Path]:
    scenario = cluster.work / f"{run_id}.yaml"
    scenario.write_text(
        yaml.safe_dump({**TINY, "rounds": ROUNDS, "execution": {"backend": "ray", "hosts": 2}})
    )
    out = cluster.work / "runs"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mecsim",
            "run",
            str(scenario),
            "--ray-address",
            cluster.address,
            "--out",
            str(out),
            "--run-id",
            run_id,
            "--quiet",
            "--no-plots",
        ],
        env=cluster.driver_env,
        cwd=cluster.work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, out / run_id


def _rounds_done(out: Path) -> int:
    path = out / "rounds.csv"
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


@pytest.mark.ray
@pytest.mark.own_ray
@pytest.mark.slow
@needs_ray_cli
def test_hosts_spread_over_two_nodes_and_a_killed_node_is_survived(
    cluster: LocalCluster, reference: Path
) -> None:
    proc, out = _start_run(cluster, "killed")
    killed: list[int] = []
    placed_first: dict | None = None
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if _rounds_done(out) >= KILL_AFTER:
                # where the hosts ran until now (read before the kill changes it)
                placed_first = json.loads((out / "run.json").read_text())["placement"][0]
                killed = cluster.worker.kill()
                break
            time.sleep(0.02)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed, f"the run ended before round {KILL_AFTER + 1}: {err[-3000:]}"
    assert proc.returncode == 0, err[-3000:]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "finished" and meta["rounds_done"] == ROUNDS

    # until the kill: one host on each node, one CPU each
    first, *after = meta["placement"]
    assert first == placed_first and first["round"] == 0
    assert [h["node_id"] for h in first["hosts"]].count(cluster.head.node_id) == 1
    assert [h["node_id"] for h in first["hosts"]].count(cluster.worker.node_id) == 1
    assert [h["clients"] for h in first["hosts"]] == [[0, 2], [1, 3]]
    assert all(h["node_ip"] == "127.0.0.1" and h["num_cpus"] == 1.0 for h in first["hosts"])

    # the kill is recorded: in round KILL_AFTER, or while checkpointing after round
    # KILL_AFTER - 1 (then counted in the next round's row)
    assert meta["faults"] and meta["faults"][0]["round"] >= KILL_AFTER - 1, meta["faults"]
    rounds = read_csv_exact(out / "rounds.csv")
    assert rounds["faults"].sum() == len(meta["faults"])
    assert rounds.loc[rounds["round"] < KILL_AFTER - 1, "faults"].eq(0).all()
    # after it (each recovery): both hosts on the head, half its one CPU each
    assert after, meta["placement"]
    for placed in after:
        assert placed["round"] >= KILL_AFTER - 1
        assert [h["node_id"] for h in placed["hosts"]] == [cluster.head.node_id] * 2
        assert [h["num_cpus"] for h in placed["hosts"]] == [0.5, 0.5]

    # rounds 1-2 ran on both nodes, the rest on the head: the records are those of an
    # undisturbed in-process run all the same
    assert_same_records(reference, out, ignore=("faults",))
