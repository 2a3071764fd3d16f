"""Where clients and edge servers run: Ray actors, or in-process.

Both executors drive the same plain classes (:class:`agents.host.ClientHost`,
:class:`agents.server.EdgeServer`); Ray is only a thin wrapper around them, so a run
gives the same records with either backend (a test checks it).
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from typing import Any

import numpy as np

from agents.algorithms import ClientResult, ClientTask
from agents.host import ClientHost, HostSetup
from agents.server import AggregateReport, EdgeServer
from mecsim.data import DataPools

ClientData = dict[int, tuple[np.ndarray, np.ndarray]]

#: Ray's switch for "this machine is not part of a cluster": Ray then takes the loopback
#: address as the node's address, and its GCS, raylet, object manager, workers and agents
#: listen on 127.0.0.1 only (checked with psutil in tests/test_ray_security.py).
RAY_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayAttachError(ValueError):
    """The Ray cluster named by ``execution.ray_address`` refused us (bad input: a setting)."""


def _attach(ray, kwargs: dict[str, Any], address: str) -> None:
    """``ray.init`` on an existing cluster; a token-authentication refusal becomes one
    clear line instead of Ray's chained tracebacks."""
    try:
        if _is_loopback_address(address):
            _init_ray_on_loopback(ray, kwargs)
        else:
            ray.init(**kwargs)
    except ConnectionError as exc:
        # Ray wraps the refusal (AuthenticationError: InvalidAuthToken) in a RuntimeError's
        # text, inside the ConnectionError
        chain, cause = [], exc
        while cause is not None and len(chain) < 10:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        if not any("InvalidAuthToken" in text or "AuthenticationError" in text
                   for text in chain):
            raise
        raise RayAttachError(
            f"execution.ray_address: the Ray cluster at {address} refused the connection "
            "(InvalidAuthToken): it uses token authentication; set RAY_AUTH_MODE=token and "
            "give this process the cluster's token (RAY_AUTH_TOKEN_PATH=FILE, RAY_AUTH_TOKEN, "
            "or ~/.ray/auth_token); see the README's Ray section") from None


def _is_loopback_address(address: str) -> bool:
    """Is ``[ray://]HOST:PORT`` on this machine's loopback interface?"""
    import ipaddress
    import socket

    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    try:
        infos = socket.getaddrinfo(host, None)
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
    except (OSError, ValueError):
        return False


def _init_ray_on_loopback(ray, kwargs: dict[str, Any]) -> None:
    """``ray.init`` for a Ray instance of our own, reachable from this machine only (or
    attaching to one on loopback: Ray would otherwise rewrite 127.0.0.1 to the machine's
    network address and look for the head there)."""
    from ray._private import ray_constants

    saved_env = os.environ.get(RAY_SINGLE_MACHINE_ENV)
    saved_const = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[RAY_SINGLE_MACHINE_ENV] = "0"  # inherited by the processes Ray starts
    ray_constants.ENABLE_RAY_CLUSTER = False  # read when this process picks its address
    try:
        ray.init(**kwargs)
    finally:  # later attaches from this process to a real cluster are unaffected
        if saved_env is None:
            os.environ.pop(RAY_SINGLE_MACHINE_ENV, None)
        else:
            os.environ[RAY_SINGLE_MACHINE_ENV] = saved_env
        if saved_const is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_const


