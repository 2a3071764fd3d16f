"""PHSFL (Pervej & Molisch, "Personalized Hierarchical Split Federated Learning in Wireless
Networks"): hierarchical split FL with a frozen, randomly initialised head, then K steps
of head fine-tuning per client; and the HSFL baseline (the same, every block trained).

Hierarchy (Section II): B edge servers (ES), each serving its own clients U_b; a central
server (CS). A global round t2 has kappa_1 edge rounds, an edge round kappa_0 local epochs.
**One mecsim round is one edge round**: round r is edge round t1 = r mod kappa_1 of
global round t2 = r div kappa_1, so a scenario of R global rounds has R * kappa_1 rounds
(``rounds``), and kappa_0 is ``training.epochs``.

Where the models live between rounds (our choice; the paper does not say how to build
it): the global model w is state of the central server (:class:`PHSFLServer`), and each
edge model w_b = [w_b0; w_b1] (client part; server part = [body; head]) is state of its
own edge server (:class:`PHSFLEdge`; under Ray each ES and the CS is an actor of its own).
The CS plans the round (selection, per-client configuration) and sends w to every ES at
the start of a global round; each ES fills in its clients' tasks with w_b, aggregates its
own clients' uploads (Eqs. 14-15) and, after the last edge round, sends w_b to the CS,
which aggregates them (Eq. 16). A client's task carries its ES's whole model: the client
part is its wireless download (Step 2.3); the server part is the per-client copy
w_u1 <- w_b1 the ES makes (Step 3.1), trained in the same ``fit`` call on the client's
host, because the ES side of split learning is real training too. The result returns
[w_u0; w_u1] to the ES; only w_u0 counts as wireless upload (Step 4), w_u1 never left
the ES.

Per mini-batch (Steps 3.2-3.8), with the op recorded for the timing engine::

    client forward o_fp = f(w_u0 | x)           Compute(client forward FLOPs, 1 batch)
    send o_fp and the batch indices N           Upload(activations + int32 indices)
    ES forward, loss Eq. 9, backward, step      ServerCompute(ES fwd+bwd FLOPs, 1 batch)
       Eq. 11 (body); Eq. 12 (head: frozen in PHSFL, ``requires_grad=False``)
    send o_bp = dLoss/d o_fp back               Download(cut-layer gradient)
    client backward with o_bp, step Eq. 13      Compute(client backward FLOPs, 0 batches)

so the ES CPU is contended per batch and the wireless time is per batch. Labels stay at
the ES (Section II-A): they are used by the ES-side step and never sent. The edge round
is framed by ``Download(client part)`` ... ``Upload(client part)``; the first edge round
of a global round starts with ``Backhaul(w, "down")`` (Step 1, CS -> ES) and the last one
ends with ``Backhaul(w, "up")`` (Step 5 -> 6, ES -> CS): the engine runs one transfer
per ES, once all of its clients have reached it.

Aggregation: after each edge round every ES averages its clients' client and server
parts, weighted by training samples (Eqs. 14-15); after the last edge round of a global
round the CS averages the edge models weighted by the ES's training samples (Eq. 16),
and the ESs restart from it (Eq. 8). Server FLOPs: 2 * |w| per averaged model, as FedAvg.
Their emulated time is all placed at the round's end on one edge-server CPU (the run
loop's model): it over-counts the B edge aggregations running in parallel by at most
(B - 1) of them (about 0.2 ms each for phsfl_cnn on the x86 edge profile).

Personalisation (Section III-B, Eq. 17): at every evaluation each client takes the
global model, keeps the client part and body fixed, and fine-tunes only the head for K
SGD steps (lr eta~) on its own training data; the main accuracy / loss columns are
those of this personalised model, ``mean_global_accuracy`` / ``mean_global_test_loss``
those of the global model w on the same test data. The fine-tuning is timed as split
learning in the op-traces (:meth:`PHSFLClient._finetune_ops`: CS -> ES backhaul of w*,
the client part down, then per step the client's forward pass, the upload of its
activations and batch indices, and the ES's body forward and head step; no gradient
comes back, the client part is fixed). ``finetune_charge`` says when: ``final`` (the
default, the paper's: once, after the last complete global round of the run) or
``every_global_round`` (after each global round, when its personalised accuracy is
evaluated); the accuracy of the intermediate global rounds is evaluated either way,
without charge under ``final``.

Choices where the paper is unclear (each tested in ``tests/unit/agents/test_phsfl.py``):
- "kappa_0 local epochs", each "N mini-batches": Section V-A lists "N = 32, N = 5". We
  read the batch size as ``training.batch_size`` (32) and offer ``batches_per_epoch``
  (the paper's N = 5, the default: each mini-batch a fresh uniform draw of B samples
  without replacement, Step 3.2); ``null`` makes an epoch one pass over the data.
- The batch indices travel as int32 (a client holds < 2^31 samples).
- The ES <-> CS transfers carry the whole model [w_b0; w_b1] (Step 5), frozen head
  included, as the paper writes it.
- The CS weights alpha_b are the ES's share of all training samples (the issue: "weights
  by sample count"); alpha_u likewise within an ES.
- An ES none of whose clients returned in a round keeps its edge model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
from pydantic import BaseModel, Field
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EdgeAlgorithm,
    EdgeReport,
    NoParams,
    ServerAlgorithm,
)
from mecsim.agents.algorithms.fedavg import aggregation_flops, weighted_average
from mecsim.agents.models import BYTES_PER_ELEMENT, ModelLayout, get_flat, set_flat
from mecsim.agents.training import StepCost, evaluate, make_optimizer
from mecsim.emulation.ops import Backhaul, Compute, Download, Op, ServerCompute, Upload

INDEX_DTYPE = torch.int32  # the batch indices N sent with the activations (Step 3.4)
#: bytes of one label kept at the ES (int64, as the data sets hold them): what moves
#: per training sample when a client hands over (PHSFLEdge.handover_state_nbytes)
LABEL_NBYTES = 8


class PHSFLParams(NoParams):
    """PHSFL / HSFL hyper-parameters (``algorithm.params``); kappa_0 is ``training.epochs``."""

    edge_rounds: int = Field(
        3,
        ge=1,
        description="kappa_1: edge rounds per global round (one mecsim round = one edge round)",
    )
    cut_layer: int = Field(
        3,
        ge=1,
        description="leading modules of the nn.Sequential model "
        "on the client (phsfl_cnn: 3 = conv-ReLU-"
        "maxpool, Section V-A)",
    )
    batches_per_epoch: int | None = Field(
        5,
        ge=1,
        description="mini-batches per local "
        "epoch, each a fresh draw (the paper's N = 5, "
        "Section V-A); null: one pass over the data",
    )
    finetune_steps: int = Field(10, ge=0, description="K: head fine-tuning SGD steps")
    finetune_lr: float | None = Field(None, gt=0, description="eta~ of Eq. 17; null: training.lr")
    finetune_charge: Literal["final", "every_global_round"] = Field(
        "final",
        description="when Eq. 17's fine-tuning is charged (its op-traces: backhaul, "
        "client-part download, K forward passes, activation uploads and head steps): "
        "final (the paper, Section III-B: once, after the last complete global round of "
        "the run) or every_global_round (after each global round, when the personalised "
        "accuracy is evaluated). The accuracy is evaluated either way",
    )


# --------------------------------------------------------------------------- model split


@dataclass(frozen=True)
class SplitParts:
    """An nn.Sequential cut into the client part w_0 and the server part w_1 = [body; head]."""

    client: nn.Sequential  # w_{u,0}
    body: nn.Sequential  # w_{u,1,bd}
    head: nn.Sequential  # w_{u,1,hd}: the last parameterised module (and anything after it)

    @property
    def server(self) -> nn.Sequential:
        return nn.Sequential(*self.body, *self.head)

    def set_trainable(self, client: bool, body: bool, head: bool) -> None:
        for part, flag in ((self.client, client), (self.body, body), (self.head, head)):
            for p in part.parameters():
                p.requires_grad_(flag)


def _has_state(module: nn.Module) -> bool:
    own: list[torch.Tensor] = list(module.parameters(recurse=True))
    own += [b for b in module.buffers(recurse=True) if b.is_floating_point()]
    return bool(own)


def split_model(model: nn.Module, cut_layer: int) -> SplitParts:
    """Cut ``model`` after its first ``cut_layer`` modules; the head is its last
    parameterised module. Raises ValueError when that is not a valid split."""
    if not isinstance(model, nn.Sequential):
        raise ValueError(
            f"PHSFL/HSFL split an nn.Sequential model at cut_layer; "
            f"{type(model).__name__} is not one"
        )
    mods = list(model)
    stateful = [i for i, m in enumerate(mods) if _has_state(m)]
    if not stateful:
        raise ValueError("the model has no parameters to split")
    head_at = stateful[-1]
    if not 1 <= cut_layer <= head_at or not any(i < cut_layer for i in stateful):
        raise ValueError(
            f"cut_layer={cut_layer} must leave a parameterised module on the "
            f"client and the head (module {head_at}) on the server: choose "
            f"{stateful[0] + 1}..{head_at}"
        )
    return SplitParts(
        nn.Sequential(*mods[:cut_layer]),
        nn.Sequential(*mods[cut_layer:head_at]),
        nn.Sequential(*mods[head_at:]),
    )


@dataclass(frozen=True)
class PartMasks:
    """Boolean masks of the flat state vector (see mecsim.agents.models) for the three parts."""

    client: np.ndarray
    body: np.ndarray
    head: np.ndarray


def part_masks(layout: ModelLayout, cut_layer: int) -> PartMasks:
    """Which elements of the flat state are client part, body and head (nn.Sequential
    layouts: layer names start with the module index)."""
    module_of_layer = []
    for name in layout.layer_names:
        top = name.split(".")[0]
        if not top.isdigit():
            raise ValueError(
                f"PHSFL/HSFL need an nn.Sequential model; layer {name!r} is not indexed by position"
            )
        module_of_layer.append(int(top))
    head_module = module_of_layer[-1]
    if not 1 <= cut_layer <= head_module or min(module_of_layer) >= cut_layer:
        raise ValueError(
            f"cut_layer={cut_layer} must leave a parameterised module on the "
            f"client and the head (module {head_module}) on the server"
        )
    client, body, head = (np.zeros(layout.size, dtype=bool) for _ in range(3))
    for s in layout.slots:
        m = module_of_layer[s.layer]
        part = client if m < cut_layer else head if m == head_module else body
        part[s.offset : s.offset + s.numel] = True
    return PartMasks(client, body, head)


# --------------------------------------------------------------------------- pure maths


def sample_weights(num_samples: Sequence[int]) -> np.ndarray:
    """alpha_k = D_k / sum_j D_j (Eqs. 14-16: weights by training samples)."""
    d = np.asarray(num_samples, dtype=np.float64)
    if d.ndim != 1 or len(d) == 0 or (d < 0).any() or d.sum() <= 0:
        raise ValueError(f"sample counts must be >= 0 with a positive sum, got {num_samples}")
    return d / d.sum()


def edge_aggregate(client_models: Sequence[np.ndarray], num_samples: Sequence[int]) -> np.ndarray:
    """Eqs. 14-15: w_b = sum_u alpha_u w_u over the ES's clients (both parts at once)."""
    return weighted_average(client_models, sample_weights(num_samples))


