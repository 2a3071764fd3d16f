"""PHSFL / HSFL: the split, the frozen head, fine-tuning, aggregation (Eqs. 14-16), the
per-batch op-trace and its bytes, the ES CPU contention and the backhaul in the engine,
and a 2-round run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from pytest import approx
from support.scenarios import tiny
from torch import nn

from mecsim.agents.algorithms import ClientContext, ClientResult, ClientTask, TrainConfig
from mecsim.agents.algorithms.phsfl import (
    HSFLClient,
    PHSFLClient,
    PHSFLEdge,
    PHSFLServer,
    batch_plan,
    edge_aggregate,
    global_aggregate,
    part_masks,
    round_position,
    sample_weights,
    split_model,
    split_step,
)
from mecsim.agents.models import build_model, get_flat, model_layout, set_flat
from mecsim.agents.training import StepCosts, evaluate
from mecsim.emulation.engine import ClientSpec, NetworkSpec, ServerSpec, time_round
from mecsim.emulation.ops import (
    Backhaul,
    Compute,
    Download,
    ServerCompute,
    Upload,
    op_from_dict,
    op_to_dict,
)
from mecsim.run.rows import ROUND_COLUMNS
from mecsim.store.session import run_in_folder

MNIST = (1, 28, 28)
MODEL_NUMEL = 733_706  # phsfl_cnn on 1x28x28: conv 1664 + conv 204928 + FC 524544 + FC 2570
CLIENT_NUMEL = 64 * 1 * 5 * 5 + 64  # conv(1 -> 64, 5x5): the client part


# --------------------------------------------------------------------------- split


def test_phsfl_cnn_is_cut_after_the_first_maxpool_as_in_the_paper():
    torch.manual_seed(0)
    parts = split_model(build_model("phsfl_cnn", MNIST, 10), cut_layer=3)
    assert [type(m).__name__ for m in parts.client] == ["Conv2d", "ReLU", "MaxPool2d"]
    assert [type(m).__name__ for m in parts.body] == [
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Flatten",
        "Linear",
        "ReLU",
    ]
    (head,) = parts.head
    assert isinstance(head, nn.Linear) and (head.in_features, head.out_features) == (256, 10)
    masks = part_masks(model_layout(build_model("phsfl_cnn", MNIST, 10)), 3)
    assert masks.client.sum() == CLIENT_NUMEL == 1664
    assert masks.head.sum() == 256 * 10 + 10
    assert masks.body.sum() == MODEL_NUMEL - 1664 - 2570
    assert not (masks.client & masks.body).any() and (masks.client | masks.body | masks.head).all()


def test_bad_splits_are_reported():
    with pytest.raises(ValueError, match="nn.Sequential"):
        split_model(build_model("resnet18", (3, 32, 32), 10), 3)
    model = build_model("phsfl_cnn", MNIST, 10)
    with pytest.raises(ValueError, match="cut_layer=10"):
        split_model(model, 10)  # the head itself would go to the client
    assert len(split_model(model, 9).body) == 0  # cut right before the head: no body
    with pytest.raises(ValueError, match="cut_layer=10"):
        part_masks(model_layout(model), 10)


def _tiny_pair(seed: int = 0) -> tuple[nn.Sequential, nn.Sequential]:
    torch.manual_seed(seed)
    a = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    b = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("frozen_head", [False, True])
def test_split_forward_backward_gives_the_unsplit_gradients_and_update(frozen_head):
    split, whole = _tiny_pair()
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 1, 0, 1])
    parts = split_model(split, cut_layer=2)
    parts.set_trainable(client=True, body=True, head=not frozen_head)
    client_opt = torch.optim.SGD(parts.client.parameters(), lr=0.1)
    server_opt = torch.optim.SGD([p for p in parts.server.parameters() if p.requires_grad], lr=0.1)
    step = split_step(parts, client_opt, server_opt, x, y)

    whole[4].requires_grad_(not frozen_head)
    opt = torch.optim.SGD([p for p in whole.parameters() if p.requires_grad], lr=0.1)
    cut = whole[:2](x)  # the unsplit model's own cut-layer output
    cut.retain_grad()
    loss = nn.functional.cross_entropy(whole[2:](cut), y)
    loss.backward()
    opt.step()
    assert step.loss == float(loss.detach())
    for (name, p), q in zip(split.named_parameters(), whole.parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None and name.startswith("4.")  # only the frozen head
        else:
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-7)
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    # what crossed the cut: the client part's output and the loss gradient w.r.t. it
    assert step.activations.shape == step.gradient.shape == (5, 3)
    torch.testing.assert_close(step.activations, cut.detach(), rtol=0, atol=0)
    torch.testing.assert_close(step.gradient, cut.grad, rtol=0, atol=1e-7)


# --------------------------------------------------------------------------- client


def _ctx(n_train: int = 40, n_test: int = 20, seed: int = 0) -> ClientContext:
    torch.manual_seed(seed)
    model = build_model("phsfl_cnn", MNIST, 10)
    layout = model_layout(model)
    g = torch.Generator().manual_seed(seed)
    return ClientContext(
        client_id=0,
        model=model,
        layout=layout,
        x_train=torch.randn(n_train, *MNIST, generator=g),
        y_train=torch.randint(0, 10, (n_train,), generator=g),
        x_test=torch.randn(n_test, *MNIST, generator=g),
        y_test=torch.randint(0, 10, (n_test,), generator=g),
        state={},
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05),
        generator=torch.Generator().manual_seed(seed + 1),
        costs=StepCosts(),
        init_weights=get_flat(model, layout),
    )


def _task(ctx: ClientContext, **config) -> ClientTask:
    return ClientTask(0, ctx.init_weights.copy(), CLIENT_NUMEL * 4, dict(config))


@pytest.mark.parametrize("client_cls", [PHSFLClient, HSFLClient])
def test_head_is_frozen_in_phsfl_training_and_trained_in_hsfl(client_cls):
    ctx = _ctx()
    task = _task(ctx)
    result = client_cls({}).fit(ctx, task)
    masks = part_masks(ctx.layout, 3)
    before, after = task.weights, result.weights
    assert not np.array_equal(before[masks.client], after[masks.client])
    assert not np.array_equal(before[masks.body], after[masks.body])
    head_unchanged = np.array_equal(before[masks.head], after[masks.head])
    assert head_unchanged is (client_cls is PHSFLClient)
    assert all(p.requires_grad for p in ctx.model.parameters())  # the shared model restored


def test_fine_tuning_changes_only_the_head_and_reports_both_models():
    ctx = _ctx()
    trained = PHSFLClient({}).fit(ctx, _task(ctx)).weights
    task = ClientTask(0, trained, 0)
    acc, loss, extra = PHSFLClient({"finetune_steps": 3, "finetune_lr": 0.5}).evaluate(ctx, task)
    personal = get_flat(ctx.model, ctx.layout)
    masks = part_masks(ctx.layout, 3)
    assert np.array_equal(personal[~masks.head], trained[~masks.head])
    assert not np.array_equal(personal[masks.head], trained[masks.head])
    assert (acc, loss) == evaluate(ctx.model, ctx.x_test, ctx.y_test)
    set_flat(ctx.model, ctx.layout, trained)
    g_acc, g_loss = evaluate(ctx.model, ctx.x_test, ctx.y_test)
    assert extra == {"global_accuracy": g_acc, "global_test_loss": g_loss}
    # K = 0: the personalised model is the global one
    acc0, loss0, extra0 = PHSFLClient({"finetune_steps": 0}).evaluate(ctx, task)
    assert (acc0, loss0) == (g_acc, g_loss) == tuple(extra0.values())


def test_per_batch_op_trace_and_bytes_are_activation_shape_times_dtype():
    ctx = _ctx(n_train=40)
    task = _task(ctx, backhaul_down_nbytes=MODEL_NUMEL * 4, backhaul_up_nbytes=MODEL_NUMEL * 4)
    r = PHSFLClient({"batches_per_epoch": None}).fit(ctx, task)  # one pass: 32 + 8
    act32 = 32 * 64 * 12 * 12 * 4  # o_fp after conv(5x5)-ReLU-maxpool(2): 64 x 12 x 12 float32
    act8 = 8 * 64 * 12 * 12 * 4  # the epoch's last batch: 40 = 32 + 8 samples
    conv_fwd = 2 * 32 * 64 * 24 * 24 * 25  # FLOPs of conv(1 -> 64, 5x5) on 32 x 1 x 28 x 28
    assert r.trace[0] == Backhaul(MODEL_NUMEL * 4, "down", "global_model")
    assert r.trace[1] == Download(CLIENT_NUMEL * 4, "client_model")
    first, second = r.trace[2:7], r.trace[7:12]
    assert [type(op) for op in first] == [Compute, Upload, ServerCompute, Download, Compute]
    assert first[0] == Compute(conv_fwd, 1, "client_forward")
    assert first[1] == Upload(act32 + 32 * 4, "activations")  # + int32 batch indices
    assert first[3] == Download(act32, "gradients")
    assert first[4].batches == 0 and first[4].what == "client_backward"
    assert second[0].flops == approx(conv_fwd / 4)
    assert second[1].nbytes == act8 + 8 * 4 and second[3].nbytes == act8
    assert first[2].flops > 0 and second[2].flops == approx(first[2].flops / 4)
    assert r.trace[12:] == (
        Upload(CLIENT_NUMEL * 4, "client_model"),
        Backhaul(MODEL_NUMEL * 4, "up", "edge_model"),
    )
    assert r.upload_nbytes == CLIENT_NUMEL * 4 and r.steps == 2 and r.num_samples == 40
    assert r.extra == {
        "activation_bytes": act32 + act8,
        "index_bytes": 160,
        "gradient_bytes": act32 + act8,
    }
    assert r.flops == approx(first[0].flops + first[4].flops + second[0].flops + second[4].flops)


def test_default_epoch_is_the_papers_n_5_batches():
    ctx = _ctx(n_train=40)
    r = PHSFLClient({}).fit(ctx, _task(ctx))
    assert r.steps == 5  # kappa_0 = 1 epoch of N = 5 mini-batches of 32
    assert r.extra["activation_bytes"] == 5 * 32 * 64 * 12 * 12 * 4


def test_eq17_fine_tuning_is_charged_after_the_global_round():
    ctx = _ctx(n_train=40)
    task = _task(ctx, backhaul_up_nbytes=MODEL_NUMEL * 4, finetune_backhaul_nbytes=MODEL_NUMEL * 4)
    r = PHSFLClient({"finetune_steps": 3, "batches_per_epoch": 1}).fit(ctx, task)
    act32 = 32 * 64 * 12 * 12 * 4
    conv_fwd = 2 * 32 * 64 * 24 * 24 * 25
    # after the training round (Download, one batch of 5 ops, Upload, Backhaul up): the CS
    # sends w* to the ES, the ES the client part, then K = 3 steps of client forward,
    # activations + indices up, the ES's body forward and head step
    tail = r.trace[8:]
    assert r.trace[7] == Backhaul(MODEL_NUMEL * 4, "up", "edge_model")
    assert tail[0] == Backhaul(MODEL_NUMEL * 4, "down", "finetune_global_model")
    assert tail[1] == Download(CLIENT_NUMEL * 4, "finetune_client_model")
    steps = tail[2:]
    assert len(steps) == 9
    for k in range(3):
        fwd, up, es = steps[3 * k : 3 * k + 3]
        assert fwd == Compute(conv_fwd, 1, "finetune_forward")  # forward only, no backward
        assert up == Upload(act32 + 32 * 4, "finetune_activations")
        assert es.what == "finetune_head" and es.batches == 1
    # the ES's step: body forward (conv 64 -> 128 5x5 on 12x12, FC 2048 -> 256) and the
    # head's forward and weight gradient (FC 256 -> 10: 2 x 2 x 32 x 256 x 10)
    body = 2 * 32 * 128 * 8 * 8 * 64 * 25 + 2 * 32 * 2048 * 256
    head = 2 * 32 * 256 * 10 * 2
    assert steps[2].flops == approx(body + head)
    # the client's FLOPs include its forward passes; nothing else changed
    train = sum(op.flops for op in r.trace[:8] if isinstance(op, Compute))
    assert r.flops == approx(train + 3 * conv_fwd)
    assert r.steps == 1
    # K = 0 or no global model this round: nothing is charged
    none = PHSFLClient({"finetune_steps": 0, "batches_per_epoch": 1}).fit(ctx, task)
    assert none.trace[-1] == Backhaul(MODEL_NUMEL * 4, "up", "edge_model")


def test_fine_tuning_is_charged_once_after_the_last_global_round_by_default():
    layout = model_layout(nn.Sequential(nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 1)))

    def charged(rounds, **params):
        """The rounds whose tasks carry the fine-tuning (w*'s backhaul: 16 bytes)."""
        server = PHSFLServer(
            layout,
            np.zeros(4, np.float32),
            {0: 1},
            1.0,
            {"edge_rounds": 3, "cut_layer": 2, **params},
        )
        server.rounds = rounds
        sizes = [
            server.configure_fit(r, [0])[0].config["finetune_backhaul_nbytes"]
            for r in range(rounds or 12)
        ]
        assert set(sizes) <= {0, 16}
        return [r for r, nbytes in enumerate(sizes) if nbytes]

    # kappa_1 = 3: global rounds end at rounds 2, 5, 8, 11 (edge round t1 = 2)
    assert charged(12, finetune_charge="every_global_round") == [2, 5, 8, 11]
    assert charged(10, finetune_charge="every_global_round") == [2, 5, 8]
    # final (the default, the paper's Section III-B): once, after the last complete
    # global round: (rounds // 3) * 3 - 1 -> 12: 11; 10 and 9: 8; 3: 2
    assert charged(12) == [11]
    assert charged(10) == charged(9) == [8]
    assert charged(3) == [2]
    assert charged(2) == []  # no complete global round: no w* to fine-tune
    assert charged(None) == []  # a server that does not know the run's length


def test_batch_plan_full_passes_or_n_random_batches():
    g = torch.Generator().manual_seed(0)
    assert [len(b) for b in batch_plan(40, 32, 2, None, g)] == [32, 8, 32, 8]
    for epoch in (batch_plan(40, 32, 1, None, g),):
        assert sorted(torch.cat(epoch).tolist()) == list(range(40))
    plan = batch_plan(40, 32, 5, 5, g)  # the paper's kappa_0 = 5 epochs of N = 5 batches
    assert len(plan) == 25 and all(len(set(b.tolist())) == 32 for b in plan)
    assert [len(b) for b in batch_plan(10, 32, 1, 3, g)] == [10, 10, 10]
    assert batch_plan(0, 32, 3, None, g) == []


# --------------------------------------------------------------------------- aggregation


def test_aggregation_weights_are_sample_shares():
    assert sample_weights([1, 3]).tolist() == [0.25, 0.75]
    a, b = np.array([0.0, 4.0], np.float32), np.array([4.0, 8.0], np.float32)
    assert edge_aggregate([a, b], [1, 3]).tolist() == [3.0, 7.0]  # Eqs. 14-15
    assert global_aggregate([a, b], [10, 30]).tolist() == [3.0, 7.0]  # Eq. 16
    with pytest.raises(ValueError):
        sample_weights([0, 0])
    assert [round_position(r, 3) for r in range(4)] == [(0, 0), (0, 1), (0, 2), (1, 0)]


def _result(cid: int, value: float, n: int) -> ClientResult:
    return ClientResult(cid, np.full(4, value, np.float32), 8, n, 0.0, (), 0.0, 1, 0)


def test_server_aggregates_per_edge_server_then_centrally():
    # w = [client Linear(1,1) w, b | head Linear(1,1) w, b]; clients 0, 1 on ES 0; 2, 3 on ES 1
    layout = model_layout(nn.Sequential(nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 1)))
    samples = {0: 1, 1: 3, 2: 4, 3: 4}
    params = {"edge_rounds": 2, "cut_layer": 2}
    server = PHSFLServer(layout, np.zeros(4, np.float32), samples, 1.0, params)
    server.edge_server_of = {0: 0, 1: 0, 2: 1, 3: 1}
    server.rounds = 2  # one global round: Eq. 17's fine-tuning follows round 1
    edges = {
        0: PHSFLEdge(0, layout, {0: 1, 1: 3}, params),
        1: PHSFLEdge(1, layout, {2: 4, 3: 4}, params),
    }

    def plan(rnd, selected):
        tasks = server.configure_fit(rnd, selected)
        assert all(t.weights is None for t in tasks)  # the ES fills in its model
        down = server.configure_edges(rnd)
        for b, edge in edges.items():
            edge.configure_fit(rnd, [t for t in tasks if t.config["edge_server"] == b], down.get(b))
        return tasks

    def aggregate(rnd, results):
        reports = {
            b: edge.aggregate_fit(
                rnd, [r for r in results if server.edge_server_of[r.client_id] == b]
            )
            for b, edge in edges.items()
        }
        return server.aggregate_edges(rnd, results, reports), reports

    tasks = plan(0, [0, 1, 2, 3])
    assert [t.download_nbytes for t in tasks] == [8] * 4  # the client part only
    assert tasks[0].config == {
        "edge_server": 0,
        "backhaul_down_nbytes": 16,
        "backhaul_up_nbytes": 0,
        "finetune_backhaul_nbytes": 0,
    }
    assert tasks[0].weights.tolist() == [0.0] * 4  # Eq. 8: the ES starts from w
    stats, reports = aggregate(
        0, [_result(0, 0, 1), _result(1, 4, 3), _result(2, 1, 4), _result(3, 3, 4)]
    )
    assert edges[0].model.tolist() == [3.0] * 4  # 0.25 * 0 + 0.75 * 4
    assert edges[1].model.tolist() == [2.0] * 4
    assert reports[0].model is None  # w_b goes up only after the last edge round
    assert server.weights.tolist() == [0.0] * 4  # no CS aggregation inside a global round
    assert stats.flops == 2 * 4 * 2 + 2 * 4 * 2
    assert stats.metrics["model_bytes_es_cs"] == 2 * 16  # two ES receive w (Step 1)
    assert server.configure_edges(1) == {}  # nothing from the CS inside a global round
    tasks = plan(1, [0, 1, 2, 3])
    assert tasks[0].weights.tolist() == [3.0] * 4 and tasks[3].weights.tolist() == [2.0] * 4
    assert tasks[3].config["backhaul_up_nbytes"] == 16
    assert tasks[3].config["finetune_backhaul_nbytes"] == 16  # the global model is made now
    stats, reports = aggregate(
        1, [_result(0, 2, 1), _result(1, 6, 3), _result(2, 0, 4), _result(3, 4, 4)]
    )
    # ES 0: 0.25 * 2 + 0.75 * 6 = 5 over 4 samples; ES 1: 2 over 8 samples
    assert reports[0].model.tolist() == [5.0] * 4 and reports[1].model.tolist() == [2.0] * 4
    assert server.weights.tolist() == [(4 * 5 + 8 * 2) / 12] * 4 == [3.0] * 4
    assert stats.flops == 2 * 4 * 2 * 2 + 2 * 4 * 2
    assert plan(2, [0])[0].weights.tolist() == [3.0] * 4  # Eq. 8
    # an ES none of whose clients returned keeps its model and aggregates nothing
    _, reports = aggregate(2, [_result(0, 7, 1)])
    assert reports[1].flops == 0 and reports[1].aggregated == 0
    assert edges[1].model.tolist() == [3.0] * 4 and edges[0].model.tolist() == [7.0] * 4


