"""Fixed clusters by k-means on model weights, in the spirit of ClusterFL (Ouyang et al.).

DC-PFL's fixed-cluster baseline (Sec. V, "ClusterFL: clusters clients by K-means"). This is
NOT ClusterFL itself (which learns its cluster structure jointly with the models and
trains with a cluster-wise regulariser); it is the simplest fixed-cluster scheme:

1. Warm-up: ``warmup_rounds`` rounds of FedAvg on one global model.
2. At the end of the warm-up, the uploaded client models (flat state vectors) are
   clustered by k-means (``scipy.cluster.vq.kmeans2``, k-means++ initialisation, ``clusters``
   groups) and the clusters are fixed for the rest of the run.
3. Afterwards, FedAvg within each cluster: every client downloads its cluster model,
   trains it and uploads it; the server averages per cluster (sample-weighted).

Each client is evaluated on its cluster's model. An empty k-means cluster is dropped (the
run then has fewer groups; ``groups`` in the records says how many). The k-means seed
is drawn from the server's seeded selection stream (one owner of randomness).
"""

from __future__ import annotations

import warnings
from typing import cast

import numpy as np
from pydantic import Field
from scipy.cluster.vq import kmeans2

from mecsim.agents.algorithms.base import AggregateStats, ClientResult, ClientTask, NoParams
from mecsim.agents.algorithms.fedavg import (
    FedAvgClient,
    FedAvgServer,
    aggregation_flops,
    weighted_average,
)


class KMeansClusterParams(NoParams):
    warmup_rounds: int = Field(5, ge=1, description="FedAvg rounds before clustering")
    clusters: int = Field(5, ge=1, description="k of k-means")
    kmeans_iterations: int = Field(20, ge=1, description="k-means iterations")


def kmeans_flops(dim: int, points: int, k: int, iterations: int) -> float:
    """FLOPs of :func:`kmeans_labels` (``scipy.cluster.vq.kmeans2`` with ``minit="++"``):

    * k-means++ seeding: the i-th centre (i = 1 .. k-1) computes the squared distance of
      every point to the i centres chosen so far (``cdist``, sqeuclidean: subtract,
      square, add = 3 per element): 3 * dim * points * k (k - 1) / 2;
    * each iteration: every point's squared distance to every centre (``vq``, 3 per
      element: 3 * dim * points * k), then the centres as their members' means (one add per
      element per point, one division per element per centre: dim * (points + k)).
    """
    seeding = 3.0 * dim * points * k * (k - 1) / 2
    per_iteration = 3.0 * dim * points * k + dim * (points + k)
    return seeding + iterations * per_iteration


def kmeans_labels(weights: np.ndarray, k: int, iterations: int, seed: int) -> np.ndarray:
    """Canonical cluster labels (0, 1, ... by first member) of the rows of ``weights``."""
    weights = np.asarray(weights)
    if weights.ndim != 2 or len(weights) == 0:
        raise ValueError("weights must be a non-empty (clients x dim) matrix")
    if not 1 <= k <= len(weights):
        raise ValueError(f"clusters={k} must be between 1 and the {len(weights)} clients")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "one of the clusters is empty": handled below
        _, raw = kmeans2(weights, k, iter=iterations, minit="++", seed=np.random.default_rng(seed))
    first: dict[int, int] = {}
    return np.array([first.setdefault(int(x), len(first)) for x in raw], dtype=np.int64)


