"""FedAvg (McMahan et al. 2017): clients train the global model, the server averages.

    w_{t+1} = sum_k (n_k / n) * w_k      (n_k: client k's training samples)

Every floating-point tensor of the model is sent and averaged, BatchNorm running
statistics included. Server FLOPs of aggregation are counted as one multiply and one add
per element per client (2 * |w| * K), the count the KAPC paper reports (0.22 GFLOPs for
ten ResNet18 updates).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    ServerAlgorithm,
    local_sgd,
    trained_result,
)
from agents.models import get_flat, set_flat


def weighted_average(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """sum_k w_k v_k / sum_k w_k, accumulated in float64, in the given order."""
    if len(vectors) == 0:
        raise ValueError("nothing to average")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must sum to a positive number")
    acc = np.zeros_like(vectors[0], dtype=np.float64)
    for v, w in zip(vectors, weights, strict=False):
        acc += (w / total) * v
    return acc.astype(np.float32)


def aggregation_flops(num_elements: int, num_clients: int) -> float:
    return 2.0 * num_elements * num_clients


class FedAvgServer(ServerAlgorithm):
    name = "fedavg"

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        uploads = [r for r in results if r.weights is not None]
        if not uploads:
            return AggregateStats(flops=0.0)
        self.weights = weighted_average([r.weights for r in uploads],
                                        [r.num_samples for r in uploads])
        return AggregateStats(flops=aggregation_flops(self.layout.size, len(uploads)))


class FedAvgClient(ClientAlgorithm):
    name = "fedavg"

    def extra_loss(self, ctx: ClientContext, task: ClientTask):
        """Hook for regularised variants (FedProx): a term added to every step's loss."""
        return None

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        set_flat(ctx.model, ctx.layout, task.weights)
        stats = local_sgd(ctx, extra_loss=self.extra_loss(ctx, task), cost_key=self.name)
        weights = get_flat(ctx.model, ctx.layout)
        up = ctx.layout.nbytes
        return trained_result(ctx, stats, weights=weights, upload_nbytes=up,
                              download_nbytes=task.download_nbytes, started_at=start)
