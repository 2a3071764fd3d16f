"""Datasets and client partitions (the data side of a personalised-FL run).

Datasets are uint8 arrays (N x C x H x W) + int64 labels, made float tensors only where a
model needs them (:func:`normalise`). Nothing is downloaded: the embedded MNIST test set
(``mecsim/_data``) is always there, other datasets are read from files under ``dataset.root``.
Every partitioner gives each client its own train AND test indices drawn from the same client
distribution, so a client's test set matches its own label distribution. All randomness
comes from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import gzip
import io
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

DATASETS = ("mnist-embedded", "mnist-embedded-3x32", "mnist", "fashion-mnist", "cifar10",
            "cifar100")
EMBEDDED_DIR = Path(__file__).resolve().parent / "_data"
NORM_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "mnist-embedded": ((0.1307,), (0.3081,)),
    # MNIST's constants per channel (the zero border makes the true mean ~0.100)
    "mnist-embedded-3x32": ((0.1307,) * 3, (0.3081,) * 3),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_NO_DOWNLOAD = ("datasets cannot be downloaded at run time; put the files on disk and point "
                "`dataset.root` at them")
#: Input shape (C, H, W) and number of classes of each dataset, known without its files.
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "mnist-embedded": ((1, 28, 28), 10),
    "mnist-embedded-3x32": ((3, 32, 32), 10),
    "mnist": ((1, 28, 28), 10),
    "fashion-mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
}


class DatasetError(ValueError):
    """Dataset files that cannot be used (corrupt, wrong shape, not what they claim)."""


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """Images (uint8, N x C x H x W) with int64 labels in ``[0, num_classes)``."""

    images: np.ndarray
    labels: np.ndarray
    num_classes: int
    name: str

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True, eq=False)
class DataPools:
    """Disjoint train and test pools that partitions index into."""

    train: ArrayDataset
    test: ArrayDataset


# ----------------------------------------------------------------------------- readers
def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (gzip-compressed or plain, detected from its content).

    Raises ValueError naming the file if the magic number, dimensions or size are wrong.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DatasetError(f"{path}: corrupt gzip stream ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise DatasetError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DatasetError(f"{path}: IDX body has {len(raw) - header} bytes, dims {dims} "
                         f"need {expected}")
    return np.frombuffer(raw, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def _idx_pair(images: Path, labels: Path, name: str, num_classes: int) -> ArrayDataset:
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise DatasetError(f"{images} / {labels}: shapes {x.shape} and {y.shape} do not match")
    if y.size and not 0 <= y.min() <= y.max() < num_classes:
        raise DatasetError(f"{labels}: labels must be in [0, {num_classes})")
    return ArrayDataset(x[:, None].astype(np.uint8), y.astype(np.int64), num_classes, name)


@lru_cache(maxsize=1)
def load_embedded_mnist() -> ArrayDataset:
    """The embedded official MNIST test set: 10,000 images (1 x 28 x 28), cached, read-only."""
    ds = _idx_pair(EMBEDDED_DIR / "t10k-images-idx3-ubyte.gz",
                   EMBEDDED_DIR / "t10k-labels-idx1-ubyte.gz", "mnist-embedded", 10)
    ds.images.flags.writeable = False
    ds.labels.flags.writeable = False
    return ds


def _missing(name: str, paths: list[Path]) -> FileNotFoundError:
    listed = ", ".join(str(p) for p in paths)
    return FileNotFoundError(f"dataset {name!r}: expected file(s) not found: {listed}; "
                             f"{_NO_DOWNLOAD}")


def _load_idx_dataset(name: str, root: Path) -> tuple[ArrayDataset, ArrayDataset]:
    out = []
    for split in ("train", "t10k"):
        files = []
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            cands = [root / f"{split}-{kind}.gz", root / f"{split}-{kind}"]
            found = [p for p in cands if p.is_file()]
            if not found:
                raise _missing(name, cands)
            files.append(found[0])
        out.append(_idx_pair(files[0], files[1], name, 10))
    return out[0], out[1]


class RefusedPickle(pickle.UnpicklingError):
    """A pickle that asks for a callable the format never contains."""


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR python batch and nothing else.

    A pickle may name any importable callable (``os.system``...) and have it called while
    it loads; this unpickler resolves only what the CIFAR batches need — numpy's array
    reconstruction and dtypes (under numpy 1's and numpy 2's module names) — plus inert
    builtin containers and the codec call that protocol-2 pickles use for bytes, and
    refuses every other name before anything is called. Dicts,
    lists, tuples, strings, bytes and numbers need no name lookup.
    """

    ALLOWED = frozenset({
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
        # bytes in protocol-2 pickles written by Python 3: _codecs.encode(text, "latin1")
        ("_codecs", "encode"),
    })

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise RefusedPickle(f"{module}.{name}")
        return super().find_class(module, name)