class KMeansClusterServer(FedAvgServer):
    name = "kmeans_cluster"
    personalised_downloads = True  # see ServerAlgorithm
    Params = KMeansClusterParams
    params: KMeansClusterParams
    round_metrics = ("groups",)

    @classmethod
    def check_scenario(cls, params, *, train, model, layout, clients, participation):
        problems = []
        if participation < 1.0:
            problems.append(
                (
                    "topology.participation",
                    f"{cls.name} clusters every client at "
                    "the end of the warm-up and needs topology.participation: 1, "
                    f"got {participation:g}",
                )
            )
        if params.clusters > clients:
            problems.append(
                (
                    "algorithm.params.clusters",
                    f"k-means with {params.clusters} "
                    f"clusters needs at least as many clients, got {clients}",
                )
            )
        return problems

    def __init__(self, layout, init_weights, client_samples, fraction, params) -> None:
        super().__init__(layout, init_weights, client_samples, fraction, params)
        if fraction < 1.0:
            raise ValueError(
                f"{self.name} clusters every client at the end of the warm-up "
                f"and needs topology.participation = 1, got {fraction}"
            )
        self.labels: dict[int, int] | None = None
        self.cluster_models: dict[int, np.ndarray] = {}
        self._seed = 0

    def select(self, rnd: int, rng: np.random.Generator) -> list[int]:
        if rnd == self.params.warmup_rounds - 1:
            self._seed = int(rng.integers(2**31))
        return super().select(rnd, rng)

    def _model_of(self, client: int) -> np.ndarray:
        if self.labels is None:
            return self.weights
        # a cluster none of whose clients has uploaded since it was formed: the global model
        return self.cluster_models.get(self.labels[client], self.weights)

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        return [ClientTask(c, self._model_of(c), self.layout.nbytes) for c in selected]

    def models(self) -> dict[str, np.ndarray]:
        """The global model and every cluster's (what clients download)."""
        clusters = {f"cluster {g}": m for g, m in self.cluster_models.items()}
        return {"weights": self.weights, **clusters}

    def configure_evaluate(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        return [ClientTask(c, self._model_of(c), 0) for c in clients]

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        uploads = [r for r in results if r.weights is not None]
        flops = aggregation_flops(self.layout.size, len(uploads))
        if self.labels is None:
            stats = super().aggregate_fit(rnd, results)
            if rnd == self.params.warmup_rounds - 1:
                p = self.params
                # a client whose last warm-up upload did not make it (a deadline, a fault,
                # a NaN the guard rejected) is clustered by the global model it would have
                # started from: the one this round's aggregation just made
                order = [r.client_id for r in uploads]
                missing = sorted(set(self.client_samples) - set(order))
                vectors = [cast(np.ndarray, r.weights) for r in uploads]
                vectors += [self.weights] * len(missing)
                labels = kmeans_labels(
                    np.stack(vectors), p.clusters, p.kmeans_iterations, self._seed
                )
                self.labels = {c: int(g) for c, g in zip(order + missing, labels, strict=True)}
                self._average_clusters(uploads)
                # FedAvg's average, k-means over every client, then the cluster averages
                # (a multiply and an add per element per upload)
                flops = (
                    stats.flops
                    + kmeans_flops(self.layout.size, len(vectors), p.clusters, p.kmeans_iterations)
                    + aggregation_flops(self.layout.size, len(uploads))
                )
            return AggregateStats(flops=flops, metrics={"groups": float(self._groups())})
        self._average_clusters(uploads)
        return AggregateStats(flops=flops, metrics={"groups": float(self._groups())})

    def _average_clusters(self, uploads: list[ClientResult]) -> None:
        by_cluster: dict[int, list[ClientResult]] = {}
        assert self.labels is not None  # called once the clusters are formed
        for r in uploads:
            by_cluster.setdefault(self.labels[r.client_id], []).append(r)
        for g, rs in by_cluster.items():
            self.cluster_models[g] = weighted_average(
                cast("list[np.ndarray]", [r.weights for r in rs]), [r.num_samples for r in rs]
            )

    def _groups(self) -> int:
        return 1 if self.labels is None else len(set(self.labels.values()))


class KMeansClusterClient(FedAvgClient):
    """Trains the downloaded cluster model, as a FedAvg client does."""

    name = "kmeans_cluster"
    Params = KMeansClusterParams


#: registered as ``kmeans_cluster`` (:data:`mecsim.registry.ALGORITHMS`)
KMEANS_CLUSTER = (KMeansClusterServer, KMeansClusterClient)
