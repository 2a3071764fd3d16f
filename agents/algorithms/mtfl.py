"""MTFL (Mills, Hu, Min, IEEE TPDS 2022): federated learning with private BatchNorm patches.

Algorithm 1, one round r, for every selected client k (``patchIdxs`` = the private values):

    M_k <- Omega ; V_k <- V                    download the federated values (Lines 5-6)
    M_k,i <- P_k,i ; V_k,i <- W_k,i            apply the client's own patches (Lines 7-8)
    M_k, V_k <- LocalUpdate(M_k, V_k, b)       E local epochs of mini-batches (Line 10)
    P_k,i <- M_k,i ; W_k,i <- V_k,i            store the patches again (Lines 12-13)
    upload M_k,i, V_k,i for i not in patchIdxs (Lines 15-16)

and the server, over the uploads (Lines 20-22):

    Omega <- GlobalModelUpdate(Omega, {M_k}) ;  V <- GlobalOptimUpdate(V, {V_k})

**Private values** (the patches; ``params.private``) are BatchNorm tensors: ``usyb`` =
running mean and variance (mu, sigma^2) and gamma, beta; ``yb`` = gamma, beta only (the
paper's best); ``us`` = the running statistics only; ``none`` = plain FL. Private values
never leave the client: they are neither downloaded nor uploaded, and the server's copy of
them stays at the initial values. A client that has not trained yet uses the initial
values as its patch.

**Strategies** (Table 1; ``params.strategy``):

==============  ===========  ==================  =================
strategy        LocalUpdate  GlobalModelUpdate   GlobalOptimUpdate
==============  ===========  ==================  =================
``fedavg``      SGD          average             -
``fedadam``     SGD          Adam step           -
``fedavg_adam`` Adam         average             average
==============  ===========  ==================  =================

Averages are weighted by the clients' training-sample counts n_k. FedAdam (Reddi et al.,
ICLR 2021, as Sec. 3.3 describes it): the averaged change Delta_r = sum_k (n_k/n) M_k -
Omega is a pseudo-gradient for a server Adam step without bias correction,

    m <- b1 m + (1 - b1) Delta_r ;  v <- b2 v + (1 - b2) Delta_r^2
    Omega <- Omega + eta m / (sqrt(v) + tau)           (m = v = 0 at the start)

(Omega - eta * m_g / (sqrt(v) + tau) with the paper's sign, Delta = Omega - average). The
Adam step is for the trainable parameters; federated BatchNorm running statistics (which
no gradient trains) are averaged, as in FedAvg (``fedadam_stats: average``, the default).
``fedadam_stats: adam`` steps them with Adam too, as the authors' code does
(``optimisers.ServerAdam`` over ``FLModel.get_params``): the statistics then move by about
eta per round and lag far behind the clients' activations, which ruins eval-mode UA when
they are federated (``none``, ``yb``) -- FL(FedAdam) on ``mtfl-mnist-shards`` never passed
85 % that way (docs/mtfl.md). FedAvg-Adam: clients
run Adam; they download and upload the Adam first and second moments of the federated
parameters and the step counter beside the model, and the server averages all of it
with the same weights. The moments (and step counter) of private parameters stay on the
client (Sec. 3.3, "clients store private optimiser values for their patch layers").
Buffers (running statistics) have no moments. So FedAvg-Adam moves
``|federated values| + 2 |federated parameters| + 1`` floats each way: about 3x FedAvg.

**Wire format**: what travels is exactly what is counted. A download or upload is one
float32 vector ``[federated values | m | v | step]`` (the last three for FedAvg-Adam
only; :class:`WireFormat`), and its bytes are ``4 * len(vector)``.

**User accuracy** (UA) is measured on each client's own test data with its patched model
(the federated values of the current global model plus its own patches), after the
round's aggregation -- what the authors' code tests at the start of the next round.

**Noisy clients** (Table 3): ``noisy_fraction`` of the clients (chosen once from
``noise_seed``) train on images with zero-mean Gaussian noise added. The authors add
``N(0, std)`` to pixels in [0, 1] and clip to [0, 1]; the clients here hold standardised
inputs, so the noise std is in units of the input's dynamic range (each channel's min..max
over the client's training images) and noisy values are clipped to that range. For 8-bit
images that contain both black and white pixels (MNIST, CIFAR) this is exactly the
authors' pixel-intensity units: ``noise_std: 3.0`` for MNIST, ``0.2`` for CIFAR-10. The
noise is drawn once per client (the same noisy images every round). ``mean_clean_accuracy``
(rounds.csv) is the mean UA of the non-noisy clients: Table 3's figure.

Choices where the paper is silent, each tested: the client's optimiser must match the
strategy (a scenario with ``training.optimizer: sgd`` and ``strategy: fedavg_adam`` is
an error, not silently changed); step counters are averaged as floats (a client that ran
15 steps and one that ran 16 give 15.5 with equal weights), as the authors' code does.

FedBN (Li et al., ICLR 2021; the KAPC paper's baseline) is MTFL(FedAvg) with ``usyb``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import torch
from pydantic import Field

from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    NoParams,
    ServerAlgorithm,
    trained_result,
)
from mecsim.agents.algorithms.fedavg import aggregation_flops, weighted_average
from mecsim.agents.models import BYTES_PER_ELEMENT, ModelLayout, get_flat, set_flat
from mecsim.agents.training import evaluate, make_optimizer, train_epochs

PrivateValues = Literal["usyb", "yb", "us", "none"]
Strategy = Literal["fedavg", "fedadam", "fedavg_adam"]

#: BatchNorm tensors (state_dict suffixes) each setting keeps private on the client
PRIVATE_BN_TENSORS: dict[str, tuple[str, ...]] = {
    "usyb": ("running_mean", "running_var", "weight", "bias"),
    "yb": ("weight", "bias"),
    "us": ("running_mean", "running_var"),
    "none": (),
}
#: the client optimiser of each strategy (Table 1, LocalUpdate)
CLIENT_OPTIMISER: dict[str, str] = {"fedavg": "sgd", "fedadam": "sgd", "fedavg_adam": "adam"}
#: FLOPs per element of one server Adam step: Delta 1, m 3, v 4, sqrt + add + div + mul
#: + add 5 (see :func:`fedadam_step`)
FEDADAM_FLOPS_PER_ELEMENT = 13


class MTFLParams(NoParams):
    private: PrivateValues = Field(
        "yb",
        description="private BatchNorm values: usyb, yb (gamma, beta), us (mu, sigma), none (= FL)",
    )
    strategy: Strategy = Field(
        "fedavg",
        description="fedavg (SGD, average), fedadam (SGD, server Adam), "
        "fedavg_adam (client Adam, model and moments averaged); MTFL Table 1",
    )
    server_lr: float = Field(0.01, gt=0, description="FedAdam server learning rate eta")
    # FedAdam defaults: the authors' example (README of their code: beta1 0.9, beta2 0.999,
    # epsilon 1e-4, server lr 0.01 with client lr 0.3)
    server_beta1: float = Field(0.9, ge=0, lt=1, description="FedAdam server beta1")
    server_beta2: float = Field(0.999, ge=0, lt=1, description="FedAdam server beta2")
    server_eps: float = Field(1e-4, gt=0, description="FedAdam adaptivity tau (epsilon)")
    fedadam_stats: Literal["average", "adam"] = Field(
        "average",
        description="FedAdam: federated BN running statistics are averaged "
        "(default) or Adam-stepped like the parameters (the authors' code)",
    )
    noisy_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="fraction of clients with Gaussian noise on their "
        "training images (Table 3: 0.2)",
    )
    noise_std: float = Field(
        3.0,
        ge=0,
        description="noise std in units of the input's dynamic range (pixel "
        "intensity for 8-bit images): 3.0 MNIST, 0.2 CIFAR-10 in the paper",
    )
    noise_seed: int = Field(0, ge=0, description="seed of the noisy-client choice and noise")


# --------------------------------------------------------------------------- pure maths


def private_mask(layout: ModelLayout, private: str) -> np.ndarray:
    """Boolean element mask of the values ``private`` keeps on the client."""
    if private not in PRIVATE_BN_TENSORS:
        raise ValueError(
            f"mtfl: unknown private setting {private!r}; known: {', '.join(PRIVATE_BN_TENSORS)}"
        )
    suffixes = PRIVATE_BN_TENSORS[private]
    mask = np.zeros(layout.size, dtype=bool)
    bn_layers = {i for i, kind in enumerate(layout.layer_kinds) if kind.startswith("BatchNorm")}
    if suffixes and not bn_layers:
        raise ValueError(
            f"mtfl: private={private!r} keeps BatchNorm values private, but the "
            "model has no BatchNorm layer"
        )
    for s in layout.slots:
        if s.layer in bn_layers and s.name.rsplit(".", 1)[-1] in suffixes:
            mask[s.offset : s.offset + s.numel] = True
    return mask


def param_mask(layout: ModelLayout) -> np.ndarray:
    """Boolean element mask of the trainable parameters (buffers excluded)."""
    mask = np.zeros(layout.size, dtype=bool)
    for s in layout.slots:
        if s.is_param:
            mask[s.offset : s.offset + s.numel] = True
    return mask


@dataclass(frozen=True, eq=False)
class WireFormat:
    """What one MTFL download or upload carries: ``[federated values | m | v | step]``.

    ``shared``: element mask of the federated (non-private) values of the flat model;
    ``moments``: element mask of the values whose Adam moments travel (federated
    parameters; FedAvg-Adam only, else all False).
    """

    shared: np.ndarray
    moments: np.ndarray
    with_optimiser: bool

    @classmethod
    def build(cls, layout: ModelLayout, private: str, strategy: str) -> WireFormat:
        shared = ~private_mask(layout, private)
        with_opt = strategy == "fedavg_adam"
        moments = shared & param_mask(layout) if with_opt else np.zeros(layout.size, bool)
        return cls(shared, moments, with_opt)

    @property
    def private(self) -> np.ndarray:
        return ~self.shared

    @property
    def numel(self) -> int:
        n_mom = int(self.moments.sum())
        return int(self.shared.sum()) + (2 * n_mom + 1 if self.with_optimiser else 0)

    @property
    def nbytes(self) -> int:
        return BYTES_PER_ELEMENT * self.numel

    def pack(
        self,
        shared_values: np.ndarray,
        m: np.ndarray | None = None,
        v: np.ndarray | None = None,
        step: float = 0.0,
    ) -> np.ndarray:
        """One float32 vector; ``m``, ``v`` hold the moments of the ``moments`` elements."""
        parts = [np.asarray(shared_values, np.float32)]
        if self.with_optimiser:
            n_mom = int(self.moments.sum())
            if m is None or v is None or len(m) != n_mom or len(v) != n_mom:
                raise ValueError(f"FedAvg-Adam payload needs m and v of {n_mom} elements")
            parts += [
                np.asarray(m, np.float32),
                np.asarray(v, np.float32),
                np.array([step], np.float32),
            ]
        out = np.concatenate(parts)
        if out.shape != (self.numel,):
            raise ValueError(f"payload has {out.size} elements, the wire format {self.numel}")
        return out

    def unpack(
        self, payload: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, float]:
        """(federated values, m, v, step) of a payload made by :meth:`pack`."""
        payload = np.asarray(payload)
        if payload.shape != (self.numel,):
            raise ValueError(f"mtfl payload has shape {payload.shape}, expected ({self.numel},)")
        n_sh = int(self.shared.sum())
        if not self.with_optimiser:
            return payload, None, None, 0.0
        n_mom = int(self.moments.sum())
        m = payload[n_sh : n_sh + n_mom]
        v = payload[n_sh + n_mom : n_sh + 2 * n_mom]
        return payload[:n_sh], m, v, float(payload[-1])


def patched_model(
    wire: WireFormat, shared_values: np.ndarray, private_values: np.ndarray
) -> np.ndarray:
    """M_k: the federated values with the client's patches applied (Algorithm 1, Line 8)."""
    full = np.empty(wire.shared.size, dtype=np.float32)
    full[wire.shared] = shared_values
    full[wire.private] = private_values
    return full


