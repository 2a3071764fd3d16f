"""Models, their layers, and the flat state vector."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from mecsim.agents.models import MODELS, build_model, get_flat, model_layout, set_flat, store_flat


def test_resnet18_size_matches_the_kapc_paper():
    # 11,173,962 parameters: 42.63 MiB as float32; with the BatchNorm running statistics
    # (2 x 4,800 floats) 42.66 MiB -- the paper's "42.65 MB" per client (426.54 for ten).
    model = build_model("resnet18", (3, 32, 32), 10)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == 11_173_962
    layout = model_layout(model)
    assert layout.size == 11_173_962 + 2 * 4_800
    assert layout.nbytes / 2**20 == pytest.approx(42.66, abs=0.01)


def test_2nn_layers_and_sizes():
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    layout = model_layout(model)
    # Linear(784,200), BatchNorm1d(200), Linear(200,200), Linear(200,10)
    assert layout.layer_kinds == ("Linear", "BatchNorm1d", "Linear", "Linear")
    per_layer = layout.layer_numel().tolist()
    assert per_layer == [784 * 200 + 200, 4 * 200, 200 * 200 + 200, 200 * 10 + 10]
    assert layout.size == sum(per_layer)
    bn_slots = [s for s in layout.slots if s.layer == 1]
    assert [s.name.rsplit(".", 1)[1] for s in bn_slots] == [
        "weight",
        "bias",
        "running_mean",
        "running_var",
    ]
    assert [s.is_param for s in bn_slots] == [True, True, False, False]


def test_flat_roundtrip_and_layer_masks():
    torch.manual_seed(0)
    model = build_model("kapc_cnn", (1, 28, 28), 10)
    layout = model_layout(model)
    flat = get_flat(model, layout)
    other = build_model("kapc_cnn", (1, 28, 28), 10)
    set_flat(other, layout, flat)
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # a mask over layers 0 and 2 covers exactly their elements, and their bytes
    mask = layout.mask([0, 2])
    numel = layout.layer_numel()
    assert mask.sum() == numel[0] + numel[2]
    assert layout.nbytes_of_layers([0, 2]) == 4 * (numel[0] + numel[2])
    assert layout.nbytes_of_layers(
        np.array([True, False, True, False, False])
    ) == layout.nbytes_of_layers([0, 2])
    with pytest.raises(ValueError, match="shape"):
        set_flat(other, layout, flat[:-1])


@pytest.mark.parametrize("name", ["mlp_2nn", "phsfl_cnn"])
def test_flat_storage_keeps_the_values_and_trains_the_same(name):
    """store_flat rebinds parameters and buffers to views of one tensor: the same values,
    get_flat/set_flat read and load through it, and training (BatchNorm statistics
    included) gives the same bits as on a model stored tensor by tensor."""
    torch.manual_seed(0)
    plain = build_model(name, (1, 28, 28), 10)
    layout = model_layout(plain)
    flat = copy.deepcopy(plain)
    before = get_flat(plain, layout)
    assert store_flat(flat, layout)
    storage = flat._mecsim_flat_state[0]
    assert np.array_equal(get_flat(flat, layout), before)
    for s in layout.slots:  # every tensor lives in the storage, at its layout offset
        t = flat.state_dict()[s.name]
        assert t.data_ptr() == storage.data_ptr() + 4 * s.offset
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    for model in (plain, flat):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    trained = get_flat(plain, layout)
    assert not np.array_equal(trained, before)
    assert np.array_equal(get_flat(flat, layout), trained)
    assert np.array_equal(storage.numpy(), trained)  # read straight from the storage
    set_flat(flat, layout, before)  # loaded through the storage
    assert np.array_equal(storage.numpy(), before)
    assert torch.equal(
        flat.state_dict()[layout.slots[0].name].reshape(-1),
        torch.from_numpy(before[: layout.slots[0].numel]),
    )


def test_flat_storage_falls_back_when_a_tensor_is_rebound_or_not_float32():
    torch.manual_seed(0)
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    layout = model_layout(model)
    assert store_flat(model, layout)
    first = layout.slots[0]
    module = model.get_submodule(first.name.rpartition(".")[0])
    module.weight.data = torch.full(first.shape, 7.0)  # no longer a view of the storage
    got = get_flat(model, layout)
    assert (got[: first.numel] == 7.0).all()
    zeros = np.zeros(layout.size, dtype=np.float32)
    set_flat(model, layout, zeros)
    assert (module.weight == 0).all()
    double = build_model("mlp_2nn", (1, 28, 28), 10).double()
    assert not store_flat(double, model_layout(double))


@pytest.mark.parametrize("stored", [True, False])
def test_get_flat_into_a_given_array(stored):
    """get_flat(out=...) writes the same values into the array it is given (from the flat
    storage or tensor by tensor) and returns it; a wrong array is refused untouched."""
    torch.manual_seed(0)
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    layout = model_layout(model)
    assert store_flat(model, layout) if stored else True
    expected = get_flat(model, layout)
    rows = np.full((2, layout.size), np.nan, dtype=np.float32)
    got = get_flat(model, layout, out=rows[1])
    assert got is not None and got.base is rows and np.array_equal(got, expected)
    assert np.isnan(rows[0]).all()
    for bad in (np.zeros(layout.size - 1, np.float32), np.zeros(layout.size, np.float64)):
        with pytest.raises(ValueError, match="out has shape"):
            get_flat(model, layout, out=bad)
        assert not bad.any()


@pytest.mark.parametrize(
    "name,shape",
    [
        ("mlp_2nn", (1, 28, 28)),
        ("mtfl_cnn", (3, 32, 32)),
        ("kapc_cnn", (1, 28, 28)),
        ("phsfl_cnn", (1, 28, 28)),
        ("resnet18", (3, 32, 32)),
    ],
)
def test_every_model_runs_forward(name, shape):
    model = build_model(name, shape, 10)
    assert set(MODELS) >= {name}
    out = model.eval()(torch.zeros(2, *shape))
    assert out.shape == (2, 10)


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        build_model("vgg", (1, 28, 28), 10)
