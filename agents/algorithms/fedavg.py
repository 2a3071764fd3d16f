"""FedAvg (McMahan et al. 2017): clients train the global model, the server averages.

    w_{t+1} = sum_k (n_k / n) * w_k      (n_k: client k's training samples)

Every floating-point tensor of the model is sent and averaged, BatchNorm running
statistics included. The server folds the uploads into a :class:`WeightedSum` one at a
time, in client-id order: the run loop can then stream them into the aggregate while the
clients are still training (``begin_aggregate`` / ``fold`` / ``end_aggregate``) instead of
holding every update, with the same bits as aggregating them all at once.

Server FLOPs of aggregation are counted as one multiply and one add per element per
client (2 * |w| * K), the count the KAPC paper reports (0.22 GFLOPs for ten ResNet18
updates).
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


class WeightedSum:
    """``sum_k n_k w_k / sum_k n_k``, one vector at a time.

    Each product ``n_k * w_k`` is formed in float64 (exact for float32 ``w_k`` and integer
    ``n_k`` < 2**29) and added to a float64 sum; the division by the total comes once, at
    the end, then the cast to float32. Adding the same vectors in the same order gives the
    same bits whether they came all at once or in parts.
    """

    def __init__(self) -> None:
        self.sum: np.ndarray | None = None
        self.total = 0.0
        self.count = 0

    def add(self, vector: np.ndarray, weight: float) -> None:
        if self.sum is None:
            self.sum = np.zeros(vector.shape, dtype=np.float64)
        self.sum += np.multiply(vector, weight, dtype=np.float64)
        self.total += float(weight)
        self.count += 1

    def result(self) -> np.ndarray:
        if self.sum is None:
            raise ValueError("nothing to average")
        if self.total <= 0:
            raise ValueError("aggregation weights must sum to a positive number")
        return (self.sum / self.total).astype(np.float32)


def aggregation_flops(num_elements: int, num_clients: int) -> float:
    return 2.0 * num_elements * num_clients


class FedAvgServer(ServerAlgorithm):
    name = "fedavg"
    streams_aggregation = True

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        acc = self.begin_aggregate(rnd)
        self.fold(acc, results)
        return self.end_aggregate(rnd, acc)

    def begin_aggregate(self, rnd: int) -> WeightedSum:
        return WeightedSum()

    def fold(self, acc: WeightedSum, results: list[ClientResult]) -> None:
        for r in results:
            if r.weights is not None:
                acc.add(r.weights, r.num_samples)

    def end_aggregate(self, rnd: int, acc: WeightedSum) -> AggregateStats:
        if acc.count == 0:
            return AggregateStats(flops=0.0)
        self.weights = acc.result()
        return AggregateStats(flops=aggregation_flops(self.layout.size, acc.count))


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
