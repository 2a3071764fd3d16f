"""KAPC (knowledge-aware parameter coaching) and KAPC+BLS (bidirectional layer selection).

Zhi et al., AAAI 2024 (KAPC) and IEEE TMC 2024 (Sec. 4: KAPC; Sec. 5-6: BLS).

Two algorithms are registered: ``kapc`` (Algorithms 1-2 of the AAAI paper, with the
client selection of TMC Algorithm 5) and ``kapc_bls`` (TMC Algorithms 3-6: the server
filters the regulariser by self-relationship mu, the client uploads only its first
Omega layers).

Equation numbers: "A." = the AAAI paper, "T." = the TMC paper (its Eqs. 20-34 are BLS).

Server (one round k, selected clients C^k, K = |C^k|, T. Algorithm 5):

1. slice R to C^k (``R[C, :, C]``, shape K x L x K) and normalise by row;
2. W: the latest parameters of every client; layers a client did not upload keep their
   stale values (T. Eq. 33);
3. E_r gradient steps of A. Eq. 11 / T. Eq. 12 on every r_i of the slice, with
   f(r_i) = lam * sum_l ||sum_j r_ij^l w_j^l - w_i^l||^2 + beta/2 * ||r_i - 1/N||^2
   (A. Eq. 10 / T. Eq. 11), gradient (A. Eq. 12):
   d f / d r_ij^l = 2 lam <sum_j' r_ij'^l w_j'^l - w_i^l, w_j^l> + beta (r_ij^l - 1/N);
4. write the slice back into R and normalise R by row (T. Alg. 5 line 12);
5. s_i^l = sum_j r_ij^l w_j^l with the normalised slice (A. Eq. 14, T. Eq. 15 / 34),
   sent to client i — with BLS only the layers whose self-relationship r_ii^l <= mu
   (T. Algorithm 3; T. Algorithm 5 lines 14-16: ``download_policy: algorithm5``;
   ``uploaded_only`` also withholds the layers beyond the client's last Omega).

Client i (A. Algorithm 2, T. Algorithm 6): keeps its own model between rounds, trains E
epochs on f_i(w_i) + lam * sum_l ||w_i^l - s_i^l||^2 over the layers it received
(A. Eq. 15-16, T. Eq. 16-17, via training's ``extra_loss`` hook), then uploads w_i —
with BLS only its first Omega_i layers (T. Algorithm 4, criterion Eq. 29); the layers
beyond its last Omega_i are coached towards its own start-of-round weights (T. Eq. 20).
BLS's layer selection (the norms of Eq. 30-31, the evaluations of Eq. 29) is charged as
client computation: a ``Compute`` op ``layer_selection`` after training, its FLOPs
counted by :func:`selection_flops`.

Choices the papers leave open (each tested in tests/unit/agents/test_kapc.py):

* **w^l is a layer's trainable parameters.** A layer is one parameterised module
  (:class:`mecsim.agents.models.ModelLayout`). BatchNorm running statistics are not parameters of
  f_s and take no gradient: they stay on the client and are never sent, so a full KAPC
  transfer is the model's parameter bytes (for the 2-conv/3-FC CNN: all of its state).
* **R starts uniform at 1/N.** "Normalise by row" = clamp negatives to 0 and divide by
  the row's sum, for each (client, layer) row (uniform when the sum is 0); option
  ``normalise: softmax`` uses softmax(r / temperature) instead.
* **The prior term pulls towards 1/N**, N = all clients, as A. Eq. 10 writes it, also
  on a slice of K < N clients (after renormalisation this is a shrinkage towards the
  slice's uniform row).
* **No normalisation between the E_r steps**: the slice is normalised before the steps
  and after them (T. Alg. 5 lines 6 and 12); s_i uses the normalised slice (T. Sec. 4.3:
  "the relationship matrix r^{k+1} is normalized, and then ... s_i").
* **f_s is the squared L2 distance**, so the coaching term's gradient is
  2 lam (w - s); the relation cube's learning rate and E_r are ``lr_relation`` and
  ``relation_steps``.
* **Server work is planned, then timed.** The relation update and the s_i are computed
  when the round is planned (they need the round's selection) and reported as this
  round's server FLOPs, so the engine times them as the round's server phase.

The mathematics is in :mod:`mecsim.agents.algorithms.parameter_coaching` (the relation
cube, the regulariser, the coaching loss, the server's FLOPs) and
:mod:`mecsim.agents.algorithms.layer_selection` (T. Algorithm 4 and Eq. 29); this module
holds the hyper-parameters and the server and client classes, and re-exports those
functions under their old names here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    EvalResult,
    NoParams,
    ServerAlgorithm,
    local_sgd,
    trained_result,
)
from mecsim.agents.algorithms.layer_selection import (
    CRITERION_FLOPS_PER_LAYER,
    BlsClientState,
    BlsConstants,
    algorithm4,
    criterion_log_lhs,
    layer_norms,
    log_m,
    search_omega,
    selection_flops,
)
from mecsim.agents.algorithms.parameter_coaching import (
    LAYER_GROUPINGS,
    ParamView,
    coaching_loss,
    coaching_pairs,
    kapc_server_flops,
    layer_groups,
    normalise_rows,
    param_view,
    personalised_regulariser,
    relation_gradient,
    relation_objective,
    self_relation_filter,
    update_relations,
)
from mecsim.agents.models import BYTES_PER_ELEMENT, ModelLayout, get_flat, set_flat
from mecsim.emulation.ops import Compute

__all__ = [
    "CRITERION_FLOPS_PER_LAYER",
    "KAPC",
    "KAPC_BLS",
    "LAYER_GROUPINGS",
    "BlsClientState",
    "BlsConstants",
    "KapcBlsClient",
    "KapcBlsParams",
    "KapcBlsServer",
    "KapcClient",
    "KapcParams",
    "KapcServer",
    "ParamView",
    "algorithm4",
    "coaching_loss",
    "coaching_pairs",
    "criterion_log_lhs",
    "kapc_server_flops",
    "layer_groups",
    "layer_norms",
    "log_m",
    "normalise_rows",
    "param_view",
    "personalised_regulariser",
    "relation_gradient",
    "relation_objective",
    "search_omega",
    "selection_flops",
    "self_relation_filter",
    "update_relations",
]

# =========================================================================== parameters


class KapcParams(NoParams):
    """Hyper-parameters of ``kapc`` (``algorithm.params``)."""

    lam: float = Field(1.0, ge=0, description="lambda: weight of the coaching loss (A. Eq. 5)")
    beta: float = Field(
        0.01,
        ge=0,
        description="beta: weight of the equal-share prior on R; "
        "the papers fix beta / (2 lambda) = 0.005 for alpha = 0.1",
    )
    lr_relation: float = Field(0.01, gt=0, description="eta_r: learning rate of R (A. Eq. 11)")
    relation_steps: int = Field(1, ge=1, description="E_r: gradient steps on R per round")
    normalise: Literal["clamp", "softmax"] = Field(
        "clamp",
        description="row normalisation of R: clamp negatives to 0 and divide by the "
        "sum (uniform if 0), or softmax(r / temperature)",
    )
    temperature: float = Field(1.0, gt=0, description="softmax temperature (normalise: softmax)")
    relation_init: Literal["random", "uniform"] = Field(
        "random",
        description="initial relation cube: random (A. Algorithm 1 line 2, "
        "'initializes ... the relationship cube randomly': U(0, 1) per entry, normalised by "
        "row, from the scenario seed) or uniform (every entry 1/N)",
    )
    layer_grouping: Literal["conv_bn", "module"] = Field(
        "conv_bn",
        description="what a layer of R, mu and Omega is: conv_bn (a BatchNorm "
        "belongs to the Conv/Linear before it: ResNet18 has 21 layers, as the KAPC+BLS "
        "paper's Fig. 8 implies) or module (every parameterised module, BatchNorm alone: 41)",
    )


class KapcBlsParams(KapcParams):
    """Hyper-parameters of ``kapc_bls``: KAPC's, plus the layer-selection constants."""

    mu: float = Field(
        0.7,
        ge=0,
        le=1,
        description="self-relationship threshold: layer l of "
        "s_i is not sent when r_ii^l > mu (T. Algorithm 3; Table 6 uses 0.7)",
    )
    first_download_full: bool = Field(
        True,
        description="a client selected for the first time receives every layer of s_i "
        "(T. Sec. 5.2.3: 'the full-layered regularizer is distributed')",
    )
    class_count: Literal["model", "client"] = Field(
        "model",
        description="c_i of Eq. 23/29: the model's output width (default), or the "
        "number of distinct labels in the client's training data",
    )
    confidence_term: bool = Field(
        False, description="keep the second term of Eq. 28 (the paper drops it: Eq. 29)"
    )
    rho: float = Field(
        1.0,
        gt=0,
        description="Lipschitz constant rho of the loss (Eq. 23, used only with confidence_term)",
    )
    delta: float = Field(0.05, gt=0, lt=1, description="confidence delta (Eq. 23)")
    loss_range: float = Field(
        math.log(10.0),
        gt=0,
        description="b - a, the range of the "
        "loss (Eq. 23); default ln 10, the cross-entropy of a uniform "
        "10-class prediction",
    )
    input_bound: float | None = Field(
        None,
        gt=0,
        description="A_i with ||x|| <= A_i (Eq. 23); default: the largest L2 norm "
        "of the client's (normalised) training inputs",
    )
    omega_policy: Literal["withhold_last", "printed"] = Field(
        "withhold_last",
        description="how a repeat selection's Omega is chosen: printed (T. "
        "Algorithm 4 with Eq. 29 as printed, which holds at every Omega < L on every model "
        "we tried, so Omega collapses to 1) or withhold_last (upload all but the last "
        "omega_withheld layers: the behaviour the paper reports in Fig. 8, not derived "
        "from Eq. 29); a first selection uploads L - 1 layers under both",
    )
    omega_withheld: int = Field(
        2,
        ge=0,
        description="layers left out of a repeat "
        "selection's upload under omega_policy withhold_last (Fig. 8: "
        "19 of ResNet18's 21)",
    )
    omega_search: Literal["last_holding", "as_written"] = Field(
        "last_holding",
        description="(omega_policy printed) Algorithm 4's downward search "
        "returns the smallest Omega that still satisfies Eq. 29 (last_holding), or, as "
        "written, the first that does not",
    )
    download_policy: Literal["algorithm5", "uploaded_only"] = Field(
        "algorithm5",
        description="which layers of s_i a repeat selection downloads: algorithm5 (T. "
        "Algorithm 5 lines 14-16: s_i = r_i W-hat over every layer, Eq. 34, with stale values "
        "filled in for the layers a client did not upload, Eq. 33, filtered only by mu, "
        "Algorithm 3) or uploaded_only (also withhold every layer beyond the client's last "
        "Omega: a client downloads at most what it uploaded last time)",
    )
    unselected_target: Literal["own_weights", "received", "none"] = Field(
        "own_weights",
        description="the coaching target of the layers l > Omega_i (not uploaded at the "
        "client's last selection): the client's own start-of-round weights (own_weights, T. "
        "Eq. 20 as printed, whether or not the server sent s_i^l), the s_i^l the server sent "
        "(received: Eq. 34 read literally; under download_policy uploaded_only nothing is "
        "sent there, so no term) or none",
    )
    unuploaded_layers: Literal["withhold", "send"] = Field(
        "withhold",
        description="a layer no client has ever uploaded (its W^l is the common initial "
        "value; under omega_policy withhold_last the last layer, which Algorithm 4 line 8 "
        "leaves out of a first upload and withhold_last out of every later one): once the "
        "server holds any upload it is not sent and is coached like a layer beyond Omega "
        "(withhold), or sent as Eq. 34 gives it, the initial values (send)",
    )


