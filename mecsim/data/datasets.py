"""Datasets and client partitions (the data side of a personalised-FL run).

Datasets are uint8 arrays (N x C x H x W) + int64 labels, made float tensors only where a
model needs them (:func:`normalise`). Nothing is downloaded: the embedded MNIST test set
(``mecsim/data/_data``) is always there, other datasets are read from files under ``dataset.root``.
Every partitioner gives each client its own train AND test indices drawn from the same client
distribution, so a client's test set matches its own label distribution. All randomness
comes from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import gzip
import io
import pickle
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import mecsim.registry as registry

if TYPE_CHECKING:  # pragma: no cover
    import torch


DATASETS = (
    "mnist-embedded",
    "mnist-embedded-3x32",
    "mnist",
    "fashion-mnist",
    "cifar10",
    "cifar100",
)


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


_NO_DOWNLOAD = (
    "datasets cannot be downloaded at run time; put the files on disk and point "
    "`dataset.root` at them"
)


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


# ----------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class DatasetSpec:
    """A data set a scenario names (``dataset.name``): an entry of the ``mecsim.datasets``
    entry-point group, mecsim's own included.

    ``load(root)`` returns ``(x_train, y_train, x_test, y_test)``: images N x C x H x W
    (uint8, scaled to [0, 1] before ``mean``/``std`` are applied; or float32, taken as
    they are) and integer labels in ``[0, num_classes)``. ``root`` is the scenario's
    ``dataset.root`` (a :class:`~pathlib.Path`, or None when it gives none); a data set
    that reads files reads them under it, with no code from the data (no pickle but
    :func:`restricted_unpickle`). mecsim subsamples the pools to ``train_size`` /
    ``test_size`` and partitions them over the clients.
    """

    in_shape: tuple[int, int, int]  # (C, H, W) of one input
    num_classes: int
    load: Any = None  # (root: Path | None) -> (x_train, y_train, x_test, y_test)
    mean: tuple[float, ...] | None = None  # per channel, after scaling uint8 to [0, 1]
    std: tuple[float, ...] | None = None
    needs_root: bool = False  # refuse a scenario without dataset.root before it starts
    description: str = ""
    builtin: bool = False  # one of mecsim's own (loaded by :func:`load_dataset` itself)


def _builtin_spec(name: str, description: str, needs_root: bool) -> DatasetSpec:
    in_shape, num_classes = DATASET_SHAPES[name]
    mean, std = NORM_STATS[name]
    return DatasetSpec(in_shape, num_classes, None, mean, std, needs_root, description, True)


MNIST_EMBEDDED = _builtin_spec(
    "mnist-embedded", "the real MNIST test set embedded in mecsim, split into train/test", False
)
MNIST_EMBEDDED_3X32 = _builtin_spec(
    "mnist-embedded-3x32", "mnist-embedded padded to 32x32 over 3 channels (CIFAR-shaped)", False
)
MNIST = _builtin_spec("mnist", "MNIST IDX files under dataset.root", True)
FASHION_MNIST = _builtin_spec("fashion-mnist", "Fashion-MNIST IDX files under dataset.root", True)
CIFAR10 = _builtin_spec("cifar10", "CIFAR-10 python batches under dataset.root", True)
CIFAR100 = _builtin_spec("cifar100", "CIFAR-100 python batches under dataset.root", True)


def dataset_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` a scenario's ``dataset.name`` names (a built-in or a
    plugin); :class:`~mecsim.registry.UnknownName` / :class:`~mecsim.registry.PluginError`."""
    spec = registry.DATASETS.get(name)
    if callable(spec) and not isinstance(spec, DatasetSpec):
        spec = spec()
    if not isinstance(spec, DatasetSpec):
        raise registry.PluginError(
            f"dataset plugin {name!r}: its entry must be a mecsim.api.DatasetSpec (or a "
            f"callable returning one), not {type(spec).__name__}"
        )
    return spec


def dataset_shape(name: str) -> tuple[tuple[int, int, int], int]:
    """(input shape (C, H, W), number of classes) of data set ``name``, without its files."""
    if name in DATASET_SHAPES:
        return DATASET_SHAPES[name]
    spec = dataset_spec(name)
    return tuple(spec.in_shape), int(spec.num_classes)  # type: ignore[return-value]