def fedadam_step(
    weights: np.ndarray,
    average: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FedAdam's server update (no bias correction): returns (weights, m, v), new arrays.

    Delta = average - weights;  m = b1 m + (1-b1) Delta;  v = b2 v + (1-b2) Delta^2;
    weights + lr m / (sqrt(v) + eps). Computed in float64, returned as float32 weights.
    """
    w = np.asarray(weights, np.float64)
    delta = np.asarray(average, np.float64) - w
    m_new = beta1 * np.asarray(m, np.float64) + (1.0 - beta1) * delta
    v_new = beta2 * np.asarray(v, np.float64) + (1.0 - beta2) * delta * delta
    w_new = w + lr * m_new / (np.sqrt(v_new) + eps)
    return w_new.astype(np.float32), m_new, v_new


def noisy_clients(client_ids: list[int], fraction: float, seed: int) -> frozenset[int]:
    """floor(fraction * N) clients chosen uniformly without replacement from ``seed``.

    (The authors' ``int(len(xs) * frac)``; a tiny tolerance keeps 0.7 * 10 at 7.)
    """
    ids = sorted(client_ids)
    k = math.floor(fraction * len(ids) + 1e-9)
    if k == 0:
        return frozenset()
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x4015E]))
    return frozenset(int(c) for c in rng.choice(ids, size=k, replace=False))


def add_input_noise(x: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """x + N(0, std * range_c), clipped to [min_c, max_c], per channel c of N x C x ... input.

    ``range_c = max_c - min_c`` over the batch: for standardised 8-bit images containing
    both black and white pixels, std is in pixel-intensity units ([0, 1]), as the paper's.
    """
    if x.ndim < 2:
        raise ValueError("add_input_noise needs N x C x ... inputs")
    dims = [d for d in range(x.ndim) if d != 1]
    shape = [1, x.shape[1]] + [1] * (x.ndim - 2)
    lo = x.amin(dim=dims).view(shape)
    hi = x.amax(dim=dims).view(shape)
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return torch.clamp(x + noise * std * (hi - lo), min=lo, max=hi)


def _noise_generator(seed: int, client_id: int) -> torch.Generator:
    state = np.random.SeedSequence([seed, client_id, 0x4015E]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 ^ int(state[1]))


# --------------------------------------------------------------------------- server


class MTFLServer(ServerAlgorithm):
    """Plans downloads of the federated values (and, FedAvg-Adam, the moments), and
    applies GlobalModelUpdate / GlobalOptimUpdate of the chosen strategy."""

    name = "mtfl"
    Params = MTFLParams
    params: MTFLParams
    round_metrics = ("mean_clean_accuracy",)

    @classmethod
    def check_scenario(cls, params, *, train, model, layout, clients, participation):
        problems = []
        wanted = CLIENT_OPTIMISER[params.strategy]
        if train.optimizer != wanted:
            problems.append(
                (
                    "training.optimizer",
                    f"mtfl strategy {params.strategy!r} trains "
                    f"with {wanted} on the clients (MTFL Table 1), but "
                    f"training.optimizer is {train.optimizer!r}; set "
                    f"training.optimizer: {wanted}",
                )
            )
        try:
            private_mask(layout, params.private)
        except ValueError as exc:
            problems.append(("algorithm.params.private", str(exc)))
        return problems

    def __init__(self, layout, init_weights, client_samples, fraction, params) -> None:
        super().__init__(layout, init_weights, client_samples, fraction, params)
        p = self.params
        self.wire = WireFormat.build(layout, p.private, p.strategy)
        n_sh, n_mom = int(self.wire.shared.sum()), int(self.wire.moments.sum())
        # FedAvg-Adam: the global Adam moments V of the federated parameters, and the step
        self.adam_m = np.zeros(n_mom, np.float32)
        self.adam_v = np.zeros(n_mom, np.float32)
        self.adam_step = 0.0
        # FedAdam: which federated values take the Adam step (positions in the federated
        # vector), and the server optimiser's moments over them
        params_only = p.fedadam_stats == "average"
        self.adam_stepped = (
            param_mask(layout)[self.wire.shared] if params_only else np.ones(n_sh, bool)
        )
        self.server_m = np.zeros(int(self.adam_stepped.sum()), np.float64)
        self.server_v = np.zeros(int(self.adam_stepped.sum()), np.float64)
        self.noisy = noisy_clients(list(self.client_samples), p.noisy_fraction, p.noise_seed)

    def _payload(self) -> np.ndarray:
        return self.wire.pack(
            self.weights[self.wire.shared], self.adam_m, self.adam_v, self.adam_step
        )

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        payload = self._payload()
        return [
            ClientTask(c, payload, self.wire.nbytes, {"noisy": c in self.noisy}) for c in selected
        ]

    def upload_size(self) -> int | None:
        """The wire format's payload: the federated values (and Adam's moments)."""
        return int(self.wire.numel)

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        uploads = [r for r in results if r.weights is not None]
        if not uploads:
            return AggregateStats(flops=0.0)
        average = weighted_average(
            cast("list[np.ndarray]", [r.weights for r in uploads]), [r.num_samples for r in uploads]
        )
        shared_avg, m, v, step = self.wire.unpack(average)
        flops = aggregation_flops(self.wire.numel, len(uploads))
        p = self.params
        if p.strategy == "fedadam":
            stepped = self.adam_stepped
            federated = self.weights[self.wire.shared]
            new, self.server_m, self.server_v = fedadam_step(
                federated[stepped],
                shared_avg[stepped],
                self.server_m,
                self.server_v,
                p.server_lr,
                p.server_beta1,
                p.server_beta2,
                p.server_eps,
            )
            federated[stepped] = new
            federated[~stepped] = shared_avg[~stepped]  # running statistics: averaged
            self.weights[self.wire.shared] = federated
            flops += FEDADAM_FLOPS_PER_ELEMENT * len(new)
        else:
            self.weights[self.wire.shared] = shared_avg
            if p.strategy == "fedavg_adam":
                assert m is not None and v is not None  # its wire format carries the moments
                self.adam_m, self.adam_v, self.adam_step = m.copy(), v.copy(), step
        return AggregateStats(flops=flops)

    def configure_evaluate(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        payload = self._payload()
        return [ClientTask(c, payload, 0, {"noisy": c in self.noisy}) for c in clients]


# --------------------------------------------------------------------------- client


class MTFLClient(ClientAlgorithm):
    """Applies its patches, trains (SGD or Adam), keeps the patches, uploads the rest.

    ``ctx.state``: ``private`` (its patch values), and for FedAvg-Adam ``private_m``,
    ``private_v``, ``private_step`` (the Adam state of its private parameters).
    """

    name = "mtfl"
    Params = MTFLParams
    params: MTFLParams

    def __init__(self, params) -> None:
        super().__init__(params)
        self._wire: WireFormat | None = None

    def wire(self, layout: ModelLayout) -> WireFormat:
        if self._wire is None or self._wire.shared.size != layout.size:
            self._wire = WireFormat.build(layout, self.params.private, self.params.strategy)
        return self._wire

    def _apply_patches(
        self, ctx: ClientContext, wire: WireFormat, shared_values: np.ndarray
    ) -> None:
        own = ctx.state.get("private")
        if own is None:
            own = ctx.init_weights[wire.private]
        set_flat(ctx.model, ctx.layout, patched_model(wire, shared_values, own))

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        p, t = self.params, ctx.train
        wanted = CLIENT_OPTIMISER[p.strategy]
        if t.optimizer != wanted:
            raise ValueError(
                f"mtfl: strategy {p.strategy!r} trains with {wanted} on the clients (MTFL "
                f"Table 1), but training.optimizer is {t.optimizer!r}; set "
                f"training.optimizer: {wanted}"
            )
        wire = self.wire(ctx.layout)
        # cast: the server sends every client its payload (unpack checks its shape)
        shared_values, m, v, step = wire.unpack(cast(np.ndarray, task.weights))
        self._apply_patches(ctx, wire, shared_values)
        x_train = ctx.x_train
        if task.config.get("noisy") and p.noise_std > 0:
            x_train = add_input_noise(
                x_train, p.noise_std, _noise_generator(p.noise_seed, ctx.client_id)
            )
        opt = make_optimizer(t.optimizer, ctx.model.parameters(), t.lr, t.momentum, t.weight_decay)
        if wire.with_optimiser:
            self._load_adam(ctx, wire, opt, m, v, step)
        stats = train_epochs(
            ctx.model,
            opt,
            x_train,
            ctx.y_train,
            epochs=t.epochs,
            batch_size=t.batch_size,
            generator=ctx.generator,
            costs=ctx.costs,
            cost_key=self.name,
        )
        trained = get_flat(ctx.model, ctx.layout)
        ctx.state["private"] = trained[wire.private].copy()  # Lines 12-13
        m_new = v_new = None
        step_new = 0.0
        if wire.with_optimiser:
            m_new, v_new, step_new = self._store_adam(ctx, wire, opt)
        payload = wire.pack(trained[wire.shared], m_new, v_new, step_new)  # Lines 15-16
        up = BYTES_PER_ELEMENT * payload.size
        return trained_result(
            ctx,
            stats,
            weights=payload,
            upload_nbytes=up,
            download_nbytes=task.download_nbytes,
            started_at=start,
        )

    # FedAvg-Adam: Adam state <-> flat moment vectors --------------------------------

    @staticmethod
    def _slots(ctx: ClientContext):
        by_name = {s.name: s for s in ctx.layout.slots}
        for name, param in ctx.model.named_parameters():
            yield param, by_name[name]

    def _load_adam(self, ctx, wire: WireFormat, opt, m, v, step: float) -> None:
        """Global moments for federated parameters, the client's own for private ones."""
        size = ctx.layout.size
        m_full, v_full = np.zeros(size, np.float32), np.zeros(size, np.float32)
        m_full[wire.moments], v_full[wire.moments] = m, v
        priv = wire.private & param_mask(ctx.layout)
        if "private_m" in ctx.state:
            m_full[priv], v_full[priv] = ctx.state["private_m"], ctx.state["private_v"]
        private_step = float(ctx.state.get("private_step", 0.0))
        for param, s in self._slots(ctx):
            sl = slice(s.offset, s.offset + s.numel)
            own = bool(wire.private[s.offset])
            opt.state[param] = {
                "step": torch.tensor(private_step if own else step, dtype=torch.float32),
                "exp_avg": torch.from_numpy(m_full[sl].reshape(s.shape).copy()),
                "exp_avg_sq": torch.from_numpy(v_full[sl].reshape(s.shape).copy()),
            }

    def _store_adam(self, ctx, wire: WireFormat, opt) -> tuple[np.ndarray, np.ndarray, float]:
        """(federated m, federated v, federated step); private ones go to ctx.state."""
        size = ctx.layout.size
        m_full, v_full = np.zeros(size, np.float32), np.zeros(size, np.float32)
        step_fed = step_own = 0.0
        for param, s in self._slots(ctx):
            st = opt.state[param]
            sl = slice(s.offset, s.offset + s.numel)
            m_full[sl] = st["exp_avg"].detach().reshape(-1).numpy()
            v_full[sl] = st["exp_avg_sq"].detach().reshape(-1).numpy()
            if wire.private[s.offset]:
                step_own = float(st["step"])
            else:
                step_fed = float(st["step"])
        priv = wire.private & param_mask(ctx.layout)
        ctx.state["private_m"], ctx.state["private_v"] = m_full[priv], v_full[priv]
        ctx.state["private_step"] = step_own
        return m_full[wire.moments], v_full[wire.moments], step_fed

    def evaluate(self, ctx: ClientContext, task: ClientTask):
        """UA of the patched model; ``clean_accuracy`` is NaN for a noisy client."""
        wire = self.wire(ctx.layout)
        self._apply_patches(ctx, wire, wire.unpack(cast(np.ndarray, task.weights))[0])
        acc, loss = evaluate(ctx.model, ctx.x_test, ctx.y_test)
        clean = float("nan") if task.config.get("noisy") else acc
        return acc, loss, {"clean_accuracy": clean}


#: registered as ``mtfl`` (:data:`mecsim.registry.ALGORITHMS`)
MTFL = (MTFLServer, MTFLClient)