def test_a_checkpoint_from_before_the_edge_split_restores_the_edge_models():
    """Checkpoints written when one server held every edge model (``edge_models`` in the
    algorithm's state) resume with each edge model in its own edge server."""
    from mecsim.agents.server import CentralServer, EdgeServer
    from mecsim.agents.state import encode

    layout = model_layout(nn.Sequential(nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 1)))
    kwargs = dict(
        algorithm="phsfl",
        layout=layout,
        init_weights=np.zeros(4, np.float32),
        client_samples={0: 1, 1: 3},
        fraction=1.0,
        params={"edge_rounds": 2, "cut_layer": 2},
        seed=0,
        edge_server_of={0: 0, 1: 1},
    )
    central = CentralServer(**kwargs)
    old = central.algorithm.state_dict()
    old["edge_models"] = {0: np.full(4, 5.0, np.float32), 1: np.full(4, 6.0, np.float32)}
    edges = central.load_state_dict(encode({"algorithm": old, "rng": central.rng}, "server"))
    assert sorted(edges) == [0, 1] and not hasattr(central.algorithm, "edge_models")
    for b, value in ((0, 5.0), (1, 6.0)):
        edge = EdgeServer(b, **kwargs)
        edge.load_state_dict(edges[b])
        (task,) = edge.plan(1, [ClientTask(b, None, 8)], None)
        assert task.weights.tolist() == [value] * 4


