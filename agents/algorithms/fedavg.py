"""FedAvg (McMahan et al. 2017): clients train the global model, the server averages.

    w_{t+1} = sum_k (n_k / n) * w_k      (n_k: client k's training samples)

Every floating-point tensor of the model is sent and averaged, BatchNorm running
statistics included. The server folds the uploads into a :class:`WeightedSum` one at a
time, in client-id order: the run loop can then stream them into the aggregate while the
clients are still training (``begin_aggregate`` / ``fold`` / ``end_aggregate``) instead of
holding every update, with the same bits as aggregating them all at once.

Server FLOPs of aggregation are counted from what :class:`WeightedSum` computes: one
multiply and one add per element per client, and one division per element at the end
(2 * |w| * K + |w|, :func:`weighted_sum_flops`). For ten ResNet18 updates (|w| = 11.17 M)
that is 0.235 GFLOPs; the KAPC paper reports 0.22 (2 * |w| * K, without the division).
:func:`weighted_average`, which the other algorithms use, folds the division into the
weights: 2 * |w| * K (:func:`aggregation_flops`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import numpy as np
import torch

from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    ServerAlgorithm,
    all_finite,
    local_sgd,
    trained_result,
)
from mecsim.agents.models import get_flat, set_flat


def weighted_average(
    vectors: Sequence[np.ndarray], weights: Sequence[float] | np.ndarray
) -> np.ndarray:
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


#: Elements per block of :meth:`WeightedSum.add_many`: the block of the float64 sum, a
#: float64 product buffer and a block of one upload stay in a core's L2 cache (640 KiB)
#: while every upload's block is added to it. On the 2-core machine (1 MiB of L2 a core)
#: 100 2NN uploads folded in 10.6-12.1 ms at 32,768 against 12.1-13.8 ms at 65,536 (1.3
#: MiB, more than L2); at 8,192 the per-block Python work doubles the time. The block
#: size does not change the result: every element's additions come in the same order.
FOLD_BLOCK_ELEMENTS = 32_768


#: Threads that fold a part's uploads (each its own share of the element blocks).
FOLD_THREADS = min(4, os.cpu_count() or 1)
_POOL: ThreadPoolExecutor | None = None


def _fold_pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(FOLD_THREADS, thread_name_prefix="mecsim-fold")
    return _POOL


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it makes a pool of its own."""
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


