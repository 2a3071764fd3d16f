"""KAPC and KAPC+BLS against hand-computed numbers, in-process.

The hand example: 3 clients, a 2-layer model without biases — layer 0 one scalar weight,
layer 1 a 2 x 1 weight — with client parameters w_0 = (3 | 1, 0), w_1 = (0 | 0, 1),
w_2 = (0 | 1, 1), lambda = 1, lr_relation = 0.1, E_r = 1, R uniform at 1/3
(``relation_init: uniform``).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from support.paths import ROOT
from support.scenarios import TINY, tiny
from torch import nn

from mecsim.agents.algorithms import ClientContext, ClientResult, ClientTask, TrainConfig, run_notes
from mecsim.agents.algorithms.kapc import (
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
    layer_groups,
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
from mecsim.agents.models import build_model, get_flat, model_layout
from mecsim.agents.training import StepCosts
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.run.loop import run
from mecsim.scenario import ScenarioError, scenario_from_dict

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
    server = cls(
        layout,
        init,
        {0: 10, 1: 10, 2: 10},
        1.0,
        {"lam": 1.0, "beta": 0.5, "lr_relation": 0.1, "relation_init": "uniform", **params},
    )
    server.relations = server.initial_relations()
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
        fd = (
            relation_objective(up, grams, 2, 0.7, 0.3, 6)
            - relation_objective(down, grams, 2, 0.7, 0.3, 6)
        ) / (2 * eps)
        assert grad[idx] == pytest.approx(fd, rel=1e-6, abs=1e-6)


def test_server_round_updates_the_cube_and_sends_the_weighted_sums():
    server = _hand_server()
    tasks = server.configure_fit(0, [0, 1, 2])
    # layer 0: w = (3, 0, 0). Client 0: e = 1 - 3, grad (-12, 0, 0) -> (23, 5, 5) / 33;
    # clients 1 and 2: e = 1, grad (6, 0, 0) -> (-4/15, 1/3, 1/3) -> clamp -> (0, 1/2, 1/2)
    # layer 1: w = (1,0), (0,1), (1,1); from 1/3: (6, 3, 4)/13, (3, 6, 4)/13, (6, 6, 7)/19
    expected = np.array(
        [
            [[23 / 33, 5 / 33, 5 / 33], [6 / 13, 3 / 13, 4 / 13]],
            [[0, 0.5, 0.5], [3 / 13, 6 / 13, 4 / 13]],
            [[0, 0.5, 0.5], [6 / 19, 6 / 19, 7 / 19]],
        ]
    )
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
    assert (
        stats.flops == 486.0 == kapc_server_flops(3, 3, np.array([1, 2]), 1, np.ones((3, 2), bool))
    )
    assert stats.metrics["kapc_layers_down_mean"] == 2.0
    assert math.isnan(stats.metrics["kapc_layers_up_mean"])  # nothing uploaded


def test_selected_slice_is_written_back_and_rows_renormalised():
    server = _hand_server(lr_relation=1e-12)  # the steps change (almost) nothing
    server.relations[0, 0] = [0.5, 0.3, 0.2]
    server.configure_fit(0, [0, 2])
    # slice of client 0, layer 0 over (0, 2): (0.5, 0.2) -> (5/7, 2/7) written back; the
    # full row (5/7, 0.3, 2/7) is renormalised by its sum 1.3
    np.testing.assert_allclose(
        server.relations[0, 0], np.array([5 / 7, 0.3, 2 / 7]) / 1.3, rtol=1e-9
    )
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
    return ClientContext(
        0,
        model,
        layout,
        x,
        y,
        x,
        y,
        {} if state is None else state,
        TrainConfig(epochs=epochs, batch_size=batch, lr=lr),
        torch.Generator().manual_seed(1),
        StepCosts(),
        get_flat(model, layout),
    )


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
    assert [type(op) for op in result.trace] == [Download, Compute, Compute, Upload]
    assert result.trace[0].nbytes == 4 * 52554 and result.trace[3].nbytes == 4 * 642560
    # the layer selection is client computation (T. Algorithm 4), counted by hand:
    # B^l of every layer, 2 n_l + 1: 2 * 643850 + 5 = 1,287,705; tau^l of the two layers
    # received, 3 n_l + 1: 153,793 + 3,871 = 157,664; no criterion evaluated (a first
    # selection); the input bound over 8 images of 784 pixels, 2 * 6,272 = 12,544
    selection = result.trace[2]
    assert selection.what == "layer_selection" and selection.batches == 0
    assert selection.flops == 1287705 + 157664 + 12544
    assert result.flops == result.trace[1].flops + selection.flops
    assert state["bls"].omega == 4 and state["bls"].times_selected == 1
    # the server stores the four layers and keeps the stale (initial) fifth one
    server = KapcBlsServer(ctx.layout, ctx.init_weights, {0: 8}, 1.0, {})
    server.aggregate_fit(0, [result])
    stored = server.client_params[0]
    np.testing.assert_array_equal(stored[:642560], result.weights)
    np.testing.assert_array_equal(stored[642560:], view.extract(ctx.init_weights)[642560:])
    # nothing received: no coaching term, no download op, a zero-byte task
    empty = KapcClient({}).fit(
        _context(model, {}, batch=4), ClientTask(0, np.zeros(0, np.float32), 0, {"layers": []})
    )
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


CONSTS = BlsConstants(
    n_cols=np.array([4, 9]),
    out_dim=np.array([3, 10]),
    classes=10,
    samples=8,
    rho=1.0,
    input_bound=2.0,
    delta=2 / math.e,
    loss_range=4.0,
)


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
        0.075 / 4 + 3 / 640
    )
    wide = BlsConstants(**{**with_conf.__dict__, "loss_range": 1000.0})  # 750/640 > 1
    assert criterion_log_lhs(1, tau, b, tau, b, wide) == pytest.approx(
        math.log(0.075 / 4 + 750 / 640)
    )
    with pytest.raises(ValueError, match="outside"):
        criterion_log_lhs(3, tau, b, tau, b, CONSTS)
    zero = np.zeros(2)  # no regulariser bound known yet: read as "not satisfied"
    assert criterion_log_lhs(1, zero, b, zero, b, CONSTS) == math.inf


@pytest.mark.parametrize(
    ("start", "holding", "expected"),
    [
        (3, {1, 2, 3}, 1),  # holds: go down while it still holds
        (4, {1, 2, 3}, 5),  # fails at 4 and 5: up to L
        (4, {3, 4, 5}, 3),  # holds at 4 and 3, not at 2: the last one that holds
        (1, {3, 4}, 3),  # fails: up until it holds
        (5, set(), 5),
        (0, {1}, 1),  # Omega is clamped into [1, L]
    ],
)
def test_omega_search_on_hand_inputs(start, holding, expected):
    calls: list[int] = []

    def holds(om: int) -> bool:
        calls.append(om)
        return om in holding

    assert search_omega(start, holds, 5) == expected
    assert all(1 <= om <= 5 for om in calls)


@pytest.mark.parametrize(
    ("start", "holding", "expected"),
    [
        (4, {3, 4, 5}, 2),  # as written: down until it fails -> the first failing Omega
        (3, {1, 2, 3}, 1),  # never fails on the way down: stops at 1
        (1, {3, 4}, 3),  # the upward loop is the same
    ],
)
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
    # conv_bn grouping: the 2NN's layers are FC 200 + its BatchNorm, FC 200, FC 10
    layer_bytes = 4 * np.array([157000 + 400, 40200, 2010])
    first = rows[0]
    assert first["bytes_down"] == 4 * params_bytes  # 4 clients, all layers (first selection)
    if name == "kapc":
        assert [r["bytes_up"] for r in rows] == [4 * params_bytes] * 2
        assert first["kapc_layers_up_mean"] == 3.0
    else:
        assert first["bytes_up"] == 4 * layer_bytes[:2].sum()  # Omega = L - 1 = 2
        assert first["kapc_layers_up_mean"] == 2.0
        assert first["kapc_omega_first_mean"] == 2.0
        assert math.isnan(first["kapc_omega_repeat_mean"])
        # second selection, withhold_last with 2 withheld: Omega = 3 - 2 = 1 layer up
        assert rows[1]["bytes_up"] == 4 * layer_bytes[0]
        assert rows[1]["kapc_omega_repeat_mean"] == 1.0
        # layer 3 (beyond last round's Omega = 2, and uploaded by no client) is not sent
        # but coached towards the client's own weights; the mu filter may hold back more
        assert rows[1]["kapc_layers_own_mean"] == 1.0
        if rows[1]["kapc_layers_filtered_mean"] == 0:  # nothing held back by mu
            assert rows[1]["bytes_down"] == 4 * layer_bytes[:2].sum()
    for r in rows:
        assert r["server_gflops"] > 0 and 0 < r["mean_accuracy"] <= 1
        assert 0 < r["kapc_self_relation_mean"] < 1


@pytest.mark.parametrize("policy", ["algorithm5", "uploaded_only"])
def test_three_rounds_download_per_algorithm5_or_only_what_was_uploaded(policy):
    # 4 clients, all selected every round, mu = 1 (r_ii <= 1: the filter never acts),
    # withhold_last with 2 withheld on the 2NN's 3 layers: Omega = 2 at the first
    # selection (round 1), then 1 (rounds 2, 3); the last layer is never uploaded
    params = {"mu": 1.0, "download_policy": policy}
    rows = run(tiny(rounds=3, algorithm={"name": "kapc_bls", "params": params}), "k")
    layer_bytes = 4 * np.array([157000 + 400, 40200, 2010])
    assert rows[0]["bytes_down"] == 4 * layer_bytes.sum()  # first selections: everything
    assert [r["bytes_up"] for r in rows] == [4 * layer_bytes[:2].sum()] + [4 * layer_bytes[0]] * 2
    # round 2: Omega was 2, so layers 0-1 under both (layer 2, never uploaded, withheld)
    assert rows[1]["bytes_down"] == 4 * layer_bytes[:2].sum()
    if policy == "algorithm5":  # round 3: s_i over layers 0-1, layer 1 with stale values
        assert rows[2]["bytes_down"] == 4 * layer_bytes[:2].sum()
        assert rows[2]["kapc_layers_down_mean"] == 2.0
    else:  # round 3: only layer 0, what each client uploaded in round 2
        assert rows[2]["bytes_down"] == 4 * layer_bytes[0]
        assert rows[2]["kapc_layers_down_mean"] == 1.0
    # under both, layers 1 and 2 are coached towards the client's own weights in round 3
    assert rows[2]["kapc_layers_own_mean"] == 2.0


# ---------------------------------------------------------------- what a layer is


def test_conv_bn_grouping_gives_resnet18_21_layers_and_module_41():
    layout = model_layout(build_model("resnet18", (3, 32, 32), 10))
    module, conv_bn = param_view(layout, "module"), param_view(layout, "conv_bn")
    assert module.num_layers == 41 and conv_bn.num_layers == 21
    assert module.size == conv_bn.size == 11173962  # the same parameters, grouped
    # the stem: conv 3x3x3 -> 64 (1728) with its BatchNorm's gamma and beta (128)
    assert conv_bn.numel()[0] == 1728 + 128 and module.numel()[:2].tolist() == [1728, 128]
    # the last two layers: layer4.1.conv2 + bn2, then the FC (5120 + 10)
    assert conv_bn.numel()[-2:].tolist() == [512 * 512 * 9 + 1024, 5130]
    # n^l and d^l of a conv_bn layer are its convolution's, not its BatchNorm's
    assert conv_bn.in_cols[:2].tolist() == [27, 576] and conv_bn.out_dim[0] == 64
    assert module.in_cols[1] == 1  # a BatchNorm alone: its scale is one column
    # three shortcut convolutions (1x1) are layers of their own, each with its BN
    assert sorted(conv_bn.in_cols.tolist()).count(64) == 1  # layer2.0.shortcut: 64 * 1 * 1
    groups = layer_groups(layout, "conv_bn")
    assert len(groups) == 41 and groups.max() == 20


def test_conv_bn_is_module_for_a_model_without_batchnorm():
    layout = model_layout(build_model("kapc_cnn", (1, 28, 28), 10))
    a, b = param_view(layout, "conv_bn"), param_view(layout, "module")
    assert a.bounds.tolist() == b.bounds.tolist() and a.num_layers == 5
    with pytest.raises(ValueError, match="unknown layer grouping"):
        layer_groups(layout, "blocks")


# ---------------------------------------------------------------- relation init


def test_random_relation_init_is_seeded_normalised_and_not_uniform():
    model = _hand_model()
    layout = model_layout(model)
    init = np.zeros(layout.size, np.float32)

    def cube(seed: int, how: str) -> np.ndarray:
        server = KapcServer(layout, init, {0: 1, 1: 1, 2: 1, 3: 1}, 1.0, {"relation_init": how})
        server.seed = seed
        return server.initial_relations()

    r = cube(5, "random")
    assert r.shape == (4, 2, 4)
    np.testing.assert_allclose(r.sum(axis=-1), 1.0)  # every (client, layer) row sums to 1
    assert np.all(r >= 0) and r.std() > 0.01
    np.testing.assert_array_equal(r, cube(5, "random"))  # the scenario seed decides it
    assert not np.array_equal(r, cube(6, "random"))
    np.testing.assert_array_equal(cube(5, "uniform"), 0.25)


# ---------------------------------------------------------------- Eq. 20


def _omega_one_for_client_0(**params) -> KapcBlsServer:
    """The hand server after a round in which client 0 uploaded Omega = 1 of 2 layers
    ([3.0]: its stale layer 1 stays (1, 0)) and clients 1, 2 both layers."""
    server = _hand_server(KapcBlsServer, lr_relation=1e-12, mu=1.0, **params)
    server.configure_fit(0, [0, 1, 2])  # first selections: everything
    server.aggregate_fit(
        0,
        [
            _upload(0, [3.0], [0]),
            _upload(1, [0.0, 0.0, 1.0], [0, 1]),
            _upload(2, [0.0, 1.0, 1.0], [0, 1]),
        ],
    )
    assert server.omega_of == {0: 1, 1: 2, 2: 2}
    return server


def test_uploaded_only_withholds_layers_beyond_omega_and_coaches_own_weights():
    server = _omega_one_for_client_0(download_policy="uploaded_only")
    tasks = server.configure_fit(1, [0, 1, 2])
    assert tasks[0].config["layers"] == [0] and tasks[0].download_nbytes == 4
    assert tasks[0].config["own_layers"] == [1]  # Eq. 20: its own weights there
    assert [t.config["layers"] for t in tasks[1:]] == [[0, 1]] * 2
    assert "own_layers" not in tasks[1].config
    stats = server.aggregate_fit(1, [])
    assert stats.metrics["kapc_layers_own_mean"] == pytest.approx(1 / 3)
    # unselected_target none: the layer is still not sent, and nothing coaches it
    plain = _hand_server(
        KapcBlsServer,
        lr_relation=1e-12,
        mu=1.0,
        unselected_target="none",
        download_policy="uploaded_only",
    )
    plain.configure_fit(0, [0])
    plain.aggregate_fit(0, [_upload(0, [3.0], [0])])
    task = plain.configure_fit(1, [0])[0]
    assert task.config["layers"] == [0] and "own_layers" not in task.config


def test_algorithm5_sends_every_layer_with_stale_values_and_keeps_the_eq20_target():
    server = _omega_one_for_client_0()  # download_policy algorithm5, the default
    tasks = server.configure_fit(1, [0, 1, 2])
    # T. Algorithm 5 lines 14-16: s_0 over both layers (mu = 1 filters nothing), 3 floats;
    # R stays uniform (lr 1e-12), so s_0 = (1/3) sum_j W_j with client 0's stale layer 1
    # (Eq. 33): layer 0 (3 + 0 + 0) / 3 = 1, layer 1 ((1, 0) + (0, 1) + (1, 1)) / 3
    assert tasks[0].config["layers"] == [0, 1] and tasks[0].download_nbytes == 12
    np.testing.assert_allclose(tasks[0].weights, [1.0, 2 / 3, 2 / 3], rtol=1e-6)
    # Eq. 20: layer 1 (beyond its Omega = 1) is coached towards its own weights
    assert tasks[0].config["own_layers"] == [1]
    assert [t.download_nbytes for t in tasks] == [12] * 3
    assert server.aggregate_fit(1, []).metrics["kapc_layers_own_mean"] == pytest.approx(1 / 3)
    # unselected_target received: the same bytes, and the sent s_0^1 is the target
    literal = _omega_one_for_client_0(unselected_target="received")
    task = literal.configure_fit(1, [0, 1, 2])[0]
    assert task.config["layers"] == [0, 1] and "own_layers" not in task.config
    # the mu filter is the only one: with r_00^1 = 0.7 > mu = 0.6 layer 1 is held back
    filtered = _omega_one_for_client_0()
    filtered.params = filtered.params.model_copy(update={"mu": 0.6})
    filtered.relations[0, 1] = [0.7, 0.2, 0.1]
    task = filtered.configure_fit(1, [0, 1, 2])[0]
    assert task.config["layers"] == [0] and task.config["own_layers"] == [1]


def test_a_layer_no_client_uploaded_is_not_sent_after_the_first_uploads():
    # withhold_last's trap: Algorithm 4 line 8 leaves the last layer out of a first upload
    # and withhold_last out of every later one, so W^1 stays the initial model's (zeros)
    model = _hand_model()
    layout = model_layout(model)
    init = np.zeros(layout.size, np.float32)

    def server(**params) -> KapcBlsServer:
        srv = KapcBlsServer(
            layout,
            init,
            {0: 10, 1: 10, 2: 10},
            1.0,
            {"lr_relation": 1e-12, "relation_init": "uniform", "mu": 1.0, **params},
        )
        round0 = srv.configure_fit(0, [0, 1])
        assert [t.config["layers"] for t in round0] == [[0, 1]] * 2  # nothing uploaded yet
        srv.aggregate_fit(0, [_upload(0, [3.0], [0]), _upload(1, [1.0], [0])])
        return srv

    fixed = server()  # unuploaded_layers: withhold (default)
    assert fixed.layers_uploaded.tolist() == [True, False]
    tasks = fixed.configure_fit(1, [1, 2])
    # client 2, a first selection, gets layer 0 only (4 B) and coaches layer 1 towards its
    # own weights instead of towards s_2^1 = the initial zeros; client 1 likewise
    assert [t.config["layers"] for t in tasks] == [[0], [0]]
    assert [t.download_nbytes for t in tasks] == [4, 4]
    assert [t.config["own_layers"] for t in tasks] == [[1], [1]]
    # the slice of the two selected, uniform: s_2^0 = (W_1^0 + W_2^0) / 2 = (1 + 0) / 2
    np.testing.assert_allclose(tasks[1].weights, [0.5], rtol=1e-6)
    # send: Algorithm 5 literally, the first selection receives the initial layer 1
    literal = server(unuploaded_layers="send").configure_fit(1, [1, 2])
    assert literal[1].config["layers"] == [0, 1] and literal[1].download_nbytes == 12
    np.testing.assert_allclose(literal[1].weights, [0.5, 0.0, 0.0], atol=1e-7)
    assert "own_layers" not in literal[1].config
    # once some client uploads layer 1 it is sent again
    fixed.aggregate_fit(1, [_upload(2, [0.0, 1.0, 1.0], [0, 1])])
    assert fixed.configure_fit(2, [0])[0].config["layers"] == [0, 1]


def test_layers_uploaded_survive_a_checkpoint_and_are_rebuilt_from_an_old_one():
    server = _omega_one_for_client_0()
    state = copy.deepcopy(server.state_dict())
    fresh = _hand_server(KapcBlsServer)
    fresh.load_state_dict(state)
    assert fresh.layers_uploaded.tolist() == [True, True]
    state.pop("layers_uploaded")  # a checkpoint from before the attribute existed
    fresh.load_state_dict(state)
    assert fresh.layers_uploaded.tolist() == [True, True]


@pytest.mark.parametrize("received_too", [False, True])
def test_client_coaches_own_layers_towards_its_start_of_round_weights(received_too):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 4), nn.ReLU(), nn.Linear(4, 10))
    ref = copy.deepcopy(model)
    ctx = _context(model, lr=0.1, batch=4)  # 8 samples, batch 4: two SGD steps
    view = param_view(ctx.layout)
    s0 = np.linspace(-1, 1, int(view.numel()[0])).astype(np.float32)
    if received_too:  # algorithm5: s^1 is downloaded too, but Eq. 20's target wins
        s1 = np.full(int(view.numel()[1]), 5.0, np.float32)
        sent = np.concatenate([s0, s1])
        task = ClientTask(0, sent, sent.size * 4, {"layers": [0, 1], "own_layers": [1]})
    else:
        task = ClientTask(0, s0, s0.size * 4, {"layers": [0], "own_layers": [1]})
    result = KapcBlsClient({"lam": 2.0}).fit(ctx, task)
    # tau (Eq. 31) is measured only against the layer coached towards the server's s
    state = ctx.state["bls"]
    assert state.tau_full[0] > 0 and state.tau_full[1] == 0
    assert result.extra["received_layers"] == task.config["layers"]
    # by hand, with the same two mini-batches: CE + 2 ||w^0 - s^0||^2 + 2 ||w^1 - w^1_start||^2
    start = [q.detach().clone() for q in ref[3].parameters()]
    order = torch.randperm(8, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for idx in order.split(4):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(ctx.x_train[idx]), ctx.y_train[idx])
        first = torch.cat([ref[1].weight.flatten(), ref[1].bias])
        loss = loss + 2.0 * ((first - torch.from_numpy(s0)) ** 2).sum()
        loss = loss + 2.0 * sum(
            ((q - q0) ** 2).sum() for q, q0 in zip(ref[3].parameters(), start, strict=True)
        )
        loss.backward()
        opt.step()
    expected = torch.cat([q.detach().flatten() for q in ref.parameters()]).numpy()
    np.testing.assert_allclose(view.extract(ctx.state["weights"]), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- omega policy


def test_withhold_last_uploads_all_but_the_last_layers_on_repeat_selections():
    state = BlsClientState(5)
    b, tau = np.ones(5), np.ones(5)
    assert algorithm4(state, b, tau, CONSTS_5, withheld=2) == 4  # first selection: L - 1
    assert algorithm4(state, b, tau, CONSTS_5, withheld=2) == 3
    assert algorithm4(state, b, tau, CONSTS_5, withheld=2) == 3
    assert algorithm4(BlsClientState(2), b[:2], tau[:2], CONSTS, withheld=5) == 1
    s2 = BlsClientState(2)
    algorithm4(s2, b[:2], tau[:2], CONSTS, withheld=5)
    assert algorithm4(s2, b[:2], tau[:2], CONSTS, withheld=5) == 1  # never below 1


CONSTS_5 = BlsConstants(n_cols=np.full(5, 4), out_dim=np.full(5, 3), classes=10, samples=8)


def test_run_notes_label_the_policy_and_warn_when_omega_stays_one():
    rows = [
        {
            "kapc_omega_repeat_mean": math.nan,
            "kapc_layers_filtered_mean": 0.0,
            "kapc_self_relation_max": 0.12,
        },
        {
            "kapc_omega_repeat_mean": 1.0,
            "kapc_layers_filtered_mean": 0.0,
            "kapc_self_relation_max": 0.13,
        },
    ]
    notes = run_notes("kapc_bls", {"omega_policy": "printed"}, rows)
    assert notes[0].startswith("KAPC+BLS uploads: omega_policy printed")
    assert any(
        n.startswith("Warning: Omega stayed 1 on every repeat selection (1 rounds") for n in notes
    )
    assert any("held back no layer" in n and "0.130" in n for n in notes)
    rows[1]["kapc_omega_repeat_mean"] = 2.0
    rows[1]["kapc_layers_filtered_mean"] = 0.5
    notes = run_notes("kapc_bls", {}, rows)
    assert len(notes) == 1 and "withhold_last" in notes[0] and "last 2 layers" in notes[0]
    assert "download_policy algorithm5" in notes[0]
    old = run_notes("kapc_bls", {"download_policy": "uploaded_only"}, rows)
    assert "download_policy uploaded_only" in old[0]
    assert run_notes("kapc", {}, rows) == []


# ---------------------------------------------------------------- Table 3 bytes benchmark


def _table3_bytes_module():
    import importlib.util
    import sys

    path = ROOT / "benchmarks" / "papers" / "kapc_table3_bytes.py"
    spec = importlib.util.spec_from_file_location("kapc_table3_bytes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kapc_table3_bytes", module)
    spec.loader.exec_module(module)
    return module


def test_table3_bytes_counts_the_recorded_layers_at_the_given_sizes():
    bench = _table3_bytes_module()
    mib = 1024 * 1024
    sizes = mib * np.array([1, 2, 3])
    decisions = [
        (0, 1, (0, 1, 2), (0, 1)),
        (0, 2, (0, 1, 2), (0, 1)),
        (1, 1, (0, 1), (0,)),
    ]
    got = bench.account(decisions, sizes)
    # by hand: down 6 + 6 = 12 MiB in round 0, 3 in round 1 -> 7.5; up 3 + 3 = 6, then 1
    # -> 3.5; layers down (3 + 3 + 2) / 3, up (2 + 2 + 1) / 3
    assert got["rounds"] == 2
    assert got["mib_down"] == pytest.approx(7.5) and got["mib_up"] == pytest.approx(3.5)
    assert got["layers_down"] == pytest.approx(8 / 3) and got["layers_up"] == pytest.approx(5 / 3)
    # ResNet18's 21 conv_bn layers: the stem 1728 + 128 parameters, the FC 5130; 11,173,962
    full = bench.resnet18_layer_bytes()
    assert len(full) == 21 and full[0] == 4 * 1856 and full[-1] == 4 * 5130
    assert full.sum() == 4 * 11173962 == 44695848


def test_table3_bytes_reduced_resnet18_has_resnet18s_layers_narrower():
    bench = _table3_bytes_module()
    narrow = param_view(model_layout(bench.NarrowResNet18(3, 10, 16)), "conv_bn")
    full = param_view(model_layout(build_model("resnet18", (3, 32, 32), 10)), "conv_bn")
    assert narrow.num_layers == full.num_layers == 21
    # layer 1 = layers.0.conv1 (3x3, 64 -> 64) + its BN: 36,864 + 128; / 16 in width: 4 -> 4,
    # 144 + 8; the FC 512 -> 10 becomes 32 -> 10: 330
    assert full.numel()[1] == 36864 + 128 and narrow.numel()[1] == 144 + 8
    assert narrow.numel()[-1] == 330
    assert narrow.in_cols.tolist()[1:5] == [36, 36, 36, 36]  # 4 channels x 3 x 3
