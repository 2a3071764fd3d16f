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
    rejected: tuple[int, ...] = ()  # clients whose upload held NaN or inf: not aggregated


def _finite(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
    if isinstance(value, float):
        return np.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return not value.is_floating_point() or bool(torch.isfinite(value).all())
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return True


def finite_upload(result: ClientResult) -> bool:
    """Is everything the client uploaded (its weights and any arrays in ``extra``) finite?"""
    return _finite(result.weights) and _finite(result.extra)


class EdgeServer:
    def __init__(self, algorithm: str, layout: ModelLayout, init_weights: np.ndarray,
                 client_samples: dict[int, int], fraction: float, params: dict[str, Any],
                 seed: int, edge_server_of: dict[int, int] | None = None) -> None:
        server_cls, _ = algorithm_classes(algorithm)
        self.algorithm = server_cls(layout, init_weights, client_samples, fraction, params)
        if edge_server_of is not None:  # which edge server serves each client (topology)
            self.algorithm.edge_server_of = dict(edge_server_of)
        self.algorithm.seed = int(seed)
        # selection draws come from their own stream of the scenario seed
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E1EC7]))

    def plan(self, rnd: int) -> tuple[list[int], list[ClientTask]]:
        selected = self.algorithm.select(rnd, self.rng)
        return selected, self.algorithm.configure_fit(rnd, selected)

    def aggregate(self, rnd: int, results: list[ClientResult]) -> AggregateReport:
        """Aggregate the results whose uploads are finite; an update holding any NaN or
        inf (a diverged client) is rejected, never aggregated. With every update
        rejected the algorithm aggregates nothing and its model stays as it was."""
        rejected = tuple(sorted(r.client_id for r in results if not finite_upload(r)))
        kept = [r for r in results if r.client_id not in rejected]
        start = time.perf_counter()
        stats = self.algorithm.aggregate_fit(rnd, sorted(kept, key=lambda r: r.client_id))
        wall = time.perf_counter() - start
        return AggregateReport(stats.flops, wall, self.rss_bytes(), dict(stats.metrics),
                               rejected)

    def aggregate_split(self, rnd: int, results: list[ClientResult],
                        *weights_by_host: dict[int, Any]) -> AggregateReport:
        """:meth:`aggregate` with the uploads delivered apart (see ClientHost.fit_split);
        only the uploads of ``results`` (the clients that made it) are fetched."""
        refs = {cid: w for part in weights_by_host for cid, w in part.items()}
        wanted = [r.client_id for r in results if r.client_id in refs]
        fetched = dict(zip(wanted, self.fetch([refs[c] for c in wanted]), strict=True))
        for r in results:
            r.weights = fetched.get(r.client_id)
        return self.aggregate(rnd, results)

    def fetch(self, uploads: list[Any]) -> list[Any]:
        """The uploads themselves, from what the hosts handed over (a hook: under Ray they
        are object-store references, fetched here as read-only zero-copy arrays)."""
        return uploads

    def state_dict(self, known_blobs: set[str] | None = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The algorithm's state and the selection generator, encoded for a checkpoint:
        (tree, new blobs). With ``known_blobs`` (the digests a checkpoint folder holds),
        large arrays are references, and only those not yet stored come back as blobs."""
        from agents.state import BlobSink, encode

        sink = BlobSink(known_blobs) if known_blobs is not None else None
        tree = encode({"algorithm": self.algorithm.state_dict(), "rng": self.rng}, "server",
                      sink)
        return tree, (sink.new if sink else {})

    def load_state_dict(self, encoded: dict[str, Any]) -> None:
        from agents.state import decode

        state = decode(encoded)
        self.algorithm.load_state_dict(state["algorithm"])
        self.rng = state["rng"]

    def evaluation_tasks(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        return self.algorithm.configure_evaluate(rnd, clients)

    def pid(self) -> int:
        return os.getpid()

    def rss_bytes(self) -> int:
        return int(psutil.Process(os.getpid()).memory_info().rss)
