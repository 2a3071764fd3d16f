"""FedAvg and Local against hand numbers, in-process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mecsim.agents.algorithms import ClientContext, ClientResult, ClientTask, TrainConfig
from mecsim.agents.algorithms.fedavg import FedAvgClient, FedAvgServer, weighted_average
from mecsim.agents.algorithms.local import LocalClient, LocalServer
from mecsim.agents.models import build_model, get_flat, model_layout
from mecsim.agents.training import StepCosts
from mecsim.emulation.ops import Compute, Download, Upload


def test_weighted_average_hand_numbers():
    out = weighted_average([np.array([1.0, 2.0]), np.array([3.0, 4.0])], [1, 3])
    np.testing.assert_allclose(out, [2.5, 3.5])
    out = weighted_average(
        [np.array([0.0, 9.0]), np.array([3.0, 0.0]), np.array([6.0, 3.0])], [100, 200, 700]
    )
    np.testing.assert_allclose(out, [0.6 + 4.2, 0.9 + 2.1])
    with pytest.raises(ValueError):
        weighted_average([], [])


def _result(cid: int, weights, n: int) -> ClientResult:
    return ClientResult(cid, np.asarray(weights, dtype=np.float32), 8, n, 0.0, (), 0.0, 0, 0)


def _layout():
    model = torch.nn.Linear(1, 1)  # 2 elements: weight, bias
    return model_layout(model)


def test_fedavg_server_aggregates_by_sample_count_and_counts_flops():
    layout = _layout()
    server = FedAvgServer(layout, np.zeros(2, np.float32), {0: 10, 1: 30}, 1.0, {})
    tasks = server.configure_fit(0, [0, 1])
    assert [t.download_nbytes for t in tasks] == [8, 8]
    stats = server.aggregate_fit(0, [_result(0, [4, 0], 10), _result(1, [0, 8], 30)])
    np.testing.assert_allclose(server.weights, [1.0, 6.0])
    # WeightedSum by hand: per element and client a multiply (n_k * w_k) and an add, then
    # per element one division by the total: 2 elements * 2 clients * 2 + 2 = 10
    assert stats.flops == 2 * 2 * 2 + 2 == 10
    # nothing arrives (all clients missed the deadline): the model is unchanged
    assert server.aggregate_fit(1, []).flops == 0
    np.testing.assert_allclose(server.weights, [1.0, 6.0])


def test_selection_is_seeded_and_sized():
    server = FedAvgServer(_layout(), np.zeros(2, np.float32), {i: 1 for i in range(20)}, 0.25, {})
    a = server.select(0, np.random.default_rng(5))
    b = server.select(0, np.random.default_rng(5))
    assert a == b and len(a) == 5 and len(set(a)) == 5 and a == sorted(a)


def _context(model, state=None) -> ClientContext:
    layout = model_layout(model)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (40,), generator=g)
    return ClientContext(
        0,
        model,
        layout,
        x,
        y,
        x[:10],
        y[:10],
        {} if state is None else state,
        TrainConfig(epochs=1, batch_size=10, lr=0.1),
        torch.Generator().manual_seed(1),
        StepCosts(),
        get_flat(model, layout),
    )


def test_fedavg_client_trace_and_bytes():
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    ctx = _context(model)
    task = ClientTask(0, ctx.init_weights, ctx.layout.nbytes)
    result = FedAvgClient({}).fit(ctx, task)
    nbytes = ctx.layout.nbytes
    assert [type(op) for op in result.trace] == [Download, Compute, Upload]
    assert result.trace[0].nbytes == nbytes == result.trace[2].nbytes == result.upload_nbytes
    assert result.trace[1].batches == 4 == result.steps
    assert result.trace[1].flops == result.flops > 0
    assert not np.array_equal(result.weights, ctx.init_weights)  # it trained


def test_local_keeps_its_own_model_and_sends_nothing():
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    state: dict = {}
    ctx = _context(model, state)
    server = LocalServer(ctx.layout, ctx.init_weights, {0: 40}, 1.0, {})
    (task,) = server.configure_fit(0, [0])
    assert task.weights is None and task.download_nbytes == 0
    client = LocalClient({})
    r1 = client.fit(ctx, task)
    assert r1.upload_nbytes == 0 and r1.weights is None
    assert [type(op) for op in r1.trace] == [Compute]
    after_one = state["weights"].copy()
    client.fit(_context(model, state), task)
    assert not np.array_equal(state["weights"], after_one)  # continued from its own model
    assert server.aggregate_fit(0, [r1]).flops == 0
