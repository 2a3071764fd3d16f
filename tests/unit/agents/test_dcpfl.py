"""DC-PFL (Eq. 3-6, group graph, RDP, trial round, layer-wise bytes), its baselines
(Per-FedAvg, k-means clusters) and the convergence definition of the benchmark table."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from support.helpers import DCPFL_E2E, DCPFL_FAST
from support.scenarios import tiny

from mecsim.agents.algorithms import ClientContext, ClientResult, ClientTask, TrainConfig
from mecsim.agents.algorithms.dcpfl import (
    DECISION_NBYTES,
    LOSS_REPORT_NBYTES,
    DCPFLClient,
    DCPFLServer,
    curvature_radii,
    discrepancy_matrix,
    group_graph,
    groups_at,
    layer_discrepancy,
    layer_intervals,
    layers_due,
    model_discrepancy,
    next_split,
    rdp_detections,
    rdp_end_unseen,
    rdp_ended,
    smoothed_losses,
    trial_accepts,
)
from mecsim.agents.algorithms.kmeans_cluster import KMeansClusterServer, kmeans_labels
from mecsim.agents.algorithms.perfedavg import PerFedAvgClient, fo_maml_epochs, pair_batches
from mecsim.agents.models import get_flat, model_layout, set_flat
from mecsim.agents.training import StepCosts
from mecsim.analysis.convergence import (
    convergence_round,
    final_accuracy,
    to_convergence,
    trailing_mean,
)
from mecsim.data import heterogeneity_dkl, load_dataset, partition
from mecsim.emulation.engine import ClientSpec, NetworkSpec, ServerSpec, time_round
from mecsim.emulation.ops import (
    Barrier,
    Compute,
    Download,
    Upload,
    op_from_dict,
    op_to_dict,
    trace_bytes,
)
from mecsim.run.loop import run
from mecsim.scenario import ScenarioError, load_scenario, resolved_yaml
from mecsim.store.session import run_in_folder

# --------------------------------------------------------------------------- helpers


def _two_layer_model() -> torch.nn.Module:
    torch.manual_seed(0)
    # layer 0: 3x2 weight + 2 bias = 8 elements (32 B); layer 1: 2x2 + 2 = 6 (24 B)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))


def _layout5():
    """A 5-element layout: layer 0 = 3 elements (Linear(2, 1)), layer 1 = 2 (Linear(1, 1))."""
    return model_layout(torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.Linear(1, 1)))


def _ctx(model, cid: int = 0, state=None, n: int = 8, batch: int = 4) -> ClientContext:
    layout = model_layout(model)
    g = torch.Generator().manual_seed(10 + cid)
    x = torch.randn(n, 3, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    return ClientContext(
        cid,
        model,
        layout,
        x,
        y,
        x[:4],
        y[:4],
        {} if state is None else state,
        TrainConfig(epochs=1, batch_size=batch, lr=0.1),
        torch.Generator().manual_seed(100 + cid),
        StepCosts(),
        get_flat(model, layout),
    )


def _fake(cid: int, weights, *, loss=None, n: int = 10, **extra) -> ClientResult:
    w = None if weights is None else np.asarray(weights, dtype=np.float32)
    ex = {"loss": loss, **extra}
    return ClientResult(cid, w, 0 if w is None else 4 * w.size, n, 0.0, (), 0.0, 0, 0, extra=ex)


# --------------------------------------------------------------------------- Eq. 3 and 5


def test_model_discrepancy_hand_numbers_for_every_scaling():
    lay = _layout5()
    w_i = np.array([0.0, 1, 2, 3, 4])
    w_j = np.array([4.0, 3, 2, 1, 0])
    # model: S(w_i) = [0, .25, .5, .75, 1], S(w_j) reversed -> |diff| = [1, .5, 0, .5, 1] / 5
    assert model_discrepancy(w_i, w_j, lay, "model") == pytest.approx(3 / 5)
    # layer: [0, .5, 1 | 0, 1] vs [1, .5, 0 | 1, 0] -> 4 / 5
    assert model_discrepancy(w_i, w_j, lay, "layer") == pytest.approx(4 / 5)
    w_k = 2 * w_i  # the same shape, twice the scale
    assert model_discrepancy(w_i, w_k, lay, "model") == 0.0  # per-client S hides the scale
    # shared over the pair (min 0, max 8): |w_i - w_k| / 8 = [0, 1, 2, 3, 4] / 8 -> 10/8 / 5
    assert model_discrepancy(w_i, w_k, lay, "shared_model") == pytest.approx(0.25)
    # shared per layer: layer 0 in [0, 4]: .75; layer 1 in [3, 8]: 3/5 + 4/5 -> 2.15 / 5
    assert model_discrepancy(w_i, w_k, lay, "shared_layer") == pytest.approx(0.43)
    assert model_discrepancy(np.full(5, 7.0), np.full(5, -1.0), lay, "model") == 0.0
    with pytest.raises(ValueError, match="scaling"):
        model_discrepancy(w_i, w_j, lay, "zscore")
    with pytest.raises(ValueError, match="shape"):
        model_discrepancy(w_i[:4], w_j, lay)


def test_discrepancy_matrix_matches_the_pairwise_definition():
    lay = _layout5()
    w = np.array([[0.0, 1, 2, 3, 4], [4.0, 3, 2, 1, 0], [0.0, 2, 1, 3, 9]])
    for scaling in ("model", "layer"):
        d = discrepancy_matrix(w, lay, scaling)
        assert np.allclose(d, d.T) and np.all(np.diag(d) == 0)
        for i in range(3):
            for j in range(3):
                if i != j:
                    assert d[i, j] == pytest.approx(model_discrepancy(w[i], w[j], lay, scaling))
    # shared: one min/max (0, 9) for all three rows, so D = L1 / 9 / 5
    d = discrepancy_matrix(w, lay, "shared_model")
    assert d[0, 2] == pytest.approx((0 + 1 + 1 + 0 + 5) / 9 / 5)
    assert d[0, 1] == pytest.approx((4 + 2 + 0 + 2 + 4) / 9 / 5)


def test_layer_discrepancy_eq5_hand_numbers():
    lay = _layout5()
    members = np.array([[0.0, 1, 2, 3, 4], [4.0, 3, 2, 1, 0]])
    group = np.array([0.0, 1, 2, 3, 5])  # S = [0, .2, .4, .6, 1]
    # member 0: S - S_g = [0, .05, .1, .15, 0] -> layer 0: .15/3, layer 1: .15/2
    # member 1: [1, .55, .1, .35, 1]          -> layer 0: 1.65/3, layer 1: 1.35/2
    np.testing.assert_allclose(
        layer_discrepancy(members, group, lay, "model"), [(0.05 + 0.55) / 2, (0.075 + 0.675) / 2]
    )


# Eq. 3 and Eq. 5 at the server, each with its own S (scaling_eq3, scaling_eq5)

W3 = {0: [0.0, 1, 2, 3, 4], 1: [4.0, 3, 2, 1, 0], 2: [0.0, 1, 2, 30, 40]}


def _warmup_server(uploads: dict, **params) -> DCPFLServer:
    """A DC-PFL server on the 5-element layout after one warm-up round (T_start = 1) in
    which client c uploaded ``uploads[c]``: Eq. 3, the group graph and, for the one group
    at gamma~ = 1, Eq. 5-6 are computed."""
    server = DCPFLServer(
        _layout5(), np.zeros(5, np.float32), dict.fromkeys(uploads, 10), 1.0,
        {"warmup_rounds": 1, **params},
    )  # fmt: skip
    tasks = server.configure_fit(0, sorted(uploads))
    server.aggregate_fit(0, [_fake(t.client_id, uploads[t.client_id], loss=1.0) for t in tasks])
    return server


def test_eq3_scales_the_whole_model_by_default_and_per_layer_on_request():
    # Layout: layer 0 = elements 0-2, layer 1 = elements 3-4.
    # scaling_eq3: model (default): S by each vector's own min/max over all 5 elements
    #   S0 = [0, .25, .5, .75, 1]   S1 = [1, .75, .5, .25, 0]   S2 = [0, .025, .05, .75, 1]
    #   D01 = (1 + .5 + 0 + .5 + 1) / 5 = .6
    #   D02 = (0 + .225 + .45 + 0 + 0) / 5 = .135
    #   D12 = (1 + .725 + .45 + .5 + 1) / 5 = .735
    #   average linkage: {0, 2} at .135, then {0, 2}-{1} at (.6 + .735) / 2 = .6675
    # scaling_eq3: layer: S per layer, each by its own min/max
    #   S0 = [0, .5, 1 | 0, 1]   S1 = [1, .5, 0 | 1, 0]   S2 = [0, .5, 1 | 0, 1]
    #   (client 2's layer 1 [30, 40] scales like client 0's [3, 4]: the scale is lost)
    #   D01 = 4 / 5 = .8, D02 = 0, D12 = .8; gamma_global = (.8 + .8) / 2 = .8
    by_model = [[0, 0.6, 0.135], [0.6, 0, 0.735], [0.135, 0.735, 0]]
    by_layer = [[0, 0.8, 0], [0.8, 0, 0.8], [0, 0.8, 0]]
    for params, d, gamma_global in (
        ({}, by_model, 0.6675),
        ({"scaling_eq5": "model"}, by_model, 0.6675),  # Eq. 5's S does not touch Eq. 3
        ({"scaling_eq3": "layer"}, by_layer, 0.8),
        ({"scaling": "layer"}, by_layer, 0.8),  # the old single switch: both per layer
    ):
        server = _warmup_server(W3, **params)
        np.testing.assert_allclose(server.discrepancy, d, rtol=1e-6, atol=1e-7, err_msg=params)
        assert server.gamma_global == pytest.approx(gamma_global, rel=1e-6), params


W2 = {0: [0.0, 2, 4, 0, 40], 1: [0.0, 2, 4, 40, 0]}


def test_eq5_scales_each_layer_by_default_and_the_whole_model_on_request():
    # One group {0, 1} at gamma~ = 1; its model is the sample-weighted mean (10 and 10
    # samples): g = [0, 2, 4, 20, 20].
    # scaling_eq5: layer (default): S of each layer of each vector by its own min/max
    #   m0 = [0, .5, 1 | 0, 1]   m1 = [0, .5, 1 | 1, 0]   g = [0, .5, 1 | 0, 0] (constant)
    #   D_{g,0} = 0, D_{g,1} = mean over members of (1 / 2, 1 / 2) = .5
    #   D_g = .25; layer 0 has 0 < .1 * .25: low-discrepancy, every alpha * tau = 3 rounds
    # scaling_eq5: model: S of each whole vector by its own min/max
    #   m0 = [0, .05, .1, 0, 1]  m1 = [0, .05, .1, 1, 0]  g = [0, .1, .2, 1, 1]
    #   |m0 - g| = [0, .05, .1, 1, 0], |m1 - g| = [0, .05, .1, 0, 1]
    #   D_{g,0} = .15 / 3 = .05 (both), D_{g,1} = 1 / 2 = .5 (both)
    #   D_g = .275; .05 >= .0275: every layer every tau = 1 round
    lay = _layout5()
    members = np.array([W2[0], W2[1]])
    group = np.array([0.0, 2, 4, 20, 20])
    np.testing.assert_allclose(layer_discrepancy(members, group, lay), [0, 0.5])
    np.testing.assert_allclose(layer_discrepancy(members, group, lay, "model"), [0.05, 0.5])
    for params, intervals in (
        ({}, [3, 1]),
        ({"scaling_eq3": "layer"}, [3, 1]),  # Eq. 3's S does not touch Eq. 5
        ({"scaling_eq5": "model"}, [1, 1]),
        ({"scaling": "model"}, [1, 1]),  # the old single switch: both over the model
    ):
        server = _warmup_server(W2, **params)
        np.testing.assert_allclose(server.group_models[0], group)
        assert server.intervals[0].tolist() == intervals, params


def test_the_old_scaling_switch_still_loads_and_cannot_be_mixed_with_the_new_ones(tmp_path):
    # a scenario (or a run folder's scenario.yaml) written before the split
    sc = tiny(algorithm={"name": "dcpfl", "params": {"scaling": "shared_model"}})
    path = tmp_path / "scenario.yaml"
    path.write_text(resolved_yaml(sc))
    again = load_scenario(path)
    p = DCPFLServer.Params(**again.algorithm.params)
    assert (p.scaling_eq3, p.scaling_eq5) == ("shared_model", "shared_model")
    with pytest.raises(ScenarioError, match=r"params.*scaling sets both.*scaling_eq5, not"):
        tiny(algorithm={"name": "dcpfl", "params": {"scaling": "layer", "scaling_eq5": "model"}})
    with pytest.raises(ScenarioError, match=r"params\.scaling_eq3"):
        tiny(algorithm={"name": "dcpfl", "params": {"scaling_eq3": "zscore"}})


# --------------------------------------------------------------------------- Eq. 6


def test_layer_intervals_eq6_and_schedule():
    # mean 0.39 -> threshold 0.039: only the first layer is low-discrepancy
    np.testing.assert_array_equal(layer_intervals([0.01, 1.0, 0.5, 0.05], 5, 3), [15, 5, 5, 5])
    # at exactly 0.1 * D_g a layer is high-discrepancy (Eq. 6: "<" for low)
    np.testing.assert_array_equal(layer_intervals([0.1, 1.9], 1, 3), [1, 1])
    np.testing.assert_array_equal(layer_intervals([0.1, 1.9], 1, 3, low_ratio=0.11), [3, 1])
    np.testing.assert_array_equal(layer_intervals([0.0, 0.0], 2, 3), [2, 2])  # all equal
    with pytest.raises(ValueError):
        layer_intervals([-1.0, 1.0], 1, 3)
    due = [layers_due(r, 5, np.array([1, 3])).tolist() for r in range(5, 11)]
    assert due == [
        [True, False],
        [True, False],
        [True, True],
        [True, False],
        [True, False],
        [True, True],
    ]
    with pytest.raises(ValueError):
        layers_due(4, 5, np.array([1, 3]))


# --------------------------------------------------------------------------- group graph

D4 = np.array(
    [[0.0, 0.1, 0.6, 0.8], [0.1, 0.0, 0.7, 0.9], [0.6, 0.7, 0.0, 0.2], [0.8, 0.9, 0.2, 0.0]]
)


def test_group_graph_structure_at_several_gamma_tilde():
    z, gamma_global = group_graph(D4)
    # average linkage: {0,1} at 0.1, {2,3} at 0.2, then (0.6+0.8+0.7+0.9)/4 = 0.75
    assert gamma_global == pytest.approx(0.75)
    expected = {
        1.0: [0, 0, 0, 0],
        0.99: [0, 0, 1, 1],
        0.3: [0, 0, 1, 1],
        0.2: [0, 0, 1, 2],
        0.1: [0, 1, 2, 3],
        0.0: [0, 1, 2, 3],
    }
    for g, labels in expected.items():
        assert groups_at(z, gamma_global, g).tolist() == labels, g
    with pytest.raises(ValueError):
        groups_at(z, gamma_global, 1.2)


def test_next_split_steps_down_until_the_groups_change():
    z, gg = group_graph(D4)
    labels, g = next_split(z, gg, 1.0, 0.2, np.zeros(4, int))
    assert labels.tolist() == [0, 0, 1, 1] and g == pytest.approx(0.8)
    # 0.6 and 0.4 give the same two groups: the step continues to 0.2
    labels, g = next_split(z, gg, 0.8, 0.2, np.array([0, 0, 1, 1]))
    assert labels.tolist() == [0, 0, 1, 2] and g == pytest.approx(0.2)
    assert next_split(z, gg, 0.2, 0.2, np.arange(4)) is None  # everyone alone already


def test_group_graph_nests_and_rejects_bad_matrices():
    rng = np.random.default_rng(0)
    x = rng.random((9, 3))
    d = np.abs(x[:, None] - x[None]).sum(-1)
    z, gg = group_graph(d)
    coarse, fine = groups_at(z, gg, 0.7), groups_at(z, gg, 0.3)
    for grp in np.unique(fine):  # a group at a small gamma~ sits inside one at a larger one
        assert len(np.unique(coarse[fine == grp])) == 1
    for bad in (
        np.ones((2, 3)),
        np.array([[0, 1], [2, 0.0]]),
        np.array([[0, -1], [-1, 0.0]]),
        np.array([[1, 1], [1, 1.0]]),
    ):
        with pytest.raises(ValueError):
            group_graph(bad)
    assert group_graph(np.zeros((1, 1)))[1] == 0.0


# --------------------------------------------------------------------------- Eq. 4, RDP


def test_curvature_and_rdp_on_a_hand_curve():
    losses = [10, 6, 3, 1, 0, 0, 0, 0]  # s = 1: l' = -4, -3, -2, -1, 0, 0, 0; l'' = 1, 1, 1, 1, 0
    r = curvature_radii(losses, 1)
    assert np.isnan(r[:2]).all()
    np.testing.assert_allclose(r[2:6], [10**1.5, 5**1.5, 2**1.5, 1.0])
    assert np.isinf(r[6:]).all()  # l'' = 0: no convex bend
    # the knee (minimum radius) is at index 5; with t_obv = 2 it is seen at the 8th loss
    assert [rdp_ended(r[:m], 2) for m in range(3, 9)] == [False] * 5 + [True]


def test_curvature_matches_an_independent_pandas_computation():
    rng = np.random.default_rng(1)
    losses = 2.3 * np.exp(-np.arange(30) / 6) + 0.05 * rng.random(30)
    ser = pd.Series(losses).rolling(5, min_periods=1).mean()
    np.testing.assert_allclose(smoothed_losses(losses, 5), ser.to_numpy())
    d1 = ser.diff()
    d2 = d1.diff()
    expected = np.where(d2 > 0, (1 + d1**2) ** 1.5 / d2.where(d2 > 0, 1.0), np.inf)
    expected[:4] = np.nan  # defined from the s-th (5th) loss on
    np.testing.assert_allclose(curvature_radii(losses, 5), expected)


def test_rdp_finds_the_knee_of_an_exponential_decay():
    # l(t) = a e^{-t/k}: r = k (1 + u^2)^{3/2} / u with u = |l'| = (a/k) e^{-t/k}, smallest
    # at u = 1/sqrt(2), i.e. t* = k ln(a sqrt(2) / k) = 19.56 for a = 50, k = 10. Backward
    # differences estimate l' at t - 1/2 and l'' at t - 1, so the discrete knee is at ~t* + 1.
    t = np.arange(60)
    losses = 50 * np.exp(-t / 10)
    r = curvature_radii(losses, 1)
    knee = int(np.nanargmin(r))
    assert abs(knee - (10 * math.log(50 * math.sqrt(2) / 10) + 1)) <= 1
    first = next(m for m in range(1, 61) if rdp_ended(r[:m], 3))
    assert first - 1 == knee + 3  # seen t_obv rounds after the knee


def test_trial_rule():
    assert trial_accepts(1.0, 0.9)
    assert not trial_accepts(0.9, 1.0)
    assert not trial_accepts(0.5, 0.5)  # no improvement: the old structure stays


# --------------------------------------------------------------------------- layer-wise bytes


def test_a_layer_not_aggregated_in_a_round_adds_no_bytes():
    models = [_two_layer_model(), _two_layer_model()]
    ctxs = [_ctx(models[c], c) for c in range(2)]
    layout = ctxs[0].layout
    assert layout.nbytes == 56 and layout.nbytes_of_layers([1]) == 24
    server = DCPFLServer(layout, ctxs[0].init_weights, {0: 8, 1: 8}, 1.0, {"warmup_rounds": 1})
    client = DCPFLClient({})

    def round_(rnd):
        tasks = server.configure_fit(rnd, [0, 1])
        results = [client.fit(ctxs[t.client_id], t) for t in tasks]
        stats = server.aggregate_fit(rnd, results)
        return tasks, results, stats

    tasks, results, _ = round_(0)  # warm-up: the whole model both ways
    assert [t.download_nbytes for t in tasks] == [56, 56]
    assert [r.upload_nbytes for r in results] == [56, 56]
    assert server.labels.tolist() == [0, 0]  # gamma~ = 1: one group
    server.intervals[0] = np.array([3, 1])  # layer 0 low-discrepancy: every 3rd round
    before = server.group_models[0].copy()

    tasks, results, stats = round_(1)
    assert [t.download_nbytes for t in tasks] == [56, 56]  # the formation's full sync
    assert [t.config["upload_layers"] for t in tasks] == [[1], [1]]
    for r in results:
        assert r.upload_nbytes == 24
        assert trace_bytes(r.trace) == (24 + LOSS_REPORT_NBYTES, 56)
        assert [type(op) for op in r.trace] == [Download, Compute, Upload, Compute, Upload]
    assert stats.metrics["layers_aggregated"] == 1 and stats.metrics["comm_round"] == 1
    l0 = layout.mask([0])
    np.testing.assert_array_equal(server.group_models[0][l0], before[l0])  # not aggregated
    expected = (results[0].weights[~l0] + results[1].weights[~l0]) / 2
    np.testing.assert_allclose(server.group_models[0][~l0], expected, rtol=1e-6)

    tasks, results, _ = round_(2)
    assert [t.download_nbytes for t in tasks] == [24, 24]  # only what was aggregated
    assert all(trace_bytes(r.trace)[0] == 24 + LOSS_REPORT_NBYTES for r in results)
    tasks, results, stats = round_(3)  # (3 - 1 + 1) % 3 == 0: full synchronisation
    assert [r.upload_nbytes for r in results] == [56, 56]
    assert stats.metrics["layers_aggregated"] == 2


# --------------------------------------------------------------------------- trial round

W_A = np.array([0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0])


def _trial_server(**params) -> DCPFLServer:
    layout = model_layout(_two_layer_model())
    p = {"warmup_rounds": 1, "loss_window": 1, "observe_rounds": 1, "hold_rounds": 2, **params}
    return DCPFLServer(layout, np.zeros(14, np.float32), {c: 10 for c in range(4)}, 1.0, p)


def _uploads(scale: float = 1.0):
    """Clients 0, 1 near one model, clients 2, 3 near another."""
    base = np.linspace(-1, 1, 14)
    return {0: base, 1: base + 0.01, 2: -base * scale, 3: -base * scale + 0.02}


def _normal_round(server, rnd, losses):
    tasks = server.configure_fit(rnd, [0, 1, 2, 3])
    up = _uploads()
    results = [
        _fake(t.client_id, up[t.client_id] if t.config["upload_layers"] else None, loss=losses)
        for t in tasks
    ]
    server.aggregate_fit(rnd, results)
    return tasks


def test_rdp_schedules_a_trial_and_a_rejected_split_holds_for_t_sp_rounds():
    server = _trial_server()
    _normal_round(server, 0, 4.0)  # warm-up: the group graph is built from these uploads
    assert server.labels.tolist() == [0, 0, 0, 0]
    for rnd, loss in ((1, 2.0), (2, 1.9)):
        _normal_round(server, rnd, loss)
        assert server.trial is None
    # losses 4, 2, 1.9, 1.85: r = 1.01^1.5 / 1.9 = 0.536, then 1.0025^1.5 / 0.05 = 20.1
    _normal_round(server, 3, 1.85)
    assert server.trial is not None
    labels, gamma = server.trial
    assert labels.tolist() == [0, 0, 1, 1] and gamma == pytest.approx(0.8)

    tasks = server.configure_fit(4, [0, 1, 2, 3])
    full = server.layout.nbytes
    assert all(t.config["trial"] and t.download_nbytes == 2 * full for t in tasks)
    np.testing.assert_allclose(
        tasks[0].config["trial_weights"], (_uploads()[0] + _uploads()[1]) / 2, rtol=1e-6
    )
    np.testing.assert_allclose(tasks[0].weights, np.mean(list(_uploads().values()), 0), atol=1e-6)
    new, old = _uploads(), _uploads(scale=3.0)
    results = [_fake(c, new[c], loss_old=0.5, loss_new=0.5, weights_old=old[c]) for c in range(4)]
    stats = server.aggregate_fit(4, results)
    assert stats.metrics["trial"] == 1 and stats.metrics["split_accepted"] == 0
    assert server.labels.tolist() == [0, 0, 0, 0] and server.gamma_tilde == 1.0
    np.testing.assert_allclose(
        server.group_models[0], np.mean(list(old.values()), 0), atol=1e-6
    )  # the uploads trained from the OLD group model
    assert server.hold_until == 4 + 1 + 2
    tasks = server.configure_fit(5, [0, 1, 2, 3])
    assert all(t.config["trial_outcome"] == "old" for t in tasks)
    results = [_fake(t.client_id, _uploads()[t.client_id], loss=1.84) for t in tasks]
    server.aggregate_fit(5, results)
    assert rdp_ended(server.radii, 1) and server.trial is None  # held: round 6 < 7
    _normal_round(server, 6, 1.83)
    assert server.trial is not None  # the hold is over: next round is a trial again


def test_a_detection_without_a_minimum_of_r_is_flagged():
    server = _trial_server()

    def round_(srv, rnd, loss):
        tasks = srv.configure_fit(rnd, [0, 1, 2, 3])
        up = _uploads()
        return srv.aggregate_fit(
            rnd, [_fake(t.client_id, up[t.client_id], loss=loss) for t in tasks]
        ).metrics

    for rnd, loss in ((0, 4.0), (1, 2.0), (2, 1.9)):
        m = round_(server, rnd, loss)
        assert m["rdp_detected"] == 0 and math.isnan(m["rdp_earliest"])
    # r is defined from the 3rd loss (index 2) on; it fires at the 4th: r(2) = 0.536 <
    # r(3) = 20.1, and r(2) is the first radius there is: no minimum was ever seen
    m = round_(server, 3, 1.85)
    assert m["rdp_detected"] == 1 and m["rdp_earliest"] == 1
    assert server.trial is not None
    # losses 15, 11, 8, 6, 5, 4.1: r = 31.6, 11.2, 2.83 (falling), then 24.4: a real
    # minimum at r(4) = 2^1.5, seen after two larger radii -> not flagged
    knee = _trial_server()
    metrics = [round_(knee, rnd, loss) for rnd, loss in enumerate((15, 11, 8, 6, 5, 4.1))]
    np.testing.assert_allclose(
        knee.radii[2:], [10**1.5, 5**1.5, 2**1.5, 1.81**1.5 / 0.1], rtol=1e-9
    )
    assert [m["rdp_detected"] for m in metrics] == [0, 0, 0, 0, 0, 1]
    assert metrics[-1]["rdp_earliest"] == 0
    assert rdp_end_unseen([math.nan, math.nan, 0.5, 20.0], 1, 1)
    assert not rdp_end_unseen([math.nan, math.nan, 31.6, 11.2, 2.8, 24.4], 1, 1)
    # with s = 5 the radii before loss index 6 come from a growing window: ignored
    assert rdp_end_unseen([math.nan] * 4 + [1401.0, math.inf, 420, 530, 614, 674], 5, 3)


def test_detections_are_rebuilt_from_the_records_for_the_warning():
    # recorded rows (s = 5, t_obv = 3, as in a 50-client run): warm-up radii with a minimum
    # (37.9 at round 11), a trial (accepted: a new history), then radii rising from the
    # first one computed from full windows (420 at round 21), a trial
    nan, inf = math.nan, math.inf
    radii = [nan] * 4 + [inf] * 4 + [87.6, 45.2, 37.9, 38.9, 46.0, 60.0]
    rows = [{"round": k, "trial": 0, "curvature_radius": r} for k, r in enumerate(radii)]
    rows.append({"round": 14, "trial": 1, "split_accepted": 1, "curvature_radius": nan})
    after = [nan] * 4 + [1401.0, inf, 420.0, 530.0, 614.0, 674.0]
    rows += [{"round": 15 + k, "trial": 0, "curvature_radius": r} for k, r in enumerate(after)]
    rows.append({"round": 25, "trial": 1, "split_accepted": 0, "curvature_radius": 674.0})
    params = DCPFLServer.Params(loss_window=5, observe_rounds=3)
    assert rdp_detections(rows, 5, 3) == [(13, False), (24, True)]
    notes = DCPFLServer.run_notes(rows, params)
    assert len(notes) == 1 and "1 of 2 ends of a rapid-decrease period" in notes[0]
    assert "(round 25)" in notes[0]  # the detection round, counted from 1


def test_low_discrepancy_metrics_and_the_warning_when_no_layer_is_ever_low():
    rows = run(
        tiny(
            rounds=4,
            algorithm={
                "name": "dcpfl",
                "params": {
                    "warmup_rounds": 1,
                    "dynamic": False,
                    "fixed_gamma_tilde": 0.9,
                    "low_ratio": 10.0,
                },
            },
            **DCPFL_E2E,
        ),
        "low",
    )
    updates = [r for r in rows if r["la_updates"] > 0]
    assert updates and all(r["la_low_layers"] > 0 for r in updates)  # 10 x the mean: all low
    assert all(math.isnan(r["la_low_layers"]) for r in rows if r["la_updates"] == 0)
    params = DCPFLServer.Params(low_ratio=1e-9)
    quiet = [
        {"round": 0, "la_updates": 2.0, "la_low_layers": 0.0, "la_min_ratio": 0.35},
        {"round": 1, "la_updates": 0.0, "la_low_layers": math.nan, "la_min_ratio": math.nan},
    ]
    notes = DCPFLServer.run_notes(quiet, params)
    assert len(notes) == 1 and "never acted" in notes[0] and "2 layer-interval updates" in notes[0]
    assert "smallest ratio 0.350" in notes[0]
    quiet[0]["la_low_layers"] = 1.0
    assert DCPFLServer.run_notes(quiet, params) == []
    assert (
        DCPFLServer.run_notes(
            [{**quiet[0], "la_low_layers": 0.0}], DCPFLServer.Params(layerwise=False)
        )
        == []
    )  # NoLA: no warning


def test_heldout_trial_losses_use_samples_the_client_never_trains_on():
    model = _two_layer_model()
    ctx = _ctx(model, n=10)
    client = DCPFLClient({"trial_loss": "heldout", "heldout_fraction": 0.2})
    w = ctx.init_weights
    plain = client.fit(
        ctx, ClientTask(0, w, 56, {"download_layers": [0, 1], "upload_layers": [0, 1]})
    )
    held = ctx.state["heldout_index"]
    assert len(held) == 2 and plain.num_samples == 8  # trains on the other 8
    cfg = {
        "trial": True,
        "trial_weights": w.copy(),
        "old_nbytes": 56,
        "new_nbytes": 56,
        "upload_layers": [0, 1],
    }
    result = client.fit(ctx, ClientTask(0, w, 112, cfg))
    np.testing.assert_array_equal(ctx.state["heldout_index"], held)  # drawn once
    # the reported loss is the cross-entropy of the trained model on the 2 held-out samples
    set_flat(model, ctx.layout, result.weights)
    idx = torch.from_numpy(held)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(
            model(ctx.x_train[idx]), ctx.y_train[idx]
        ).item()
    assert result.extra["loss_new"] == pytest.approx(expected, rel=1e-6)
    assert result.num_samples == 8


def test_an_accepted_split_is_adopted_with_the_new_uploads():
    server = _trial_server()
    _normal_round(server, 0, 4.0)
    server.trial = next_split(server.z, server.gamma_global, 1.0, 0.2, server.labels)
    server.configure_fit(1, [0, 1, 2, 3])
    new, old = _uploads(), _uploads(scale=3.0)
    results = [_fake(c, new[c], loss_old=1.0, loss_new=0.8, weights_old=old[c]) for c in range(4)]
    stats = server.aggregate_fit(1, results)
    assert stats.metrics["split_accepted"] == 1 and stats.metrics["groups"] == 2
    assert server.labels.tolist() == [0, 0, 1, 1] and server.gamma_tilde == pytest.approx(0.8)
    np.testing.assert_allclose(server.group_models[1], (new[2] + new[3]) / 2, rtol=1e-6)
    assert server.losses == [] and server.formed == {0: 2, 1: 2}  # a new RDP starts
    assert all(
        t.config["trial_outcome"] == "new" and t.download_nbytes == 56
        for t in server.configure_fit(2, [0, 1, 2, 3])
    )


def test_trial_client_downloads_and_trains_twice_on_the_same_batches():
    model = _two_layer_model()
    ctx = _ctx(model)
    w = ctx.init_weights
    client = DCPFLClient({})
    cfg = {
        "trial": True,
        "trial_weights": w.copy(),
        "old_nbytes": 56,
        "new_nbytes": 56,
        "upload_layers": [0, 1],
        "report_loss": True,
    }
    result = client.fit(ctx, ClientTask(0, w, 112, cfg))
    kinds = [(type(op).__name__, getattr(op, "what", "")) for op in result.trace]
    assert kinds == [
        ("Download", "group model"),
        ("Download", "trial group model"),
        ("Compute", "train"),
        ("Compute", "loss"),
        ("Compute", "train"),
        ("Compute", "loss"),
        ("Upload", "loss"),
        ("Barrier", "trial_decision"),
        ("Download", "trial_decision"),
        ("Upload", "model"),
    ]
    assert trace_bytes(result.trace) == (2 * LOSS_REPORT_NBYTES + 56, 112 + DECISION_NBYTES)
    train_ops = [op for op in result.trace if isinstance(op, Compute) and op.what == "train"]
    assert train_ops[0] == train_ops[1] and result.steps == 2 * train_ops[0].batches
    assert result.flops == pytest.approx(
        sum(op.flops for op in result.trace if isinstance(op, Compute))
    )
    # identical start and identical mini-batches -> identical models and losses
    assert result.extra["loss_old"] == result.extra["loss_new"]
    np.testing.assert_array_equal(result.extra["weights_old"], result.weights)
    # the next round's task announces the outcome; "old" restores the old-structure model
    ctx.state["weights_old"] = result.weights + 1.0
    kept = client._local(ctx, {"trial_outcome": "old"})
    np.testing.assert_array_equal(kept, result.weights + 1.0)
    assert "weights_old" not in ctx.state


def test_dcpfl_needs_full_participation_and_valid_params():
    layout = model_layout(_two_layer_model())
    with pytest.raises(ValueError, match="participation"):
        DCPFLServer(layout, np.zeros(14, np.float32), {0: 1, 1: 1}, 0.5, {})
    with pytest.raises(Exception, match="scaling"):
        DCPFLServer(layout, np.zeros(14, np.float32), {0: 1}, 1.0, {"scaling": "zscore"})
    # Eq. 3 and Eq. 5 read literally, by default: S over the whole model, S per layer
    p = DCPFLServer.Params()
    assert (p.scaling_eq3, p.scaling_eq5, p.scaling) == ("model", "layer", None)
    with pytest.raises(ScenarioError, match="without dynamic clustering"):
        tiny(algorithm={"name": "dcpfl_nodc", "params": {"dynamic": True}})


# --------------------------------------------------------------------------- end to end


def test_dcpfl_run_records_a_trial_round_with_double_download_and_compute(tmp_path):
    sc = tiny(rounds=11, algorithm={"name": "dcpfl", "params": DCPFL_FAST}, **DCPFL_E2E)
    out = tmp_path / "run"
    run_in_folder(sc, out)
    rounds = pd.read_csv(out / "rounds.csv")
    model_bytes = json.loads((out / "run.json").read_text())["model_bytes"]
    trials = rounds.index[rounds["trial"] == 1].tolist()
    assert len(trials) >= 1
    t = trials[0]
    prev = rounds.loc[t - 1]
    assert prev["trial"] == 0 and rounds.loc[: t - 1, "groups"].eq(1).all()
    # from one group, every client's group changes: two full models down each, and the
    # decision (1 byte) before the upload
    assert rounds.loc[t, "bytes_down"] == 6 * (2 * model_bytes + DECISION_NBYTES)
    assert rounds.loc[t, "bytes_up"] == 6 * (model_bytes + 2 * LOSS_REPORT_NBYTES)
    # train + loss-test twice vs once
    assert rounds.loc[t, "client_gflops"] == pytest.approx(2 * prev["client_gflops"], rel=1e-9)
    assert rounds.loc[t, "round_time_s"] > prev["round_time_s"]
    assert rounds.loc[t, "comm_round"] == 1
    traces = [json.loads(line) for line in (out / "optraces.jsonl").read_text().splitlines()]
    ops = [op["what"] for op in traces[t]["clients"]["0"] if op["op"] == "download"]
    assert ops == ["group model", "trial group model", "trial_decision"]
    kinds = [op["op"] for op in traces[t]["clients"]["0"]]
    assert kinds[-4:] == ["upload", "barrier", "download", "upload"]  # loss, wait, decision


def test_barrier_holds_every_client_until_the_last_report_by_hand():
    # 1000 B at 8000 b/s = 1 s a transfer; 1 GFLOP at 1 GFLOP/s = 1 s of compute
    spec = {c: ClientSpec(c, 8000.0, 8000.0, 0.0, 1e9) for c in range(3)}
    traces = {
        0: (Compute(1e9, 0), Barrier("trial_decision"), Download(1000), Upload(1000)),
        1: (Compute(3e9, 0), Barrier("trial_decision"), Download(1000), Upload(1000)),
        2: (Compute(1e9, 0), Upload(1000)),
    }  # no barrier: does not wait
    timing = time_round(traces, spec, [ServerSpec(1e12)], NetworkSpec())
    tl = {t.client_id: t for t in timing.clients}
    # client 0 waits at the barrier from 1 s to 3 s (client 1's report), then 1 s + 1 s
    assert tl[0].finish_s == pytest.approx(5.0) and tl[1].finish_s == pytest.approx(5.0)
    assert (tl[0].compute_s, tl[0].download_s, tl[0].upload_s) == pytest.approx((1, 1, 1))
    assert tl[2].finish_s == pytest.approx(2.0)
    assert timing.round_time_s == pytest.approx(5.0)
    # without the barrier client 0 would be done at 3 s
    alone = dict(traces)
    alone[0] = tuple(op for op in traces[0] if not isinstance(op, Barrier))
    assert {
        t.client_id: t.finish_s
        for t in time_round(alone, spec, [ServerSpec(1e12)], NetworkSpec()).clients
    }[0] == pytest.approx(3.0)
    # two barriers: the second releases after the slowest second report
    two = {
        0: (Barrier(), Compute(1e9, 0), Barrier()),
        1: (Barrier(), Compute(2e9, 0), Barrier(), Upload(1000)),
    }
    t2 = {
        t.client_id: t.finish_s
        for t in time_round(two, spec, [ServerSpec(1e12)], NetworkSpec()).clients
    }
    assert t2 == pytest.approx({0: 2.0, 1: 3.0})
    assert op_from_dict(op_to_dict(Barrier("trial_decision"))) == Barrier("trial_decision")


def test_dataset_heterogeneity_is_recorded(tmp_path):
    sc = tiny(rounds=1, **DCPFL_E2E)
    out = tmp_path / "run"
    run_in_folder(sc, out)
    rng = np.random.default_rng(np.random.SeedSequence([sc.seed, 1]))
    pools = load_dataset("mnist-embedded", None, 600, 150, rng)
    parts = partition(
        pools, 6, "primary_secondary", rng, samples_per_client=80, test_samples_per_client=20
    )
    expected = heterogeneity_dkl(parts.label_histograms(pools)[0])
    assert json.loads((out / "run.json").read_text())["label_dkl"] == pytest.approx(expected)
    assert expected > 0.5  # primary/secondary skew, not IID


@pytest.mark.parametrize(
    "name, params",
    [
        ("dcpfl", {}),
        ("dcpfl_nola", {"warmup_rounds": 1}),
        ("dcpfl_nodc", {"warmup_rounds": 1, "fixed_gamma_tilde": 0.5}),
        ("perfedavg", {}),
        ("kmeans_cluster", {"warmup_rounds": 1, "clusters": 2}),
    ],
)
def test_two_round_smoke_runs(name, params):
    rows = run(tiny(rounds=2, algorithm={"name": name, "params": params}, **DCPFL_E2E), "smoke")
    assert len(rows) == 2 and all(r["round_time_s"] > 0 for r in rows)
    assert not math.isnan(rows[-1]["mean_accuracy"])
    if name in ("dcpfl_nodc", "kmeans_cluster"):
        assert rows[-1]["groups"] >= 1


def test_nola_sends_every_layer_and_nodc_keeps_its_groups():
    rows = run(
        tiny(
            rounds=6,
            algorithm={"name": "dcpfl_nola", "params": {"warmup_rounds": 1, "low_ratio": 10.0}},
            **DCPFL_E2E,
        ),
        "nola",
    )
    # low_ratio 10 would make every layer "low" -- NoLA ignores Eq. 6 altogether
    assert all(r["bytes_down"] == rows[0]["bytes_down"] for r in rows if r["groups"] == 1)
    rows = run(
        tiny(
            rounds=4,
            algorithm={
                "name": "dcpfl_nodc",
                "params": {"warmup_rounds": 1, "fixed_gamma_tilde": 0.5},
            },
            **DCPFL_E2E,
        ),
        "nodc",
    )
    assert len({r["groups"] for r in rows[1:]}) == 1 and rows[-1]["gamma_tilde"] == 0.5
    assert all(r["trial"] == 0 for r in rows)


# --------------------------------------------------------------------------- Per-FedAvg


def _ce_grad(model, x, y):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def test_pair_batches():
    assert pair_batches(5) == [(0, 1), (2, 3), (4, 0)]
    assert pair_batches(4) == [(0, 1), (2, 3)]
    assert pair_batches(1) == [(0, 0)]
    with pytest.raises(ValueError):
        pair_batches(0)


def test_first_order_maml_matches_an_independent_computation():
    model = _two_layer_model()
    ctx = _ctx(model, n=8, batch=4)  # two batches: one (D, D') pair
    ref = copy.deepcopy(model)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(100))
    d, d2 = order[:4], order[4:]
    w = [p.detach().clone() for p in ref.parameters()]
    g1 = _ce_grad(ref, ctx.x_train[d], ctx.y_train[d])
    with torch.no_grad():
        for p, g in zip(ref.parameters(), g1, strict=True):
            p -= 0.03 * g  # w' = w - alpha g(w; D)
    g2 = _ce_grad(ref, ctx.x_train[d2], ctx.y_train[d2])
    expected = [p0 - 0.2 * g for p0, g in zip(w, g2, strict=True)]  # w - beta g(w'; D')
    stats = fo_maml_epochs(ctx, inner_lr=0.03, outer_lr=0.2, cost_key="t")
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e)
    assert stats.steps == 2 and stats.flops > 0
    assert stats.flops == pytest.approx(2 * ctx.costs.get(4, "t").flops)


def test_perfedavg_evaluates_after_one_personalisation_step():
    model = _two_layer_model()
    ctx = _ctx(model, n=8, batch=4)
    client = PerFedAvgClient({"inner_lr": 0.5})
    acc, loss = client.evaluate(ctx, ClientTask(0, ctx.init_weights, 0))
    ref = copy.deepcopy(model)
    set_flat(ref, ctx.layout, ctx.init_weights)
    idx = torch.randperm(8, generator=torch.Generator().manual_seed(100))[:4]
    g = _ce_grad(ref, ctx.x_train[idx], ctx.y_train[idx])
    with torch.no_grad():
        for p, gi in zip(ref.parameters(), g, strict=True):
            p -= 0.5 * gi
        logits = ref(ctx.x_test)
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, ctx.y_test)))
    assert acc == pytest.approx(float((logits.argmax(1) == ctx.y_test).float().mean()))


# --------------------------------------------------------------------------- k-means baseline


def test_kmeans_clusters_fixed_after_warmup():
    blob_a = np.array([[0.0] * 14, [0.1] * 14, [0.0] * 13 + [0.2]])
    blob_b = blob_a + 10.0
    weights = np.vstack([blob_a, blob_b])
    assert kmeans_labels(weights, 2, 20, seed=3).tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError):
        kmeans_labels(weights, 7, 20, seed=3)
    layout = model_layout(_two_layer_model())
    server = KMeansClusterServer(
        layout,
        np.zeros(14, np.float32),
        {c: 10 for c in range(6)},
        1.0,
        {"warmup_rounds": 1, "clusters": 2},
    )
    server.select(0, np.random.default_rng(0))
    assert [t.weights.sum() for t in server.configure_fit(0, list(range(6)))] == [0.0] * 6
    stats = server.aggregate_fit(0, [_fake(c, weights[c]) for c in range(6)])
    assert stats.metrics["groups"] == 2
    tasks = server.configure_fit(1, list(range(6)))
    np.testing.assert_allclose(tasks[0].weights, blob_a.mean(0), rtol=1e-6)
    np.testing.assert_allclose(tasks[5].weights, blob_b.mean(0), rtol=1e-6)
    server.aggregate_fit(1, [_fake(c, weights[c] + 1) for c in range(6)])
    assert server.labels == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}  # fixed thereafter
    np.testing.assert_allclose(
        server.configure_evaluate(1, [4])[0].weights, blob_b.mean(0) + 1, rtol=1e-6
    )


# --------------------------------------------------------------------------- convergence


def test_convergence_definition_hand_numbers():
    acc = [0.1, 0.5, 0.8, 0.9, 0.95, 0.96, 0.95, 0.96, 0.95, 0.96]
    assert final_accuracy(acc) == pytest.approx(0.956)
    np.testing.assert_allclose(
        trailing_mean(acc, 5), pd.Series(acc).rolling(5, min_periods=1).mean()
    )
    # trailing means: ..., 0.912 (index 6), 0.944 (7), 0.954 (8): first stays >= 0.946 at 8
    assert convergence_round(acc) == 8
    assert convergence_round([0.5] * 4) == 0
    rows = [
        {
            "mean_accuracy": a,
            "dl_time_s": 1.0,
            "ul_time_s": 2.0,
            "client_time_s": 0.5,
            "elapsed_s": 4.0 * (k + 1),
            "bytes_up": 10,
            "bytes_down": 10,
            "comm_round": float(k % 2 == 0),
        }
        for k, a in enumerate(acc)
    ]
    c = to_convergence(rows)
    assert c["convergence_round"] == 8 and c["training_rounds"] == 9
    assert c["comm_rounds"] == 5  # rounds 0, 2, 4, 6, 8 sent model weights
    assert c["comm_time_s"] == 27.0 and c["compute_time_s"] == 4.5 and c["total_time_s"] == 36
    for r in rows:
        del r["comm_round"]
    rows[3]["bytes_up"] = rows[3]["bytes_down"] = 0  # no column: any bytes sent
    assert to_convergence(rows)["comm_rounds"] == 8
    with pytest.raises(ValueError):
        final_accuracy([float("nan")])
