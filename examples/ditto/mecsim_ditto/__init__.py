"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021) as a mecsim algorithm plugin, written only against
:mod:`mecsim.api`.

Each client k keeps a personal model v_k beside the global model w (the paper's objective):

    min_{v_k}  h_k(v_k; w) = F_k(v_k) + lam/2 * ||v_k - w*||^2
    s.t.       w* in argmin_w G(F_1(w), ..., F_N(w))        (G: FedAvg's weighted average)

One round t (the paper's Algorithm 1), for every selected client k:

1. receive the global model w^t;
2. **personal**: train v_k (kept on the client in ``ctx.state``; initialised from the
   global model the first time the client trains) for ``personal_epochs`` epochs on
   F_k(v_k) + lam/2 * ||v_k - w^t||^2, the proximal term anchored at the w^t it received
   (its gradient is lam * (v_k - w^t), as in the authors' code, litian96/ditto,
   ``flearn/trainers_MTL/ditto.py``);
3. **global**: train a copy of w^t on F_k for ``training.epochs`` epochs, exactly as a
   FedAvg client does (the scenario's optimiser), and upload it;

and the server averages the uploaded copies weighted by the clients' training-sample
counts (FedAvg). The proximal term covers the trainable parameters; a BatchNorm layer's
running statistics take no gradient and are the personal model's own.

**User accuracy** (``mean_accuracy``) is each client's personal model v_k on its own test
data (the global model for a client that has not trained yet: v_k starts from it). The
global model's accuracy on the same clients is recorded beside it as
``mean_global_accuracy`` (a column of rounds.csv).

**Costs**: a client downloads and uploads the full model (FedAvg's bytes: the personal
model never leaves the client). It trains two models a round: its op-trace's compute is
the FLOPs and steps of both (the personal steps are counted with the proximal term, under
their own step-cost key), so a Ditto round costs about (1 + personal_epochs / epochs)
times a FedAvg client's compute. Server FLOPs of aggregation are FedAvg's: one multiply
and one add per element per client.

**lambda** (``lam``, default 0.1): the paper lets each client pick it on its validation
data from {0.1, 1, 2} ({0.05, 0.1, 0.2} under strong attacks) and fixes 0.1 or 1 for
clients with very few validation samples; the authors' code's dynamic choice tries
0.1, 1 and 2. This plugin takes one value for every client.

Choices where the paper leaves room: the two trainings run one after the other
(personal, then global: the authors' code's order), each with its own shuffles from
``ctx.generator``, rather than interleaved batch by batch on the same batches as in the
authors' code (the same number of steps over the same data with personal_epochs =
epochs); the personal model uses the scenario's optimiser and learning rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, cast

import numpy as np
import torch
from pydantic import Field

from mecsim.api import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EvalResult,
    Params,
    ServerAlgorithm,
    TrainStats,
    WeightedSum,
    evaluate,
    get_flat,
    local_sgd,
    model_optimizer,
    set_flat,
    train_epochs,
    trained_result,
)

__all__ = [
    "DITTO",
    "DittoClient",
    "DittoParams",
    "DittoServer",
    "combine_stats",
    "proximal_term",
]

__version__ = "0.1.0"


class DittoParams(Params):
    """Ditto's hyper-parameters (``algorithm.params`` of a scenario)."""

    lam: float = Field(
        0.1,
        ge=0,
        description=(
            "lambda, the weight of the proximal term lam/2 ||v_k - w||^2 that pulls the "
            "personal model towards the global one (0: local training beside FedAvg; "
            "large: the personal model follows the global one). The paper selects it per "
            "client from {0.1, 1, 2} (from {0.05, 0.1, 0.2} under strong attacks) and uses "
            "a fixed 0.1 or 1 for clients with few validation samples; 0.1 is the default "
            "here. Keep lam * training.lr below 1: the personal SGD step is explicit"
        ),
    )
    personal_epochs: int | None = Field(
        None,
        ge=1,
        description="local epochs of the personal model per round; default training.epochs",
    )


def proximal_term(model: torch.nn.Module, anchors: list[torch.Tensor], lam: float) -> torch.Tensor:
    """lam/2 * sum ||v - w||^2 over the model's parameters v and their anchors w."""
    return (
        lam
        / 2.0
        * sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), anchors, strict=True))
    )


def combine_stats(a: TrainStats, b: TrainStats) -> TrainStats:
    """The training statistics of two trainings one after the other: steps, samples,
    FLOPs summed; the mean loss over all steps; the larger peak memory."""
    steps = a.steps + b.steps
    loss = (a.mean_loss * a.steps + b.mean_loss * b.steps) / steps if steps else a.mean_loss
    return TrainStats(
        steps=steps,
        samples=a.samples + b.samples,
        flops=a.flops + b.flops,
        mean_loss=loss,
        peak_memory_bytes=max(a.peak_memory_bytes, b.peak_memory_bytes),
        optimizer_flops=a.optimizer_flops + b.optimizer_flops,
    )


