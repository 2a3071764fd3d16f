"""FedProx against an independent computation, in-process."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from support.scenarios import TINY, tiny
from torch import nn

from mecsim.agents.algorithms import ClientContext, ClientResult, ClientTask, TrainConfig
from mecsim.agents.algorithms.fedavg import FedAvgClient
from mecsim.agents.algorithms.fedprox import FedProxClient, FedProxServer, proximal_term
from mecsim.agents.models import get_flat, model_layout, set_flat
from mecsim.agents.training import StepCosts
from mecsim.run.loop import run
from mecsim.scenario import ScenarioError, scenario_from_dict


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 5), nn.ReLU(), nn.Linear(5, 10))


def _context(model, state=None, epochs=2, lr=0.5) -> ClientContext:
    layout = model_layout(model)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (6,), generator=g)
    return ClientContext(
        0,
        model,
        layout,
        x,
        y,
        x[:3],
        y[:3],
        {} if state is None else state,
        TrainConfig(epochs=epochs, batch_size=6, lr=lr),
        torch.Generator().manual_seed(1),
        StepCosts(),
        get_flat(model, layout),
    )


def test_proximal_term_and_its_gradient():
    model = nn.Linear(2, 1)
    anchors = [torch.zeros_like(p) for p in model.parameters()]
    loss = proximal_term(model, anchors, mu=0.4)
    loss.backward()
    w = torch.cat([model.weight.detach().flatten(), model.bias.detach()])
    assert float(loss.detach()) == pytest.approx(0.2 * float((w**2).sum()))
    grad = torch.cat([model.weight.grad.flatten(), model.bias.grad])
    torch.testing.assert_close(grad, 0.4 * w)  # mu (w - w^t)


def test_two_full_batch_steps_match_a_hand_written_fedprox():
    model = _model()
    ref = copy.deepcopy(model)
    ctx = _context(model)  # 6 samples, batch 6, 2 epochs: two SGD steps at lr 0.5
    global_w = ctx.init_weights.copy()
    FedProxClient({"mu": 0.3}).fit(ctx, ClientTask(0, global_w, 4 * global_w.size))
    anchors = [p.detach().clone() for p in ref.parameters()]
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(ctx.x_train), ctx.y_train)
        loss = loss + 0.15 * sum(
            ((p - a) ** 2).sum() for p, a in zip(ref.parameters(), anchors, strict=True)
        )
        loss.backward()
        opt.step()
    np.testing.assert_allclose(
        get_flat(model, ctx.layout), get_flat(ref, ctx.layout), rtol=1e-5, atol=1e-6
    )
    # mu = 0 is FedAvg, to the bit
    a, b = _model(), _model()
    ra = FedProxClient({"mu": 0.0}).fit(_context(a), ClientTask(0, global_w, 0))
    rb = FedAvgClient({}).fit(_context(b), ClientTask(0, global_w, 0))
    np.testing.assert_array_equal(ra.weights, rb.weights)
    assert ra.upload_nbytes == rb.upload_nbytes == 4 * global_w.size


def test_local_evaluation_uses_the_clients_own_trained_model():
    model = _model()
    state: dict = {}
    ctx = _context(model, state)
    global_w = ctx.init_weights.copy()
    client = FedProxClient({"mu": 0.01, "eval_model": "local"})
    result = client.fit(ctx, ClientTask(0, global_w, 0))
    np.testing.assert_array_equal(state["weights"], result.weights)
    set_flat(model, ctx.layout, global_w)
    own = client.evaluate(ctx, ClientTask(0, global_w, 0))
    set_flat(model, ctx.layout, result.weights)
    expected = FedAvgClient({}).evaluate(ctx, ClientTask(0, result.weights, 0))
    assert own == expected
    glob = FedProxClient({"mu": 0.01}).evaluate(ctx, ClientTask(0, global_w, 0))
    assert glob == FedAvgClient({}).evaluate(ctx, ClientTask(0, global_w, 0))


def test_server_is_fedavg_and_parameters_are_validated():
    layout = model_layout(nn.Linear(1, 1))
    server = FedProxServer(layout, np.zeros(2, np.float32), {0: 10, 1: 30}, 1.0, {"mu": 0.1})
    results = [
        ClientResult(c, np.asarray(w, np.float32), 8, n, 0.0, (), 0.0, 0, 0)
        for c, w, n in ((0, [4, 0], 10), (1, [0, 8], 30))
    ]
    assert server.aggregate_fit(0, results).flops == 2 * 2 * 2 + 2  # FedAvg's: 2|w|K + |w|
    np.testing.assert_allclose(server.weights, [1.0, 6.0])  # FedAvg's weighted mean
    with pytest.raises(ScenarioError, match="params.mu"):
        scenario_from_dict({**TINY, "algorithm": {"name": "fedprox", "params": {"mu": -1}}}, "x")
    with pytest.raises(ScenarioError, match="params.eval_model"):
        scenario_from_dict(
            {**TINY, "algorithm": {"name": "fedprox", "params": {"eval_model": "best"}}}, "x"
        )


def test_two_round_run_moves_full_models():
    rows = run(tiny(rounds=2, algorithm={"name": "fedprox", "params": {"mu": 0.1}}), "p")
    layout_bytes = 4 * (199610 + 400)  # mlp_2nn state incl. BN running statistics
    assert [r["bytes_up"] for r in rows] == [4 * layout_bytes] * 2
    assert [r["server_gflops"] for r in rows] == [(2 * 200010 * 4 + 200010) / 1e9] * 2