def norm_stats(name: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Per-channel (mean, std) data set ``name`` is standardised with (None: none)."""
    if name in NORM_STATS:
        return NORM_STATS[name]
    spec = dataset_spec(name)
    if spec.mean is None or spec.std is None:
        return None
    return tuple(spec.mean), tuple(spec.std)


def _plugin_pools(name: str, root: str | Path | None) -> DataPools:
    """Load a plugin data set's pools and check what it returned (shapes, labels, values)."""
    spec = dataset_spec(name)
    if spec.needs_root and root is None:
        raise FileNotFoundError(f"dataset {name!r}: no `dataset.root` given; {_NO_DOWNLOAD}")
    try:
        out = spec.load(None if root is None else Path(root).expanduser())
        x_tr, y_tr, x_te, y_te = (np.asarray(a) for a in out)
    except (DatasetError, FileNotFoundError):
        raise
    except Exception as exc:  # the plugin's own code: one line naming it
        raise DatasetError(
            f"dataset plugin {name!r} failed to load: {type(exc).__name__}: {exc}"
        ) from None
    pools = []
    for what, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if x.ndim != 4 or tuple(x.shape[1:]) != tuple(spec.in_shape):
            raise DatasetError(
                f"dataset plugin {name!r}: {what} images have shape {x.shape}, "
                f"not N x {' x '.join(map(str, spec.in_shape))} (its in_shape)"
            )
        if y.ndim != 1 or len(y) != len(x) or y.dtype.kind not in "iu" or len(y) == 0:
            raise DatasetError(
                f"dataset plugin {name!r}: {what} labels must be N integers (got {y.shape}, "
                f"{y.dtype}) for {len(x)} images"
            )
        if not 0 <= int(y.min()) <= int(y.max()) < spec.num_classes:
            raise DatasetError(
                f"dataset plugin {name!r}: {what} labels must be in [0, {spec.num_classes})"
            )
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise DatasetError(f"dataset plugin {name!r}: {what} images hold NaN or inf")
        if x.dtype != np.uint8:
            x = x.astype(np.float32)
        pools.append(ArrayDataset(x, y.astype(np.int64), int(spec.num_classes), name))
    return DataPools(pools[0], pools[1])


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
        raise DatasetError(
            f"{path}: IDX body has {len(raw) - header} bytes, dims {dims} need {expected}"
        )
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
    ds = _idx_pair(
        EMBEDDED_DIR / "t10k-images-idx3-ubyte.gz",
        EMBEDDED_DIR / "t10k-labels-idx1-ubyte.gz",
        "mnist-embedded",
        10,
    )
    ds.images.flags.writeable = False
    ds.labels.flags.writeable = False
    return ds


def _missing(name: str, paths: list[Path]) -> FileNotFoundError:
    listed = ", ".join(str(p) for p in paths)
    return FileNotFoundError(
        f"dataset {name!r}: expected file(s) not found: {listed}; {_NO_DOWNLOAD}"
    )


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

    ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "bytearray"),
            # bytes in protocol-2 pickles written by Python 3: _codecs.encode(text, "latin1")
            ("_codecs", "encode"),
        }
    )

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
        raise DatasetError(
            f"{path}: refused: the pickle asks to import a callable that a "
            "CIFAR batch never contains (nothing was run)"
        ) from None
    except Exception as exc:  # a corrupt pickle raises anything; the file's bytes stay unsaid
        raise DatasetError(
            f"{path}: not a CIFAR python batch (unpickling failed: {type(exc).__name__})"
        ) from None
    if not isinstance(d, dict):
        raise DatasetError(f"{path}: not a CIFAR python batch (a {type(d).__name__}, not a dict)")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}


