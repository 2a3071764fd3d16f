"""Tests for mecsim.data: readers, embedded MNIST, partitioners and D̄_KL."""

from __future__ import annotations

import gzip
import hashlib
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from mecsim.data import (
    EMBEDDED_DIR,
    ArrayDataset,
    DataPools,
    Partition,
    heterogeneity_dkl,
    load_dataset,
    load_embedded_mnist,
    normalise,
    partition,
    partition_shards,
    read_idx,
)

OFFICIAL_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
METHODS = {
    "iid": {},
    "dirichlet": {"alpha": 0.5},
    "shards": {},
    "primary_secondary": {"samples_per_client": 100, "test_samples_per_client": 25},
}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def mnist_pools() -> DataPools:
    return load_dataset("mnist-embedded", rng=rng(123))


def hand_pools(n_classes: int, train_per_class: int, test_per_class: int) -> DataPools:
    """Pools with labels in shuffled order (images irrelevant: zeros)."""

    def ds(per_class: int, seed: int) -> ArrayDataset:
        labels = rng(seed).permutation(np.repeat(np.arange(n_classes), per_class))
        return ArrayDataset(
            np.zeros((len(labels), 1, 2, 2), np.uint8), labels.astype(np.int64), n_classes, "hand"
        )

    return DataPools(ds(train_per_class, 1), ds(test_per_class, 2))


def assert_valid(part: Partition, pools: DataPools, cover: bool = False) -> None:
    """Sorted, int, no index used twice within a pool, all in range; optionally covering."""
    for parts, ds in ((part.train, pools.train), (part.test, pools.test)):
        for p in parts:
            assert p.dtype == np.int64 and np.all(np.diff(p) > 0)
        allidx = np.concatenate(parts)
        assert len(np.unique(allidx)) == len(allidx)
        assert allidx.min(initial=0) >= 0 and allidx.max(initial=0) < len(ds)
        if cover:
            assert len(allidx) == len(ds)


# ----------------------------------------------------------------------------- datasets
def test_embedded_mnist_is_the_official_test_set() -> None:
    ds = load_embedded_mnist()
    assert ds.images.shape == (10000, 1, 28, 28) and ds.images.dtype == np.uint8
    assert ds.labels.shape == (10000,) and ds.labels.dtype == np.int64
    assert ds.num_classes == 10
    assert np.bincount(ds.labels).tolist() == OFFICIAL_COUNTS
    with gzip.open(EMBEDDED_DIR / "t10k-images-idx3-ubyte.gz", "rb") as fh:
        assert hashlib.md5(fh.read()).hexdigest() == "2646ac647ad5339dbf082846283269ea"
    assert load_embedded_mnist() is ds  # cached


def test_embedded_split_sizes_and_disjointness() -> None:
    pools = load_dataset("mnist-embedded", rng=rng(0))
    assert (len(pools.train), len(pools.test)) == (8000, 2000)
    # 8,000 + 2,000 = all 10,000 images: disjoint iff the label counts add up exactly
    total = np.bincount(pools.train.labels, minlength=10) + np.bincount(pools.test.labels)
    assert total.tolist() == OFFICIAL_COUNTS
    small = load_dataset("mnist-embedded", train_size=300, test_size=50, rng=rng(0))
    assert small.train.images.shape == (300, 1, 28, 28) and len(small.test) == 50
    with pytest.raises(ValueError, match="at most the 10000"):
        load_dataset("mnist-embedded", train_size=9000, test_size=1001, rng=rng(0))


def idx_bytes(arr: np.ndarray, code: int) -> bytes:
    dims = np.array(arr.shape, ">u4").tobytes()
    return bytes([0, 0, code, arr.ndim]) + dims + arr.tobytes()


