"""Where the host actors go in a Ray cluster: CPUs per host, and waiting for room."""

from __future__ import annotations

import math
import time
from typing import Any

#: How long the host actors may wait for room in the Ray cluster (when a run starts, or
#: after a node died) before the run stops with :class:`PlacementTimeout`.
PLACEMENT_TIMEOUT_S = 120.0


#: Ray counts resources in steps of 1/10,000.
_RAY_RESOURCE_STEP = 10_000


class PlacementTimeout(RuntimeError):
    """The Ray cluster had no room for the host actors within :data:`PLACEMENT_TIMEOUT_S`."""


def host_cpus(node_cpus: list[float], n_hosts: int) -> float:
    """CPUs each of ``n_hosts`` host actors asks for on nodes with ``node_cpus`` CPUs.

    One CPU when the nodes have room for a one-CPU actor per host; otherwise (e.g. after
    a node died) the largest share ``r`` that still fits all of them, a node with ``c`` CPUs
    holding ``floor(c / r)`` hosts: 2 hosts on one surviving 1-CPU node ask for 0.5 each,
    3 hosts on two 1-CPU nodes 0.5 each. Raises ValueError when the nodes have no CPU.
    """

    def fits(r: float) -> bool:
        return sum(math.floor(c / r + 1e-9) for c in node_cpus) >= n_hosts

    shares = {1.0} | {c / k for c in node_cpus if c > 0 for k in range(1, n_hosts + 1)}
    for share in sorted(shares, reverse=True):
        r = math.floor(min(share, 1.0) * _RAY_RESOURCE_STEP) / _RAY_RESOURCE_STEP
        if r > 0 and fits(r):
            return r
    raise ValueError(f"no CPU for {n_hosts} host actor(s) on nodes with {node_cpus} CPUs")


def _alive_node_cpus(ray) -> dict[str, float]:
    """``{node id: CPUs}`` of the cluster's live nodes, as the GCS knows them."""
    return {
        n["NodeID"]: float(n.get("Resources", {}).get("CPU", 0.0))
        for n in ray.nodes()
        if n.get("Alive")
    }


def place_hosts(ray: Any, n_hosts: int) -> tuple[Any, float]:
    """Reserve room for ``n_hosts`` host actors: a SPREAD placement group sized to the live
    nodes, planned again whenever the set of live nodes changes (a node that died is still
    listed as alive for a while), waiting at most :data:`PLACEMENT_TIMEOUT_S`. Returns the
    group and the CPUs each host asks for; raises :class:`PlacementTimeout`."""
    from ray.util.placement_group import (  # deferred: part of Ray (see ensure_ray)
        placement_group,
        remove_placement_group,
    )

    deadline = time.monotonic() + PLACEMENT_TIMEOUT_S
    nodes: dict[str, float] = {}
    while True:
        nodes = _alive_node_cpus(ray)
        try:
            cpus = host_cpus(list(nodes.values()), n_hosts)
        except ValueError:
            cpus = 0.0
        group = placement_group([{"CPU": cpus}] * n_hosts, strategy="SPREAD") if cpus > 0 else None
        while time.monotonic() < deadline:
            if group is not None and group.wait(timeout_seconds=1):
                return group, cpus
            if group is None:
                time.sleep(1)
            if _alive_node_cpus(ray) != nodes:
                break  # a node joined or died: plan again
        if group is not None:
            remove_placement_group(group)
        if time.monotonic() >= deadline:
            break
    seen = ", ".join(f"{node_id[:8]}: {cpus:g}" for node_id, cpus in nodes.items())
    raise PlacementTimeout(
        f"the Ray cluster had no room for {n_hosts} host actor(s) within "
        f"{PLACEMENT_TIMEOUT_S:.0f} s (its live nodes and their CPUs: {seen or 'none'})"
    )
