"""Partitions of a data set over the clients: IID, Dirichlet(alpha), shards, and
primary/secondary class shares; the test pool split with each client's label proportions."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mecsim.data.datasets import ArrayDataset, DataPools


# ----------------------------------------------------------------------------- partitions
@dataclass(frozen=True, eq=False)
class Partition:
    """Per-client sorted index arrays into ``pools.train`` and ``pools.test``."""

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]

    def label_histograms(self, pools: DataPools) -> tuple[np.ndarray, np.ndarray]:
        """(n_clients x num_classes) label counts of each client's train and test indices."""

        def hist(parts: tuple[np.ndarray, ...], ds: ArrayDataset) -> np.ndarray:
            return np.array(
                [np.bincount(ds.labels[p], minlength=ds.num_classes) for p in parts], dtype=np.int64
            ).reshape(len(parts), ds.num_classes)

        return hist(self.train, pools.train), hist(self.test, pools.test)


def _finish(train: list[np.ndarray], test: list[np.ndarray]) -> Partition:
    as_idx = lambda parts: tuple(np.sort(np.asarray(p, np.int64)) for p in parts)  # noqa: E731
    return Partition(as_idx(train), as_idx(test))


def _check(pools: DataPools, n_clients: int, need: int = 1) -> None:
    if n_clients < 1 or len(pools.train) < n_clients * need:
        raise ValueError(f"cannot split {len(pools.train)} train samples among {n_clients} clients")


def partition_iid(
    pools: DataPools,
    n_clients: int,
    rng: np.random.Generator,
    samples_per_client: int | None = None,
    test_samples_per_client: int | None = None,
) -> Partition:
    """Shuffle each pool and split it into ``n_clients`` parts whose sizes differ by <= 1.

    With ``samples_per_client``, each client instead draws that many train samples (and
    ``test_samples_per_client``, default 1, test samples) uniformly from the pool, without
    replacement within a client: clients may share samples, so a population can be larger
    than the data set (a campus of 10,000 devices on the 10,000 embedded images).
    """
    if samples_per_client is not None:
        test_n = test_samples_per_client or 1
        for ds, k in ((pools.train, samples_per_client), (pools.test, test_n)):
            if k > len(ds):
                raise ValueError(f"samples_per_client {k} exceeds the pool's {len(ds)} samples")
        draw: Callable[[ArrayDataset, int], list[np.ndarray]] = lambda ds, k: [  # noqa: E731
            rng.choice(len(ds), k, replace=False) for _ in range(n_clients)
        ]
        return _finish(draw(pools.train, samples_per_client), draw(pools.test, test_n))
    _check(pools, n_clients)
    split = lambda n: np.array_split(rng.permutation(n), n_clients)  # noqa: E731
    return _finish(split(len(pools.train)), split(len(pools.test)))


def partition_dirichlet(
    pools: DataPools,
    n_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.3,
    min_samples: int = 1,
    max_tries: int = 100,
) -> Partition:
    """Label-skew by Dirichlet proportions (Hsu et al. 2019; KAPC uses alpha in {0.1, 0.3}).

    For each class c, q_c ~ Dir(alpha * 1_n); the shuffled train indices of c are cut at
    ``floor(cumsum(q_c) * n_c)``. The class's test indices are cut at the train cut points
    scaled by ``n_test_c / n_train_c`` (floored), i.e. by the same q_c: each client's test
    count of c is within 1 of its train count times ``n_test_c / n_train_c``, and a client
    with no train sample of c gets no test sample of c. The whole draw is repeated until
    every client has >= ``min_samples`` train samples (at most ``max_tries`` times).
    """
    _check(pools, n_clients, min_samples)
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    ytr, yte = pools.train.labels, pools.test.labels
    for _ in range(max_tries):
        train: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        test: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in range(pools.train.num_classes):
            q = rng.dirichlet(np.full(n_clients, float(alpha)))
            itr = rng.permutation(np.flatnonzero(ytr == c))
            ite = rng.permutation(np.flatnonzero(yte == c))
            frac = np.cumsum(q)[:-1]
            cut_tr = np.minimum(np.floor(frac * len(itr)).astype(np.int64), len(itr))
            cut_te = (
                cut_tr * len(ite) // len(itr)
                if len(itr)
                else np.minimum(np.floor(frac * len(ite)).astype(np.int64), len(ite))
            )
            pairs = zip(np.split(itr, cut_tr), np.split(ite, cut_te), strict=True)
            for k, (a, b) in enumerate(pairs):
                train[k].append(a)
                test[k].append(b)
        if min(sum(len(a) for a in parts) for parts in train) >= min_samples:
            return _finish([np.concatenate(p) for p in train], [np.concatenate(p) for p in test])
    raise ValueError(
        f"dirichlet(alpha={alpha}): no draw in {max_tries} tries gave every one of "
        f"{n_clients} clients >= {min_samples} train samples"
    )


def partition_shards(
    pools: DataPools, n_clients: int, rng: np.random.Generator, shards_per_client: int = 2
) -> Partition:
    """Shards (McMahan et al.; MTFL Sec. 4.1): sort each pool by label (stable), split it
    into ``n_clients * shards_per_client`` near-equal shards and give each client
    ``shards_per_client`` random shard ids, the SAME ids in the train and test pools."""
    n_shards = n_clients * shards_per_client
    _check(pools, n_clients, shards_per_client)
    shards = [
        np.array_split(np.argsort(ds.labels, kind="stable"), n_shards)
        for ds in (pools.train, pools.test)
    ]
    assign = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return _finish(*([np.concatenate([s[i] for i in row]) for row in assign] for s in shards))