def _cifar_arrays(
    parts: list[dict[Any, Any]], paths: list[Path], key: str, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for d, path in zip(parts, paths, strict=True):
        data, labels = d.get("data"), d.get(key)
        if (
            not isinstance(data, np.ndarray)
            or data.dtype != np.uint8
            or data.ndim != 2
            or data.shape[1] != 3 * 32 * 32
        ):
            raise DatasetError(f"{path}: 'data' is not a uint8 array of N x 3072 pixels")
        try:
            y = np.asarray(labels, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise DatasetError(f"{path}: {key!r} is not a list of integer labels") from None
        if y.shape != (data.shape[0],) or (y.size and not 0 <= y.min() <= y.max() < num_classes):
            raise DatasetError(
                f"{path}: {key!r} must be {data.shape[0]} labels in [0, {num_classes})"
            )
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _load_cifar(name: str, root: Path) -> tuple[ArrayDataset, ArrayDataset]:
    folder, splits, key, ncls = (
        (
            "cifar-10-batches-py",
            ([f"data_batch_{i}" for i in range(1, 6)], ["test_batch"]),
            "labels",
            10,
        )
        if name == "cifar10"
        else ("cifar-100-python", (["train"], ["test"]), "fine_labels", 100)
    )
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


def _subsample(
    ds: ArrayDataset, size: int | None, rng: np.random.Generator | None, what: str
) -> ArrayDataset:
    if size is None or size == len(ds):
        return ds
    if not 0 < size <= len(ds):
        raise ValueError(f"{ds.name}: {what}_size={size} must be in [1, {len(ds)}]")
    if rng is None:
        raise ValueError(f"{ds.name}: subsampling to {what}_size={size} needs an rng")
    return _take(ds, np.sort(rng.choice(len(ds), size, replace=False)))


def load_dataset(
    name: str,
    root: str | Path | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    rng: np.random.Generator | None = None,
) -> DataPools:
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
            raise ValueError(
                f"mnist-embedded: train_size + test_size = {n_tr} + {n_te} must be "
                f"positive and at most the {len(full)} embedded images"
            )
        if rng is None:
            raise ValueError("mnist-embedded: splitting the embedded set needs an rng")
        perm = rng.permutation(len(full))
        return DataPools(
            _take(full, np.sort(perm[:n_tr])), _take(full, np.sort(perm[n_tr : n_tr + n_te]))
        )
    if name not in DATASETS:  # a plugin's (mecsim.datasets entry points)
        pools = _plugin_pools(name, root)
        return DataPools(
            _subsample(pools.train, train_size, rng, "train"),
            _subsample(pools.test, test_size, rng, "test"),
        )
    if root is None:
        raise FileNotFoundError(f"dataset {name!r}: no `dataset.root` given; {_NO_DOWNLOAD}")
    root = Path(root).expanduser()
    loader = _load_cifar if name.startswith("cifar") else _load_idx_dataset
    train, test = loader(name, root)
    return DataPools(
        _subsample(train, train_size, rng, "train"), _subsample(test, test_size, rng, "test")
    )


def _as_3x32(pools: DataPools) -> DataPools:
    """A stand-in for CIFAR-shaped input (3 x 32 x 32) when CIFAR files are absent: each
    MNIST image zero-padded by 2 pixels on every side (28 -> 32, as LeNet-5 fed MNIST)
    and repeated over 3 channels. Same images and labels, so the same split and partition."""

    def widen(ds: ArrayDataset) -> ArrayDataset:
        x = np.pad(ds.images, ((0, 0), (0, 0), (2, 2), (2, 2)))
        return ArrayDataset(
            np.repeat(x, 3, axis=1), ds.labels, ds.num_classes, "mnist-embedded-3x32"
        )

    return DataPools(widen(pools.train), widen(pools.test))


def to_float_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 images -> float32 tensor scaled to [0, 1] (same shape)."""
    import torch

    return torch.from_numpy(np.asarray(images, dtype=np.float32) / 255.0)


def normalise(images_uint8: np.ndarray, name: str) -> torch.Tensor:
    """uint8 N x C x H x W -> float32 tensor, scaled to [0, 1] and standardised per channel
    with the constants of dataset ``name`` (:data:`NORM_STATS`)."""
    import torch

    stats = norm_stats(name)
    if images_uint8.dtype != np.uint8:  # a plugin's float images: taken as they are
        x = torch.from_numpy(np.ascontiguousarray(images_uint8, dtype=np.float32))
    else:
        x = to_float_tensor(images_uint8)
    if stats is None:
        return x
    mean, std = stats
    shape = (1, len(mean), 1, 1)
    return (x - torch.tensor(mean).view(shape)) / torch.tensor(std).view(shape)