def test_read_idx_plain_gzip_and_bad_files(tmp_path: Path) -> None:
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a-idx3-ubyte").write_bytes(idx_bytes(arr, 0x08))
    (tmp_path / "a-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(arr, 0x08)))
    for name in ("a-idx3-ubyte", "a-idx3-ubyte.gz"):
        out = read_idx(tmp_path / name)
        assert out.shape == (2, 3, 4) and out.dtype == np.uint8
        np.testing.assert_array_equal(out, arr)
    ints = np.array([1, -2, 70000], ">i4")
    (tmp_path / "i.idx").write_bytes(idx_bytes(ints, 0x0C))
    assert read_idx(tmp_path / "i.idx").tolist() == [1, -2, 70000]
    (tmp_path / "bad.gz").write_bytes(gzip.compress(b"\x12\x34\x08\x01" + bytes(8)))
    with pytest.raises(ValueError, match="bad.gz"):
        read_idx(tmp_path / "bad.gz")
    (tmp_path / "short").write_bytes(idx_bytes(arr, 0x08)[:-1])
    with pytest.raises(ValueError, match="short"):
        read_idx(tmp_path / "short")


def test_idx_dataset_from_root_with_subsampling(tmp_path: Path) -> None:
    for split, n in (("train", 6), ("t10k", 4)):
        imgs = np.arange(n * 784, dtype=np.int64).reshape(n, 28, 28).astype(np.uint8)
        (tmp_path / f"{split}-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(idx_bytes(imgs, 0x08))
        )
        (tmp_path / f"{split}-labels-idx1-ubyte").write_bytes(
            idx_bytes(np.arange(n, dtype=np.uint8) % 10, 0x08)
        )
    pools = load_dataset("fashion-mnist", root=tmp_path)
    assert pools.train.images.shape == (6, 1, 28, 28) and pools.test.labels.tolist() == [0, 1, 2, 3]
    sub = load_dataset("fashion-mnist", root=tmp_path, train_size=3, test_size=2, rng=rng(0))
    assert len(sub.train) == 3 and len(sub.test) == 2
    assert len(set(sub.train.labels.tolist())) == 3  # without replacement
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_dataset("mnist", root=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="dataset.root"):
        load_dataset("mnist", root=None)


def write_cifar10(folder: Path) -> None:
    folder.mkdir()
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]):
        data = np.full((2, 3072), i, np.uint8)
        data[:, 1024:2048] = 100 + i  # green channel
        batch = {b"data": data, b"labels": [i, (i + 1) % 10], b"batch_label": b"x"}
        (folder / name).write_bytes(pickle.dumps(batch))


def test_cifar10_reader(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "cifar-10-batches-py")
    for root in (tmp_path, tmp_path / "cifar-10-batches-py"):  # parent or the folder itself
        pools = load_dataset("cifar10", root=str(root))
        assert pools.train.images.shape == (10, 3, 32, 32) and pools.train.images.dtype == np.uint8
        assert pools.test.images.shape == (2, 3, 32, 32)
        assert pools.train.labels.tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
        assert pools.test.labels.tolist() == [5, 6] and pools.train.num_classes == 10
        assert pools.train.images[2, 0, 5, 5] == 1 and pools.train.images[2, 1, 5, 5] == 101
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3") as exc:
        load_dataset("cifar10", root=tmp_path)
    assert "cannot be downloaded" in str(exc.value) and "dataset.root" in str(exc.value)