def _largest_remainder(p: np.ndarray, total: int) -> np.ndarray:
    raw = p * total
    out = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - out), kind="stable")
    out[order[: total - int(out.sum())]] += 1
    return out


def partition_primary_secondary(
    pools: DataPools,
    n_clients: int,
    rng: np.random.Generator,
    samples_per_client: int | None = None,
    test_samples_per_client: int | None = None,
    primary_range: tuple[float, float] = (0.4, 0.6),
    secondary_range: tuple[float, float] = (0.2, 0.4),
) -> Partition:
    """DC-PFL (Sec. V): each client has a random primary class (share sigma_p ~ U[0.4, 0.6])
    and a distinct random secondary class (sigma_s ~ U[0.2, 0.4]); the rest is spread
    uniformly over the other C - 2 classes. Counts per client and class are rounded by
    largest remainder, so each client gets exactly ``samples_per_client`` train and
    ``test_samples_per_client`` test samples (defaults: half an equal share of the pool,
    ``len(pool) // (2 * n_clients)``). If the total demand for a class exceeds its pool,
    that class's column is scaled down (floor) and those clients get fewer samples.
    Sampling is without replacement within each class.
    """
    ncls = pools.train.num_classes
    if ncls < 3:
        raise ValueError("primary_secondary needs at least 3 classes")
    if primary_range[1] + secondary_range[1] > 1.0:
        raise ValueError("primary_range[1] + secondary_range[1] must be <= 1")
    _check(pools, n_clients)
    props = np.empty((n_clients, ncls))
    for k in range(n_clients):
        prim, sec = rng.choice(ncls, 2, replace=False)
        sp, ss = rng.uniform(*primary_range), rng.uniform(*secondary_range)
        props[k] = (1.0 - sp - ss) / (ncls - 2)
        props[k, prim], props[k, sec] = sp, ss
    out = []
    for ds, size in ((pools.train, samples_per_client), (pools.test, test_samples_per_client)):
        size = len(ds) // (2 * n_clients) if size is None else size
        counts = np.stack([_largest_remainder(p, size) for p in props])
        avail = np.bincount(ds.labels, minlength=ncls)
        c: int | np.intp
        for c in np.flatnonzero(counts.sum(0) > avail):
            counts[:, c] = counts[:, c] * avail[c] // counts[:, c].sum()
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in range(ncls):
            idx = rng.permutation(np.flatnonzero(ds.labels == c))
            for k, chunk in enumerate(
                np.split(idx[: counts[:, c].sum()], np.cumsum(counts[:, c])[:-1])
            ):
                parts[k].append(chunk)
        out.append([np.concatenate(p) for p in parts])
    return _finish(out[0], out[1])


PARTITIONERS: dict[str, Callable[..., Partition]] = {
    "iid": partition_iid,
    "dirichlet": partition_dirichlet,
    "shards": partition_shards,
    "primary_secondary": partition_primary_secondary,
}


def partition(
    pools: DataPools, n_clients: int, method: str, rng: np.random.Generator, **params: Any
) -> Partition:
    """Dispatch to ``partition_<method>`` (see :data:`PARTITIONERS`) with ``params``."""
    if method not in PARTITIONERS:
        raise ValueError(
            f"unknown partition method {method!r}; choose one of {sorted(PARTITIONERS)}"
        )
    return PARTITIONERS[method](pools, n_clients, rng, **params)


def heterogeneity_dkl(
    train_hist: np.ndarray, eps: float = 1e-6, paper_normaliser: bool = False
) -> float:
    """D̄_KL of DC-PFL (Eq. 1-2): the symmetrised KL ``(KL(P_i||P_j) + KL(P_j||P_i)) / 2``
    between the label distributions of clients i and j (natural log), averaged over all
    client pairs i < j, as the paper's text says ("the average ... among all client pairs").

    Eq. 2 as printed normalises the pair sum by 2/n instead of 2/(n(n-1)); pass
    ``paper_normaliser=True`` for that literal form (= (n - 1) x the pair average).
    Distributions are smoothed as ``(P + eps) / (1 + C * eps)`` so that disjoint supports
    (shards, small-alpha Dirichlet) give finite values; ``eps=0`` gives the exact KL
    (possibly ``inf``). One client -> 0.0.
    """
    h = np.asarray(train_hist, dtype=np.float64)
    if h.ndim != 2 or np.any(h < 0) or np.any(h.sum(1) <= 0):
        raise ValueError("train_hist must be (n_clients x n_classes), non-negative, no empty row")
    n, ncls = h.shape
    if n < 2:
        return 0.0
    p = (h / h.sum(1, keepdims=True) + eps) / (1.0 + ncls * eps)
    logp = np.log(np.where(p > 0, p, 1.0))
    # a label some client has and another lacks makes a KL infinite (eps = 0 only)
    if np.any(np.any(p > 0, axis=0) & np.any(p == 0, axis=0)):
        return math.inf
    # sum over pairs i < j of (KL_ij + KL_ji) / 2 = half the sum of KL_ij over i != j,
    # a block of rows at a time: the n x n matrix of 10,000 clients would take 0.8 GB
    self_term = (p * logp).sum(1)
    block = max(1, (1 << 20) // n)
    total = 0.0
    for lo in range(0, n, block):
        kl = self_term[lo : lo + block, None] - p[lo : lo + block] @ logp.T  # KL(P_i || P_j)
        rows = np.arange(kl.shape[0])
        kl[rows, lo + rows] = 0.0
        total += float(kl.sum())
    pair_sum = total / 2.0
    return pair_sum * 2.0 / n if paper_normaliser else pair_sum / (n * (n - 1) / 2)
