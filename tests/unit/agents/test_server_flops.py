"""Server aggregation FLOPs count what the server code computes.

Each count is worked out by hand from the operations of the server's code, or counted
independently by instrumenting the library the server calls (k-means)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.cluster.vq as scipy_vq
import torch

from mecsim.agents.algorithms import ClientResult
from mecsim.agents.algorithms.dcpfl import DCPFLServer
from mecsim.agents.algorithms.fedavg import (
    FedAvgServer,
    WeightedSum,
    aggregation_flops,
    weighted_average,
    weighted_sum_flops,
)
from mecsim.agents.algorithms.kmeans_cluster import (
    KMeansClusterServer,
    kmeans_flops,
    kmeans_labels,
)
from mecsim.agents.models import model_layout


def _result(cid: int, weights, n: int = 10, **extra) -> ClientResult:
    w = np.asarray(weights, dtype=np.float32)
    return ClientResult(cid, w, 4 * w.size, n, 0.0, (), 0.0, 0, 0, extra=dict(extra))


def _layout():
    # layer 0: Linear(3, 2) = 6 + 2 elements; layer 1: Linear(2, 2) = 4 + 2: |w| = 14
    torch.manual_seed(0)
    return model_layout(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)))


def test_weighted_sum_and_weighted_average_counts_by_hand():
    # WeightedSum over 3 vectors of 5 elements: 3 * 5 products n_k * w_k, 3 * 5 adds into
    # the float64 sum, then 5 divisions by the total in result(): 15 + 15 + 5 = 35
    assert weighted_sum_flops(5, 3) == 35
    assert weighted_sum_flops(5, 0) == 0  # nothing folded: no result computed
    # weighted_average: the scalar w_k / total once per vector (not per element), then per
    # element a multiply and an add: 3 * 5 * 2 = 30
    assert aggregation_flops(5, 3) == 30
    acc = WeightedSum()
    for k in range(3):
        acc.add(np.full(5, k, np.float32), 1.0)
    np.testing.assert_array_equal(
        acc.result(), weighted_average([np.full(5, k) for k in range(3)], [1, 1, 1])
    )


def test_fedavg_server_counts_the_division_of_its_result():
    layout = _layout()
    server = FedAvgServer(layout, np.zeros(14, np.float32), {0: 10, 1: 30, 2: 20}, 1.0, {})
    stats = server.aggregate_fit(
        0, [_result(c, np.full(14, c), n) for c, n in ((0, 10), (1, 30), (2, 20))]
    )
    # 3 uploads of 14 elements: 2 * 14 * 3 + 14 = 98 (the count without the division: 84)
    assert stats.flops == 98


def test_kmeans_flops_by_hand_and_against_scipy_s_own_calls(monkeypatch):
    # d = 14, n = 6 points, k = 2, 20 iterations:
    #   seeding: the 2nd centre measures 6 points against 1 centre: 3 * 14 * 6 * 1 = 252
    #   an iteration: 3 * 14 * 6 * 2 = 504 (distances) + 14 * (6 + 2) = 112 (means) = 616
    #   252 + 20 * 616 = 12,572
    assert kmeans_flops(14, 6, 2, 20) == 12_572
    # k = 3: seeding measures against 1, then 2 centres: 3 * d * n * (1 + 2)
    assert kmeans_flops(10, 4, 3, 1) == 3 * 10 * 4 * 3 + (3 * 10 * 4 * 3 + 10 * (4 + 3))

    # independently: count the elements scipy's kmeans2 actually processes
    counted = {"flops": 0.0}
    real_vq, real_cdist = scipy_vq.vq, scipy_vq.cdist
    real_means = scipy_vq._vq.update_cluster_means

    def vq(obs, code_book, *a, **kw):
        counted["flops"] += 3.0 * np.size(obs) * len(code_book)  # (x - c)^2 summed
        return real_vq(obs, code_book, *a, **kw)

    def cdist(xa, xb, *a, **kw):
        counted["flops"] += 3.0 * np.size(xb) * len(xa)
        return real_cdist(xa, xb, *a, **kw)

    class Means:
        def __getattr__(self, name):
            return getattr(real_vq_module, name)

        @staticmethod
        def update_cluster_means(data, label, nc):
            counted["flops"] += np.size(data) + nc * data.shape[1]  # sums, then divisions
            return real_means(data, label, nc)

    real_vq_module = scipy_vq._vq
    monkeypatch.setattr(scipy_vq, "vq", vq)
    monkeypatch.setattr(scipy_vq, "cdist", cdist)
    monkeypatch.setattr(scipy_vq, "_vq", Means())
    rng = np.random.default_rng(0)
    for n, d, k, iters in ((6, 14, 2, 20), (9, 5, 3, 4), (12, 7, 4, 1)):
        counted["flops"] = 0.0
        kmeans_labels(rng.normal(size=(n, d)), k, iters, seed=1)
        assert counted["flops"] == kmeans_flops(d, n, k, iters), (n, d, k, iters)


def test_kmeans_cluster_server_counts_fedavg_kmeans_and_the_cluster_averages():
    layout = _layout()
    blob = np.array([[0.0] * 14, [0.1] * 14, [0.0] * 13 + [0.2]])
    weights = np.vstack([blob, blob + 10.0])
    server = KMeansClusterServer(
        layout,
        np.zeros(14, np.float32),
        {c: 10 for c in range(6)},
        1.0,
        {"warmup_rounds": 1, "clusters": 2},
    )
    server.select(0, np.random.default_rng(0))
    stats = server.aggregate_fit(0, [_result(c, weights[c]) for c in range(6)])
    # FedAvg's average 2 * 14 * 6 + 14 = 182; k-means 12,572 (above); the two cluster
    # averages 2 * 14 * 6 = 168: 12,922 (the count before the second fidelity pass:
    # 182 + 3*14*6*2*20 = 10,262)
    assert stats.flops == 12_922
    # afterwards: the cluster averages alone, 2 * 14 * 6 = 168
    assert server.aggregate_fit(1, [_result(c, weights[c]) for c in range(6)]).flops == 168


def _dcpfl(layerwise: bool = False) -> DCPFLServer:
    layout = _layout()
    return DCPFLServer(
        layout,
        np.zeros(14, np.float32),
        {0: 10, 1: 10, 2: 10},
        1.0,
        {"warmup_rounds": 1, "layerwise": layerwise},
    )


def test_dcpfl_counts_a_one_member_group_s_average():
    server = _dcpfl(layerwise=True)
    w = {c: np.full(14, float(c), np.float32) for c in range(3)}
    flops = server._sync_structure(2, np.array([0, 0, 1]), w)
    # group {0, 1}: its average 2 * 14 * 2 = 56 and Eq. 5-6 over its 2 members (scaling of
    # 3 rows 4 * 14 * 3 = 168, L1 of 2 rows 3 * 14 * 2 = 84): 56 + 168 + 84 = 308;
    # group {2} alone: its average is formed too, 2 * 14 = 28. Total 336 (before: 308)
    assert flops == 336


def test_dcpfl_charges_a_trial_s_planned_averages_to_its_aggregation():
    server = _dcpfl()
    server.labels = np.array([0, 0, 1])
    server.formed = {0: 1, 1: 1}
    server.trial = (np.array([0, 1, 2]), 0.6)
    tasks = server.configure_fit(3, [0, 1, 2])
    assert len(tasks) == 3
    # the plan averages the old groups {0, 1}, {2} and the new {0}, {1}, {2}: every client
    # once in each structure, 2 * 14 * 3 per structure = 84, 168 in all
    assert server._planned_flops == 168
    results = [
        _result(c, np.full(14, float(c)), loss_old=1.0, loss_new=2.0, loss=None) for c in range(3)
    ]
    stats = server.aggregate_fit(3, results)
    assert stats.metrics["split_accepted"] == 0.0  # the old structure stays
    # + the old structure's models again from the uploads: 2 * 14 * 2 + 2 * 14 = 84
    assert stats.flops == 168 + 84
    # nothing is planned in the next round: the planned count was used once
    assert server._planned_flops == 0.0


# --------------------------------------------------------------------------- the rate


def test_aggregation_is_timed_at_the_profile_s_aggregation_rate():
    from mecsim.emulation.devices import DeviceProfile, builtin_profiles

    server = builtin_profiles()["edge-server-x86"]
    assert server.aggregate_flops_per_s == 1.7e9 and "measured" in server.aggregate_flops_source
    # the default scenario's round: 10 uploads of mlp_2nn's 200,010 elements, FedAvg's
    # 2 * 200,010 * 10 + 200,010 = 4,200,210 FLOPs at 1.7 GFLOP/s = 2.4707 ms (at the
    # training rate, 200 GFLOP/s, it was 21 us)
    assert server.aggregate_time_s(4_200_210) == pytest.approx(2.4707e-3, rel=1e-4)
    # a profile without an aggregation rate aggregates at flops_per_s
    plain = DeviceProfile("p", flops_per_s=2e9, step_overhead_s=0.5, ram_bytes=1)
    assert plain.aggregate_time_s(1e9) == 0.5  # no step overhead


def test_a_scenario_profile_s_aggregation_rate_needs_its_source():
    from support.scenarios import tiny

    from mecsim.scenario import ScenarioError

    mine = {
        "flops_per_s": 1e11,
        "step_overhead_s": 0.0,
        "ram_bytes": 2**34,
        "flops_source": "guess",
        "step_overhead_source": "guess",
        "aggregate_flops_per_s": 2e9,
    }
    with pytest.raises(ScenarioError, match="aggregate_flops_source"):
        tiny(devices={"edge_server": "mine", "profiles": {"mine": mine}})
    sourced = {**mine, "aggregate_flops_source": "measured: ours"}
    assert tiny(devices={"edge_server": "mine", "profiles": {"mine": sourced}})


def test_a_run_s_server_time_is_its_server_flops_at_the_aggregation_rate():
    from support.scenarios import tiny

    from mecsim.run.loop import run

    rows = run(tiny(rounds=1), "rate")
    row = rows[0]
    # the records, independently: 4 uploads of 200,010 elements (mlp_2nn with its BN
    # statistics) -> 2 * 200,010 * 4 + 200,010 = 1,800,090 FLOPs; at 1.7 GFLOP/s 1.0589 ms
    assert row["server_gflops"] * 1e9 == pytest.approx(1_800_090)
    assert row["server_time_s"] == pytest.approx(1_800_090 / 1.7e9, rel=1e-9)