def global_aggregate(edge_models: Sequence[np.ndarray], edge_samples: Sequence[int]) -> np.ndarray:
    """Eq. 16: w = sum_b alpha_b w_b, alpha_b = D_b / sum D (D_b: the ES's samples)."""
    return weighted_average(edge_models, sample_weights(edge_samples))


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes on the air of a tensor: its shape times its dtype's size."""
    return int(t.numel()) * int(t.element_size())


def round_position(rnd: int, edge_rounds: int) -> tuple[int, int]:
    """(t2, t1): global round and edge round of mecsim round ``rnd`` (Eq. 1 without t0)."""
    return divmod(rnd, edge_rounds)


# --------------------------------------------------------------------------- split training


def batch_plan(
    n: int, batch_size: int, epochs: int, batches_per_epoch: int | None, generator: torch.Generator
) -> list[torch.Tensor]:
    """Index batches of ``epochs`` local epochs over ``n`` samples.

    ``batches_per_epoch=None``: each epoch is a shuffled pass (the last batch may be
    smaller). Otherwise each epoch is that many batches, each min(batch_size, n) indices
    drawn uniformly without replacement (Step 3.2).
    """
    if n <= 0:
        return []
    out: list[torch.Tensor] = []
    for _ in range(epochs):
        if batches_per_epoch is None:
            out += list(torch.randperm(n, generator=generator).split(batch_size))
        else:
            b = min(batch_size, n)
            out += [torch.randperm(n, generator=generator)[:b] for _ in range(batches_per_epoch)]
    return out


