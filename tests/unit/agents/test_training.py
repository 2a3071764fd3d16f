"""FLOPs, memory and the device CPU model, against hand-derived numbers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mecsim.agents.models import build_model
from mecsim.agents.training import (
    StepCosts,
    make_optimizer,
    measured_step,
    model_optimizer,
    optimizer_step,
    optimizer_step_flops,
    set_mode,
    train_epochs,
    work_signature,
)
from mecsim.emulation.devices import builtin_profiles


def _mlp(i: int, h: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o))


def test_step_flops_of_a_two_layer_mlp():
    # forward: 2*B*(i*h + h*o); backward: weight grads of both layers 2*B*(i*h + h*o),
    # input grad of the second layer only 2*B*h*o (the data needs no gradient)
    b, i, h, o = 5, 7, 11, 3
    model = _mlp(i, h, o)
    opt = make_optimizer("sgd", model.parameters(), 0.1)
    _, cost = measured_step(model, opt, torch.randn(b, i), torch.randint(0, o, (b,)), None)
    forward = 2 * b * (i * h + h * o)
    # plus plain SGD's update p -= lr * g: 2 FLOPs for each of the 7*11+11 + 11*3+3 = 124
    # parameters
    assert cost.optimizer_flops == 2 * 124
    assert cost.flops == forward + forward + 2 * b * h * o + 2 * 124


@pytest.mark.parametrize(
    "name,kwargs,per_param",
    [
        ("sgd", {}, 2),  # p -= lr * g
        ("sgd", {"momentum": 0.9}, 4),  # b = mu * b + g; p -= lr * b
        ("sgd", {"momentum": 0.9, "weight_decay": 1e-4}, 6),  # g += wd * p
        ("adam", {}, 13),  # m: 3, v: 4, denominator: 3, update: 3
        ("adam", {"weight_decay": 1e-4}, 15),
    ],
)
def test_optimizer_step_flops_per_parameter(name, kwargs, per_param):
    model = _mlp(7, 11, 3)  # 124 parameters
    opt = make_optimizer(name, model.parameters(), 0.1, **kwargs)
    _, cost = measured_step(model, opt, torch.randn(5, 7), torch.randint(0, 3, (5,)), None)
    assert cost.optimizer_flops == per_param * 124


def test_optimizer_flops_count_only_stepped_parameters_and_known_optimizers():
    model = _mlp(7, 11, 3)
    for p in model[0].parameters():  # a frozen first layer gets no gradient, no update
        p.requires_grad_(False)
    opt = make_optimizer("adam", [p for p in model.parameters() if p.requires_grad], 0.1)
    _, cost = measured_step(model, opt, torch.randn(5, 7), torch.randint(0, 3, (5,)), None)
    assert cost.optimizer_flops == 13 * (11 * 3 + 3)
    rms = torch.optim.RMSprop(model.parameters())
    with pytest.raises(ValueError, match="RMSprop"):
        optimizer_step_flops(rms)


def test_step_memory_counts_optimizer_state_exactly():
    model_sgd, model_adam = _mlp(7, 11, 3), _mlp(7, 11, 3)
    x, y = torch.randn(5, 7), torch.randint(0, 3, (5,))
    _, sgd = measured_step(
        model_sgd, make_optimizer("sgd", model_sgd.parameters(), 0.1), x, y, None
    )
    _, adam = measured_step(
        model_adam, make_optimizer("adam", model_adam.parameters(), 0.1), x, y, None
    )
    n_params = sum(p.numel() for p in model_sgd.parameters())
    n_tensors = len(list(model_sgd.parameters()))
    # Adam keeps exp_avg and exp_avg_sq (float32 each) and a float32 step per tensor
    assert adam.memory_bytes - sgd.memory_bytes == 2 * 4 * n_params + 4 * n_tensors
    # weights + gradients + the input batch are a floor
    assert sgd.memory_bytes > 2 * 4 * n_params + x.numel() * 4


def test_train_epochs_counts_steps_and_reuses_measured_costs():
    torch.manual_seed(0)
    model = _mlp(7, 11, 3)
    x, y = torch.randn(50, 7), torch.randint(0, 3, (50,))
    costs = StepCosts()
    stats = train_epochs(
        model,
        make_optimizer("sgd", model.parameters(), 0.1),
        x,
        y,
        epochs=2,
        batch_size=16,
        generator=torch.Generator().manual_seed(1),
        costs=costs,
    )
    # 50 samples at batch 16: 16, 16, 16, 2 -> 4 steps an epoch
    assert stats.steps == 8
    # the cache keys on the cost key and what decides a step's cost (work_signature)
    key = ("", work_signature(model, make_optimizer("sgd", model.parameters(), 0.1), x, None))
    full, last = costs.get(16, key), costs.get(2, key)
    assert full is not None and last is not None
    assert stats.flops == 2 * (3 * full.flops + last.flops)
    assert full.flops == 3 * 2 * 16 * (7 * 11 + 11 * 3) - 2 * 16 * 7 * 11 + 2 * 124
    assert stats.optimizer_flops == 8 * 2 * 124  # 8 SGD steps over 124 parameters


@pytest.mark.parametrize(
    "kwargs,direct",
    [
        ({}, True),
        ({"momentum": 0.9}, False),
        ({"weight_decay": 1e-3}, False),
        ({"foreach": True}, False),
        ({"maximize": True}, False),
    ],
)
def test_optimizer_step_equals_the_optimizers_own_step_bit_for_bit(kwargs, direct):
    """optimizer_step steps plain SGD itself (p -= lr * grad, what torch.optim.SGD's
    single-tensor step does) and any other optimiser through optimizer.step(): either
    way the weights after five steps equal those of the optimiser's own step, bit for
    bit, and plain SGD (only) is stepped without its step() being called."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 7), torch.randint(0, 3, (32,))
    ours, theirs = _mlp(7, 11, 3), _mlp(7, 11, 3)
    theirs.load_state_dict(ours.state_dict())
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05, **kwargs)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.05, **kwargs)
    calls = []
    if not direct:
        opt_ours.register_step_post_hook(lambda *_: calls.append(1))
    for _ in range(5):
        loss = optimizer_step(ours, opt_ours, x, y, None)
        opt_theirs.zero_grad(set_to_none=True)
        expected = nn.functional.cross_entropy(theirs(x), y)
        expected.backward()
        opt_theirs.step()
        assert loss == float(expected.detach())
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    assert len(calls) == (0 if direct else 5)
    if direct:  # a registered hook must run: the optimiser's own step is used then
        opt_ours.register_step_post_hook(lambda *_: calls.append(1))
        optimizer_step(ours, opt_ours, x, y, None)
        assert calls == [1]


