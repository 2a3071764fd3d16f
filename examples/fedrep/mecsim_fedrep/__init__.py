"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021) as a mecsim algorithm plugin, written only
against :mod:`mecsim.api`.

The model is split in two: a **body** (the representation phi, shared by all clients) and
a **head** (h_k, each client's own: its last ``head_layers`` layers). One round t, every
selected client k

1. receives the body phi^t (only the body: the server never holds a head worth sending);
2. **head**: trains its head h_k (kept on the client in ``ctx.state``; the common initial
   model's head the first time) for ``head_epochs`` epochs with the body frozen;
3. **body**: trains the body for ``training.epochs`` epochs with its new head frozen;
4. uploads the body only; the head never leaves the client;

and the server averages the uploaded bodies weighted by the clients' training samples
(FedAvg over the body). This is the paper's Algorithm 1 with the authors' order (head
first, then the body: lgcollins/FedRep, ``models/Update.py``, ``head_eps = local_ep -
local_rep_ep`` epochs of the head, then the representation's).

**User accuracy** (``mean_accuracy``) is each client's personal model, the round's body
with its own head, on its own test data (a client that has not trained yet has the
initial head: chance accuracy, as in the paper's setting where heads are learnt locally).

**Costs**: the body down and up (``upload_size()`` says the server expects the body's
number of values). Both phases are one ``compute`` op of the client's op-trace with the
FLOPs and steps of both; each phase's steps are measured under a ``cost_key`` of its
own (``fedrep/head``, ``fedrep/body``): a head step computes the forward pass and the
head's weight gradient only, a body step everything but the head's weight gradient.

Choices where the paper leaves room (each a choice point of a port: docs/extending.md):

* **personal layers**: the last ``head_layers`` entries of ``ctx.layout.layer_names``
  (the modules that own floating-point tensors, in the flat vector's order); for the
  2NN the last Linear (2,010 values of 200,010);
* **frozen layers**: ``requires_grad_(False)`` on the other phase's parameters, and
  every parameter's flag put back as it was in a ``finally:`` (``ctx.model`` is shared
  by the host's clients);
* **BatchNorm statistics**: a BatchNorm layer of the body keeps updating its running
  mean and variance in both phases (the model trains in train mode throughout, as in
  the authors' code) and they travel and are averaged with the body; the integer batch
  counter stays each host's;
* **the second model**: there is none; the head is a flat vector in ``ctx.state``
  (checkpointed with the client's state, so a resumed run equals a fresh one);
* **optimiser**: the scenario's, built afresh for each phase (one optimiser for both
  phases would carry momentum from the head's steps into the body's; with plain SGD,
  the default, the two are the same).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, cast

import numpy as np
from mecsim.api import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EvalResult,
    ModelLayout,
    Params,
    ServerAlgorithm,
    TrainConfig,
    TrainStats,
    WeightedSum,
    evaluate,
    get_flat,
    model_optimizer,
    set_flat,
    train_epochs,
    trained_result,
)
from pydantic import Field
from torch import nn

__all__ = [
    "ALGORITHM",
    "FedRepClient",
    "FedRepParams",
    "FedRepServer",
    "combine_stats",
    "head_mask",
    "head_parameters",
    "personal_model",
]

__version__ = "0.1.0"


class FedRepParams(Params):
    """FedRep's hyper-parameters (``algorithm.params`` of a scenario); the body trains for
    the scenario's ``training.epochs``."""

    head_epochs: int = Field(
        5,
        ge=1,
        description=(
            "local epochs of the head (the body frozen) before the body's epochs in a "
            "round; FedRep's point is many cheap head updates per body update (the "
            "authors' code runs local_ep - local_rep_ep head epochs, then local_rep_ep "
            "body epochs)"
        ),
    )
    head_layers: int = Field(
        1,
        ge=1,
        description=(
            "how many of the model's last layers (in the order of the flat vector, "
            "ctx.layout.layer_names) are the client's own head; the paper's head is the "
            "last (classifier) layer"
        ),
    )


def head_mask(layout: ModelLayout, head_layers: int) -> np.ndarray:
    """The boolean mask of the flat vector covering the last ``head_layers`` layers."""
    n = layout.num_layers
    return layout.mask(list(range(n - head_layers, n)))


def head_parameters(
    model: nn.Module, layout: ModelLayout, head_layers: int
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the head's parameters, the body's): the parameters of the modules that own the
    last ``head_layers`` layers of ``layout``, and all the others."""
    modules = dict(model.named_modules())
    names = layout.layer_names[layout.num_layers - head_layers :]
    head = [p for name in names for p in modules[name].parameters(recurse=False)]
    ids = {id(p) for p in head}
    return head, [p for p in model.parameters() if id(p) not in ids]


def personal_model(body: np.ndarray, head: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The flat model of ``body`` (the values outside ``mask``) and ``head`` (inside)."""
    flat = np.empty(mask.shape, dtype=np.float32)
    flat[~mask] = body
    flat[mask] = head
    return flat


def combine_stats(a: TrainStats, b: TrainStats) -> TrainStats:
    """Two trainings one after the other: steps, samples and FLOPs summed, the mean loss
    over all steps, the larger peak memory."""
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


class FedRepServer(ServerAlgorithm):
    """FedAvg over the body: the sample-weighted average of the uploaded bodies, streamed
    (folded in client-id order while clients still train). ``self.weights`` is the whole
    flat model; its head part stays the initial head (the server never learns one)."""

    name = "fedrep"
    Params = FedRepParams
    params: FedRepParams
    streams_aggregation = True
    #: ``body`` (the mask of the body's values) follows from the scenario: not checkpointed
    static_attributes: ClassVar[tuple[str, ...]] = (*ServerAlgorithm.static_attributes, "body")

    def __init__(
        self,
        layout: ModelLayout,
        init_weights: np.ndarray,
        client_samples: dict[int, int],
        fraction: float,
        params: dict[str, Any],
    ) -> None:
        super().__init__(layout, init_weights, client_samples, fraction, params)
        self.body = ~head_mask(self.layout, self.params.head_layers)

    @classmethod
    def check_scenario(
        cls,
        params: Any,
        *,
        train: TrainConfig,
        model: Any,
        layout: ModelLayout,
        clients: int,
        participation: float,
    ) -> list[tuple[str, str]]:
        """A head of every layer leaves no body to share: refused, naming the field."""
        if params.head_layers >= layout.num_layers:
            return [
                (
                    "algorithm.params.head_layers",
                    (
                        f"{params.head_layers} head layers leave no body: the model has "
                        f"{layout.num_layers} layers ({', '.join(layout.layer_names)})"
                    ),
                )
            ]
        return []

    def global_body(self) -> np.ndarray:
        """The body every client downloads (a copy of the global model's body values)."""
        return self.weights[self.body]

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        body = self.global_body()
        return [ClientTask(c, body, body.nbytes) for c in selected]

    def upload_size(self) -> int:
        """A client uploads the body: the model's values outside the head."""
        return int(self.body.sum())

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
        weights = self.weights.copy()
        weights[self.body] = acc.result()
        self.weights = weights
        n = float(self.body.sum())
        # a multiply and an add per body value per client, the division once per value
        return AggregateStats(flops=2.0 * n * acc.count + n)

    def configure_evaluate(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        """Each client evaluates the body with its own head."""
        body = self.global_body()
        return [ClientTask(c, body, 0) for c in clients]


class FedRepClient(ClientAlgorithm):
    """Trains the head (body frozen), then the body (head frozen); uploads the body and
    keeps the head in ``ctx.state``."""

    name = "fedrep"
    Params = FedRepParams
    params: FedRepParams
    #: the head is the client's state: its host keeps it, so it is never lent to another
    keeps_no_state = False

    #: ``ctx.state`` key of the client's head (the flat values of its head layers)
    STATE_KEY: ClassVar[str] = "head"

    def own_model(self, ctx: ClientContext, body: np.ndarray) -> np.ndarray:
        """The flat model of ``body`` and this client's head (the initial model's head
        before its first training)."""
        mask = head_mask(ctx.layout, self.params.head_layers)
        head = ctx.state.get(self.STATE_KEY)
        return personal_model(body, ctx.init_weights[mask] if head is None else head, mask)

    def phase(
        self, ctx: ClientContext, train: list[nn.Parameter], epochs: int, cost_key: str
    ) -> TrainStats:
        """``epochs`` epochs of the scenario's optimiser on ``train`` only (every other
        parameter frozen); the flags are put back as they were, whatever happens."""
        params = list(ctx.model.parameters())
        flags = [p.requires_grad for p in params]
        ids = {id(p) for p in train}
        try:
            for p in params:
                p.requires_grad_(id(p) in ids)
            t = ctx.train
            opt = model_optimizer(ctx.model, t.optimizer, t.lr, t.momentum, t.weight_decay)
            return train_epochs(
                ctx.model,
                opt,
                ctx.x_train,
                ctx.y_train,
                epochs=epochs,
                batch_size=t.batch_size,
                generator=ctx.generator,
                costs=ctx.costs,
                cost_key=cost_key,
            )
        finally:  # ctx.model is shared by the host's clients
            for p, flag in zip(params, flags, strict=True):
                p.requires_grad_(flag)

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        if task.weights is None:
            raise ValueError(f"fedrep: client {ctx.client_id} was sent no body")
        set_flat(ctx.model, ctx.layout, self.own_model(ctx, task.weights))
        head, body = head_parameters(ctx.model, ctx.layout, self.params.head_layers)
        head_stats = self.phase(ctx, head, self.params.head_epochs, "fedrep/head")
        body_stats = self.phase(ctx, body, ctx.train.epochs, "fedrep/body")
        flat = get_flat(ctx.model, ctx.layout)
        mask = head_mask(ctx.layout, self.params.head_layers)
        ctx.state[self.STATE_KEY] = flat[mask]  # a copy: the head stays on the client
        upload = flat[~mask]  # the body, all that goes up
        return trained_result(
            ctx,
            combine_stats(head_stats, body_stats),
            weights=upload,
            upload_nbytes=upload.nbytes,
            download_nbytes=task.download_nbytes,
            started_at=start,
        )

    def evaluate(self, ctx: ClientContext, task: ClientTask) -> EvalResult:
        """(accuracy, loss) of the round's body with this client's head."""
        if task.weights is None:
            raise ValueError(f"fedrep: client {ctx.client_id} was sent no body to evaluate")
        set_flat(ctx.model, ctx.layout, self.own_model(ctx, task.weights))
        return evaluate(ctx.model, ctx.x_test, ctx.y_test)


#: The entry point (pyproject.toml: ``fedrep = "mecsim_fedrep:ALGORITHM"``)
ALGORITHM: tuple[type[ServerAlgorithm], type[ClientAlgorithm]] = (FedRepServer, FedRepClient)