@dataclass(frozen=True)
class SplitStep:
    loss: float
    activations: torch.Tensor  # o_fp as sent (Step 3.4)
    gradient: torch.Tensor  # o_bp as sent back (Step 3.7)


class _Meter:
    """FLOPs per phase and the client's saved tensors, for the first step of a size."""

    def __init__(self) -> None:
        self.flops: dict[str, float] = {}
        self.saved_bytes = 0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        counter = FlopCounterMode(display=False)
        if name == "client_forward":

            def pack(t: torch.Tensor) -> torch.Tensor:
                self.saved_bytes += tensor_nbytes(t)
                return t

            hooks: Any = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        else:
            hooks = nullcontext()
        with counter, hooks:
            yield
        self.flops[name] = float(counter.get_total_flops())


def split_step(
    parts: SplitParts,
    client_opt: torch.optim.Optimizer,
    server_opt: torch.optim.Optimizer | None,
    xb: torch.Tensor,
    yb: torch.Tensor,
    meter: _Meter | None = None,
) -> SplitStep:
    """One split-learning SGD step, Steps 3.2-3.8; ``server_opt`` None: nothing on the
    server side trains (all frozen)."""
    phase: Callable[[str], Any] = meter.phase if meter else (lambda _name: nullcontext())
    client_opt.zero_grad(set_to_none=True)
    if server_opt is not None:
        server_opt.zero_grad(set_to_none=True)
    with phase("client_forward"):
        out = parts.client(xb)  # o_fp (Step 3.2)
    smashed = out.detach().requires_grad_(True)  # what the ES receives (Step 3.4)
    with phase("server"):
        loss = nn.functional.cross_entropy(parts.head(parts.body(smashed)), yb)  # Eq. 9
        loss.backward()  # Step 3.6
    if server_opt is not None:
        server_opt.step()  # Eq. 11 (body); the frozen head has no grad: Eq. 12
    grad = smashed.grad  # o_bp (Step 3.7)
    assert grad is not None
    with phase("client_backward"):
        out.backward(grad)  # chain rule through the client part (Step 3.8)
    client_opt.step()  # Eq. 13
    return SplitStep(float(loss.detach()), smashed.detach(), grad)