def test_a_stateless_sgd_is_reused_from_client_to_client_with_the_same_bits():
    """model_optimizer hands the same plain SGD to one client after another (it keeps no
    state), and three clients trained that way end with the same weights, bit for bit,
    as with a fresh torch.optim.SGD each; anything with state or other settings is new."""
    torch.manual_seed(1)
    model, fresh = _mlp(7, 11, 3), _mlp(7, 11, 3)
    fresh.load_state_dict(model.state_dict())
    data = [(torch.randn(40, 7), torch.randint(0, 3, (40,))) for _ in range(3)]
    first = model_optimizer(model, "sgd", 0.05)
    costs_a, costs_b = StepCosts(), StepCosts()
    for i, (x, y) in enumerate(data):
        opt = model_optimizer(model, "sgd", 0.05)
        assert opt is first and not opt.state
        train_epochs(
            model,
            opt,
            x,
            y,
            epochs=2,
            batch_size=16,
            generator=torch.Generator().manual_seed(i),
            costs=costs_a,
        )
        train_epochs(
            fresh,
            torch.optim.SGD(fresh.parameters(), lr=0.05),
            x,
            y,
            epochs=2,
            batch_size=16,
            generator=torch.Generator().manual_seed(i),
            costs=costs_b,
        )
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    assert model_optimizer(model, "sgd", 0.01) is not first  # another lr
    other = model_optimizer(model, "sgd", 0.01)
    assert other.param_groups[0]["lr"] == 0.01
    for kwargs in ({"momentum": 0.9}, {"weight_decay": 1e-4}):  # state: always new
        assert model_optimizer(model, "sgd", 0.01, **kwargs) is not model_optimizer(
            model, "sgd", 0.01, **kwargs
        )
    adam = model_optimizer(model, "adam", 0.01)
    assert isinstance(adam, torch.optim.Adam) and adam is not model_optimizer(model, "adam", 0.01)
    assert model_optimizer(_mlp(7, 11, 3), "sgd", 0.01) is not other  # another model
    other.register_step_post_hook(lambda *_: None)  # a hook someone left on it
    assert model_optimizer(model, "sgd", 0.01) is not other
    changed = model_optimizer(model, "sgd", 0.01)
    assert model_optimizer(model, "sgd", 0.01) is changed
    changed.param_groups[0]["nesterov"] = True  # a setting someone changed on it
    assert model_optimizer(model, "sgd", 0.01) is not changed


def test_set_mode_switches_every_module_only_when_one_differs():
    model = _mlp(7, 11, 3)
    model[2].eval()  # one submodule in the other mode
    set_mode(model, training=True)
    assert all(m.training for m in model.modules())
    set_mode(model, training=False)
    assert not any(m.training for m in model.modules())
    calls = []
    model.train = lambda mode=True: calls.append(mode)  # noqa: ARG005 - spy
    set_mode(model, training=False)
    assert calls == []  # already so: nothing called
    set_mode(model, training=True)
    assert calls == [True]


def test_pi2b_calibration_reproduces_the_mtfl_testbed_training_time():
    # MTFL testbed (TPDS 2022, Table 4): 30 s per round, 88 % of it training -> 26.4 s
    # for one epoch of 6,000 MNIST images at batch 20 (300 steps) of the 2NN on a Pi 2B.
    # The profile was fitted to that figure with a 3x-forward FLOP count; counted here by
    # FlopCounterMode (no input gradient for the first layer) it lands within 5 %.
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    opt = make_optimizer("sgd", model.parameters(), 0.01)
    _, cost = measured_step(
        model, opt, torch.randn(20, 1, 28, 28), torch.randint(0, 10, (20,)), None
    )
    pi2b = builtin_profiles()["rpi2b"]
    t = pi2b.compute_time_s(300 * cost.flops, 300)
    assert t == pytest.approx(26.4, rel=0.05)


def test_device_compute_time_formula():
    p = builtin_profiles()["rpi4"]
    assert p.compute_time_s(28e9, 10) == pytest.approx(10 * p.step_overhead_s + 2.0)
    for profile in builtin_profiles().values():
        assert profile.flops_source and profile.step_overhead_source and profile.ram_source
