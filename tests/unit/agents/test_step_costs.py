"""Step costs are never silently wrong: the cost cache keys on what decides a step's cost,
the public ``counted_step`` counts a custom loop's FLOPs, and the kit's ``flops``
property catches a plugin whose cache reuses one kind of step's cost for another.

The FLOPs are worked out by hand for a 2-layer MLP (IN -> H -> OUT, biases) with the
project's definition of a step's FLOPs (agents/training.py): the counter's matmuls,
2 * m * n * k each (forward; and backward, for each gradient autograd computes), plus
2 per stepped parameter for plain SGD. Per step of a batch of B:

- every layer trainable: forward 2B(IN H + H OUT); backward, the second layer's weight
  and input gradients 2B H OUT each, the first's weight gradient 2B IN H (the input
  needs none): 4B IN H + 6B H OUT, + 2P (P = all parameters);
- the head (second layer) alone: forward, and its weight gradient only (nothing before
  it needs a gradient): 2B IN H + 4B H OUT, + 2 (H OUT + OUT);
- the body (first layer) alone: forward, the head's input gradient (the body needs it)
  and the body's weight gradient: 4B IN H + 4B H OUT, + 2 (IN H + H).
"""

from __future__ import annotations

import pytest
import torch
from support.paths import DATA
from torch import nn

from mecsim.api import (
    StepCosts,
    counted_step,
    measured_step,
    train_epochs,
    work_signature,
)
from mecsim.registry import ALGORITHMS, load_plugin_file
from mecsim.testing import check_algorithm

IN, H, OUT = 6, 5, 3
P_HEAD = H * OUT + OUT  # 18
P_BODY = IN * H + H  # 35
P = P_HEAD + P_BODY  # 53
PLUGIN = DATA / "fedrep_like.py"


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))


def data(n: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, IN, generator=g), torch.randint(0, OUT, (n,), generator=g)


def full_flops(b: int) -> int:
    return 4 * b * IN * H + 6 * b * H * OUT + 2 * P


def head_flops(b: int) -> int:
    return 2 * b * IN * H + 4 * b * H * OUT + 2 * P_HEAD


def body_flops(b: int) -> int:
    return 4 * b * IN * H + 4 * b * H * OUT + 2 * P_BODY


def epoch(model: nn.Module, costs: StepCosts, key: str = "fedrep") -> float:
    x, y = data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = train_epochs(
        model,
        opt,
        x,
        y,
        epochs=1,
        batch_size=4,  # batches of 4, 4 and 2
        generator=torch.Generator().manual_seed(2),
        costs=costs,
        cost_key=key,
    )
    return stats.flops


def test_each_fedrep_phase_is_charged_its_own_flops_under_one_cost_key() -> None:
    model, costs = mlp(), StepCosts()
    head, body = model[2], model[0]
    assert epoch(model, costs) == sum(full_flops(b) for b in (4, 4, 2)) == 2418
    body.requires_grad_(False)
    assert epoch(model, costs) == sum(head_flops(b) for b in (4, 4, 2)) == 1308
    body.requires_grad_(True)
    head.requires_grad_(False)
    # a cache keyed on (batch size, cost_key) alone charged this phase 1308 (the head's)
    assert epoch(model, costs) == sum(body_flops(b) for b in (4, 4, 2)) == 2010
    head.requires_grad_(True)
    assert epoch(model, costs) == 2418  # the first cost, found again in the cache


def test_the_work_signature_tells_apart_what_changes_a_step() -> None:
    model = mlp()
    x, _ = data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    base = work_signature(model, opt, x)
    assert work_signature(model, opt, x[:3]) == base  # the batch size is the cache's own
    assert work_signature(model, opt, torch.randn(4, IN + 1)) != base
    assert work_signature(model, opt, x, lambda m: torch.zeros(())) != base
    assert work_signature(model, torch.optim.Adam(model.parameters()), x) != base
    assert work_signature(nn.Sequential(nn.Linear(IN, OUT)), opt, x) != base
    model[2].weight.requires_grad_(False)
    assert work_signature(model, opt, x) != base