class WeightedSum:
    """``sum_k n_k w_k / sum_k n_k``, one vector at a time.

    Each product ``n_k * w_k`` is formed in float64 (exact for float32 ``w_k`` and integer
    ``n_k`` < 2**29) and added to a float64 sum; the division by the total comes once, at
    the end, then the cast to float32. Adding the same vectors in the same order gives the
    same bits whether they came all at once, in parts, one by one (:meth:`add`) or a
    part at a time (:meth:`add_many`): every element's additions come in the same order.
    """

    def __init__(self) -> None:
        self.sum: np.ndarray | None = None
        self.total = 0.0
        self.count = 0

    def _start(self, shape: tuple[int, ...]) -> np.ndarray:
        if self.sum is None:
            self.sum = np.zeros(shape, dtype=np.float64)
        return self.sum

    def add(self, vector: np.ndarray, weight: float) -> None:
        self._start(vector.shape)
        self.sum += np.multiply(vector, weight, dtype=np.float64)
        self.total += float(weight)
        self.count += 1

    def add_many(self, vectors: Sequence[np.ndarray], weights: Sequence[float]) -> list[int]:
        """Add the vectors whose elements are all finite, in order; returns the positions
        of the others (NaN or inf), which are left out.

        Element block by element block (:data:`FOLD_BLOCK_ELEMENTS`), every vector's block
        is added while the sum's block stays in cache: each vector is read once, instead of
        a pass over the whole sum per vector. Finiteness is read off the sum: a NaN or inf
        in any vector leaves its element of the sum non-finite (the sum of finite float32
        products cannot overflow float64), and only then are the vectors checked one by
        one and the part added again, from the sum as it was, without the bad ones.
        """
        if len(vectors) == 0:
            return []
        total = self._start(vectors[0].shape).reshape(-1)
        flat = [np.asarray(v).reshape(-1) for v in vectors]
        if any(v.shape != total.shape for v in flat):
            raise ValueError("vectors of different sizes cannot be summed")
        before = total.copy()
        bad: list[int] = []
        if not self._add_blocks(total, flat, weights):
            total[...] = before
            bad = [i for i, v in enumerate(flat) if not np.isfinite(v).all()]
            keep = [i for i in range(len(flat)) if i not in bad]
            self._add_blocks(total, [flat[i] for i in keep], [weights[i] for i in keep])
        for i, w in enumerate(weights):
            if i not in bad:
                self.total += float(w)
                self.count += 1
        return bad

    @staticmethod
    def _add_blocks(total: np.ndarray, vectors: list[np.ndarray], weights: Sequence[float]) -> bool:
        """total += sum_k w_k v_k, each product in float64 as in :meth:`add`, in the
        vectors' order; True when the result is finite.

        When every product is exact (:func:`_exact_products`: float32 vectors, integer
        weights), each vector is added whole by torch (``total.add_(v, alpha=w)``: cast,
        multiply and add in one pass over the vector, on :data:`FOLD_THREADS` threads):
        an exact product gives the same rounded sum whether or not the multiply and add
        are fused, so the bits are those of the numpy path below, ~2x faster (100 2NN
        uploads: ~7 ms against 13-18 ms on the 2-core machine). Otherwise, block by
        block, the blocks shared among :data:`FOLD_THREADS` threads (numpy lets go of
        the GIL while it computes): each element is still summed by one thread, in the
        vectors' order."""
        if _exact_products(vectors, weights):
            return _add_whole(total, vectors, weights)
        starts = list(range(0, total.size, FOLD_BLOCK_ELEMENTS))

        def fold(mine: list[int]) -> bool:
            finite = True
            product = np.empty(min(FOLD_BLOCK_ELEMENTS, total.size), dtype=np.float64)
            for start in mine:
                block = total[start : start + FOLD_BLOCK_ELEMENTS]
                out = product[: block.size]
                for v, w in zip(vectors, weights, strict=True):
                    np.multiply(
                        v[start : start + FOLD_BLOCK_ELEMENTS], w, out=out, dtype=np.float64
                    )
                    block += out
                finite = finite and bool(np.isfinite(block).all())
            return finite

        threads = min(FOLD_THREADS, len(starts))
        if threads <= 1 or len(vectors) < 2:
            return fold(starts)
        # every thread's result is waited for (a list, not all()'s short cut): the caller
        # may restore the sum at once when one of them saw a non-finite block
        done = list(_fold_pool().map(fold, [starts[i::threads] for i in range(threads)]))
        return all(done)

    def result(self) -> np.ndarray:
        if self.sum is None:
            raise ValueError("nothing to average")
        if self.total <= 0:
            raise ValueError("aggregation weights must sum to a positive number")
        return (self.sum / self.total).astype(np.float32)


#: |weight| below which the float64 product of an integer weight and a float32 element is
#: exact (a 24-bit significand times a weight of at most 29 bits fits float64's 53 bits).
EXACT_WEIGHT_LIMIT = 2**29