class LocalExecutor:
    """Everything in this process: for tests, debugging and profiling."""

    def __init__(self, server_kwargs: dict[str, Any], setup: HostSetup, pools: DataPools,
                 host_clients: list[ClientData]) -> None:
        self.server = EdgeServer(**server_kwargs)
        self.hosts = [ClientHost(setup, pools, clients) for clients in host_clients]
        self.host_of = {cid: h for h, clients in enumerate(host_clients) for cid in clients}

    def _by_host(self, tasks: list[ClientTask]) -> dict[int, list[ClientTask]]:
        grouped: dict[int, list[ClientTask]] = defaultdict(list)
        for task in tasks:
            grouped[self.host_of[task.client_id]].append(task)
        return grouped

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        return self.server.plan(rnd)

    def fit(self, rnd: int, tasks: list[ClientTask]) -> list[ClientResult]:
        out: list[ClientResult] = []
        for h, group in self._by_host(tasks).items():
            out += self.hosts[h].fit(rnd, group)
        return sorted(out, key=lambda r: r.client_id)

    def aggregate(self, rnd: int, results: list[ClientResult]) -> AggregateReport:
        return self.server.aggregate(rnd, results)

    def evaluate(self, rnd: int, clients: list[int]) -> list[tuple[int, float, float, int]]:
        tasks = self.server.evaluation_tasks(rnd, clients)
        out = []
        for h, group in self._by_host(tasks).items():
            out += self.hosts[h].evaluate(rnd, group)
        return sorted(out)

    def host_rss_bytes(self) -> list[int]:
        return [self.hosts[0].rss_bytes()] if self.hosts else []

    def close(self) -> None:
        pass


class RayExecutor(LocalExecutor):
    """Host actors (one CPU each) and an edge-server actor in a Ray cluster."""

    def __init__(self, server_kwargs: dict[str, Any], setup: HostSetup, pools: DataPools,
                 host_clients: list[ClientData], ray_address: str | None = None) -> None:
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            kwargs: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.WARNING,
                                          configure_logging=False, log_to_driver=True)
            if ray_address:
                kwargs["address"] = ray_address
                _attach(ray, kwargs, ray_address)
            else:
                kwargs["num_cpus"] = max(len(host_clients), os.cpu_count() or 1)
                _init_ray_on_loopback(ray, kwargs)
            self._owns_ray = True
        else:
            self._owns_ray = False
        self._ray = ray
        server_actor = ray.remote(num_cpus=0)(EdgeServer)
        host_actor = ray.remote(num_cpus=1)(ClientHost)
        pools_ref = ray.put(pools)
        self.server = server_actor.remote(**server_kwargs)
        self.hosts = [host_actor.remote(setup, pools_ref, clients) for clients in host_clients]
        self.host_of = {cid: h for h, clients in enumerate(host_clients) for cid in clients}
        ray.get(self.server.rss_bytes.remote())  # surface start-up errors here
        ray.get([h.rss_bytes.remote() for h in self.hosts])

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        return self._ray.get(self.server.plan.remote(rnd))

    def fit(self, rnd: int, tasks: list[ClientTask]) -> list[ClientResult]:
        """Results without their weights; the weights stay in the object store."""
        meta_refs, self._weight_refs = [], []
        for h, group in self._by_host(tasks).items():
            meta, weights = self.hosts[h].fit_split.options(num_returns=2).remote(rnd, group)
            meta_refs.append(meta)
            self._weight_refs.append(weights)
        out = [r for part in self._ray.get(meta_refs) for r in part]
        return sorted(out, key=lambda r: r.client_id)

    def aggregate(self, rnd: int, results: list[ClientResult]) -> AggregateReport:
        refs, self._weight_refs = self._weight_refs, []
        return self._ray.get(self.server.aggregate_split.remote(rnd, results, *refs))

    def evaluate(self, rnd: int, clients: list[int]) -> list[tuple[int, float, float, int]]:
        tasks = self._ray.get(self.server.evaluation_tasks.remote(rnd, clients))
        refs = [self.hosts[h].evaluate.remote(rnd, g) for h, g in self._by_host(tasks).items()]
        return sorted(x for part in self._ray.get(refs) for x in part)

    def host_rss_bytes(self) -> list[int]:
        return self._ray.get([h.rss_bytes.remote() for h in self.hosts])

    def close(self) -> None:
        for actor in [self.server, *self.hosts]:
            self._ray.kill(actor)
        if self._owns_ray:
            self._ray.shutdown()