class DittoServer(ServerAlgorithm):
    """FedAvg's server: the sample-weighted average of the uploaded global-model copies,
    streamed (the uploads folded in client-id order while clients still train)."""

    name = "ditto"
    Params = DittoParams
    params: DittoParams
    streams_aggregation = True
    round_metrics: ClassVar[tuple[str, ...]] = ("mean_global_accuracy",)

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        acc = self.begin_aggregate(rnd)
        self.fold(acc, results)
        return self.end_aggregate(rnd, acc)

    def begin_aggregate(self, rnd: int) -> WeightedSum:
        return WeightedSum()

    def fold(self, acc: WeightedSum, results: list[ClientResult]) -> None:
        uploads = [r for r in results if r.weights is not None]
        bad = acc.add_many(
            [cast(np.ndarray, r.weights) for r in uploads], [r.num_samples for r in uploads]
        )
        if bad:
            raise ValueError(
                f"non-finite uploads of clients {[uploads[i].client_id for i in bad]}"
                " reached the aggregation"
            )

    def end_aggregate(self, rnd: int, acc: WeightedSum) -> AggregateStats:
        if acc.count == 0:
            return AggregateStats(flops=0.0)
        self.weights = acc.result()
        # one multiply and one add per element per aggregated client, and the division of
        # WeightedSum.result once per element (FedAvg's count)
        return AggregateStats(flops=2.0 * self.layout.size * acc.count + self.layout.size)


class DittoClient(ClientAlgorithm):
    """Trains the global model's copy (uploaded) and the personal model (kept)."""

    name = "ditto"
    Params = DittoParams
    params: DittoParams

    #: ``ctx.state`` key of the personal model v_k (flat, as :func:`mecsim.api.get_flat`)
    STATE_KEY: ClassVar[str] = "personal"

    def personal_loss(
        self, ctx: ClientContext, global_weights: np.ndarray
    ) -> Callable[[torch.nn.Module], torch.Tensor]:
        """The proximal term anchored at ``global_weights`` (w^t)."""
        set_flat(ctx.model, ctx.layout, global_weights)
        anchors = [p.detach().clone() for p in ctx.model.parameters()]
        lam = self.params.lam
        return lambda model: proximal_term(model, anchors, lam)

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        if task.weights is None:
            raise ValueError("ditto: the server sent the client no global model")
        w_t = task.weights
        # the personal model v_k: from the global model the first time the client trains
        personal = ctx.state.get(self.STATE_KEY)
        extra = self.personal_loss(ctx, w_t)  # leaves w^t loaded in ctx.model
        if personal is not None:
            set_flat(ctx.model, ctx.layout, personal)
        t = ctx.train
        opt = model_optimizer(ctx.model, t.optimizer, t.lr, t.momentum, t.weight_decay)
        personal_stats = train_epochs(
            ctx.model,
            opt,
            ctx.x_train,
            ctx.y_train,
            epochs=self.params.personal_epochs or t.epochs,
            batch_size=t.batch_size,
            generator=ctx.generator,
            costs=ctx.costs,
            extra_loss=extra,
            cost_key="ditto/personal",  # steps with the proximal term: their own cost
        )
        ctx.state[self.STATE_KEY] = get_flat(ctx.model, ctx.layout)
        # the global model's copy: FedAvg's local update from w^t, uploaded
        set_flat(ctx.model, ctx.layout, w_t)
        global_stats = local_sgd(ctx, cost_key="ditto/global")
        upload = get_flat(ctx.model, ctx.layout, out=ctx.upload_row())
        stats = combine_stats(global_stats, personal_stats)
        return trained_result(
            ctx,
            stats,
            weights=upload,
            upload_nbytes=ctx.layout.nbytes,
            download_nbytes=task.download_nbytes,
            started_at=start,
        )

    def evaluate(self, ctx: ClientContext, task: ClientTask) -> EvalResult:
        """(accuracy, loss) of the personal model on the client's test data, and the
        global model's accuracy as ``global_accuracy``."""
        if task.weights is None:
            raise ValueError("ditto: the server sent the client no global model to evaluate")
        set_flat(ctx.model, ctx.layout, task.weights)
        global_acc, global_loss = evaluate(ctx.model, ctx.x_test, ctx.y_test)
        personal = ctx.state.get(self.STATE_KEY)
        if personal is None:  # not trained yet: v_k is still the global model
            return global_acc, global_loss, {"global_accuracy": global_acc}
        set_flat(ctx.model, ctx.layout, personal)
        acc, loss = evaluate(ctx.model, ctx.x_test, ctx.y_test)
        return acc, loss, {"global_accuracy": global_acc}


#: the plugin's entry (``mecsim.algorithms``: ``ditto = "mecsim_ditto:DITTO"``)
DITTO: tuple[type[ServerAlgorithm], type[ClientAlgorithm]] = (DittoServer, DittoClient)