def test_counted_step_counts_an_apfl_like_loop_of_two_models() -> None:
    """APFL (Deng et al., 2020) steps two models per batch: the global w on its own loss,
    the personal v on the loss of the mixture alpha v(x) + (1 - alpha) w(x) (w's output
    detached). The v step runs both forwards and backpropagates through v only."""
    w, v = mlp(), mlp()
    opt_w = torch.optim.SGD(w.parameters(), lr=0.1)
    opt_v = torch.optim.SGD(v.parameters(), lr=0.1)
    x, y = data(4)
    alpha = 0.25
    with counted_step(opt_w, opt_v, inputs=(x,), models=(w, v)) as step:
        opt_w.zero_grad()
        nn.functional.cross_entropy(w(x), y).backward()
        opt_w.step()
        opt_v.zero_grad()
        mixed = alpha * v(x) + (1 - alpha) * w(x).detach()
        nn.functional.cross_entropy(mixed, y).backward()
        opt_v.step()
    b = 4
    forward = 2 * b * (IN * H + H * OUT)
    v_step = 2 * forward + (2 * b * IN * H + 4 * b * H * OUT) + 2 * P
    assert step.cost is not None
    assert step.cost.flops == full_flops(b) + v_step == 2252
    assert step.cost.optimizer_flops == 4 * P
    # weights and gradients of both models, the input; then what autograd saved
    assert step.cost.memory_bytes > 4 * (4 * P + b * IN)


def test_counted_step_agrees_with_measured_step_on_a_plain_step() -> None:
    x, y = data(4)
    a, b = mlp(), mlp()
    _, cost = measured_step(a, torch.optim.SGD(a.parameters(), lr=0.1), x, y)
    opt = torch.optim.SGD(b.parameters(), lr=0.1)
    with counted_step(opt, inputs=(x,), models=(b,)) as step:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(b(x), y).backward()
        opt.step()
    assert step.cost == cost
    assert cost.flops == full_flops(4) == 946


def test_counted_step_refuses_a_model_where_an_optimiser_goes() -> None:
    with pytest.raises(TypeError, match=r"models go in models=\.\.\."):
        counted_step(mlp())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def fedrep_plugin():
    load_plugin_file(PLUGIN)
    yield
    for name in ("fedrep_like", "fedrep_one_key"):
        ALGORITHMS.unregister(name)


def test_the_kit_catches_one_cost_key_for_two_phases(fedrep_plugin) -> None:
    """The kit's tiny scenario: the 2NN (784 -> 200 -> BatchNorm -> 200 -> 10; the
    counter counts no BatchNorm FLOPs), batches of 16, plain SGD; client 0 trains on 70
    samples (5 steps: 4 of 16, 1 of 6) per phase. Per sample, the forward pass is
    2 (784·200 + 200·200 + 200·10) = 397,600; the head phase's backward pass 2·200·10 =
    4,000 (the head's weight gradient), the body phase's 4,000 + 80,000 + 80,000 +
    313,600 = 477,600 (the head's input gradient, fc2's weight and input gradients,
    fc1's weight gradient). SGD steps 2,010 head values (4,020 FLOPs a step) or 197,600
    body values (fc1, BatchNorm, fc2: 395,200 a step). Performed: 70 (401,600 +
    875,200) + 5 (4,020 + 395,200) = 91,372,100; charged, the body phase at the head
    phase's cost: 2 (70·401,600 + 5·4,020) = 56,264,200 (-38.4 %)."""
    report = check_algorithm("fedrep_one_key", ray=False, properties=["flops"])
    bad = report.result("flops")
    assert not bad.passed, bad.render()
    assert bad.reason.startswith(
        "round 1 client 0: its op-trace charges 5.62642e+07 FLOPs, but its fit performed "
        "9.13721e+07 (-38.4%"
    ), bad.reason
    assert "cost_key" in bad.reason
    assert "flops" in str(pytest.raises(AssertionError, report.assert_ok).value)


def test_the_kit_passes_both_phases_through_local_sgd(fedrep_plugin) -> None:
    report = check_algorithm("fedrep_like", ray=False, properties=["flops"])
    good = report.result("flops")
    assert good.passed, good.render()
    assert good.reason.startswith("12 fits measured whole")  # 4 clients, 3 rounds
