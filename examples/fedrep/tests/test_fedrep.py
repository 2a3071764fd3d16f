"""Tests of the algorithm fedrep: its maths and costs worked out by hand on MTFL's 2NN at
MNIST's real input shape (1 x 28 x 28, 10 classes), mecsim's conformance checks, and its
scenario run end to end.

Run them with ``pip install -e ".[test]"`` then ``python -m pytest -q tests``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from mecsim.api import (
    MODELS,
    ClientContext,
    ClientResult,
    ClientTask,
    Compute,
    Download,
    StepCosts,
    TrainConfig,
    Upload,
    evaluate,
    get_flat,
    model_layout,
    set_flat,
)

from mecsim_fedrep import FedRepClient, FedRepServer, head_mask, head_parameters

PACKAGE = Path(__file__).resolve().parent.parent
SCENARIO = PACKAGE / "scenarios" / "fedrep.yaml"

IN, H, OUT = 28 * 28, 200, 10  # the 2NN: 784 -> 200 (BatchNorm) -> 200 -> 10
HEAD = H * OUT + OUT  # the last Linear layer: 2,010 values
BN = 4 * H  # BatchNorm1d(200): weight, bias, running mean, running variance
BODY = (IN * H + H) + BN + (H * H + H)  # 157,000 + 800 + 40,200 = 198,000 values


def context(n: int = 48, batch: int = 16, seed: int = 0, labels: int = 3) -> ClientContext:
    """One client of MNIST's shape on the 2NN: ``n`` random images of ``labels`` classes."""
    with torch.random.fork_rng():  # the model's initial weights; the global stream untouched
        torch.manual_seed(1234)
        model = MODELS.get("mlp_2nn")((1, 28, 28), 10)
    layout = model_layout(model)
    g = torch.Generator().manual_seed(99)
    x = torch.randn(n, 1, 28, 28, generator=g)
    y = torch.randint(0, labels, (n,), generator=g)
    return ClientContext(
        client_id=0,
        model=model,
        layout=layout,
        x_train=x,
        y_train=y,
        x_test=x[:24],
        y_test=y[:24],
        state={},
        train=TrainConfig(epochs=1, batch_size=batch, optimizer="sgd", lr=0.05),
        generator=torch.Generator().manual_seed(seed),
        costs=StepCosts(),
        init_weights=get_flat(model, layout),
    )


def server(ctx: ClientContext, **params: int) -> FedRepServer:
    return FedRepServer(ctx.layout, ctx.init_weights, {0: 30, 1: 10}, 1.0, params)


def test_head_and_body_of_the_2nn() -> None:
    ctx = context()
    assert ctx.layout.size == BODY + HEAD == 200_010
    mask = head_mask(ctx.layout, 1)
    assert int(mask.sum()) == HEAD and int((~mask).sum()) == BODY
    head, body = head_parameters(ctx.model, ctx.layout, 1)
    assert [tuple(p.shape) for p in head] == [(OUT, H), (OUT,)]
    assert sum(p.numel() for p in body) == BODY - 2 * H  # the running statistics are buffers
    # the server expects the body, and sends it: 198,000 float32 values, 792,000 bytes
    srv = server(ctx)
    assert srv.upload_size() == BODY
    tasks = srv.configure_fit(0, [0, 1])
    assert [t.download_nbytes for t in tasks] == [4 * BODY] * 2 == [792_000] * 2
    np.testing.assert_array_equal(tasks[0].weights, ctx.init_weights[~mask])


def test_a_head_of_every_layer_is_refused() -> None:
    ctx = context()
    kwargs = {"train": ctx.train, "model": ctx.model, "layout": ctx.layout}
    kwargs |= {"clients": 2, "participation": 1.0}
    ok = FedRepServer.check_scenario(FedRepServer.Params(head_layers=3), **kwargs)
    assert ok == []
    ((field, message),) = FedRepServer.check_scenario(FedRepServer.Params(head_layers=4), **kwargs)
    assert field == "algorithm.params.head_layers"
    assert "leave no body" in message and "4 layers (1, 3, 4, 6)" in message


def test_fit_uploads_the_body_keeps_the_head_and_charges_both_phases() -> None:
    ctx = context()
    mask = head_mask(ctx.layout, 1)
    client = FedRepClient({"head_epochs": 2})
    task = ClientTask(0, ctx.init_weights[~mask], 4 * BODY)
    result = client.fit(ctx, task)
    trained = get_flat(ctx.model, ctx.layout)
    np.testing.assert_array_equal(result.weights, trained[~mask])
    np.testing.assert_array_equal(ctx.state["head"], trained[mask])
    assert not np.array_equal(ctx.state["head"], ctx.init_weights[mask])  # the head trained
    assert not np.array_equal(result.weights, task.weights)  # and the body
    assert result.upload_nbytes == 4 * BODY == 792_000
    # 48 samples in batches of 16: 3 steps an epoch; 2 head epochs, then 1 body epoch
    assert result.steps == 2 * 3 + 3
    # FLOPs by hand (FlopCounterMode counts 2 m n k a matmul; plain SGD 2 a stepped value):
    # forward 2B(IN H + H H + H OUT); a head step adds the head's weight gradient only
    # (2B H OUT); a body step the head's input gradient (2B OUT H), the middle layer's
    # weight and input gradients (2 x 2B H H) and the first layer's weight gradient
    # (2B IN H; the images need none)
    b = 16
    forward = 2 * b * (IN * H + H * H + H * OUT)
    head_step = forward + 2 * b * H * OUT + 2 * HEAD
    body_step = forward + 2 * b * (OUT * H + 2 * H * H + IN * H) + 2 * (BODY - 2 * H)
    assert (head_step, body_step) == (6_429_620, 14_398_400)
    assert result.flops == 6 * head_step + 3 * body_step == 81_772_920
    assert result.trace == (
        Download(4 * BODY),
        Compute(result.flops, result.steps),
        Upload(4 * BODY),
    )
    # every parameter trainable again: ctx.model is shared by the host's clients
    assert all(p.requires_grad for p in ctx.model.parameters())


