"""FedRep-like algorithms for the cost tests (``tests/unit/agents/test_step_costs.py``): a
plugin file (``mecsim check NAME --plugin FILE``).

FedRep (Collins et al., 2021) trains a client's model in two phases a round: the head
(the last layer) with the body frozen, then the body with the head frozen. The two
phases cost different FLOPs per step at one batch size (a frozen layer computes no
weight gradient; the layers before a frozen input none for their input).

``fedrep_like``
    both phases through ``local_sgd`` under one ``cost_key``: the step-cost cache keys
    on which parameters require grad too, so each phase is charged its own cost;
``fedrep_one_key``
    a custom loop that caches its step costs in ``ctx.costs`` under one key for both
    phases (the bug the ``flops`` property must catch): the body phase is charged the
    head phase's cost.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from mecsim.api import (
    ALGORITHMS,
    ClientContext,
    ClientResult,
    ClientTask,
    TrainStats,
    get_flat,
    local_sgd,
    measured_step,
    model_optimizer,
    register,
    set_flat,
    trained_result,
)

FedAvgServer, FedAvgClient = ALGORITHMS.get("fedavg")


def head_and_body(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the last Linear layer's parameters, all the others)."""
    head_layer = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    head = list(head_layer.parameters())
    ids = {id(p) for p in head}
    return head, [p for p in model.parameters() if id(p) not in ids]


def set_trainable(params: list[nn.Parameter], flag: bool) -> None:
    for p in params:
        p.requires_grad_(flag)


def add(a: TrainStats, b: TrainStats) -> TrainStats:
    return TrainStats(
        a.steps + b.steps,
        a.samples + b.samples,
        a.flops + b.flops,
        (a.mean_loss * a.steps + b.mean_loss * b.steps) / max(a.steps + b.steps, 1),
        max(a.peak_memory_bytes, b.peak_memory_bytes),
        a.optimizer_flops + b.optimizer_flops,
    )


class FedRepLikeClient(FedAvgClient):
    """Head, then body, each phase one epoch of ``local_sgd`` under one cost key."""

    name = "fedrep_like"
    keeps_no_state = True

    def phase(self, ctx: ClientContext) -> TrainStats:
        return local_sgd(ctx, cost_key="fedrep")

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        assert task.weights is not None
        set_flat(ctx.model, ctx.layout, task.weights)
        head, body = head_and_body(ctx.model)
        try:
            set_trainable(body, False)
            stats = self.phase(ctx)
            set_trainable(body, True)
            set_trainable(head, False)
            stats = add(stats, self.phase(ctx))
        finally:  # the host's model is shared by its clients: leave it all trainable
            set_trainable(head, True)
            set_trainable(body, True)
        weights = get_flat(ctx.model, ctx.layout)
        return trained_result(
            ctx,
            stats,
            weights=weights,
            upload_nbytes=weights.nbytes,
            download_nbytes=task.download_nbytes,
            started_at=start,
        )


class FedRepOneKeyClient(FedRepLikeClient):
    """The same phases in a custom loop whose cost cache keys on batch size alone."""

    name = "fedrep_one_key"

    def phase(self, ctx: ClientContext) -> TrainStats:
        t = ctx.train
        opt = model_optimizer(ctx.model, t.optimizer, t.lr, t.momentum, t.weight_decay)
        n = int(ctx.y_train.shape[0])
        order = torch.randperm(n, generator=ctx.generator)
        steps, flops, opt_flops, loss_sum, peak = 0, 0.0, 0.0, 0.0, 0
        for s in range(0, n, t.batch_size):
            idx = order[s : s + t.batch_size]
            xb, yb = ctx.x_train[idx], ctx.y_train[idx]
            cost = ctx.costs.get(len(yb), "fedrep")  # the bug: one key, two kinds of step
            loss, measured = measured_step(ctx.model, opt, xb, yb, None)
            if cost is None:
                cost = measured
                ctx.costs.put(len(yb), cost, "fedrep")
            steps += 1
            flops += cost.flops
            opt_flops += cost.optimizer_flops
            loss_sum += loss
            peak = max(peak, cost.memory_bytes)
        return TrainStats(steps, n, flops, loss_sum / max(steps, 1), peak, opt_flops)


register("algorithm", "fedrep_like", (FedAvgServer, FedRepLikeClient))
register("algorithm", "fedrep_one_key", (FedAvgServer, FedRepOneKeyClient))