def restricted_unpickle(raw: bytes) -> Any:
    """Unpickle ``raw`` with :class:`_CifarUnpickler` (bytes keys and py2 strings stay
    bytes, as the CIFAR batches were written by Python 2)."""
    return _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()


def _unpickle(path: Path) -> dict[Any, Any]:
    try:
        d = restricted_unpickle(path.read_bytes())
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc.strerror})") from None
    except RefusedPickle:
        raise DatasetError(f"{path}: refused: the pickle asks to import a callable that a "
                           "CIFAR batch never contains (nothing was run)") from None
    except Exception as exc:  # a corrupt pickle raises anything; the file's bytes stay unsaid
        raise DatasetError(f"{path}: not a CIFAR python batch (unpickling failed: "
                           f"{type(exc).__name__})") from None
    if not isinstance(d, dict):
        raise DatasetError(f"{path}: not a CIFAR python batch (a {type(d).__name__}, "
                           "not a dict)")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}


def _cifar_arrays(parts: list[dict[Any, Any]], paths: list[Path], key: str,
                  num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for d, path in zip(parts, paths, strict=True):
        data, labels = d.get("data"), d.get(key)
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
                or data.shape[1] != 3 * 32 * 32:
            raise DatasetError(f"{path}: 'data' is not a uint8 array of N x 3072 pixels")
        try:
            y = np.asarray(labels, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise DatasetError(f"{path}: {key!r} is not a list of integer labels") from None
        if y.shape != (data.shape[0],) or (y.size and not 0 <= y.min() <= y.max()
                                           < num_classes):
            raise DatasetError(f"{path}: {key!r} must be {data.shape[0]} labels in "
                               f"[0, {num_classes})")
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _load_cifar(name: str, root: Path) -> tuple[ArrayDataset, ArrayDataset]:
    folder, splits, key, ncls = (
        ("cifar-10-batches-py", ([f"data_batch_{i}" for i in range(1, 6)], ["test_batch"]),
         "labels", 10) if name == "cifar10"
        else ("cifar-100-python", (["train"], ["test"]), "fine_labels", 100))
    base = root if (root / splits[1][0]).is_file() else root / folder
    out = []
    for files in splits:
        paths = [base / f for f in files]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise _missing(name, missing)
        x, y = _cifar_arrays([_unpickle(p) for p in paths], paths, key, ncls)
        out.append(ArrayDataset(x, y, ncls, name))
    return out[0], out[1]


def _take(ds: ArrayDataset, idx: np.ndarray) -> ArrayDataset:
    return ArrayDataset(ds.images[idx], ds.labels[idx], ds.num_classes, ds.name)


def _subsample(ds: ArrayDataset, size: int | None, rng: np.random.Generator | None,
               what: str) -> ArrayDataset:
    if size is None or size == len(ds):
        return ds
    if not 0 < size <= len(ds):
        raise ValueError(f"{ds.name}: {what}_size={size} must be in [1, {len(ds)}]")
    if rng is None:
        raise ValueError(f"{ds.name}: subsampling to {what}_size={size} needs an rng")
    return _take(ds, np.sort(rng.choice(len(ds), size, replace=False)))


def load_dataset(name: str, root: str | Path | None = None, train_size: int | None = None,
                 test_size: int | None = None,
                 rng: np.random.Generator | None = None) -> DataPools:
    """Load train/test pools for ``name`` (one of :data:`DATASETS`).

    ``"mnist-embedded"`` splits the 10,000 embedded images by a seeded shuffle into a train
    pool of ``train_size`` (default 8,000) and a disjoint test pool of ``test_size`` (default
    2,000); ``rng`` is required. Other datasets read local files under ``root`` and are
    subsampled without replacement (``rng`` required then) when a size is given.
    """
    if name == "mnist-embedded-3x32":
        return _as_3x32(load_dataset("mnist-embedded", root, train_size, test_size, rng))
    if name == "mnist-embedded":
        full = load_embedded_mnist()
        n_tr = 8000 if train_size is None else train_size
        n_te = 2000 if test_size is None else test_size
        if n_tr < 1 or n_te < 1 or n_tr + n_te > len(full):
            raise ValueError(f"mnist-embedded: train_size + test_size = {n_tr} + {n_te} must be "
                             f"positive and at most the {len(full)} embedded images")
        if rng is None:
            raise ValueError("mnist-embedded: splitting the embedded set needs an rng")
        perm = rng.permutation(len(full))
        return DataPools(_take(full, np.sort(perm[:n_tr])),
                         _take(full, np.sort(perm[n_tr:n_tr + n_te])))
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {DATASETS}")
    if root is None:
        raise FileNotFoundError(f"dataset {name!r}: no `dataset.root` given; {_NO_DOWNLOAD}")
    root = Path(root).expanduser()
    loader = _load_cifar if name.startswith("cifar") else _load_idx_dataset
    train, test = loader(name, root)
    return DataPools(_subsample(train, train_size, rng, "train"),
                     _subsample(test, test_size, rng, "test"))


def _as_3x32(pools: DataPools) -> DataPools:
    """A stand-in for CIFAR-shaped input (3 x 32 x 32) when CIFAR files are absent: each
    MNIST image zero-padded by 2 pixels on every side (28 -> 32, as LeNet-5 fed MNIST)
    and repeated over 3 channels. Same images and labels, so the same split and partition."""
    def widen(ds: ArrayDataset) -> ArrayDataset:
        x = np.pad(ds.images, ((0, 0), (0, 0), (2, 2), (2, 2)))
        return ArrayDataset(np.repeat(x, 3, axis=1), ds.labels, ds.num_classes,
                            "mnist-embedded-3x32")
    return DataPools(widen(pools.train), widen(pools.test))


def to_float_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 images -> float32 tensor scaled to [0, 1] (same shape)."""
    import torch

    return torch.from_numpy(np.asarray(images, dtype=np.float32) / 255.0)


def normalise(images_uint8: np.ndarray, name: str) -> torch.Tensor:
    """uint8 N x C x H x W -> float32 tensor, scaled to [0, 1] and standardised per channel
    with the constants of dataset ``name`` (:data:`NORM_STATS`)."""
    import torch

    mean, std = NORM_STATS[name]
    x = to_float_tensor(images_uint8)
    shape = (1, len(mean), 1, 1)
    return (x - torch.tensor(mean).view(shape)) / torch.tensor(std).view(shape)


# ----------------------------------------------------------------------------- partitions
@dataclass(frozen=True, eq=False)
class Partition:
    """Per-client sorted index arrays into ``pools.train`` and ``pools.test``."""

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]

    def label_histograms(self, pools: DataPools) -> tuple[np.ndarray, np.ndarray]:
        """(n_clients x num_classes) label counts of each client's train and test indices."""
        def hist(parts: tuple[np.ndarray, ...], ds: ArrayDataset) -> np.ndarray:
            return np.array([np.bincount(ds.labels[p], minlength=ds.num_classes) for p in parts],
                            dtype=np.int64).reshape(len(parts), ds.num_classes)
        return hist(self.train, pools.train), hist(self.test, pools.test)


def _finish(train: list[np.ndarray], test: list[np.ndarray]) -> Partition:
    as_idx = lambda parts: tuple(np.sort(np.asarray(p, np.int64)) for p in parts)  # noqa: E731
    return Partition(as_idx(train), as_idx(test))


def _check(pools: DataPools, n_clients: int, need: int = 1) -> None:
    if n_clients < 1 or len(pools.train) < n_clients * need:
        raise ValueError(f"cannot split {len(pools.train)} train samples among "
                         f"{n_clients} clients")


def partition_iid(pools: DataPools, n_clients: int, rng: np.random.Generator,
                  samples_per_client: int | None = None,
                  test_samples_per_client: int | None = None) -> Partition:
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
                raise ValueError(f"samples_per_client {k} exceeds the pool's {len(ds)} "
                                 "samples")
        draw = lambda ds, k: [rng.choice(len(ds), k, replace=False)  # noqa: E731
                              for _ in range(n_clients)]
        return _finish(draw(pools.train, samples_per_client), draw(pools.test, test_n))
    _check(pools, n_clients)
    split = lambda n: np.array_split(rng.permutation(n), n_clients)  # noqa: E731
    return _finish(split(len(pools.train)), split(len(pools.test)))


def partition_dirichlet(pools: DataPools, n_clients: int, rng: np.random.Generator,
                        alpha: float = 0.3, min_samples: int = 1,
                        max_tries: int = 100) -> Partition:
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
            cut_te = (cut_tr * len(ite) // len(itr) if len(itr)
                      else np.minimum(np.floor(frac * len(ite)).astype(np.int64), len(ite)))
            pairs = zip(np.split(itr, cut_tr), np.split(ite, cut_te), strict=True)
            for k, (a, b) in enumerate(pairs):
                train[k].append(a)
                test[k].append(b)
        if min(sum(len(a) for a in parts) for parts in train) >= min_samples:
            return _finish([np.concatenate(p) for p in train], [np.concatenate(p) for p in test])
    raise ValueError(f"dirichlet(alpha={alpha}): no draw in {max_tries} tries gave every one of "
                     f"{n_clients} clients >= {min_samples} train samples")


def partition_shards(pools: DataPools, n_clients: int, rng: np.random.Generator,
                     shards_per_client: int = 2) -> Partition:
    """Shards (McMahan et al.; MTFL Sec. 4.1): sort each pool by label (stable), split it
    into ``n_clients * shards_per_client`` near-equal shards and give each client
    ``shards_per_client`` random shard ids, the SAME ids in the train and test pools."""
    n_shards = n_clients * shards_per_client
    _check(pools, n_clients, shards_per_client)
    shards = [np.array_split(np.argsort(ds.labels, kind="stable"), n_shards)
              for ds in (pools.train, pools.test)]
    assign = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return _finish(*([np.concatenate([s[i] for i in row]) for row in assign] for s in shards))


def _largest_remainder(p: np.ndarray, total: int) -> np.ndarray:
    raw = p * total
    out = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - out), kind="stable")
    out[order[: total - int(out.sum())]] += 1
    return out