# --------------------------------------------------------------------------- engine


def _spec(cid: int, es: int) -> ClientSpec:
    return ClientSpec(
        cid,
        uplink_rate_bps=8e6,
        downlink_rate_bps=8e6,
        step_overhead_s=0.0,
        flops_per_s=1e9,
        edge_server=es,
    )


def _sl_trace(upload_bytes: int) -> tuple:
    return (Compute(1e9, 1), Upload(upload_bytes), ServerCompute(2e9, 1), Download(1_000_000))


def test_edge_server_cpu_is_shared_by_its_clients_worked_by_hand():
    # 1 s client compute; uploads of 1 s and 2 s; 2 s of ES work each; 1 s downloads.
    # Same ES: client 1's job runs alone 2-3 s (1 s of work done), then both share the
    # CPU: its last 1 s of work takes 2 s (done at 5), client 2's first 1 s also ends at 5
    # and its last 1 s runs alone (done at 6). Downloads: 5-6 and 6-7.
    traces = {1: _sl_trace(1_000_000), 2: _sl_trace(2_000_000)}
    servers = [ServerSpec(1e9), ServerSpec(1e9)]
    shared = time_round(traces, {1: _spec(1, 0), 2: _spec(2, 0)}, servers, NetworkSpec())
    c1, c2 = shared.clients
    assert (c1.finish_s, c1.server_compute_s) == (approx(6.0), approx(3.0))
    assert (c2.finish_s, c2.server_compute_s) == (approx(7.0), approx(3.0))
    assert shared.round_time_s == approx(7.0) and shared.critical_client == 2
    assert (shared.download_s, shared.client_s, shared.upload_s, shared.server_s) == (
        approx(1.0),
        approx(1.0),
        approx(2.0),
        approx(3.0),
    )
    assert shared.idle_s == approx(0.0)
    apart = time_round(traces, {1: _spec(1, 0), 2: _spec(2, 1)}, servers, NetworkSpec())
    assert [c.finish_s for c in apart.clients] == [approx(5.0), approx(6.0)]


