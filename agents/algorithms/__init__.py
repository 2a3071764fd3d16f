"""The algorithms: each is a (server class, client class) pair, found by name.

Each module defines its classes and a ``(server, client)`` pair named in
:data:`mecsim.registry.ALGORITHMS` (e.g. ``fedavg.FEDAVG``); :func:`algorithm_classes`
looks a name up there. To add one: write ``agents/algorithms/<name>.py`` with a
:class:`ServerAlgorithm` and a :class:`ClientAlgorithm` subclass and the pair, and add
its import string to the registry. Nothing in the engine or the run loop changes.
"""

from __future__ import annotations

from mecsim.agents.algorithms.base import (
    ROUND_STAGE,
    AggregateStats,
    AlgorithmError,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EdgeAlgorithm,
    EdgeReport,
    ServerAlgorithm,
    TrainConfig,
)
from mecsim.registry import ALGORITHMS, algorithm


def algorithm_classes(name: str) -> tuple[type[ServerAlgorithm], type[ClientAlgorithm]]:
    """The (server class, client class) of algorithm ``name``; ValueError (listing the
    known ones) for an unknown name."""
    return algorithm(name)


def algorithm_names() -> list[str]:
    """Every algorithm a scenario may name, sorted."""
    return ALGORITHMS.names()


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
    "AggregateStats",
    "AlgorithmError",
    "ClientAlgorithm",
    "ClientContext",
    "ClientResult",
    "ClientTask",
    "ROUND_STAGE",
    "EdgeAlgorithm",
    "EdgeReport",
    "ServerAlgorithm",
    "TrainConfig",
    "algorithm_classes",
    "algorithm_names",
    "run_notes",
]
