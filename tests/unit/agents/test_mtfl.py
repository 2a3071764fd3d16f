"""MTFL: private BN bookkeeping, FedAvg-Adam and FedAdam against hand numbers, bytes, the
shard partition, noisy clients, rounds-to-target, and the two MTFL scenarios."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from support.paths import ROOT

from mecsim.agents.algorithms import ClientContext, TrainConfig
from mecsim.agents.algorithms.fedavg import weighted_average
from mecsim.agents.algorithms.mtfl import (
    FEDADAM_FLOPS_PER_ELEMENT,
    MTFLClient,
    MTFLServer,
    WireFormat,
    add_input_noise,
    fedadam_step,
    noisy_clients,
    private_mask,
)
from mecsim.agents.models import build_model, get_flat, model_layout, set_flat
from mecsim.agents.training import StepCosts, make_optimizer, measured_step
from mecsim.data import load_dataset, partition
from mecsim.emulation.engine import time_round
from mecsim.emulation.network import NetworkModel, device_profiles
from mecsim.emulation.ops import Compute, Download, Upload
from mecsim.run.round import run_round
from mecsim.run.setup import prepare
from mecsim.scenario import ScenarioError, load_scenario, scenario_from_dict
from mecsim.store.summary import rounds_to_target, target_lines, times_to_targets

N_2NN = 784 * 200 + 200 + 4 * 200 + 200 * 200 + 200 + 200 * 10 + 10  # 200,010 floats


def _tiny_bn_layout():
    # Linear(1,1) + BatchNorm1d(1): 0.weight, 0.bias, 1.weight, 1.bias, 1.running_mean,
    # 1.running_var -- one element each, in that order
    return model_layout(torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.BatchNorm1d(1)))


# --------------------------------------------------------------------------- private values


@pytest.mark.parametrize(
    "private,names",
    [
        ("usyb", {"3.weight", "3.bias", "3.running_mean", "3.running_var"}),
        ("yb", {"3.weight", "3.bias"}),
        ("us", {"3.running_mean", "3.running_var"}),
        ("none", set()),
    ],
)
def test_private_mask_covers_exactly_the_chosen_bn_tensors(private, names):
    layout = model_layout(build_model("mlp_2nn", (1, 28, 28), 10))
    mask = private_mask(layout, private)
    assert mask.sum() == 200 * len(names)
    covered = {s.name for s in layout.slots if mask[s.offset : s.offset + s.numel].all()}
    partly = {s.name for s in layout.slots if mask[s.offset : s.offset + s.numel].any()}
    assert covered == partly == names


def test_private_bn_values_need_a_bn_layer():
    layout = model_layout(build_model("kapc_cnn", (1, 28, 28), 10))
    with pytest.raises(ValueError, match="no BatchNorm layer"):
        private_mask(layout, "yb")
    assert private_mask(layout, "none").sum() == 0


def _ctx(
    model, layout, init, cid: int, state: dict, optimizer: str = "sgd", n: int = 30
) -> ClientContext:
    g = torch.Generator().manual_seed(100 + cid)
    x = torch.randn(n, 1, 4, 4, generator=g) + cid  # clients differ
    y = torch.randint(0, 10, (n,), generator=g)
    lr = 0.01 if optimizer == "adam" else 0.1
    return ClientContext(
        cid,
        model,
        layout,
        x,
        y,
        x[:10],
        y[:10],
        state,
        TrainConfig(epochs=1, batch_size=10, optimizer=optimizer, lr=lr),
        torch.Generator().manual_seed(cid),
        StepCosts(),
        init,
    )


@pytest.mark.parametrize("private", ["usyb", "yb", "us", "none"])
@pytest.mark.parametrize("strategy", ["fedavg", "fedavg_adam"])
def test_private_values_stay_on_the_client_and_the_rest_is_averaged(private, strategy):
    torch.manual_seed(0)
    model = build_model("mlp_2nn", (1, 4, 4), 10)
    layout = model_layout(model)
    init = get_flat(model, layout)
    params = {"private": private, "strategy": strategy}
    opt = "adam" if strategy == "fedavg_adam" else "sgd"
    samples = {0: 30, 1: 20}
    server = MTFLServer(layout, init, samples, 1.0, params)
    client = MTFLClient(params)
    states: dict[int, dict] = {0: {}, 1: {}}
    priv = private_mask(layout, private)
    wire = WireFormat.build(layout, private, strategy)

    for rnd in range(2):
        global_before = server.weights.copy()
        tasks = server.configure_fit(rnd, [0, 1])
        results, trained = [], {}
        for task in tasks:
            cid = task.client_id
            before_private = states[cid].get("private")
            ctx = _ctx(model, layout, init, cid, states[cid], opt, samples[cid])
            # what the client starts from: the federated values + its own patches
            client._apply_patches(ctx, wire, wire.unpack(task.weights)[0])
            start = get_flat(model, layout)
            np.testing.assert_array_equal(start[~priv], global_before[~priv])
            expected_private = init[priv] if before_private is None else before_private
            np.testing.assert_array_equal(start[priv], expected_private)
            result = client.fit(ctx, task)
            trained[cid] = get_flat(model, layout)
            # the upload is the federated values only (+ moments): no private value in it
            assert result.weights.size == wire.numel
            np.testing.assert_array_equal(result.weights[: int((~priv).sum())], trained[cid][~priv])
            np.testing.assert_array_equal(states[cid]["private"], trained[cid][priv])
            results.append(result)
        server.aggregate_fit(rnd, results)
        # non-private values: the sample-weighted average of what the clients trained
        expected = weighted_average([trained[0][~priv], trained[1][~priv]], [30, 20])
        np.testing.assert_allclose(server.weights[~priv], expected, rtol=0, atol=1e-6)
        # private values: the server never saw them, its copy is still the initial one
        np.testing.assert_array_equal(server.weights[priv], init[priv])
        if priv.any():  # the clients' patches really are their own
            assert not np.array_equal(trained[0][priv], trained[1][priv])
            assert not np.array_equal(trained[0][priv], init[priv])

    # evaluation uses the patched model: global federated values + the client's patch
    (etask,) = server.configure_evaluate(1, [1])
    acc, loss, extra = client.evaluate(_ctx(model, layout, init, 1, states[1], opt), etask)
    now = get_flat(model, layout)
    np.testing.assert_array_equal(now[~priv], server.weights[~priv])
    np.testing.assert_array_equal(now[priv], states[1]["private"])
    assert extra == {"clean_accuracy": acc} and 0 <= acc <= 1


def test_fl_none_equals_fedavg_of_the_full_model():
    layout = _tiny_bn_layout()
    init = np.arange(6, dtype=np.float32)
    server = MTFLServer(layout, init, {0: 1, 1: 3}, 1.0, {"private": "none"})
    assert server.wire.numel == 6 and server.wire.nbytes == 24
    a, b = np.full(6, 4.0, np.float32), np.arange(6, dtype=np.float32) * 2
    res = [_result(0, a, 1), _result(1, b, 3)]
    stats = server.aggregate_fit(0, res)
    np.testing.assert_allclose(server.weights, 0.25 * a + 0.75 * b)
    assert stats.flops == 2 * 6 * 2


def _result(cid, payload, n):
    from mecsim.agents.algorithms import ClientResult

    return ClientResult(
        cid, np.asarray(payload, np.float32), 4 * len(payload), n, 0.0, (), 0.0, 0, 0
    )


# --------------------------------------------------------------------------- FedAvg-Adam


def test_fedavg_adam_averages_model_moments_and_step_by_samples():
    layout = _tiny_bn_layout()
    init = np.array([0.5, -0.5, 1.0, 0.0, 0.0, 1.0], np.float32)
    server = MTFLServer(
        layout, init, {0: 1, 1: 3}, 1.0, {"private": "yb", "strategy": "fedavg_adam"}
    )
    # yb: federated = 0.weight, 0.bias, running_mean, running_var; moments: 0.weight, 0.bias
    assert server.wire.numel == 4 + 2 + 2 + 1
    (t0,) = server.configure_fit(0, [0])
    np.testing.assert_array_equal(t0.weights, [0.5, -0.5, 0.0, 1.0, 0, 0, 0, 0, 0])
    assert t0.download_nbytes == 36
    a = [1, 2, 3, 4, 0.1, 0.2, 0.01, 0.02, 10]
    b = [5, 6, 7, 8, 0.5, 0.6, 0.05, 0.06, 20]
    stats = server.aggregate_fit(0, [_result(0, a, 1), _result(1, b, 3)])
    # 1/4 a + 3/4 b
    np.testing.assert_allclose(server.weights, [4, 5, 1.0, 0.0, 6, 7], rtol=1e-6)
    np.testing.assert_allclose(server.adam_m, [0.4, 0.5], rtol=1e-6)
    np.testing.assert_allclose(server.adam_v, [0.04, 0.05], rtol=1e-6)
    assert server.adam_step == pytest.approx(17.5)
    assert stats.flops == 2 * 9 * 2
    (t1,) = server.configure_fit(1, [1])
    np.testing.assert_allclose(t1.weights, [4, 5, 6, 7, 0.4, 0.5, 0.04, 0.05, 17.5], rtol=1e-6)


def test_fedavg_adam_client_uses_global_moments_and_keeps_private_ones():
    torch.manual_seed(1)
    model = build_model("mlp_2nn", (1, 4, 4), 10)
    layout = model_layout(model)
    init = get_flat(model, layout)
    params = {"private": "yb", "strategy": "fedavg_adam"}
    server = MTFLServer(layout, init, {0: 30}, 1.0, params)
    client = MTFLClient(params)
    state: dict = {}
    (task,) = server.configure_fit(0, [0])
    r0 = client.fit(_ctx(model, layout, init, 0, state, "adam"), task)
    assert state["private_step"] == 3.0  # 30 samples / batch 10, its own counter
    priv_params = private_mask(layout, "yb")
    assert state["private_m"].shape == (int(priv_params.sum()),)
    assert np.abs(state["private_m"]).sum() > 0
    _, m_up, v_up, step_up = server.wire.unpack(r0.weights)
    assert step_up == 3.0 and np.abs(m_up).sum() > 0 and (v_up >= 0).all()
    # pretend the server's global moments are something else: the client must load those
    # for federated parameters and its own for the private gamma, beta
    server.aggregate_fit(0, [r0])
    server.adam_m = np.full_like(server.adam_m, 0.25)
    server.adam_v = np.full_like(server.adam_v, 0.5)
    server.adam_step = 7.5
    (task1,) = server.configure_fit(1, [0])
    ctx = _ctx(model, layout, init, 0, state, "adam")
    wire = client.wire(layout)
    _, m, v, step = wire.unpack(task1.weights)
    opt = make_optimizer("adam", model.parameters(), 0.01)
    client._load_adam(ctx, wire, opt, m, v, step)
    named = dict(model.named_parameters())
    assert torch.all(opt.state[named["1.weight"]]["exp_avg"] == 0.25)
    assert torch.all(opt.state[named["1.weight"]]["exp_avg_sq"] == 0.5)
    assert float(opt.state[named["1.weight"]]["step"]) == 7.5
    bn_w = opt.state[named["3.weight"]]
    np.testing.assert_array_equal(bn_w["exp_avg"].numpy(), state["private_m"][:200])
    np.testing.assert_array_equal(bn_w["exp_avg_sq"].numpy(), state["private_v"][:200])
    assert float(bn_w["step"]) == 3.0


def test_client_optimiser_must_match_the_strategy():
    torch.manual_seed(0)
    model = build_model("mlp_2nn", (1, 4, 4), 10)
    layout = model_layout(model)
    init = get_flat(model, layout)
    params = {"strategy": "fedavg_adam"}
    (task,) = MTFLServer(layout, init, {0: 30}, 1.0, params).configure_fit(0, [0])
    with pytest.raises(ValueError, match="training.optimizer: adam"):
        MTFLClient(params).fit(_ctx(model, layout, init, 0, {}, "sgd"), task)


def test_unknown_private_setting_is_reported_with_its_field():
    data = load_scenario(ROOT / "scenarios" / "mtfl-mnist-shards.yaml").model_dump(mode="json")
    data["algorithm"]["params"]["private"] = "gamma"
    with pytest.raises(ScenarioError, match="params.private"):
        scenario_from_dict(data, "x.yaml")


# --------------------------------------------------------------------------- FedAdam


def test_fedadam_step_hand_numbers():
    # Delta = avg - w; m = .9 m + .1 Delta; v = .99 v + .01 Delta^2; w + .1 m/(sqrt v + .001)
    w, m, v = fedadam_step(
        np.array([1.0, -2.0, 0.0]),
        np.array([1.5, -2.0, -0.3]),
        np.zeros(3),
        np.zeros(3),
        0.1,
        0.9,
        0.99,
        1e-3,
    )
    np.testing.assert_allclose(m, [0.05, 0.0, -0.03], rtol=1e-12)
    np.testing.assert_allclose(v, [0.0025, 0.0, 0.0009], rtol=1e-12)
    # 1 + .1*.05/(.05+.001) = 1.0980392...; 0 - .1*.03/(.03+.001) = -0.0967741...
    np.testing.assert_allclose(w, [1.0980392156862746, -2.0, -0.0967741935483871], rtol=1e-7)
    # no change uploaded: the momentum keeps moving (no bias correction): m = .045, v =
    # .002475 -> + .0045/(sqrt(.002475)+.001)
    w2, m2, v2 = fedadam_step(w, w, m, v, 0.1, 0.9, 0.99, 1e-3)
    np.testing.assert_allclose(m2, [0.045, 0.0, -0.027], rtol=1e-6)
    np.testing.assert_allclose(w2, [1.18671026392758, -2.0, -0.18429552209404576], rtol=1e-6)


@pytest.mark.parametrize("stats", ["average", "adam"])
def test_fedadam_server_steps_only_federated_values_and_counts_flops(stats):
    layout = _tiny_bn_layout()
    init = np.array([1.0, -2.0, 1.0, 0.0, 0.0, 1.0], np.float32)
    server = MTFLServer(
        layout,
        init,
        {0: 1, 1: 1},
        1.0,
        {
            "private": "yb",
            "strategy": "fedadam",
            "server_lr": 0.1,
            "server_beta1": 0.9,
            "server_beta2": 0.99,
            "server_eps": 1e-3,
            "fedadam_stats": stats,
        },
    )
    # uploads of the 4 federated values (0.weight, 0.bias, running mean, running var)
    # whose average is [1.5, -2, -0.3, 1]
    a = [1.0, -2.0, -0.6, 1.0]
    b = [2.0, -2.0, 0.0, 1.0]
    out = server.aggregate_fit(0, [_result(0, a, 1), _result(1, b, 1)])
    # gamma, beta (private) stay 1, 0; running_var's average is unchanged at 1
    if stats == "average":  # running mean 0 -> its average -0.3; 2 values Adam-stepped
        expected = [1.0980392156862746, -2.0, 1.0, 0.0, -0.3, 1.0]
        stepped = 2
    else:  # the authors' code: running mean 0 -> -0.3 is Adam-stepped like a parameter
        expected = [1.0980392156862746, -2.0, 1.0, 0.0, -0.0967741935483871, 1.0]
        stepped = 4
    np.testing.assert_allclose(server.weights, expected, rtol=1e-6)
    assert out.flops == 2 * 4 * 2 + FEDADAM_FLOPS_PER_ELEMENT * stepped


# --------------------------------------------------------------------------- bytes


def test_fedavg_adam_moves_about_three_times_the_bytes_of_fedavg():
    layout = model_layout(build_model("mlp_2nn", (1, 28, 28), 10))
    n_params = N_2NN - 400  # the BN running statistics are buffers
    assert layout.size == N_2NN
    fedavg = WireFormat.build(layout, "none", "fedavg").nbytes
    fedadam = WireFormat.build(layout, "none", "fedadam").nbytes
    fedavg_adam = WireFormat.build(layout, "none", "fedavg_adam").nbytes
    assert fedavg == fedadam == 4 * N_2NN == 800_040
    assert fedavg_adam == 4 * (N_2NN + 2 * n_params + 1) == 2_396_924
    assert fedavg_adam / fedavg == 599_231 / 200_010  # = 2.99601
    # MTFL(yb): gamma, beta and their moments stay home
    assert WireFormat.build(layout, "yb", "fedavg").nbytes == 4 * (N_2NN - 400)
    assert (
        WireFormat.build(layout, "yb", "fedavg_adam").nbytes
        == 4 * ((N_2NN - 400) + 2 * (n_params - 400) + 1)
        == 2_392_124
    )


# --------------------------------------------------------------------------- data, noise


def test_shard_partition_of_the_mtfl_scenario():
    sc = load_scenario(ROOT / "scenarios" / "mtfl-mnist-shards.yaml")
    rng = np.random.default_rng(np.random.SeedSequence([sc.seed, 1]))  # as the runner
    pools = load_dataset("mnist-embedded", None, 6000, 4000, rng)
    part = partition(pools, 20, "shards", rng, shards_per_client=2)
    # rebuild the shards independently: 40 of 150 (train) and of 100 (test) by label
    tr_shards = np.array_split(np.argsort(pools.train.labels, kind="stable"), 40)
    te_shards = np.array_split(np.argsort(pools.test.labels, kind="stable"), 40)
    owner = {}
    for k, (tr, te) in enumerate(zip(part.train, part.test, strict=True)):
        assert len(tr) == 300 and len(te) == 200
        ids = [i for i, s in enumerate(tr_shards) if set(s.tolist()) <= set(tr.tolist())]
        assert len(ids) == 2
        for i in ids:
            owner[i] = k
        # the test set is split with the same assignment
        assert set(te.tolist()) == set(te_shards[ids[0]].tolist()) | set(te_shards[ids[1]])
        # a shard of a label-sorted pool spans at most 2 classes, a client at most 4
        assert len(set(pools.train.labels[tr].tolist())) <= 4
    assert sorted(owner) == list(range(40))


def test_noisy_clients_are_a_seeded_fraction():
    ids = list(range(10))
    a = noisy_clients(ids, 0.2, 0)
    assert len(a) == 2 and a == noisy_clients(ids, 0.2, 0) and a <= set(ids)
    assert len(noisy_clients(ids, 0.7, 0)) == 7
    assert noisy_clients(ids, 0.0, 0) == frozenset()
    assert len(noisy_clients(list(range(200)), 0.2, 5)) == 40


def test_input_noise_is_in_units_of_the_dynamic_range_and_clipped():
    g = torch.Generator().manual_seed(0)
    # channel 0 spans [0, 1], channel 1 spans [-1, 3] (range 4); mid values inside
    x = torch.full((2000, 2, 2, 2), 0.5)
    x[0, 0], x[1, 0] = 0.0, 1.0
    x[:, 1] = 1.0
    x[0, 1], x[1, 1] = -1.0, 3.0
    noisy = add_input_noise(x, 0.01, g)
    diff = (noisy - x)[2:]  # the mid values are never clipped at std 0.01 * range
    assert float(diff[:, 0].std()) == pytest.approx(0.01, rel=0.05)
    assert float(diff[:, 1].std()) == pytest.approx(0.04, rel=0.05)
    big = add_input_noise(x, 3.0, torch.Generator().manual_seed(1))
    assert float(big[:, 0].min()) == 0.0 and float(big[:, 0].max()) == 1.0
    assert float(big[:, 1].min()) == -1.0 and float(big[:, 1].max()) == 3.0
    assert torch.equal(add_input_noise(x, 0.0, g), x)


def test_noisy_clients_train_on_noise_and_are_left_out_of_clean_accuracy():
    sc = load_scenario(ROOT / "scenarios" / "mtfl-mnist-shards.yaml")
    data = sc.model_dump(mode="json")
    data.update(rounds=1)
    data["topology"]["clients"] = 10
    data["devices"]["clients"] = [{"profile": "rpi3b"}]
    data["dataset"].update(train_size=1000, test_size=500)
    data["algorithm"]["params"].update(noisy_fraction=0.3, noise_std=3.0, noise_seed=4)
    data["metrics"]["enabled"] = False
    data["execution"] = {"backend": "local", "hosts": 1}
    rs = prepare(scenario_from_dict(data, "noisy"), "noisy", None)
    try:
        row, clients, _ = run_round(rs, 0, 0.0)
    finally:
        rs.executor.close()
    noisy = noisy_clients(list(range(10)), 0.3, 4)
    assert len(noisy) == 3
    clean = [c["accuracy"] for c in clients if c["client_id"] not in noisy]
    assert row["mean_clean_accuracy"] == pytest.approx(sum(clean) / 7, abs=1e-12)
    assert row["mean_clean_accuracy"] != pytest.approx(row["mean_accuracy"], abs=1e-9)
    # noisy training images are harder to fit: higher first-round loss than the clean ones
    loss = {c["client_id"]: c["train_loss"] for c in clients}
    assert min(loss[c] for c in noisy) > max(v for c, v in loss.items() if c not in noisy)


# --------------------------------------------------------------------------- rounds to target


def test_rounds_to_target_counts_from_one_and_skips_unevaluated_rounds():
    rows = [
        {"round": 0, "mean_accuracy": 0.5},
        {"round": 1, "mean_accuracy": float("nan")},
        {"round": 2, "mean_accuracy": 0.97},
        {"round": 3, "mean_accuracy": 0.99},
    ]
    assert rounds_to_target(rows, 0.97) == 3
    assert rounds_to_target(rows, 0.5) == 1
    assert rounds_to_target(rows, 0.995) is None  # the paper's "X"
    rows[3]["mean_clean_accuracy"] = 0.98
    assert rounds_to_target(rows, 0.975, "mean_clean_accuracy") == 4
    with pytest.raises(ValueError, match="no round row has a 'mean_ua' column"):
        rounds_to_target(rows, 0.9, "mean_ua")


def test_times_to_targets_give_rounds_and_emulated_seconds_or_x():
    rows = [
        {"round": 0, "mean_accuracy": 0.5, "elapsed_s": 10.0},
        {"round": 1, "mean_accuracy": float("nan"), "elapsed_s": 25.0},
        {"round": 2, "mean_accuracy": 0.97, "elapsed_s": 31.5},
    ]
    assert times_to_targets(rows, [0.5, 0.9, 0.98]) == [
        (0.5, 1, 10.0),
        (0.9, 3, 31.5),
        (0.98, None, None),
    ]
    assert target_lines(rows, [0.9, 0.98]) == [
        "Rounds to 90 % mean user accuracy: 3 (31.5 s emulated).",
        "Rounds to 98 % mean user accuracy: X (not reached in 3 rounds).",
    ]
    # MTFL records mean_clean_accuracy in every run: without noisy clients it equals
    # mean_accuracy, and the targets are read (and labelled) as usual
    for r in rows:
        r["mean_clean_accuracy"] = r["mean_accuracy"]
    assert target_lines(rows, [0.9])[0] == "Rounds to 90 % mean user accuracy: 3 (31.5 s emulated)."
    # a noisy-client run is judged on its clean clients (MTFL Table 3)
    for r, clean in zip(rows, (0.95, float("nan"), 0.96), strict=True):
        r["mean_clean_accuracy"] = clean
    assert times_to_targets(rows, [0.95, 0.97]) == [(0.95, 1, 10.0), (0.97, None, None)]
    assert target_lines(rows, [0.95])[0].startswith(
        "Rounds to 95 % mean user accuracy of the non-noisy clients: 1 "
    )
    assert target_lines(rows, []) == []


def test_run_reports_rounds_to_its_targets(tmp_path, capsys):
    from support.scenarios import tiny

    from mecsim.interfaces.cli import main

    path = tmp_path / "tiny.yaml"
    path.write_text(tiny(rounds=3).model_dump_json())
    code = main(
        [
            "run",
            str(path),
            "--out",
            str(tmp_path / "runs"),
            "--run-id",
            "t",
            "--target",
            "0.05",
            "--target",
            "1.0",
            "--no-plots",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    rounds = pd.read_csv(tmp_path / "runs" / "t" / "rounds.csv")
    first = int(rounds.index[rounds["mean_accuracy"] >= 0.05][0])  # the records decide
    line = (
        f"Rounds to 5 % mean user accuracy: {first + 1} "
        f"({rounds['elapsed_s'][first]:.1f} s emulated)."
    )
    summary = (tmp_path / "runs" / "t" / "summary.md").read_text()
    assert line in printed and line in summary
    assert "Rounds to 100 % mean user accuracy: X (not reached in 3 rounds)." in summary
    # a target outside (0, 1] is a scenario error naming the field; nothing is written
    assert main(["run", str(path), "--out", str(tmp_path / "bad"), "--target", "1.5"]) == 2
    assert "evaluation.target_accuracy.0" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


# --------------------------------------------------------------------------- scenarios


def _two_rounds(name: str):
    data = load_scenario(ROOT / "scenarios" / name).model_dump(mode="json")
    data.update(rounds=2)
    data["metrics"]["enabled"] = False
    data["execution"] = {"backend": "local", "hosts": 1}
    rs = prepare(scenario_from_dict(data, name), "smoke", None)
    try:
        out, elapsed = [], 0.0
        for rnd in range(2):
            row, clients, traces = run_round(rs, rnd, elapsed)
            elapsed = row["elapsed_s"]
            out.append((row, clients, traces))
    finally:
        rs.executor.close()
    return out


def test_testbed_scenario_two_rounds_records_fedavg_adam_bytes():
    rounds = _two_rounds("mtfl-rpi-testbed.yaml")
    per_client = 4 * ((N_2NN - 400) + 2 * (N_2NN - 800) + 1)  # yb: 598,031 floats
    for row, clients, _ in rounds:
        assert row["bytes_up"] == row["bytes_down"] == 10 * per_client == 23_921_240
        assert row["server_gflops"] * 1e9 == pytest.approx(2 * (per_client // 4) * 10)
        assert row["mean_clean_accuracy"] == pytest.approx(row["mean_accuracy"])
        assert {c["bytes_up"] for c in clients} == {per_client}
        assert {c["steps"] for c in clients} == {40}  # 800 images / batch 20
    assert rounds[1][0]["mean_accuracy"] > 0.5


def test_shards_scenario_two_rounds_records_yb_bytes():
    rounds = _two_rounds("mtfl-mnist-shards.yaml")
    for row, clients, _ in rounds:
        assert row["bytes_up"] == row["bytes_down"] == 20 * 4 * (N_2NN - 400) == 15_968_800
        assert {c["steps"] for c in clients} == {15}  # 300 images / batch 20
    assert not math.isnan(rounds[-1][0]["mean_accuracy"])


def test_testbed_access_point_calibration_reproduces_the_fitted_figures():
    """The scenario's AP and server reproduce FL(FedAvg)'s 1.5 s / 1.8 s / 0.30 s on a
    paper-sized MNIST round (300 steps), with traces built here by hand."""
    sc = load_scenario(ROOT / "scenarios" / "mtfl-rpi-testbed.yaml")
    model = build_model("mlp_2nn", (1, 28, 28), 10)
    opt = make_optimizer("sgd", model.parameters(), 0.1)
    _, cost = measured_step(model, opt, torch.zeros(20, 1, 28, 28), torch.arange(20) % 10, None)
    # FlopCounterMode's 17,584,000 + SGD's update, 2 FLOPs for each of 199,610 parameters
    assert cost.optimizer_flops == 2 * 199_610
    assert cost.flops == 17_584_000 + 2 * 199_610
    trace = (Download(4 * N_2NN), Compute(300 * cost.flops, 300), Upload(4 * N_2NN))
    profiles = device_profiles(sc)
    specs, servers, net, _ = NetworkModel(sc, profiles).round(0, list(range(10)))
    agg_s = profiles["mtfl-testbed-server"].compute_time_s(2 * N_2NN * 10, 0)
    t = time_round({c: trace for c in range(10)}, specs, servers, net, aggregate_s=agg_s)
    assert t.download_s == pytest.approx(1.5, abs=0.005)
    assert t.upload_s == pytest.approx(1.8, abs=0.005)
    assert t.server_s == pytest.approx(0.30, abs=0.005)
    # the Pi 2B profile: 300 * (0.076 + 17.98322e6 / 2.06e9) = 25.42 s of training
    assert t.client_s == pytest.approx(300 * (0.076 + 17.98322e6 / 2.06e9), rel=1e-12)
    assert t.critical_client in range(5)  # a Pi 2B


def test_mtfl_cnn_is_the_authors_unpadded_model():
    model = build_model("mtfl_cnn", (3, 32, 32), 10)
    layout = model_layout(model)
    assert (
        layout.size
        == (3 * 9 * 32 + 32)
        + 4 * 32
        + (32 * 9 * 64 + 64)
        + 4 * 64
        + (2304 * 512 + 512)
        + (512 * 10 + 10)
        == 1_205_066
    )
    set_flat(model, layout, get_flat(model, layout))
