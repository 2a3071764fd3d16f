"""Algorithms by name: each is a (server class, client class) pair.

To add one: write ``agents/algorithms/<name>.py`` with a ServerAlgorithm and a
ClientAlgorithm subclass, and register the pair here. Nothing in the engine or the run
loop changes.
"""

from __future__ import annotations

from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EdgeAlgorithm,
    EdgeReport,
    ServerAlgorithm,
    TrainConfig,
)
from mecsim.agents.algorithms.dcpfl import (
    DCPFLClient,
    DCPFLServer,
    NoDCClient,
    NoDCServer,
    NoLAClient,
    NoLAServer,
)
from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer
from mecsim.agents.algorithms.fedprox import FedProxClient, FedProxServer
from mecsim.agents.algorithms.kapc import KapcBlsClient, KapcBlsServer, KapcClient, KapcServer
from mecsim.agents.algorithms.kmeans_cluster import KMeansClusterClient, KMeansClusterServer
from mecsim.agents.algorithms.local import LocalClient, LocalServer
from mecsim.agents.algorithms.mtfl import MTFLClient, MTFLServer
from mecsim.agents.algorithms.perfedavg import PerFedAvgClient, PerFedAvgServer
from mecsim.agents.algorithms.phsfl import HSFLClient, HSFLServer, PHSFLClient, PHSFLServer

ALGORITHMS: dict[str, tuple[type[ServerAlgorithm], type[ClientAlgorithm]]] = {
    "fedavg": (FedAvgServer, FedAvgClient),
    "fedprox": (FedProxServer, FedProxClient),
    "kapc": (KapcServer, KapcClient),
    "kapc_bls": (KapcBlsServer, KapcBlsClient),
    "local": (LocalServer, LocalClient),
    "mtfl": (MTFLServer, MTFLClient),
    "perfedavg": (PerFedAvgServer, PerFedAvgClient),
    "kmeans_cluster": (KMeansClusterServer, KMeansClusterClient),
    "dcpfl": (DCPFLServer, DCPFLClient),
    "dcpfl_nola": (NoLAServer, NoLAClient),
    "dcpfl_nodc": (NoDCServer, NoDCClient),
    "phsfl": (PHSFLServer, PHSFLClient),
    "hsfl": (HSFLServer, HSFLClient),
}


def algorithm_classes(name: str) -> tuple[type[ServerAlgorithm], type[ClientAlgorithm]]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        known = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"unknown algorithm {name!r}; known: {known}") from None


def run_notes(name: str, params: dict, rows: list[dict]) -> list[str]:
    """The algorithm's warnings about a run from its round rows (see
    :meth:`ServerAlgorithm.run_notes`); none for an unknown algorithm or bad parameters
    (records of another mecsim)."""
    try:
        server_cls, _ = algorithm_classes(name)
        parsed = server_cls.Params(**(params or {}))
    except (ValueError, TypeError):
        return []
    return server_cls.run_notes([dict(r) for r in rows], parsed) if rows else []


__all__ = [
    "ALGORITHMS",
    "AggregateStats",
    "ClientAlgorithm",
    "ClientContext",
    "ClientResult",
    "ClientTask",
    "EdgeAlgorithm",
    "EdgeReport",
    "ServerAlgorithm",
    "TrainConfig",
    "algorithm_classes",
    "run_notes",
]