def partition_primary_secondary(
    pools: DataPools, n_clients: int, rng: np.random.Generator,
    samples_per_client: int | None = None, test_samples_per_client: int | None = None,
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
        for c in np.flatnonzero(counts.sum(0) > avail):
            counts[:, c] = counts[:, c] * avail[c] // counts[:, c].sum()
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in range(ncls):
            idx = rng.permutation(np.flatnonzero(ds.labels == c))
            for k, chunk in enumerate(np.split(idx[: counts[:, c].sum()],
                                               np.cumsum(counts[:, c])[:-1])):
                parts[k].append(chunk)
        out.append([np.concatenate(p) for p in parts])
    return _finish(out[0], out[1])


PARTITIONERS: dict[str, Callable[..., Partition]] = {
    "iid": partition_iid,
    "dirichlet": partition_dirichlet,
    "shards": partition_shards,
    "primary_secondary": partition_primary_secondary,
}


def partition(pools: DataPools, n_clients: int, method: str, rng: np.random.Generator,
              **params: Any) -> Partition:
    """Dispatch to ``partition_<method>`` (see :data:`PARTITIONERS`) with ``params``."""
    if method not in PARTITIONERS:
        raise ValueError(f"unknown partition method {method!r}; choose one of "
                         f"{sorted(PARTITIONERS)}")
    return PARTITIONERS[method](pools, n_clients, rng, **params)


def heterogeneity_dkl(train_hist: np.ndarray, eps: float = 1e-6,
                      paper_normaliser: bool = False) -> float:
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
        kl = self_term[lo:lo + block, None] - p[lo:lo + block] @ logp.T  # KL(P_i || P_j)
        rows = np.arange(kl.shape[0])
        kl[rows, lo + rows] = 0.0
        total += float(kl.sum())
    pair_sum = total / 2.0
    return pair_sum * 2.0 / n if paper_normaliser else pair_sum / (n * (n - 1) / 2)
