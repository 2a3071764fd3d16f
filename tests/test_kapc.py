"""KAPC and KAPC+BLS against hand-computed numbers, in-process.

The hand example: 3 clients, a 2-layer model without biases — layer 0 one scalar weight,
layer 1 a 2 x 1 weight — with client parameters w_0 = (3 | 1, 0), w_1 = (0 | 0, 1),
w_2 = (0 | 1, 1), lambda = 1, lr_relation = 0.1, E_r = 1, R uniform at 1/3.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from agents.algorithms import ClientContext, ClientResult, ClientTask, TrainConfig
from agents.algorithms.kapc import (
    BlsClientState,
    BlsConstants,
    KapcBlsClient,
    KapcBlsServer,
    KapcClient,
    KapcServer,
    algorithm4,
    coaching_loss,
    coaching_pairs,
    criterion_log_lhs,
    kapc_server_flops,
    log_m,
    normalise_rows,
    param_view,
    personalised_regulariser,
    relation_gradient,
    relation_objective,
    search_omega,
    self_relation_filter,
    update_relations,
)
from agents.models import build_model, get_flat, model_layout
from agents.training import StepCosts
from mecsim.ops import Compute, Download, Upload
from mecsim.runner import run
from mecsim.scenario import ScenarioError, scenario_from_dict
from tests.conftest import TINY, tiny

HAND_W = {0: [3.0, 1.0, 0.0], 1: [0.0, 0.0, 1.0], 2: [0.0, 1.0, 1.0]}


def _hand_model() -> nn.Module:
    return nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 2, bias=False))


def _upload(cid: int, weights, layers) -> ClientResult:
    w = np.asarray(weights, dtype=np.float32)
    return ClientResult(cid, w, 4 * w.size, 10, 0.0, (), 0.0, 0, 0, extra={"layers": layers})


def _hand_server(cls=KapcServer, **params) -> KapcServer:
    model = _hand_model()
    layout = model_layout(model)
    init = np.zeros(layout.size, np.float32)
    server = cls(layout, init, {0: 10, 1: 10, 2: 10}, 1.0,
                 {"lam": 1.0, "beta": 0.5, "lr_relation": 0.1, **params})
    server.aggregate_fit(-1, [_upload(c, w, [0, 1]) for c, w in HAND_W.items()])
    return server


# ---------------------------------------------------------------- relation cube


def test_normalise_rows_clamps_divides_and_falls_back_to_uniform():
    r = np.array([[2.0, -1.0, 2.0], [-1.0, -2.0, 0.0], [1.0, 1.0, 2.0]])
    np.testing.assert_allclose(normalise_rows(r), [[0.5, 0, 0.5], [1 / 3] * 3, [0.25, 0.25, 0.5]])
    soft = normalise_rows(np.array([[0.0, math.log(3.0)]]), "softmax", 1.0)
    np.testing.assert_allclose(soft, [[0.25, 0.75]])
    soft_t = normalise_rows(np.array([[0.0, math.log(3.0)]]), "softmax", 0.5)
    np.testing.assert_allclose(soft_t, [[0.1, 0.9]])  # exp(2 ln 3) = 9
    with pytest.raises(ValueError, match="unknown normalisation"):
        normalise_rows(r, "l1")


def test_relation_gradient_by_hand_with_the_prior_term():
    # layer 1 of the hand example, row of client 0 = (1/2, 1/4, 1/4), beta = 0.5, N = 3:
    # sum_j r_j w_j = (3/4, 1/2), e = (-1/4, 1/2); 2<e, w_j> = (-1/2, 1, 1/2);
    # beta (r - 1/3) = (1/12, -1/24, -1/24)
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    grams = np.stack([np.outer([3.0, 0, 0], [3.0, 0, 0]), x @ x.T])
    r0 = np.array([[1 / 3] * 3, [0.5, 0.25, 0.25]])
    grad = relation_gradient(r0, grams, 0, lam=1.0, beta=0.5, n_clients=3)
    np.testing.assert_allclose(grad[1], [-5 / 12, 23 / 24, 11 / 24])
    # layer 0: sum r w = 1, e = -2, 2 e w_j = (-12, 0, 0); the prior is 0 at 1/N
    np.testing.assert_allclose(grad[0], [-12.0, 0.0, 0.0])
    # one step, lr 0.1, then normalised: (130, 37, 49) / 216
    r_slice = np.stack([r0, normalise_rows(np.ones((2, 3))), normalise_rows(np.ones((2, 3)))])
    new = update_relations(r_slice, grams, lam=1.0, beta=0.5, lr=0.1, steps=1, n_clients=3)
    np.testing.assert_allclose(new[0, 1], [13 / 24, 37 / 240, 49 / 240])
    np.testing.assert_allclose(normalise_rows(new)[0, 1], np.array([130, 37, 49]) / 216)


def test_relation_gradient_matches_finite_differences_of_the_objective():
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(4, n)) for n in (3, 5)]
    grams = np.stack([a @ a.T for a in x])
    r = rng.uniform(size=(2, 4))
    grad = relation_gradient(r, grams, 2, lam=0.7, beta=0.3, n_clients=6)
    # the objective, computed directly from the vectors (not the Gram matrices)
    direct = sum(0.7 * np.sum((r[layer] @ x[layer] - x[layer][2]) ** 2) for layer in (0, 1))
    direct += 0.3 / 2 * np.sum((r - 1 / 6) ** 2)
    assert relation_objective(r, grams, 2, 0.7, 0.3, 6) == pytest.approx(direct)
    eps = 1e-6
    for idx in np.ndindex(r.shape):
        up, down = r.copy(), r.copy()
        up[idx] += eps
        down[idx] -= eps
        fd = (relation_objective(up, grams, 2, 0.7, 0.3, 6)
              - relation_objective(down, grams, 2, 0.7, 0.3, 6)) / (2 * eps)
        assert grad[idx] == pytest.approx(fd, rel=1e-6, abs=1e-6)


def test_server_round_updates_the_cube_and_sends_the_weighted_sums():
    server = _hand_server()
    tasks = server.configure_fit(0, [0, 1, 2])
    # layer 0: w = (3, 0, 0). Client 0: e = 1 - 3, grad (-12, 0, 0) -> (23, 5, 5) / 33;
    # clients 1 and 2: e = 1, grad (6, 0, 0) -> (-4/15, 1/3, 1/3) -> clamp -> (0, 1/2, 1/2)
    # layer 1: w = (1,0), (0,1), (1,1); from 1/3: (6, 3, 4)/13, (3, 6, 4)/13, (6, 6, 7)/19
    expected = np.array([
        [[23 / 33, 5 / 33, 5 / 33], [6 / 13, 3 / 13, 4 / 13]],
        [[0, 0.5, 0.5], [3 / 13, 6 / 13, 4 / 13]],
        [[0, 0.5, 0.5], [6 / 19, 6 / 19, 7 / 19]],
    ])
    np.testing.assert_allclose(server.relations, expected)
    # s_i = sum_j r_ij^l w_j^l, sent as the concatenated layers
    np.testing.assert_allclose(tasks[0].weights, [69 / 33, 10 / 13, 7 / 13], rtol=1e-6)
    np.testing.assert_allclose(tasks[1].weights, [0.0, 7 / 13, 10 / 13], rtol=1e-6)
    np.testing.assert_allclose(tasks[2].weights, [0.0, 13 / 19, 13 / 19], rtol=1e-6)
    assert [t.download_nbytes for t in tasks] == [12, 12, 12]
    assert [t.config["layers"] for t in tasks] == [[0, 1]] * 3
    # analytic FLOPs: Gram 3*4*3 + steps 3*2*(18+21) + normalisation 3*2*(18+9)
    # + s_i 2*3*(3 clients * 3 elements) = 36 + 234 + 162 + 54
    stats = server.aggregate_fit(0, [])
    assert stats.flops == 486.0 == kapc_server_flops(3, 3, np.array([1, 2]), 1,
                                                    np.ones((3, 2), bool))
    assert stats.metrics["kapc_layers_down_mean"] == 2.0
    assert math.isnan(stats.metrics["kapc_layers_up_mean"])  # nothing uploaded


def test_selected_slice_is_written_back_and_rows_renormalised():
    server = _hand_server(lr_relation=1e-12)  # the steps change (almost) nothing
    server.relations[0, 0] = [0.5, 0.3, 0.2]
    server.configure_fit(0, [0, 2])
    # slice of client 0, layer 0 over (0, 2): (0.5, 0.2) -> (5/7, 2/7) written back; the
    # full row (5/7, 0.3, 2/7) is renormalised by its sum 1.3
    np.testing.assert_allclose(server.relations[0, 0], np.array([5 / 7, 0.3, 2 / 7]) / 1.3,
                               rtol=1e-9)
    np.testing.assert_allclose(server.relations[1], 1 / 3)  # not selected: untouched


def test_personalised_regulariser_is_the_weighted_sum():
    rng = np.random.default_rng(1)
    stacks = [rng.normal(size=(3, 4)), rng.normal(size=(3, 2))]
    r = rng.uniform(size=(2, 3))
    s = personalised_regulariser(r, stacks, [0, 1])
    for layer in (0, 1):
        by_hand = sum(r[layer, j] * stacks[layer][j] for j in range(3))
        np.testing.assert_allclose(s[layer], by_hand)


# ---------------------------------------------------------------- client side


def test_param_view_skips_batchnorm_buffers_and_describes_layers():
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    layout = model_layout(model)
    view = param_view(layout)
    assert view.numel().tolist() == [157000, 400, 40200, 2010]
    assert view.size == layout.size - 400  # BN running mean and var stay on the client
    assert view.out_dim.tolist() == [200, 200, 200, 10]
    assert view.in_cols.tolist() == [784, 1, 200, 200]
    cnn = param_view(model_layout(build_model("kapc_cnn", (1, 28, 28), 10)))
    assert cnn.in_cols.tolist() == [25, 800, 1024, 512, 128]  # conv: in * kh * kw
    assert cnn.nbytes([0, 4]) == 4 * (832 + 1290)


def test_coaching_loss_gradient_is_2_lambda_w_minus_s():
    model = nn.Linear(3, 2)
    view = param_view(model_layout(model))
    s = np.arange(8, dtype=np.float32) / 10
    pairs = coaching_pairs(model, view, {0: s})
    loss = coaching_loss(pairs, lam=0.7)
    loss.backward()
    w = torch.cat([model.weight.detach().flatten(), model.bias.detach()])
    grad = torch.cat([model.weight.grad.flatten(), model.bias.grad])
    torch.testing.assert_close(grad, 2 * 0.7 * (w - torch.from_numpy(s)))
    expected = 0.7 * float(((w - torch.from_numpy(s)) ** 2).sum())
    assert float(loss.detach()) == pytest.approx(expected)


def _context(model, state=None, epochs=1, batch=8, lr=0.1, n=8) -> ClientContext:
    layout = model_layout(model)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return ClientContext(0, model, layout, x, y, x, y, {} if state is None else state,
                         TrainConfig(epochs=epochs, batch_size=batch, lr=lr),
                         torch.Generator().manual_seed(1), StepCosts(), get_flat(model, layout))


def test_client_step_adds_the_coaching_gradient_to_received_layers_only():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 4), nn.ReLU(), nn.Linear(4, 10))
    ref = copy.deepcopy(model)  # same initial weights, for an independent computation
    ctx = _context(model, lr=0.1)  # 8 samples, batch 8: one full-batch SGD step
    view = param_view(ctx.layout)
    s0 = np.linspace(-1, 1, int(view.numel()[0])).astype(np.float32)
    task = ClientTask(0, s0, s0.size * 4, {"layers": [0]})
    result = KapcClient({"lam": 2.0}).fit(ctx, task)
    # by hand: one SGD step on CE + 2 * ||w^0 - s^0||^2 (layer 1 has no coaching term)
    loss = nn.functional.cross_entropy(ref(ctx.x_train), ctx.y_train)
    first = torch.cat([ref[1].weight.flatten(), ref[1].bias])
    loss = loss + 2.0 * ((first - torch.from_numpy(s0)) ** 2).sum()
    loss.backward()
    expected = torch.cat([(q - 0.1 * q.grad).flatten() for q in ref.parameters()])
    got = view.extract(ctx.state["weights"])
    np.testing.assert_allclose(got, expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    # the whole model goes up; its own model stays on the client for the next round
    assert result.extra["layers"] == [0, 1] and result.upload_nbytes == 4 * 3190
    np.testing.assert_array_equal(result.weights, got)


def test_bytes_follow_the_layer_selection_exactly():
    model = build_model("kapc_cnn", (1, 28, 28), 10)  # layers 832, 51264, 524800, 65664, 1290
    state: dict = {}
    ctx = _context(model, state, batch=4)
    view = param_view(ctx.layout)
    s = view.select(view.extract(ctx.init_weights), [1, 4])
    task = ClientTask(0, s, s.size * 4, {"layers": [1, 4]})
    result = KapcBlsClient({}).fit(ctx, task)
    # first selection: Omega = L - 1 = 4 leading layers go up
    assert result.extra["layers"] == [0, 1, 2, 3]
    assert result.upload_nbytes == 4 * (832 + 51264 + 524800 + 65664) == result.weights.size * 4
    assert task.download_nbytes == 4 * (51264 + 1290)
    assert [type(op) for op in result.trace] == [Download, Compute, Upload]
    assert result.trace[0].nbytes == 4 * 52554 and result.trace[2].nbytes == 4 * 642560
    assert state["bls"].omega == 4 and state["bls"].times_selected == 1
    # the server stores the four layers and keeps the stale (initial) fifth one
    server = KapcBlsServer(ctx.layout, ctx.init_weights, {0: 8}, 1.0, {})
    server.aggregate_fit(0, [result])
    stored = server.client_params[0]
    np.testing.assert_array_equal(stored[:642560], result.weights)
    np.testing.assert_array_equal(stored[642560:], view.extract(ctx.init_weights)[642560:])
    # nothing received: no coaching term, no download op, a zero-byte task
    empty = KapcClient({}).fit(_context(model, {}, batch=4),
                               ClientTask(0, np.zeros(0, np.float32), 0, {"layers": []}))
    assert [type(op) for op in empty.trace] == [Compute, Upload]


# ---------------------------------------------------------------- BLS, server side


def test_self_relation_filter():
    assert self_relation_filter(np.array([0.2, 0.8, 0.5]), 0.5).tolist() == [True, False, True]


def test_bls_server_filters_by_self_relationship_after_the_first_download():
    server = _hand_server(KapcBlsServer, lr_relation=1e-12, mu=0.6)
    server.relations[0, 1] = [0.7, 0.2, 0.1]  # client 0 relies on itself on layer 1
    first = server.configure_fit(0, [0, 1, 2])
    assert [t.config["layers"] for t in first] == [[0, 1]] * 3  # first selection: all layers
    second = server.configure_fit(1, [0, 1, 2])
    assert second[0].config["layers"] == [0] and second[0].download_nbytes == 4
    np.testing.assert_allclose(second[0].weights, [1.0], rtol=1e-6)  # (1/3)*3
    assert [t.download_nbytes for t in second[1:]] == [12, 12]
    stats = server.aggregate_fit(1, [])
    assert stats.metrics["kapc_layers_down_mean"] == pytest.approx(5 / 3)
    # 2 K n_l only for what is sent: 2 * 3 * (1 + (1 + 2) + (1 + 2)) = 42 instead of 54
    assert stats.flops == 36 + 234 + 162 + 42


# ---------------------------------------------------------------- BLS, client side


CONSTS = BlsConstants(n_cols=np.array([4, 9]), out_dim=np.array([3, 10]), classes=10,
                      samples=8, rho=1.0, input_bound=2.0, delta=2 / math.e, loss_range=4.0)


def test_m_and_the_criterion_by_hand():
    tau, b = np.array([1.0, 2.0]), np.array([2.0, 4.0])
    # M = tau^2/(2 B^2) + tau^1/(2 B^1) sqrt(n^2) = 2/8 + 1/4 * 3 = 1
    assert math.exp(log_m(tau, b, CONSTS.n_cols, 2)) == pytest.approx(1.0)
    assert math.exp(log_m(tau, b, CONSTS.n_cols, 1)) == pytest.approx(0.25)
    # Omega = 1: L d_1 M(1) / (1 c 2^(L-1) M) = 2*3*0.25 / 20 = 0.075 against B^2 = 4
    assert math.exp(criterion_log_lhs(1, tau, b, tau, b, CONSTS)) == pytest.approx(0.075 / 4)
    # Omega = L with current bounds: both sides of (29) are 1, so it does not hold
    assert criterion_log_lhs(2, tau, b, tau, b, CONSTS) == pytest.approx(0.0, abs=1e-12)
    # Eq. 28's second term: (L-Omega) 3(b-a) sqrt(ln(2/delta)/2m) / (Omega 2 sqrt2 rho A
    # / sqrt m * c 2^L B^1 B^2 M) = 1 * 3 / (2 * 10 * 4 * 8 * 1) = 3/640
    with_conf = BlsConstants(**{**CONSTS.__dict__, "confidence_term": True})
    assert math.exp(criterion_log_lhs(1, tau, b, tau, b, with_conf)) == pytest.approx(
        0.075 / 4 + 3 / 640)
    wide = BlsConstants(**{**with_conf.__dict__, "loss_range": 1000.0})  # 750/640 > 1
    assert criterion_log_lhs(1, tau, b, tau, b, wide) == pytest.approx(
        math.log(0.075 / 4 + 750 / 640))
    with pytest.raises(ValueError, match="outside"):
        criterion_log_lhs(3, tau, b, tau, b, CONSTS)
    zero = np.zeros(2)  # no regulariser bound known yet: read as "not satisfied"
    assert criterion_log_lhs(1, zero, b, zero, b, CONSTS) == math.inf


@pytest.mark.parametrize(("start", "holding", "expected"), [
    (3, {1, 2, 3}, 1),  # holds: go down while it still holds
    (4, {1, 2, 3}, 5),  # fails at 4 and 5: up to L
    (4, {3, 4, 5}, 3),  # holds at 4 and 3, not at 2: the last one that holds
    (1, {3, 4}, 3),  # fails: up until it holds
    (5, set(), 5),
    (0, {1}, 1),  # Omega is clamped into [1, L]
])
def test_omega_search_on_hand_inputs(start, holding, expected):
    calls: list[int] = []

    def holds(om: int) -> bool:
        calls.append(om)
        return om in holding

    assert search_omega(start, holds, 5) == expected
    assert all(1 <= om <= 5 for om in calls)


@pytest.mark.parametrize(("start", "holding", "expected"), [
    (4, {3, 4, 5}, 2),  # as written: down until it fails -> the first failing Omega
    (3, {1, 2, 3}, 1),  # never fails on the way down: stops at 1
    (1, {3, 4}, 3),  # the upward loop is the same
])
def test_omega_search_as_written(start, holding, expected):
    assert search_omega(start, lambda om: om in holding, 5, as_written=True) == expected


def test_algorithm4_resets_after_full_uploads_and_searches_otherwise():
    state = BlsClientState(2)
    b1, tau1 = np.array([2.0, 4.0]), np.array([1.0, np.nan])  # layer 1 not received
    assert algorithm4(state, b1, tau1, CONSTS) == 1  # first selection: L - 1
    np.testing.assert_array_equal(state.b_full, [2.0, 4.0])
    np.testing.assert_array_equal(state.tau_full, [1.0, 0.0])  # unknown tau stays 0
    # second selection: search from 1 with b_hat = b, tau_hat = (1, stored 0), tau = (1, 0):
    # M = 1/4 * 3 = 0.75, M(1) = 0.25 -> 2*3*0.25/(1*10*2*0.75) = 0.1 < B^2 = 4: holds -> 1
    assert algorithm4(state, b1, tau1, CONSTS) == 1
    # a much smaller B^2 on the stored side makes Omega = 1 fail: 0.1 > 0.05, up to L
    state.b_full = np.array([2.0, 0.05])
    assert algorithm4(state, b1, np.array([1.0, 2.0]), CONSTS) == 2
    # last upload was full: bounds are max(stored, current) and Omega resets to L - 1
    assert algorithm4(state, np.array([1.0, 3.0]), np.array([0.5, 5.0]), CONSTS) == 1
    np.testing.assert_array_equal(state.b_full, [2.0, 3.0])
    np.testing.assert_array_equal(state.tau_full, [1.0, 5.0])
    assert state.times_selected == 4


# ---------------------------------------------------------------- scenarios and runs


def test_bad_parameters_are_reported_with_their_field():
    data = {**TINY, "algorithm": {"name": "kapc_bls", "params": {"mu": 1.5}}}
    with pytest.raises(ScenarioError, match="params.mu"):
        scenario_from_dict(data, "x")
    data = {**TINY, "algorithm": {"name": "kapc", "params": {"mu": 0.5}}}  # BLS-only field
    with pytest.raises(ScenarioError, match="params.mu"):
        scenario_from_dict(data, "x")


@pytest.mark.parametrize("name", ["kapc", "kapc_bls"])
def test_two_round_smoke_run_moves_the_selected_bytes(name):
    rows = run(tiny(rounds=2, algorithm={"name": name, "params": {}}), "k")
    params_bytes = 4 * 199610  # mlp_2nn's parameters (its BN running stats stay home)
    first = rows[0]
    assert first["bytes_down"] == 4 * params_bytes  # 4 clients, all layers (first selection)
    if name == "kapc":
        assert [r["bytes_up"] for r in rows] == [4 * params_bytes] * 2
        assert first["kapc_layers_up_mean"] == 4.0
    else:
        assert first["bytes_up"] == 4 * 4 * (157000 + 400 + 40200)  # Omega = L - 1 = 3
        assert first["kapc_layers_up_mean"] == 3.0
        assert rows[1]["bytes_up"] < first["bytes_up"] or rows[1]["kapc_layers_up_mean"] == 4
    for r in rows:
        assert r["server_gflops"] > 0 and 0 < r["mean_accuracy"] <= 1
        assert r["kapc_self_relation_mean"] == pytest.approx(0.25, abs=0.05)