def _exact_products(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> bool:
    """Whether every ``w_k * v_k`` is exact in float64: float32 vectors, integer weights
    of magnitude below :data:`EXACT_WEIGHT_LIMIT` (a sample count is one)."""
    return all(v.dtype == np.float32 for v in vectors) and all(
        float(w).is_integer() and abs(float(w)) < EXACT_WEIGHT_LIMIT for w in weights
    )


def _add_whole(total: np.ndarray, vectors: Sequence[np.ndarray], weights: Sequence[float]) -> bool:
    """total += sum_k w_k v_k with torch, vector by vector (see
    :meth:`WeightedSum._add_blocks`); True when the result is finite."""
    threads = torch.get_num_threads()
    acc = torch.from_numpy(total)
    try:
        torch.set_num_threads(FOLD_THREADS)
        with warnings.catch_warnings():
            # an upload read in place from shared memory is read-only; torch only reads it
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            for v, w in zip(vectors, weights, strict=True):
                acc.add_(torch.from_numpy(v), alpha=float(w))
        return bool(torch.isfinite(acc).all())
    finally:
        torch.set_num_threads(threads)


def aggregation_flops(num_elements: int, num_clients: int) -> float:
    """FLOPs of :func:`weighted_average` over ``num_clients`` vectors: per element and
    vector one multiply (``(w / total) * v``, the scalar ``w / total`` once per vector)
    and one add (``acc +=``)."""
    return 2.0 * num_elements * num_clients


def weighted_sum_flops(num_elements: int, num_clients: int) -> float:
    """FLOPs of :class:`WeightedSum` over ``num_clients`` vectors and its
    :meth:`~WeightedSum.result`: per element and vector one multiply (``n_k * w_k``) and one
    add, then one division per element (``sum / total``)."""
    if num_clients == 0:
        return 0.0
    return 2.0 * num_elements * num_clients + num_elements


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
        uploads = [r for r in results if r.weights is not None]
        bad = acc.add_many(
            cast("list[np.ndarray]", [r.weights for r in uploads]), [r.num_samples for r in uploads]
        )
        if bad:
            raise ValueError(
                f"non-finite uploads of clients {[uploads[i].client_id for i in bad]}"
                " reached the aggregation"
            )

    def fold_finite(self, acc: WeightedSum, results: list[ClientResult]) -> list[int]:
        """:meth:`fold`, reading each upload once: the finiteness of the weights is checked
        by :meth:`WeightedSum.add_many` while it adds them."""
        rejected = [r.client_id for r in results if not all_finite(r.extra)]
        uploads = [r for r in results if r.weights is not None and r.client_id not in rejected]
        bad = acc.add_many(
            cast("list[np.ndarray]", [r.weights for r in uploads]), [r.num_samples for r in uploads]
        )
        return sorted(rejected + [uploads[i].client_id for i in bad])

    def end_aggregate(self, rnd: int, acc: WeightedSum) -> AggregateStats:
        if acc.count == 0:
            return AggregateStats(flops=0.0)
        self.weights = acc.result()
        return AggregateStats(flops=weighted_sum_flops(self.layout.size, acc.count))


class FedAvgClient(ClientAlgorithm):
    name = "fedavg"
    keeps_no_state = True  # trains from the global model every round
    compressible_uploads = True  # the whole model, one Upload (docs/compressors.md)

    def extra_loss(self, ctx: ClientContext, task: ClientTask):
        """Hook for regularised variants (FedProx): a term added to every step's loss."""
        return None

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        # cast: FedAvg's server sends every client the model
        set_flat(ctx.model, ctx.layout, cast(np.ndarray, task.weights))
        stats = local_sgd(ctx, extra_loss=self.extra_loss(ctx, task), cost_key=self.name)
        # straight into the host's upload buffer, unless a subclass's fit may keep the
        # weights (FedProx keeps them as its local model)
        out = ctx.upload_row() if type(self).fit is FedAvgClient.fit else None
        weights = get_flat(ctx.model, ctx.layout, out=out)
        up = ctx.layout.nbytes
        return trained_result(
            ctx,
            stats,
            weights=weights,
            upload_nbytes=up,
            download_nbytes=task.download_nbytes,
            started_at=start,
        )


#: registered as ``fedavg`` (:data:`mecsim.registry.ALGORITHMS`)
FEDAVG = (FedAvgServer, FedAvgClient)
