"""The edge server: holds the algorithm's server state, plans rounds and aggregates.

Plain class; :mod:`mecsim.execution` runs it as a Ray actor (its own process, so its
resident memory is the server's memory, measured with psutil as the KAPC paper does) or
in-process for tests.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from agents.algorithms import ClientResult, ClientTask, algorithm_classes
from agents.models import ModelLayout


@dataclass(frozen=True)
class AggregateReport:
    flops: float
    wall_s: float  # measured host seconds of the aggregation
    rss_bytes: int  # resident memory of the server process after aggregating
    metrics: dict[str, float]  # the algorithm's own per-round figures


class EdgeServer:
    def __init__(self, algorithm: str, layout: ModelLayout, init_weights: np.ndarray,
                 client_samples: dict[int, int], fraction: float, params: dict[str, Any],
                 seed: int, edge_server_of: dict[int, int] | None = None) -> None:
        server_cls, _ = algorithm_classes(algorithm)
        self.algorithm = server_cls(layout, init_weights, client_samples, fraction, params)
        if edge_server_of is not None:  # which edge server serves each client (topology)
            self.algorithm.edge_server_of = dict(edge_server_of)
        # selection draws come from their own stream of the scenario seed
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E1EC7]))

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        selected = self.algorithm.select(rnd, self.rng)
        return selected, self.algorithm.configure_fit(rnd, selected)

    def aggregate(self, rnd: int, results: list[ClientResult]) -> AggregateReport:
        start = time.perf_counter()
        stats = self.algorithm.aggregate_fit(rnd, sorted(results, key=lambda r: r.client_id))
        wall = time.perf_counter() - start
        return AggregateReport(stats.flops, wall, self.rss_bytes(), dict(stats.metrics))

    def aggregate_split(self, rnd: int, results: list[ClientResult],
                        *weights_by_host: dict[int, np.ndarray]) -> AggregateReport:
        """:meth:`aggregate` with the uploads delivered apart (see ClientHost.fit_split)."""
        weights = {cid: w for part in weights_by_host for cid, w in part.items()}
        for r in results:
            r.weights = weights.get(r.client_id)
        return self.aggregate(rnd, results)

    def evaluation_tasks(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        return self.algorithm.configure_evaluate(rnd, clients)

    def rss_bytes(self) -> int:
        return int(psutil.Process(os.getpid()).memory_info().rss)