def _optimizer(
    ctx: ClientContext, params: list[torch.nn.Parameter]
) -> torch.optim.Optimizer | None:
    t = ctx.train
    return make_optimizer(t.optimizer, params, t.lr, t.momentum, t.weight_decay) if params else None


def finetune_head(
    parts: SplitParts,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
    chunk: int = 512,
) -> float:
    """Eq. 17: K SGD steps on the head only, client part and body fixed. Mean loss.

    Each step takes min(batch_size, n) samples drawn uniformly without replacement. The
    fixed client part and body (in eval mode) are a deterministic function of the input,
    so the features o = body(client(x)) of all training samples are computed once and
    each step's mini-batch is cut from them: the same numbers as running the forward
    pass per step, at a fraction of the host time.
    """
    n = int(y.shape[0])
    if steps == 0 or n == 0:
        return float("nan")
    parts.client.eval()
    parts.body.eval()
    with torch.no_grad():
        features = torch.cat(
            [parts.body(parts.client(x[i : i + chunk])) for i in range(0, n, chunk)]
        )
    parts.set_trainable(client=False, body=False, head=True)
    parts.head.train()
    opt = torch.optim.SGD(parts.head.parameters(), lr=lr)
    total = 0.0
    try:
        for _ in range(steps):
            idx = torch.randperm(n, generator=generator)[: min(batch_size, n)]
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(parts.head(features[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach())
    finally:
        parts.set_trainable(client=True, body=True, head=True)
    return total / steps


# --------------------------------------------------------------------------- server


class PHSFLEdge(EdgeAlgorithm):
    """One edge server b: its model w_b, its clients' downloads and Eqs. 14-15."""

    Params = PHSFLParams
    params: PHSFLParams

    def __init__(
        self,
        edge_server: int,
        layout: ModelLayout,
        client_samples: dict[int, int],
        params: dict[str, Any],
    ) -> None:
        super().__init__(edge_server, layout, client_samples, params)
        self.model: np.ndarray | None = None  # w_b

    def models(self) -> dict[str, Any]:
        return {} if self.model is None else {"model": self.model}

    @classmethod
    def handover_state_nbytes(cls, params: BaseModel, num_samples: int) -> int:
        """The client's label set D_u,lb, which belongs to its ES (Section II-A: the
        client holds only the features; the ES looks the labels up by the indices N it
        is sent, Step 3.5): D_u labels of LABEL_NBYTES each move to the new ES. Nothing
        else is per client: the ES's copy w_u1 of the server part (Step 3.1) lives
        within an edge round (Eq. 15 aggregates it at its end), and the edge model w_b
        is the ES's own (the client downloads its new ES's, as every round)."""
        return int(num_samples) * LABEL_NBYTES

    def configure_fit(self, rnd: int, tasks: list[ClientTask], downlink: Any) -> list[ClientTask]:
        if downlink is not None:  # Eq. 8: the ES starts the global round from w
            self.model = downlink
        if tasks and self.model is None:
            raise RuntimeError(
                f"edge server {self.edge_server} has no model in round "
                f"{rnd + 1}: the central server sent none"
            )
        for task in tasks:  # Step 2.3: w_b0 to the client; w_b1 copied by the ES (3.1)
            task.weights = self.model
        return tasks

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> EdgeReport:
        k1 = self.params.edge_rounds
        _, t1 = round_position(rnd, k1)
        rs = [r for r in sorted(results, key=lambda r: r.client_id) if r.weights is not None]
        flops = 0.0
        if rs:  # Eqs. 14-15; an ES none of whose clients returned keeps w_b
            self.model = edge_aggregate(
                cast("list[np.ndarray]", [r.weights for r in rs]), [r.num_samples for r in rs]
            )
            flops += aggregation_flops(self.layout.size, len(rs))
        # Step 5: after the last edge round w_b goes up to the CS
        return EdgeReport(flops, len(rs), self.model if t1 == k1 - 1 else None)


class PHSFLServer(ServerAlgorithm):
    name = "phsfl"
    personalised_downloads = True  # see ServerAlgorithm
    Params = PHSFLParams
    params: PHSFLParams
    Edge = PHSFLEdge
    round_metrics = (
        "global_round",
        "edge_round",
        "activation_bytes",
        "index_bytes",
        "gradient_bytes",
        "model_bytes_client_es",
        "model_bytes_es_cs",
        "es_gflops",
        "finetune_bytes",
        "finetune_es_gflops",
        "mean_global_accuracy",
        "mean_global_test_loss",
    )

    @classmethod
    def check_scenario(cls, params, *, train, model, layout, clients, participation):
        if not isinstance(model, nn.Sequential):
            return [
                (
                    "model",
                    f"{cls.name} splits an nn.Sequential model at cut_layer; "
                    f"{type(model).__name__} is not one (use mlp_2nn, mtfl_cnn, "
                    "kapc_cnn or phsfl_cnn)",
                )
            ]
        try:
            split_model(model, params.cut_layer)
            part_masks(layout, params.cut_layer)
        except ValueError as exc:
            return [("algorithm.params.cut_layer", str(exc))]
        return []

    def __init__(
        self,
        layout: ModelLayout,
        init_weights: np.ndarray,
        client_samples: dict[int, int],
        fraction: float,
        params: dict[str, Any],
    ) -> None:
        super().__init__(layout, init_weights, client_samples, fraction, params)
        self.masks = part_masks(layout, self.params.cut_layer)
        self.client_part_nbytes = int(self.masks.client.sum()) * BYTES_PER_ELEMENT

    def _servers(self) -> list[int]:
        """The edge servers: every one of the topology when clients move (each gets w at
        a global round's start, Eq. 8, so a client that hands over mid global round
        finds a model at its new ES), else those serving clients."""
        if self.edge_server_ids is not None:
            return list(self.edge_server_ids)
        return sorted(set(self.edge_server_of.values()))

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        """The tasks without their weights: each ES fills in its model (PHSFLEdge)."""
        k1 = self.params.edge_rounds
        _, t1 = round_position(rnd, k1)
        model_nbytes = self.layout.nbytes
        tasks = []
        for u in selected:
            b = self.edge_server_of[u]
            config = {
                "edge_server": b,
                "backhaul_down_nbytes": model_nbytes if t1 == 0 else 0,
                "backhaul_up_nbytes": model_nbytes if t1 == k1 - 1 else 0,
                # Eq. 17's fine-tuning (Section III-B) follows the global round whose
                # model it personalises and is timed with it
                "finetune_backhaul_nbytes": model_nbytes if self.charges_finetune(rnd) else 0,
            }
            tasks.append(ClientTask(u, None, self.client_part_nbytes, config))
        return tasks

    def charges_finetune(self, rnd: int) -> bool:
        """Does round ``rnd`` carry Eq. 17's fine-tuning in its op-traces? Only a round that
        ends a global round (edge round kappa_1 - 1, when the global model exists); with
        ``finetune_charge: final`` only the last such round of the run (the paper
        fine-tunes w* once, after training): round ``(rounds // kappa_1) * kappa_1 - 1``,
        none when the run is shorter than one global round or its length is unknown."""
        k1 = self.params.edge_rounds
        if round_position(rnd, k1)[1] != k1 - 1:
            return False
        if self.params.finetune_charge == "every_global_round":
            return True
        return self.rounds is not None and rnd == (self.rounds // k1) * k1 - 1

    def configure_edges(self, rnd: int) -> dict[int, Any]:
        """Step 1: w to every ES at the start of a global round (Eq. 8: it starts from it)."""
        _, t1 = round_position(rnd, self.params.edge_rounds)
        return {b: self.weights for b in self._servers()} if t1 == 0 else {}

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        """Not used: the edge servers aggregate their clients (PHSFLEdge.aggregate_fit)
        and the central server their reports (:meth:`aggregate_edges`)."""
        raise TypeError("phsfl is hierarchical: its rounds end in aggregate_edges")

    def aggregate_edges(
        self, rnd: int, results: list[ClientResult], reports: dict[int, EdgeReport]
    ) -> AggregateStats:
        k1 = self.params.edge_rounds
        t2, t1 = round_position(rnd, k1)
        flops = 0.0
        for b in sorted(reports):  # Eqs. 14-15, at the edge servers
            flops += reports[b].flops
        if t1 == k1 - 1:  # Eq. 16
            servers = self._servers()
            missing = [b for b in servers if b not in reports or reports[b].model is None]
            if missing:
                raise RuntimeError(
                    f"{self.name}: no edge model from edge server(s) "
                    f"{missing} at the end of global round {t2}"
                )
            served = {
                b: sum(n for u, n in self.client_samples.items() if self.edge_server_of[u] == b)
                for b in servers
            }
            # cast: every edge server's model is there (missing, above)
            self.weights = global_aggregate(
                cast("list[np.ndarray]", [reports[b].model for b in servers]),
                [served[b] for b in servers],
            )
            flops += aggregation_flops(self.layout.size, len(servers))
        aggregating = sum(1 for rep in reports.values() if rep.aggregated)
        metrics = {
            "global_round": float(t2),
            "edge_round": float(t1),
            **self._traffic(results, aggregating, t1),
        }
        return AggregateStats(flops=flops, metrics=metrics)

    def legacy_edge_states(self, state: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Checkpoints from before the split held every w_b in ``edge_models``."""
        return {b: {"model": w} for b, w in (state.pop("edge_models", None) or {}).items()}

    def _traffic(self, results: list[ClientResult], servers: int, t1: int) -> dict[str, float]:
        """Bytes and ES FLOPs of the aggregated clients' edge round (round_metrics)."""
        out = dict.fromkeys(
            (
                "activation_bytes",
                "index_bytes",
                "gradient_bytes",
                "model_bytes_client_es",
                "finetune_bytes",
            ),
            0.0,
        )
        es_flops = finetune_flops = 0.0
        finetune_backhaul = 0
        for r in results:
            for key in ("activation_bytes", "index_bytes", "gradient_bytes"):
                out[key] += r.extra.get(key, 0)
            for op in r.trace:
                if isinstance(op, (Download, Upload)) and op.what == "client_model":
                    out["model_bytes_client_es"] += op.nbytes
                elif isinstance(op, (Download, Upload)) and op.what.startswith("finetune"):
                    out["finetune_bytes"] += op.nbytes  # client part down, activations up
                elif isinstance(op, ServerCompute):
                    if op.what == "finetune_head":
                        finetune_flops += op.flops
                    else:
                        es_flops += op.flops
                elif isinstance(op, Backhaul) and op.what == "finetune_global_model":
                    finetune_backhaul = 1
        directions = (t1 == 0) + (t1 == self.params.edge_rounds - 1) + finetune_backhaul
        out["model_bytes_es_cs"] = float(servers * directions * self.layout.nbytes)
        out["es_gflops"] = es_flops / 1e9
        out["finetune_es_gflops"] = finetune_flops / 1e9
        return out


class HSFLServer(PHSFLServer):
    """HSFL baseline: the same hierarchy, split and aggregation (the head is trained)."""

    name = "hsfl"


# --------------------------------------------------------------------------- client


class PHSFLClient(ClientAlgorithm):
    name = "phsfl"
    Params = PHSFLParams
    params: PHSFLParams
    freeze_head: ClassVar[bool] = True  # Step 2.2: the head stays as initialised
    #: Eq. 17's fine-tuning: charged in the round's op-trace, run by evaluate()
    hand_counted_flops = ("finetune_forward", "finetune_head")

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        p = self.params
        # Step 3.1: w_u0 <- w_b0, w_u1 <- w_b1 (cast: the edge server sends its model)
        set_flat(ctx.model, ctx.layout, cast(np.ndarray, task.weights))
        parts = split_model(ctx.model, p.cut_layer)
        parts.set_trainable(client=True, body=True, head=not self.freeze_head)
        ctx.model.train()
        client_opt = _optimizer(ctx, list(parts.client.parameters()))
        server_opt = _optimizer(ctx, [q for q in parts.server.parameters() if q.requires_grad])
        assert client_opt is not None  # split_model leaves parameters on the client
        cfg = task.config
        ops: list[Op] = []
        if cfg.get("backhaul_down_nbytes"):
            ops.append(Backhaul(int(cfg["backhaul_down_nbytes"]), "down", "global_model"))
        ops.append(Download(task.download_nbytes, "client_model"))
        n = int(ctx.y_train.shape[0])
        batches = batch_plan(
            n, ctx.train.batch_size, ctx.train.epochs, p.batches_per_epoch, ctx.generator
        )
        loss_sum, client_flops, peak = 0.0, 0.0, 0
        sent = dict.fromkeys(("activation_bytes", "index_bytes", "gradient_bytes"), 0)
        try:
            for idx in batches:
                step, cost = self._step(ctx, parts, client_opt, server_opt, idx)
                idx_nbytes = tensor_nbytes(idx.to(INDEX_DTYPE))
                act_nbytes, grad_nbytes = (
                    tensor_nbytes(step.activations),
                    tensor_nbytes(step.gradient),
                )
                ops += [
                    Compute(cost["client_forward"], 1, "client_forward"),
                    Upload(act_nbytes + idx_nbytes, "activations"),
                    ServerCompute(cost["server"], 1, "es_train"),
                    Download(grad_nbytes, "gradients"),
                    Compute(cost["client_backward"], 0, "client_backward"),
                ]
                sent["activation_bytes"] += act_nbytes
                sent["index_bytes"] += idx_nbytes
                sent["gradient_bytes"] += grad_nbytes
                loss_sum += step.loss
                client_flops += cost["client_forward"] + cost["client_backward"]
                peak = max(peak, int(cost["client_memory_bytes"]))
        finally:
            parts.set_trainable(client=True, body=True, head=True)
        up = task.download_nbytes  # Step 4: the client part goes back to the ES
        ops.append(Upload(up, "client_model"))
        if cfg.get("backhaul_up_nbytes"):
            ops.append(Backhaul(int(cfg["backhaul_up_nbytes"]), "up", "edge_model"))
        if cfg.get("finetune_backhaul_nbytes") and p.finetune_steps > 0 and n > 0:
            finetune = self._finetune_ops(
                ctx, parts, int(cfg["finetune_backhaul_nbytes"]), task.download_nbytes
            )
            ops += finetune
            client_flops += sum(op.flops for op in finetune if isinstance(op, Compute))
        return ClientResult(
            client_id=ctx.client_id,
            weights=get_flat(ctx.model, ctx.layout),
            upload_nbytes=up,
            num_samples=n,
            train_loss=loss_sum / max(len(batches), 1),
            trace=tuple(ops),
            flops=client_flops,
            steps=len(batches),
            peak_memory_bytes=peak,
            host_seconds=time.perf_counter() - start,
            extra=dict(sent),
        )

    def _finetune_ops(
        self, ctx: ClientContext, parts: SplitParts, model_nbytes: int, client_part_nbytes: int
    ) -> list[Op]:
        """The op-trace of Eq. 17's fine-tuning (Section III-B) after the global round:
        the CS sends w* to the ES (``Backhaul``), the ES sends the client part down, then
        per step k < K the client's forward pass on its mini-batch, the upload of its
        activations and indices, and the ES's body forward with the head's SGD step.
        FLOPs are counted once per batch size (they depend on shapes only)."""
        p = self.params
        bsz = min(ctx.train.batch_size, int(ctx.y_train.shape[0]))
        xb, yb = ctx.x_train[:bsz], ctx.y_train[:bsz]
        keys = {k: f"{self.name}/cut{p.cut_layer}/finetune_{k}" for k in ("client", "server")}
        with torch.no_grad():
            act_nbytes = tensor_nbytes(parts.client(xb))
        cached = {k: c for k, key in keys.items() if (c := ctx.costs.get(bsz, key)) is not None}
        if len(cached) < len(keys):
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                out = parts.client(xb)
            client_flops = float(counter.get_total_flops())
            parts.set_trainable(client=False, body=False, head=True)
            try:
                counter = FlopCounterMode(display=False)
                with counter:
                    with torch.no_grad():
                        features = parts.body(out)
                    nn.functional.cross_entropy(parts.head(features), yb).backward()
                server_flops = float(counter.get_total_flops())
            finally:
                for q in parts.head.parameters():
                    q.grad = None
                parts.set_trainable(client=True, body=True, head=True)
            cached = {"client": StepCost(client_flops, 0), "server": StepCost(server_flops, 0)}
            for k, key in keys.items():
                ctx.costs.put(bsz, cached[k], key)
        idx_nbytes = bsz * torch.tensor([], dtype=INDEX_DTYPE).element_size()
        ops: list[Op] = [
            Backhaul(model_nbytes, "down", "finetune_global_model"),
            Download(client_part_nbytes, "finetune_client_model"),
        ]
        for _ in range(p.finetune_steps):
            ops += [
                Compute(cached["client"].flops, 1, "finetune_forward"),
                Upload(act_nbytes + idx_nbytes, "finetune_activations"),
                ServerCompute(cached["server"].flops, 1, "finetune_head"),
            ]
        return ops

    def _step(
        self,
        ctx: ClientContext,
        parts: SplitParts,
        client_opt: torch.optim.Optimizer,
        server_opt: torch.optim.Optimizer | None,
        idx: torch.Tensor,
    ) -> tuple[SplitStep, dict[str, float]]:
        """A split step; its FLOPs and client memory measured on the first step of each
        batch size (they depend only on shapes) and reused from ``ctx.costs`` after."""
        xb, yb = ctx.x_train[idx], ctx.y_train[idx]
        bsz = int(idx.numel())
        keys = {
            k: f"{self.name}/cut{self.params.cut_layer}/{k}"
            for k in ("client_forward", "server", "client_backward")
        }
        cached = {k: c for k, key in keys.items() if (c := ctx.costs.get(bsz, key)) is not None}
        if len(cached) == len(keys):
            step = split_step(parts, client_opt, server_opt, xb, yb)
            cost = {k: c.flops for k, c in cached.items()}
            cost["client_memory_bytes"] = float(cached["client_forward"].memory_bytes)
            return step, cost
        meter = _Meter()
        step = split_step(parts, client_opt, server_opt, xb, yb, meter)
        client_params = list(parts.client.parameters())
        memory = (
            2 * sum(tensor_nbytes(q) for q in client_params)  # weights + gradients
            + sum(
                tensor_nbytes(v)
                for s in client_opt.state.values()
                for v in s.values()
                if torch.is_tensor(v)
            )
            + tensor_nbytes(xb)
            + meter.saved_bytes
            + tensor_nbytes(step.gradient)
        )
        for k, key in keys.items():
            ctx.costs.put(
                bsz, StepCost(meter.flops[k], memory if k == "client_forward" else 0), key
            )
        return step, {**meter.flops, "client_memory_bytes": float(memory)}

    def evaluate(
        self, ctx: ClientContext, task: ClientTask
    ) -> tuple[float, float, dict[str, float]]:
        """Personalised (acc, loss) after K head steps from the global model (Eq. 17),
        with the global model's own figures as extras."""
        p = self.params
        set_flat(ctx.model, ctx.layout, cast(np.ndarray, task.weights))  # the global model
        global_acc, global_loss = evaluate(ctx.model, ctx.x_test, ctx.y_test)
        if p.finetune_steps > 0:
            parts = split_model(ctx.model, p.cut_layer)
            finetune_head(
                parts,
                ctx.x_train,
                ctx.y_train,
                p.finetune_steps,
                p.finetune_lr or ctx.train.lr,
                ctx.train.batch_size,
                ctx.generator,
            )
            acc, loss = evaluate(ctx.model, ctx.x_test, ctx.y_test)
        else:
            acc, loss = global_acc, global_loss
        return acc, loss, {"global_accuracy": global_acc, "global_test_loss": global_loss}


class HSFLClient(PHSFLClient):
    """HSFL baseline: every block trained, head included; the same fine-tuning after."""

    name = "hsfl"
    freeze_head = False


#: registered as ``phsfl`` (:data:`mecsim.registry.ALGORITHMS`)
PHSFL = (PHSFLServer, PHSFLClient)

#: registered as ``hsfl`` (:data:`mecsim.registry.ALGORITHMS`)
HSFL = (HSFLServer, HSFLClient)