# =========================================================================== server


class KapcServer(ServerAlgorithm):
    """KAPC's edge server: every client's latest parameters W and the relation cube R."""

    name = "kapc"
    personalised_downloads = True  # see ServerAlgorithm
    Params: ClassVar[type[KapcParams]] = KapcParams
    params: KapcParams
    round_metrics: ClassVar[tuple[str, ...]] = (
        "kapc_layers_down_mean",
        "kapc_layers_up_mean",
        "kapc_self_relation_mean",
        "kapc_self_relation_max",
        "kapc_plan_host_s",
    )

    def __init__(
        self,
        layout: ModelLayout,
        init_weights: np.ndarray,
        client_samples: dict[int, int],
        fraction: float,
        params: dict[str, Any],
    ) -> None:
        super().__init__(layout, init_weights, client_samples, fraction, params)
        self.view = param_view(layout, self.params.layer_grouping)
        self.ids = sorted(client_samples)
        self.position = {cid: a for a, cid in enumerate(self.ids)}
        # R, client x layer x client: drawn at the first round (it needs the scenario seed,
        # set after construction), see initial_relations
        self.relations: np.ndarray | None = None
        self.init_params = self.view.extract(init_weights)
        # W: latest uploaded parameters; a client that never uploaded has the common initial
        # model (kept once), so memory grows with the clients seen, not with N
        self.client_params: dict[int, np.ndarray] = {}
        self.times_selected = {cid: 0 for cid in self.ids}
        self._planned: dict[str, Any] = {"flops": 0.0, "metrics": {}}

    # ------------------------------------------------------------------ maths on W

    def initial_relations(self) -> np.ndarray:
        """R before the first round: uniform 1/N, or (``relation_init: random``, A.
        Algorithm 1 line 2) U(0, 1) entries from the scenario seed, normalised by row."""
        n, n_layers = len(self.ids), self.view.num_layers
        if self.params.relation_init == "uniform":
            return np.full((n, n_layers, n), 1.0 / n)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0x4B415043]))
        return self.normalise(rng.uniform(0.0, 1.0, size=(n, n_layers, n)))

    def params_of(self, cid: int) -> np.ndarray:
        return self.client_params.get(cid, self.init_params)

    def layer_stack(self, selected: Sequence[int], layer: int) -> np.ndarray:
        """X^l: the K x n_l float64 matrix of the selected clients' layer l (T. Eq. 33)."""
        return np.stack([self.view.layer(self.params_of(c), layer) for c in selected]).astype(
            np.float64
        )

    def grams(self, selected: Sequence[int]) -> np.ndarray:
        """G^l = X^l X^l^T for every layer (L x K x K)."""
        out = []
        for layer in range(self.view.num_layers):
            x = self.layer_stack(selected, layer)
            out.append(x @ x.T)
        return np.stack(out)

    def normalise(self, r: np.ndarray) -> np.ndarray:
        return normalise_rows(r, self.params.normalise, self.params.temperature)

    def download_layers(self, cid: int, self_relation: np.ndarray) -> np.ndarray:
        """Which layers of s_i are sent (KAPC: all of them)."""
        return np.ones(len(self_relation), dtype=bool)

    def own_layers(self, cid: int) -> list[int]:
        """Layers the client coaches towards its own start-of-round weights (KAPC: none)."""
        return []

    # ------------------------------------------------------------------ the round

    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        start = time.perf_counter()
        p = self.params
        if self.relations is None:
            self.relations = self.initial_relations()
        pos = np.array([self.position[c] for c in selected])
        k, n_layers, n = len(selected), self.view.num_layers, len(self.ids)
        grams = self.grams(selected)
        block = np.ix_(pos, np.arange(n_layers), pos)
        r = self.normalise(self.relations[block])  # T. Alg. 5 line 6
        r = update_relations(
            r, grams, lam=p.lam, beta=p.beta, lr=p.lr_relation, steps=p.relation_steps, n_clients=n
        )  # lines 8-10
        self.relations[block] = r  # line 12
        self.relations[pos] = self.normalise(self.relations[pos])
        coeffs = self.normalise(r)  # normalised before s_i = r_i W (T. Sec. 4.3)
        self_rel = coeffs[np.arange(k), :, np.arange(k)]  # r_ii^l, K x L
        sent = np.stack([self.download_layers(c, self_rel[a]) for a, c in enumerate(selected)])
        parts: list[list[np.ndarray]] = [[] for _ in selected]
        for layer in range(n_layers):  # one K x n_l stack in memory at a time
            rows = np.flatnonzero(sent[:, layer])
            if len(rows) == 0:
                continue
            s = coeffs[rows, layer, :] @ self.layer_stack(selected, layer)  # Eq. 14/34
            for row, s_row in zip(rows, s, strict=True):
                parts[row].append(s_row.astype(np.float32))
        tasks = []
        for a, cid in enumerate(selected):
            layers = np.flatnonzero(sent[a]).tolist()
            s_i = np.concatenate(parts[a]) if parts[a] else np.zeros(0, np.float32)
            config: dict[str, Any] = {"layers": layers}
            own = self.own_layers(cid)
            if own:
                config["own_layers"] = own
            tasks.append(ClientTask(cid, s_i, s_i.size * BYTES_PER_ELEMENT, config))
            self.times_selected[cid] += 1
        self._planned = {
            "flops": kapc_server_flops(k, n, self.view.numel(), p.relation_steps, sent),
            "metrics": {
                "kapc_layers_down_mean": float(sent.sum(1).mean()),
                "kapc_self_relation_mean": float(self_rel.mean()),
                "kapc_self_relation_max": float(self_rel.max()),
                "kapc_plan_host_s": time.perf_counter() - start,
                **self.plan_metrics(selected, self_rel, sent),
            },
        }
        return tasks

    def plan_metrics(
        self, selected: list[int], self_rel: np.ndarray, sent: np.ndarray
    ) -> dict[str, float]:
        """Extra per-round figures of the plan (BLS adds its own)."""
        return {}

    def stored(self, result: ClientResult) -> None:
        """Hook after an upload is stored (BLS keeps the client's Omega)."""

    def upload_size(self) -> int | None:
        """None: a client uploads the layers it selected (BLS), not a fixed size."""
        return None

    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        """Store every upload into W (stale layers stay, T. Eq. 33); no arithmetic."""
        uploaded = []
        for r in results:
            if r.weights is None:
                continue
            layers = r.extra["layers"]
            mine = self.client_params.get(r.client_id)
            if mine is None:
                mine = self.client_params[r.client_id] = self.init_params.copy()
            for layer, values in self.view.split(np.asarray(r.weights), layers).items():
                mine[self.view.bounds[layer] : self.view.bounds[layer + 1]] = values
            uploaded.append(len(layers))
            self.stored(r)
        planned, self._planned = self._planned, {"flops": 0.0, "metrics": {}}
        metrics = {key: float("nan") for key in self.round_metrics}
        metrics.update(planned["metrics"])
        if uploaded:
            metrics["kapc_layers_up_mean"] = float(np.mean(uploaded))
        metrics.update(self.upload_metrics(results))
        return AggregateStats(flops=planned["flops"], metrics=metrics)

    def upload_metrics(self, results: list[ClientResult]) -> dict[str, float]:
        return {}

    def configure_evaluate(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        return [ClientTask(c, None, 0) for c in clients]  # each client's own model


class KapcBlsServer(KapcServer):
    """KAPC with both halves of BLS on the server: T. Algorithm 3 filters s_i by
    self-relationship (``download_policy: algorithm5``, T. Algorithm 5 lines 14-16);
    ``uploaded_only`` also leaves out the layers beyond the client's Omega. The layers
    beyond Omega are coached towards the client's own weights (T. Eq. 20)."""

    name = "kapc_bls"
    Params = KapcBlsParams
    params: KapcBlsParams
    round_metrics = KapcServer.round_metrics + (
        "kapc_omega_repeat_mean",
        "kapc_omega_first_mean",
        "kapc_layers_filtered_mean",
        "kapc_layers_own_mean",
    )

    def __init__(
        self,
        layout: ModelLayout,
        init_weights: np.ndarray,
        client_samples: dict[int, int],
        fraction: float,
        params: dict[str, Any],
    ) -> None:
        super().__init__(layout, init_weights, client_samples, fraction, params)
        # Omega_i of each client's last stored upload (T. Eq. 20); absent: never uploaded
        self.omega_of: dict[int, int] = {}
        # layers some client has uploaded at least once (unuploaded_layers)
        self.layers_uploaded = np.zeros(self.view.num_layers, dtype=bool)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "layers_uploaded" not in state:  # a checkpoint written before it was kept
            self.layers_uploaded = np.zeros(self.view.num_layers, dtype=bool)
            for cid, params in self.client_params.items():
                differs = params != self.init_params
                for layer in range(self.view.num_layers):
                    if self.omega_of.get(cid, 0) > layer or bool(
                        differs[self.view.bounds[layer] : self.view.bounds[layer + 1]].any()
                    ):
                        self.layers_uploaded[layer] = True

    def eq20_layers(self, cid: int) -> np.ndarray:
        """T. Eq. 20: s_i^l is the regulariser for l <= Omega_i and the client's own weights
        beyond; True for the layers l <= Omega_i (all before a first upload)."""
        mask = np.ones(self.view.num_layers, dtype=bool)
        omega = self.omega_of.get(cid)
        if omega is not None:
            mask[omega:] = False
        return mask

    def never_uploaded(self) -> np.ndarray:
        """True for the layers withheld under ``unuploaded_layers: withhold``: those no
        client has uploaded yet, once the server holds some upload (before any upload every
        layer is the initial model's and the first downloads are full, T. Sec. 5.2.3)."""
        if self.params.unuploaded_layers != "withhold" or not self.layers_uploaded.any():
            return np.zeros(self.view.num_layers, dtype=bool)
        return ~self.layers_uploaded

    def policy_layers(self, cid: int) -> np.ndarray:
        """The layers the download policy allows before the mu filter: every layer
        (algorithm5) or the layers l <= Omega_i (uploaded_only); never a layer no client
        has uploaded (unuploaded_layers: withhold)."""
        if self.params.download_policy == "uploaded_only":
            mask = self.eq20_layers(cid)
        else:
            mask = np.ones(self.view.num_layers, dtype=bool)
        return mask & ~self.never_uploaded()

    def download_layers(self, cid: int, self_relation: np.ndarray) -> np.ndarray:
        if self.params.first_download_full and self.times_selected[cid] == 0:
            return ~self.never_uploaded()
        return self_relation_filter(self_relation, self.params.mu) & self.policy_layers(cid)

    def own_layers(self, cid: int) -> list[int]:
        """The layers coached towards the client's own start-of-round weights: beyond its
        Omega (T. Eq. 20, ``unselected_target: own_weights``) and, unless the target is
        ``none``, the layers withheld because no client uploaded them."""
        target = self.params.unselected_target
        if target == "none":
            return []
        own = self.never_uploaded()
        if target == "own_weights":
            own = own | ~self.eq20_layers(cid)
        return np.flatnonzero(own).tolist()

    def plan_metrics(
        self, selected: list[int], self_rel: np.ndarray, sent: np.ndarray
    ) -> dict[str, float]:
        allowed = np.stack([self.policy_layers(c) for c in selected])
        filtered = ~self_relation_filter(self_rel, self.params.mu) & allowed
        own = np.array([len(self.own_layers(c)) for c in selected], dtype=float)
        return {
            "kapc_layers_filtered_mean": float(filtered.sum(1).mean()),
            "kapc_layers_own_mean": float(own.mean()),
        }

    def stored(self, result: ClientResult) -> None:
        layers = result.extra["layers"]
        self.omega_of[result.client_id] = len(layers)
        self.layers_uploaded[list(layers)] = True

    @classmethod
    def run_notes(cls, rows: list[dict[str, Any]], params: KapcBlsParams) -> list[str]:
        """The upload policy (every upload figure of the run depends on it), a warning
        when Omega was 1 on every repeat selection, and when the mu filter never acted."""

        def finite(key: str) -> np.ndarray:
            values = np.array([float(r.get(key, math.nan)) for r in rows], dtype=float)
            return values[np.isfinite(values)]

        if params.omega_policy == "printed":
            policy = (
                f"omega_policy printed: Omega from T. Eq. 29 as printed "
                f"(omega_search {params.omega_search})"
            )
        else:
            policy = (
                f"omega_policy withhold_last: a repeat selection uploads all but the "
                f"last {params.omega_withheld} layers (the KAPC+BLS paper's Fig. 8, "
                f"not derived from Eq. 29)"
            )
        if params.download_policy == "algorithm5":
            downloads = (
                "download_policy algorithm5: s_i over every layer with r_ii <= mu (T. Algorithm 5)"
            )
        else:
            downloads = "download_policy uploaded_only: only layers within the client's last Omega"
        notes = [
            f"KAPC+BLS uploads: {policy}; a first selection uploads L - 1 layers. "
            f"Downloads: {downloads} (docs/kapc.md)."
        ]
        repeat = finite("kapc_omega_repeat_mean")
        if len(repeat) and repeat.max() <= 1.0:
            notes.append(
                f"Warning: Omega stayed 1 on every repeat selection ({len(repeat)} "
                f"rounds with repeat selections): after its first selection each "
                f"client uploaded only its first layer, so the server's copies of "
                f"the others stay as first uploaded. Eq. 29 as printed holds at "
                f"every Omega < L (docs/kapc.md); omega_policy withhold_last "
                f"reproduces the paper's Fig. 8."
            )
        filtered, top = finite("kapc_layers_filtered_mean"), finite("kapc_self_relation_max")
        if len(filtered) and filtered.max() == 0.0:
            largest = f" (the largest r_ii^l was {top.max():.3f})" if len(top) else ""
            notes.append(
                f"Warning: the self-relationship filter held back no layer: no "
                f"r_ii^l exceeded mu = {params.mu:g}{largest}, so the downloads "
                f"are KAPC's except for the download policy; a mu sweep (Table 3) shows nothing "
                f"in such a run."
            )
        return notes

    def upload_metrics(self, results: list[ClientResult]) -> dict[str, float]:
        """Mean Omega of the uploads from first and from repeat selections."""
        out = {}
        for key, repeat in (("kapc_omega_first_mean", False), ("kapc_omega_repeat_mean", True)):
            omegas = [
                len(r.extra["layers"])
                for r in results
                if r.weights is not None and bool(r.extra.get("repeat_selection")) == repeat
            ]
            out[key] = float(np.mean(omegas)) if omegas else float("nan")
        return out


# =========================================================================== client


_VIEWS: dict[tuple[int, str], tuple[ModelLayout, ParamView]] = {}


def _view_of(layout: ModelLayout, grouping: str) -> ParamView:
    """param_view, once per layout object and grouping (a host's clients share one). The
    entry keeps its layout alive, so its id cannot be reused by another layout while
    cached."""
    key = (id(layout), grouping)
    entry = _VIEWS.get(key)
    if entry is None or entry[0] is not layout:
        if len(_VIEWS) >= 16:
            _VIEWS.clear()
        entry = _VIEWS[key] = (layout, param_view(layout, grouping))
    return entry[1]


class KapcClient(ClientAlgorithm):
    """A KAPC client: its own model, coached towards s_i (A. Algorithm 2)."""

    name = "kapc"
    Params: ClassVar[type[KapcParams]] = KapcParams
    params: KapcParams

    def _own(self, ctx: ClientContext) -> np.ndarray:
        own = ctx.state.get("weights")
        return ctx.init_weights if own is None else own

    def upload_layers(
        self, ctx: ClientContext, view: ParamView, p: np.ndarray, received: dict[int, np.ndarray]
    ) -> tuple[list[int], float]:
        """Which layers to upload, and the FLOPs of choosing them (KAPC: all, none)."""
        return list(range(view.num_layers)), 0.0

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        view = _view_of(ctx.layout, self.params.layer_grouping)
        own = self._own(ctx)
        set_flat(ctx.model, ctx.layout, own)
        layers = list(task.config.get("layers", []))
        weights = np.zeros(0, np.float32) if task.weights is None else task.weights
        received = view.split(np.asarray(weights), layers)
        # T. Eq. 20: the layers the server names in own_layers (beyond the client's Omega)
        # are coached towards its own start-of-round weights (the client has them), also
        # when the server sent s_i^l for them (download_policy algorithm5)
        own_layers = {int(layer) for layer in task.config.get("own_layers", [])}
        start_p = view.extract(own)
        from_server = {layer: s for layer, s in received.items() if layer not in own_layers}
        targets = {
            **from_server,
            **{layer: view.layer(start_p, layer).copy() for layer in sorted(own_layers)},
        }
        pairs = coaching_pairs(ctx.model, view, targets)
        lam = self.params.lam
        extra = (lambda model: coaching_loss(pairs, lam)) if pairs else None
        stats = local_sgd(ctx, extra_loss=extra, cost_key=f"{self.name}:{len(weights)}")
        flat = get_flat(ctx.model, ctx.layout)
        ctx.state["weights"] = flat
        p = view.extract(flat)
        repeat = bool(ctx.state.get("kapc_selections", 0))
        ctx.state["kapc_selections"] = int(ctx.state.get("kapc_selections", 0)) + 1
        up_layers, selection_flops = self.upload_layers(ctx, view, p, from_server)
        upload = view.select(p, up_layers)
        up = upload.size * BYTES_PER_ELEMENT
        result = trained_result(
            ctx,
            stats,
            weights=upload,
            upload_nbytes=up,
            download_nbytes=task.download_nbytes,
            started_at=start,
            extra={"layers": up_layers, "received_layers": layers, "repeat_selection": repeat},
        )
        if selection_flops:  # BLS: T. Algorithm 4 on the device, after training (Alg. 6)
            trace = list(result.trace)
            at = next(i for i, op in enumerate(trace) if isinstance(op, Compute)) + 1
            trace.insert(at, Compute(selection_flops, 0, "layer_selection"))
            result.trace = tuple(trace)
            result.flops += selection_flops
            result.extra["selection_flops"] = selection_flops
        return result

    def evaluate(self, ctx: ClientContext, task: ClientTask) -> EvalResult:
        set_flat(ctx.model, ctx.layout, self._own(ctx))
        return super().evaluate(ctx, ClientTask(ctx.client_id, None, 0))


class KapcBlsClient(KapcClient):
    """KAPC with the client half of BLS: upload the first Omega layers (T. Algorithm 4)."""

    name = "kapc_bls"
    Params = KapcBlsParams
    params: KapcBlsParams
    #: T. Algorithm 4's selection, counted by selection_flops (not run under torch)
    hand_counted_flops = ("layer_selection",)

    def constants(self, ctx: ClientContext, view: ParamView) -> BlsConstants:
        p = self.params
        if p.class_count == "model":
            classes = int(view.out_dim[-1])
        else:
            classes = int(torch.unique(ctx.y_train).numel())
        bound = p.input_bound
        if bound is None:
            bound = ctx.state.get("bls_input_bound")
            if bound is None:
                bound = float(ctx.x_train.flatten(1).norm(dim=1).max())
                ctx.state["bls_input_bound"] = bound
        return BlsConstants(
            view.in_cols,
            view.out_dim,
            classes,
            int(ctx.y_train.shape[0]),
            p.rho,
            bound,
            p.delta,
            p.loss_range,
            p.confidence_term,
        )

    def upload_layers(
        self, ctx: ClientContext, view: ParamView, p: np.ndarray, received: dict[int, np.ndarray]
    ) -> tuple[list[int], float]:
        """T. Algorithm 4: Omega from the bounds of Eq. 30-31, and the FLOPs it took
        (:func:`selection_flops`). ``received``: the layers coached towards the server's
        s_i^l this round (tau of Eq. 31 is measured against them)."""
        b_now = layer_norms(p, view)  # Eq. 30
        tau_now = np.full(view.num_layers, np.nan)
        for layer, s in received.items():  # Eq. 31, for the layers received
            tau_now[layer] = float(
                np.linalg.norm(view.layer(p, layer).astype(np.float64) - s.astype(np.float64))
            )
        state = ctx.state.get("bls")
        if state is None:
            state = ctx.state["bls"] = BlsClientState(view.num_layers)
        withheld = None
        if self.params.omega_policy == "withhold_last":
            withheld = self.params.omega_withheld
        bound_known = self.params.input_bound is not None or "bls_input_bound" in ctx.state
        evaluations = [0]
        omega = algorithm4(
            state,
            b_now,
            tau_now,
            self.constants(ctx, view),
            self.params.omega_search == "as_written",
            withheld,
            evaluations,
        )
        input_elements = 0 if bound_known else int(ctx.x_train.numel())
        flops = selection_flops(view.numel(), list(received), evaluations[0], input_elements)
        return list(range(omega)), flops


#: registered as ``kapc`` (:data:`mecsim.registry.ALGORITHMS`)
KAPC = (KapcServer, KapcClient)

#: registered as ``kapc_bls`` (:data:`mecsim.registry.ALGORITHMS`)
KAPC_BLS = (KapcBlsServer, KapcBlsClient)