def test_the_head_phase_leaves_the_body_s_parameters_and_moves_its_batchnorm_statistics() -> None:
    ctx = context()
    client = FedRepClient({})
    head, body = head_parameters(ctx.model, ctx.layout, 1)
    before = [p.detach().clone() for p in body]
    bn = ctx.model[3]
    mean_before = bn.running_mean.clone()
    client.phase(ctx, head, 1, "fedrep/head")
    for p, q in zip(body, before, strict=True):
        assert torch.equal(p.detach(), q)
    # train mode throughout (the authors' code): the body's running statistics move
    assert not torch.equal(bn.running_mean, mean_before)


def test_frozen_flags_are_put_back_even_when_training_fails() -> None:
    ctx = context()
    frozen = ctx.model[1].bias
    frozen.requires_grad_(False)  # someone's choice before fit: kept after it
    client = FedRepClient({})
    mask = head_mask(ctx.layout, 1)
    client.fit(ctx, ClientTask(0, ctx.init_weights[~mask], 4 * BODY))
    assert [p.requires_grad for p in ctx.model.parameters()] == [
        p is not frozen for p in ctx.model.parameters()
    ]
    bad = context()
    bad.y_train[0] = 10  # a label the model has no output for: cross_entropy raises
    with pytest.raises((IndexError, RuntimeError)):
        client.fit(bad, ClientTask(0, bad.init_weights[~mask], 4 * BODY))
    assert all(p.requires_grad for p in bad.model.parameters())


def test_evaluate_uses_the_body_with_the_client_s_own_head() -> None:
    ctx = context()
    mask = head_mask(ctx.layout, 1)
    client = FedRepClient({"head_epochs": 3})
    body = ctx.init_weights[~mask]
    # before any training: the initial model (the initial head)
    set_flat(ctx.model, ctx.layout, ctx.init_weights)
    assert client.evaluate(ctx, ClientTask(0, body, 0)) == evaluate(
        ctx.model, ctx.x_test, ctx.y_test
    )
    client.fit(ctx, ClientTask(0, body, 4 * BODY))
    other_body = body + np.float32(0.01)
    acc, loss = client.evaluate(ctx, ClientTask(0, other_body, 0))
    own = np.empty(ctx.layout.size, np.float32)
    own[~mask], own[mask] = other_body, ctx.state["head"]
    set_flat(ctx.model, ctx.layout, own)
    assert (acc, loss) == evaluate(ctx.model, ctx.x_test, ctx.y_test)
    assert math.isfinite(loss)


def test_the_second_round_trains_on_from_the_kept_head() -> None:
    ctx = context()
    mask = head_mask(ctx.layout, 1)
    client = FedRepClient({"head_epochs": 1})
    body = ctx.init_weights[~mask]
    client.fit(ctx, ClientTask(0, body, 4 * BODY))
    first_head = ctx.state["head"].copy()
    # round 2 from the same body: the same as a fresh client given that head, not as one
    # that starts from the initial head
    planted, blank = context(), context()
    planted.state["head"] = first_head.copy()
    for c in (ctx, planted, blank):
        c.generator = torch.Generator().manual_seed(5)
    a, b, c = (client.fit(x, ClientTask(0, body, 4 * BODY)) for x in (ctx, planted, blank))
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(ctx.state["head"], planted.state["head"])
    assert not np.array_equal(a.weights, c.weights)


def test_server_averages_the_bodies_by_samples_and_keeps_its_head() -> None:
    ctx = context()
    mask = head_mask(ctx.layout, 1)
    srv = server(ctx)
    a = np.full(BODY, 1.0, np.float32)
    b = np.full(BODY, 5.0, np.float32)
    results = [
        ClientResult(c, w, 4 * BODY, n, 0.0, (), 0.0, 0, 0) for c, w, n in ((0, a, 30), (1, b, 10))
    ]
    stats = srv.aggregate_fit(0, results)
    np.testing.assert_allclose(srv.weights[~mask], 2.0)  # (30 * 1 + 10 * 5) / 40
    np.testing.assert_array_equal(srv.weights[mask], ctx.init_weights[mask])
    assert stats.flops == 2.0 * BODY * 2 + BODY == 990_000
    assert srv.aggregate_fit(1, []).flops == 0.0  # nobody made it: nothing changes
    np.testing.assert_allclose(srv.weights[~mask], 2.0)


@pytest.mark.slow
def test_passes_the_conformance_checks() -> None:
    """What `mecsim check fedrep` runs: determinism, checkpoints, Ray, the class
    flags, bytes and FLOPs charged (mecsim.testing)."""
    from mecsim.testing import check_algorithm

    report = check_algorithm("fedrep")  # runs the algorithm several times over
    report.assert_ok()


def test_runs_its_scenario(tmp_path: Path) -> None:
    import mecsim.api

    run = mecsim.api.simulate(
        SCENARIO, out=tmp_path, backend="local", rounds=2, progress=False, plots=False
    )
    assert run.status == "finished"
    info = json.loads((run.run_dir / "run.json").read_text())
    plugin = info["plugins"][0]  # what the run used that is not mecsim's own
    assert (plugin["kind"], plugin["name"]) == ("algorithm", "fedrep")
    # 6 clients, each the body down and up: 6 x 792,000 bytes a round each way
    assert list(run.rounds["bytes_up"]) == list(run.rounds["bytes_down"]) == [4_752_000] * 2