def test_cifar100_reader(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name, n in (("train", 3), ("test", 2)):
        batch = {
            b"data": np.zeros((n, 3072), np.uint8),
            b"fine_labels": list(range(97, 97 + n)),
            b"coarse_labels": [0] * n,
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    pools = load_dataset("cifar100", root=tmp_path)
    assert pools.train.labels.tolist() == [97, 98, 99] and pools.train.num_classes == 100
    assert pools.test.images.shape == (2, 3, 32, 32)


def test_normalise_constants() -> None:
    x = normalise(np.array([[[[0, 255]]]], np.uint8), "mnist")
    assert x.dtype.is_floating_point and tuple(x.shape) == (1, 1, 1, 2)
    assert x[0, 0, 0, 0].item() == pytest.approx(-0.1307 / 0.3081, rel=1e-6)
    assert x[0, 0, 0, 1].item() == pytest.approx((1 - 0.1307) / 0.3081, rel=1e-6)
    c = normalise(np.zeros((2, 3, 4, 4), np.uint8), "cifar10")
    assert c[1, :, 3, 3].tolist() == pytest.approx(
        [-0.4914 / 0.2470, -0.4822 / 0.2435, -0.4465 / 0.2616], rel=1e-6
    )


# ----------------------------------------------------------------------------- partitions
def test_iid(mnist_pools: DataPools) -> None:
    part = partition(mnist_pools, 7, "iid", rng(3))
    assert_valid(part, mnist_pools, cover=True)
    for parts in (part.train, part.test):
        sizes = [len(p) for p in parts]
        assert len(sizes) == 7 and max(sizes) - min(sizes) <= 1


def test_dirichlet_same_q_for_train_and_test(mnist_pools: DataPools) -> None:
    part = partition(mnist_pools, 10, "dirichlet", rng(4), alpha=0.5)
    assert_valid(part, mnist_pools, cover=True)
    tr, te = part.label_histograms(mnist_pools)
    n_tr, n_te = tr.sum(0), te.sum(0)
    assert n_tr.tolist() == np.bincount(mnist_pools.train.labels).tolist()
    # test cut points are the train cut points scaled by n_test_c / n_train_c (floored)
    assert np.all(np.abs(te - tr * n_te / n_tr) < 1.0)
    assert np.all(te[tr == 0] == 0)


def test_dirichlet_alpha_controls_skew(mnist_pools: DataPools) -> None:
    def mean_max_share(alpha: float) -> float:
        tr, _ = partition(mnist_pools, 20, "dirichlet", rng(5), alpha=alpha).label_histograms(
            mnist_pools
        )
        return float((tr.max(1) / tr.sum(1)).mean())

    assert mean_max_share(0.1) > 0.6
    assert mean_max_share(100.0) < 0.2
    with pytest.raises(ValueError, match="min_samples|train samples"):
        partition(mnist_pools, 50, "dirichlet", rng(0), alpha=0.01, min_samples=150, max_tries=3)


def test_shards_test_classes_equal_train_classes() -> None:
    pools = hand_pools(10, 20, 10)  # 20 shards: train shards of 10, test shards of 5
    part = partition(pools, 10, "shards", rng(6))
    assert_valid(part, pools, cover=True)
    for ptr, pte in zip(part.train, part.test, strict=True):
        assert len(ptr) == 20 and len(pte) == 10  # exactly 2 shards each
        tr_set = set(pools.train.labels[ptr].tolist())
        assert len(tr_set) <= 2
        assert set(pools.test.labels[pte].tolist()) == tr_set
    # with 1 shard per client every client gets exactly one class, and all classes are used
    one = partition_shards(pools, 10, rng(6), shards_per_client=1)
    labels = [set(pools.train.labels[p].tolist()) for p in one.train]
    assert all(len(s) == 1 for s in labels) and set().union(*labels) == set(range(10))


def test_primary_secondary_shares(mnist_pools: DataPools) -> None:
    spc, tspc = 100, 25
    part = partition(
        mnist_pools,
        20,
        "primary_secondary",
        rng(7),
        samples_per_client=spc,
        test_samples_per_client=tspc,
    )
    assert_valid(part, mnist_pools)
    tr, te = part.label_histograms(mnist_pools)
    assert tr.sum(1).tolist() == [spc] * 20 and te.sum(1).tolist() == [tspc] * 20
    srt = np.sort(tr, axis=1)[:, ::-1] / spc
    tol = 1.0 / spc
    assert np.all((srt[:, 0] >= 0.4 - tol) & (srt[:, 0] <= 0.6 + tol))
    assert np.all((srt[:, 1] >= 0.2 - tol) & (srt[:, 1] <= 0.4 + tol))
    rest = (1 - srt[:, 0] - srt[:, 1]) / 8  # the other 8 classes share the rest uniformly
    assert np.all(np.abs(srt[:, 2:] - rest[:, None]) <= tol + 1e-12)


def test_primary_secondary_scales_down_exhausted_classes() -> None:
    pools = hand_pools(3, 10, 10)  # every client wants >= 4 of its primary of 10 per class
    part = partition(
        pools, 6, "primary_secondary", rng(8), samples_per_client=10, test_samples_per_client=10
    )
    assert_valid(part, pools)
    tr, _ = part.label_histograms(pools)
    assert np.all(tr.sum(0) <= 10) and np.all(tr.sum(1) <= 10)


def test_determinism(mnist_pools: DataPools) -> None:
    for method, params in METHODS.items():
        a = partition(mnist_pools, 12, method, rng(42), **params)
        b = partition(mnist_pools, 12, method, rng(42), **params)
        c = partition(mnist_pools, 12, method, rng(43), **params)
        for x, y in ((a.train, b.train), (a.test, b.test)):
            assert all(np.array_equal(p, q) for p, q in zip(x, y, strict=True))
        assert not all(np.array_equal(p, q) for p, q in zip(a.train, c.train, strict=True))
        assert_valid(a, mnist_pools, cover=method in ("iid", "dirichlet", "shards"))
    p1 = load_dataset("mnist-embedded", train_size=100, test_size=10, rng=rng(1))
    p2 = load_dataset("mnist-embedded", train_size=100, test_size=10, rng=rng(1))
    assert np.array_equal(p1.train.images, p2.train.images)


def test_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown partition method"):
        partition(hand_pools(3, 2, 2), 2, "nope", rng())
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("svhn", root=".")


# ----------------------------------------------------------------------------- D̄_KL
def test_heterogeneity_dkl() -> None:
    same = np.array([[5, 3, 2], [10, 6, 4], [5, 3, 2]])
    assert heterogeneity_dkl(same) == pytest.approx(0.0, abs=1e-12)
    assert heterogeneity_dkl(same, eps=0.0) == 0.0
    # P1 = (3/4, 1/4), P2 = (1/4, 3/4): KL(P1||P2) = 3/4 ln 3 + 1/4 ln(1/3) = 1/2 ln 3 = KL(P2||P1)
    two = np.array([[3, 1], [1, 3]])
    assert heterogeneity_dkl(two, eps=0.0) == pytest.approx(0.5 * math.log(3), rel=1e-12)
    assert heterogeneity_dkl(two) == pytest.approx(0.5 * math.log(3), rel=1e-5)
    assert heterogeneity_dkl(two, eps=0.0, paper_normaliser=True) == pytest.approx(
        0.5 * math.log(3), rel=1e-12
    )  # n = 2: 2/n = 2/(n(n-1))
    # 3 clients, pairs (1,2) = (2,3) = 1/2 ln 3, (1,3) = 0: mean 1/3 ln 3, Eq. 2 literal 2/3 ln 3
    three = np.array([[3, 1], [1, 3], [3, 1]])
    assert heterogeneity_dkl(three, eps=0.0) == pytest.approx(math.log(3) / 3, rel=1e-12)
    assert heterogeneity_dkl(three, eps=0.0, paper_normaliser=True) == pytest.approx(
        2 * math.log(3) / 3, rel=1e-12
    )
    disjoint = np.array([[4, 0], [0, 4]])
    assert heterogeneity_dkl(disjoint, eps=0.0) == math.inf
    assert math.isfinite(heterogeneity_dkl(disjoint)) and heterogeneity_dkl(disjoint) > 10
    assert heterogeneity_dkl(np.array([[1, 2]])) == 0.0


def test_heterogeneity_dkl_equals_a_pair_by_pair_sum_over_many_clients() -> None:
    # computed a block of rows at a time: against scipy's KL, pair by pair
    from scipy.special import rel_entr

    rng = np.random.default_rng(5)
    hist = rng.integers(0, 9, size=(300, 10)) + np.eye(300, 10, dtype=np.int64)
    eps = 1e-6
    p = (hist / hist.sum(1, keepdims=True) + eps) / (1 + 10 * eps)
    pairs = [
        (rel_entr(p[i], p[j]).sum() + rel_entr(p[j], p[i]).sum()) / 2
        for i in range(300)
        for j in range(i + 1, 300)
    ]
    assert heterogeneity_dkl(hist) == pytest.approx(float(np.mean(pairs)), rel=1e-12)


def test_iid_with_samples_per_client_serves_more_clients_than_samples() -> None:
    rng = np.random.default_rng(0)
    pools = load_dataset("mnist-embedded", None, 300, 50, rng)
    part = partition(pools, 1000, "iid", rng, samples_per_client=5, test_samples_per_client=2)
    assert len(part.train) == 1000
    assert all(len(p) == 5 and len(set(p.tolist())) == 5 for p in part.train)
    assert all(len(p) == 2 for p in part.test)
    assert max(int(p.max()) for p in part.train) < 300
    with pytest.raises(ValueError, match="exceeds"):
        partition(pools, 10, "iid", rng, samples_per_client=301)


def test_cifar_batches_in_the_original_python2_format_load(tmp_path: Path) -> None:
    """The CIFAR python batches were written by Python 2 (protocol 2, numpy 1's module
    names, str keys that Python 3 reads as bytes): the restricted unpickler reads them."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]):
        batch = {
            b"batch_label": b"x",
            b"labels": [i % 10, 3],
            b"data": np.full((2, 3072), i, np.uint8),
            b"filenames": [b"a.png", b"b.png"],
        }
        raw = pickle.dumps(batch, protocol=2).replace(b"numpy._core.", b"numpy.core.")
        assert b"cnumpy.core.multiarray\n_reconstruct\n" in raw
        (folder / name).write_bytes(raw)
    pools = load_dataset("cifar10", root=tmp_path)
    assert pools.train.images.shape == (10, 3, 32, 32)
    assert pools.test.labels.tolist() == [5, 3]


def test_cifar_batches_that_are_not_cifar_are_refused(tmp_path: Path) -> None:
    from mecsim.data import DatasetError

    def write(obj, proto=2) -> Path:
        folder = tmp_path / "cifar-10-batches-py"
        folder.mkdir(exist_ok=True)
        for name in [f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]:
            (folder / name).write_bytes(pickle.dumps(obj, protocol=proto))
        return tmp_path

    cases = [
        ([1, 2, 3], "not a dict"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "uint8"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, "labels in"),
        ({b"data": np.zeros((2, 3072), np.uint8)}, "'labels'"),
        (
            {
                b"data": np.zeros((2, 3072), np.uint8),
                b"labels": [0, 1],
                b"x": __import__("collections").OrderedDict(),
            },
            "refused",
        ),  # a class it never has
    ]
    for obj, fragment in cases:
        with pytest.raises(DatasetError, match=fragment):
            load_dataset("cifar10", root=write(obj))