def test_backhaul_is_one_transfer_per_edge_server_after_its_last_client():
    # ES 0: clients 1 (1 s) and 2 (3 s) then the edge model up: 0.5 s + 8 Mbit / 8 Mbit/s,
    # from 3 s to 4.5 s for both. ES 1: client 3 waits for the global model (0.5 + 2 s).
    server = ServerSpec(1e9, backhaul_bps=8e6, backhaul_latency_s=0.5)
    traces = {
        1: (Compute(1e9, 0), Backhaul(1_000_000, "up")),
        2: (Compute(3e9, 0), Backhaul(1_000_000, "up")),
        3: (Backhaul(2_000_000, "down"), Compute(1e9, 0)),
    }
    specs = {1: _spec(1, 0), 2: _spec(2, 0), 3: _spec(3, 1)}
    t = time_round(traces, specs, [server, server], NetworkSpec())
    c1, c2, c3 = t.clients
    assert (c1.finish_s, c1.backhaul_s, c1.compute_s) == (approx(4.5), approx(1.5), approx(1.0))
    assert (c2.finish_s, c2.backhaul_s) == (approx(4.5), approx(1.5))
    assert (c3.finish_s, c3.backhaul_s) == (approx(3.5), approx(2.5))
    assert t.critical_client == 2  # of the two released together, the one that did not wait
    assert (t.round_time_s, t.backhaul_s, t.client_s, t.idle_s) == (
        approx(4.5),
        approx(1.5),
        approx(3.0),
        approx(0.0),
    )
    bad = {**traces, 2: (Compute(3e9, 0), Backhaul(5, "up"))}
    with pytest.raises(ValueError, match="one transfer"):
        time_round(bad, specs, [server, server], NetworkSpec())
    assert op_from_dict(op_to_dict(traces[3][0])) == traces[3][0]
    with pytest.raises(ValueError, match="direction"):
        Backhaul(1, "sideways")


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "charge", "charged"),
    [("phsfl", "final", [3]), ("hsfl", "every_global_round", [1, 3])],
)
def test_four_round_run_records_split_traffic_and_backhaul(algorithm, charge, charged, tmp_path):
    params = {"edge_rounds": 2, "finetune_steps": 2, "finetune_charge": charge}
    sc = tiny(
        rounds=4,
        model={"name": "phsfl_cnn"},
        topology={"clients": 4, "edge_servers": 2},
        backhaul={"bandwidth_bps": 1e9, "latency_s": 0.005},
        algorithm={"name": algorithm, "params": params},
        training={"epochs": 1, "batch_size": 32, "lr": 0.01},
    )
    rows = run_in_folder(sc, tmp_path / "run").rows
    model_bytes, client_bytes = MODEL_NUMEL * 4, CLIENT_NUMEL * 4
    act32 = 32 * 64 * 12 * 12 * 4  # one batch of 32 (every client holds about 100 samples)
    transfer_s = 0.005 + 8 * model_bytes / 1e9  # 5 ms + 8 * |w| / 1 Gbit/s
    for r in rows:
        # kappa_1 = 2: rounds 1 and 3 end the two global rounds; Eq. 17's fine-tuning is
        # charged after round 3 only (final, the paper's), or after both
        last = r["round"] in charged
        assert r["round_time_s"] > 0 and r["server_time_s"] > 0
        # one ES <-> CS transfer per round (w down in an edge round 0, the edge model up
        # in an edge round 1), and in a charged round w* down again for the fine-tuning
        assert r["backhaul_time_s"] == approx((2 if last else 1) * transfer_s)
        assert r["model_bytes_es_cs"] == (4 if last else 2) * model_bytes
        assert r["model_bytes_client_es"] == 2 * 4 * client_bytes
        # N = 5 mini-batches of 32 per client (the default), 4 clients
        assert r["activation_bytes"] == r["gradient_bytes"] == 4 * 5 * act32
        assert r["index_bytes"] == 4 * 5 * 32 * 4
        # K = 2 fine-tuning steps per client: activations and indices up, client part down
        finetune_up = 4 * 2 * (act32 + 32 * 4) if last else 0
        assert r["finetune_bytes"] == finetune_up + (4 * client_bytes if last else 0)
        assert (r["finetune_es_gflops"] > 0) is last
        assert r["bytes_up"] == (
            r["activation_bytes"] + r["index_bytes"] + 4 * client_bytes + finetune_up
        )
        assert r["bytes_down"] == r["gradient_bytes"] + (8 if last else 4) * client_bytes
        assert 0 <= r["mean_global_accuracy"] <= 1 and 0 <= r["mean_accuracy"] <= 1
    assert [r["edge_round"] for r in rows] == [0, 1, 0, 1]
    recorded = pd.read_csv(tmp_path / "run" / "rounds.csv")
    assert list(recorded.columns) == ROUND_COLUMNS + list(PHSFLServer.round_metrics)
    assert recorded["backhaul_time_s"].tolist() == approx([r["backhaul_time_s"] for r in rows])
