"""Algorithms by name: each is a (server class, client class) pair.

To add one: write ``agents/algorithms/<name>.py`` with a ServerAlgorithm and a
ClientAlgorithm subclass, and register the pair here. Nothing in the engine or the run
loop changes.
"""

from __future__ import annotations

from agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    ServerAlgorithm,
    TrainConfig,
)
from agents.algorithms.fedavg import FedAvgClient, FedAvgServer
from agents.algorithms.local import LocalClient, LocalServer

ALGORITHMS: dict[str, tuple[type[ServerAlgorithm], type[ClientAlgorithm]]] = {
    "fedavg": (FedAvgServer, FedAvgClient),
    "local": (LocalServer, LocalClient),
}


def algorithm_classes(name: str) -> tuple[type[ServerAlgorithm], type[ClientAlgorithm]]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        known = ", ".join(sorted(ALGORITHMS))
        raise ValueError(f"unknown algorithm {name!r}; known: {known}") from None


__all__ = [
    "ALGORITHMS",
    "AggregateStats",
    "ClientAlgorithm",
    "ClientContext",
    "ClientResult",
    "ClientTask",
    "ServerAlgorithm",
    "TrainConfig",
    "algorithm_classes",
]
