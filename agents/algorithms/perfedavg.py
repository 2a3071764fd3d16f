"""Per-FedAvg (Fallah et al. 2020), first-order MAML variant: a meta-model that adapts in one step.

Local training runs the first-order MAML update on pairs of mini-batches (D, D') of the
client's shuffled data, for ``training.epochs`` epochs:

    w' = w - alpha * grad f(w; D)            (inner, personalisation step)
    w  = w - beta  * grad f(w'; D')          (outer, first-order: the gradient at w'
                                              is applied to w, no Hessian term)

The server averages the meta-models as FedAvg does. Before testing, each client takes
the global model and performs ONE personalisation step ``w - alpha * grad f(w; D)`` on one
mini-batch of its training data, then tests that model.

Choices: ``inner_lr`` (alpha) and ``outer_lr`` (beta) default to ``training.lr``. With an
odd number of mini-batches in an epoch, the last batch is paired with the epoch's first
(so every sample is used once as D or D' per epoch and FLOPs equal one SGD epoch's,
every batch being one forward-backward pass; the engine counts both passes of a pair as
steps). The personalisation step at test time is not in the op-trace, as evaluation is not
timed for any algorithm.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import cast

import numpy as np
import torch
from pydantic import Field
from torch.utils.flop_counter import FlopCounterMode

from mecsim.agents.algorithms.base import (
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    NoParams,
    trained_result,
)
from mecsim.agents.algorithms.fedavg import FedAvgServer
from mecsim.agents.models import get_flat, set_flat
from mecsim.agents.training import (
    StepCost,
    TrainStats,
    batch_loss,
    evaluate,
    measured_step,
    optimizer_step,
    optimizer_step_flops,
)


class PerFedAvgParams(NoParams):
    inner_lr: float | None = Field(None, gt=0, description="alpha; default training.lr")
    outer_lr: float | None = Field(None, gt=0, description="beta; default training.lr")


class PerFedAvgServer(FedAvgServer):
    name = "perfedavg"
    Params = PerFedAvgParams


def pair_batches(num_batches: int) -> list[tuple[int, int]]:
    """(D, D') batch indices of one epoch: (0, 1), (2, 3), ...; an odd last batch is paired
    with batch 0. One batch alone pairs with itself."""
    if num_batches < 1:
        raise ValueError("an epoch needs at least one batch")
    return [(k, (k + 1) % num_batches) for k in range(0, num_batches, 2)]


def fo_maml_epochs(
    ctx: ClientContext, inner_lr: float, outer_lr: float, cost_key: str
) -> TrainStats:
    """First-order MAML on ``ctx.model`` in place; FLOPs from the measured step costs."""
    model, t = ctx.model, ctx.train
    params = [p for p in model.parameters() if p.requires_grad]
    inner = torch.optim.SGD(params, lr=inner_lr)
    outer = torch.optim.SGD(params, lr=outer_lr)
    n = int(ctx.y_train.shape[0])
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    model.train()
    steps, flops, opt_flops, loss_sum, peak = 0, 0.0, 0.0, 0.0, 0
    for _ in range(t.epochs):
        order = torch.randperm(n, generator=ctx.generator)
        batches = [order[s : s + t.batch_size] for s in range(0, n, t.batch_size)]
        for a, b in pair_batches(len(batches)):
            if has_bn and min(len(batches[a]), len(batches[b])) < 2:
                continue  # BatchNorm cannot train on a single sample
            xa, ya = ctx.x_train[batches[a]], ctx.y_train[batches[a]]
            xb, yb = ctx.x_train[batches[b]], ctx.y_train[batches[b]]
            start = [p.detach().clone() for p in params]
            cost = ctx.costs.get(len(ya), cost_key)  # inner step: w' = w - alpha g(w; D)
            if cost is None:
                loss, cost = measured_step(model, inner, xa, ya, None)
                ctx.costs.put(len(ya), cost, cost_key)
            else:
                loss = optimizer_step(model, inner, xa, ya, None)
            flops += cost.flops
            opt_flops += cost.optimizer_flops
            peak = max(peak, cost.memory_bytes)
            outer.zero_grad(set_to_none=True)  # outer step: w - beta g(w'; D')
            outer_key = cost_key + "/outer"
            cost_b = ctx.costs.get(len(yb), outer_key)
            counter = FlopCounterMode(display=False) if cost_b is None else nullcontext()
            with counter:
                outer_loss = batch_loss(model, xb, yb, None)
                outer_loss.backward()
            if cost_b is None:  # + the outer SGD update (optimizer_step_flops)
                update = optimizer_step_flops(outer)
                # cast: cost_b None, so counter is the FlopCounterMode
                cost_b = StepCost(
                    float(cast(FlopCounterMode, counter).get_total_flops()) + update,
                    cost.memory_bytes,
                    update,
                )
                ctx.costs.put(len(yb), cost_b, outer_key)
            with torch.no_grad():
                for p, p0 in zip(params, start, strict=True):
                    p.copy_(p0)
            outer.step()
            flops += cost_b.flops
            opt_flops += cost_b.optimizer_flops
            loss_sum += loss + float(outer_loss.detach())
            steps += 2
    return TrainStats(steps, n * t.epochs, flops, loss_sum / max(steps, 1), peak, opt_flops)


class PerFedAvgClient(ClientAlgorithm):
    name = "perfedavg"
    Params = PerFedAvgParams
    params: PerFedAvgParams

    def _lrs(self, ctx: ClientContext) -> tuple[float, float]:
        p = self.params
        return (p.inner_lr or ctx.train.lr, p.outer_lr or ctx.train.lr)

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        # cast: the server sends every client the model
        set_flat(ctx.model, ctx.layout, cast(np.ndarray, task.weights))
        alpha, beta = self._lrs(ctx)
        stats = fo_maml_epochs(ctx, alpha, beta, cost_key=self.name)
        weights = get_flat(ctx.model, ctx.layout)
        up = ctx.layout.nbytes
        return trained_result(
            ctx,
            stats,
            weights=weights,
            upload_nbytes=up,
            download_nbytes=task.download_nbytes,
            started_at=start,
        )

    def evaluate(self, ctx: ClientContext, task: ClientTask) -> tuple[float, float]:
        """One personalisation step from the global model on one training batch, then test."""
        # cast: the server sends every client the global model
        set_flat(ctx.model, ctx.layout, cast(np.ndarray, task.weights))
        alpha, _ = self._lrs(ctx)
        n = int(ctx.y_train.shape[0])
        idx = torch.randperm(n, generator=ctx.generator)[: ctx.train.batch_size]
        ctx.model.train()
        opt = torch.optim.SGD(ctx.model.parameters(), lr=alpha)
        optimizer_step(ctx.model, opt, ctx.x_train[idx], ctx.y_train[idx], None)
        return evaluate(ctx.model, ctx.x_test, ctx.y_test)


#: registered as ``perfedavg`` (:data:`mecsim.registry.ALGORITHMS`)
PERFEDAVG = (PerFedAvgServer, PerFedAvgClient)
