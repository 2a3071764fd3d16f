"""DC-PFL (Liu et al.): dynamic clustering with layer-wise aggregation for personalised FL.

The paper's Sections III-IV: the mathematics as pure functions in
:mod:`mecsim.agents.algorithms.dynamic_clustering`, the hyper-parameters and one server
and one client class here:

- **Model discrepancy** (Eq. 3) ``D_ij = |S(w_i) - S(w_j)|_1 / dim(w)`` with the min-max
  scaling ``S(w) = (w - min w) / (max w - min w)``, averaged over the first ``T_start``
  rounds (in which everyone trains one global model, as in FedAvg).
- **Hierarchical group graph** (Sec. III-B): average-linkage agglomerative clustering of
  the discrepancy matrix (``scipy.cluster.hierarchy``); ``gamma_global`` is the smallest
  threshold that puts everyone in one group and ``gamma_tilde = gamma / gamma_global``.
- **Dynamic clustering** (Sec. III-C): start at ``gamma_tilde = 1``; the clients report the
  loss of the model they download, the server smooths it over a window of ``s`` rounds,
  takes differences for ``l'`` and ``l''`` and the radius of curvature (Eq. 4)
  ``r = (1 + l'^2)^(3/2) / l''``; the rapid-decrease period (RDP) is over when ``r`` has not
  decreased for ``t_obv`` rounds. Then a *trial round*: every client downloads its old and
  its new group model, trains both, reports both losses; the split is kept if the mean
  loss of the new structure is lower, else the old one stays for ``t_sp`` rounds.
- **Layer-wise aggregation** (Eq. 5-6): per group, layer discrepancy ``D_{g,l}``; a layer
  with ``D_{g,l} < 0.1 * D_g`` is aggregated every ``alpha * tau`` rounds, others every
  ``tau``. A layer is uploaded and downloaded only in the rounds it is aggregated in.

Choices where the paper is not explicit (each is a parameter or documented in
``docs/dcpfl.md``, and tested in ``tests/unit/agents/test_dcpfl.py``):

1. Which min and max S uses, chosen for each equation: ``scaling_eq3`` (default
   ``model``) and ``scaling_eq5`` (default ``layer``), the literal reading of each. Eq. 3
   writes ``S(w_i)`` of the whole model with "min(w) the smallest value in w", so each
   client's flat state vector is scaled by its own min and max; Eq. 5 writes
   ``S(w_{l,i})``, so each layer of each member (and of the group model) by its own.
   Either equation takes any of ``model`` / ``layer`` (each vector's own min and max,
   over the whole model or per layer) and ``shared_model`` / ``shared_layer`` (one min
   and max for all the vectors compared: the round's uploads in Eq. 3, the group's
   members and group model in Eq. 5; our construction, not the paper's). ``scaling``
   sets both at once (the single switch of earlier versions, whose default ``layer``
   scaled Eq. 3 per layer too; kept so that their scenarios and run folders load and
   resume unchanged). What the choice costs: per-client scaling turns a small
   difference in two clients' extreme weights into a shift of every scaled element,
   which swamps the weight differences. Measured on the 50-client scenario's uploads
   (round 5): correlation of D_ij with the label KL 0.12 (``model``), 0.23 (``layer``),
   0.75 (``shared_model``); averaged over the 5 warm-up rounds, 0.85 with
   ``shared_model`` (the paper reports 0.895). A constant vector scales to 0.
2. A *round* is ``training.epochs`` local epochs. The paper's ``tau = 5 epochs`` is the
   interval between aggregations that every method shares; ``tau_rounds`` counts rounds,
   so ``tau_rounds: 1`` with ``training.epochs: 5`` is the paper's setting.
3. The paper "adds" the step ``lambda`` to ``gamma_tilde``; splitting needs a *smaller*
   threshold, so ``gamma_tilde`` is *decreased* by ``lambda``. If the next threshold gives
   the same groups, it is decreased again until the groups change (a trial between
   identical structures would be pointless); at 0, or when every client is alone, the
   dynamic clustering stops (and so do the loss reports).
4. Smoothing: ``l_w(t)`` is the mean of the last ``min(s, t)`` losses (the printed sum runs
   over ``s + 1`` terms but divides by ``s``). ``r(t)`` is defined once ``s`` (and at least
   3) losses are in; where ``l'' <= 0`` (no convex bend) ``r = +inf``. The RDP ended at the
   latest round m when ``r(m - t_obv) < r(t')`` for every ``t'`` in ``(m - t_obv, m]``. A
   new RDP (fresh loss history) starts when the structure changes; after a rejected trial
   the history continues and detection resumes after ``t_sp`` rounds.
5. Trial round: a client whose group is the same in both structures downloads and trains
   once (its two models would be identical) and reports that loss twice. The losses are
   measured after the local training, on the client's training data (Sec. III-C: "followed
   by a local SGD. Then it tests the training loss"), with the same mini-batch order for
   both models. Every client uploads one full model; both candidates have the same size,
   so the client hands both to the server, which keeps the one its decision selects (the
   op-trace carries one upload; the few-byte decision round trip is not timed).
6. Loss reports are 4-byte uploads (``Upload(what="loss")``) and count in ``bytes_up``; a
   *communication round* (``comm_round``) is a round in which model weights are sent.
7. Layer discrepancies and intervals (Eq. 5-6) are recomputed at every full
   synchronisation of a group (all layers uploaded): when it is formed and every
   ``alpha * tau`` rounds. Groups are aggregated sample-weighted (FedAvg within a group).

Server FLOPs count element operations: min-max scaling 4 per element, an L1 distance 3 per
element, aggregation a multiply and an add per element per client (as in FedAvg) for
every average the server forms: a one-member group's too, and the old and new group
models a trial round's plan averages (charged to the trial round's aggregation).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Literal, cast

import numpy as np
import torch
from pydantic import Field, model_validator
from torch.utils.flop_counter import FlopCounterMode

from mecsim.agents.algorithms.base import (
    AggregateStats,
    ClientAlgorithm,
    ClientContext,
    ClientResult,
    ClientTask,
    NoParams,
    ServerAlgorithm,
    local_sgd,
)
from mecsim.agents.algorithms.dynamic_clustering import (
    L1_OPS_PER_ELEMENT,
    SCALE_OPS_PER_ELEMENT,
    SCALINGS,
    Scaling,
    curvature_radii,
    discrepancy_matrix,
    group_graph,
    groups_at,
    layer_discrepancy,
    layer_intervals,
    layers_due,
    minmax_scale,
    model_discrepancy,
    next_split,
    rdp_detections,
    rdp_end_unseen,
    rdp_ended,
    scale_rows,
    smoothed_losses,
    trial_accepts,
)
from mecsim.agents.algorithms.fedavg import aggregation_flops, weighted_average
from mecsim.agents.models import ModelLayout, get_flat, set_flat
from mecsim.agents.training import StepCost, evaluate
from mecsim.emulation.ops import Barrier, Compute, Download, Upload

# the mathematics is re-exported: it was defined here, and scripts import it from here
__all__ = [
    "DCPFL",
    "DCPFL_NODC",
    "DCPFL_NOLA",
    "DECISION_NBYTES",
    "LOSS_REPORT_NBYTES",
    "SCALINGS",
    "DCPFLClient",
    "DCPFLParams",
    "DCPFLServer",
    "NoDCClient",
    "NoDCParams",
    "NoDCServer",
    "NoLAClient",
    "NoLAParams",
    "NoLAServer",
    "Scaling",
    "curvature_radii",
    "discrepancy_matrix",
    "group_graph",
    "groups_at",
    "layer_discrepancy",
    "layer_intervals",
    "layers_due",
    "minmax_scale",
    "model_discrepancy",
    "next_split",
    "rdp_detections",
    "rdp_end_unseen",
    "rdp_ended",
    "scale_rows",
    "smoothed_losses",
    "train_loss",
    "trial_accepts",
]

LOSS_REPORT_NBYTES = 4  # one float32 loss value
DECISION_NBYTES = 1  # the trial's outcome, old or new structure, sent to every client


# ================================================================== parameters


class DCPFLParams(NoParams):
    """DC-PFL hyper-parameters; defaults are the paper's (Sec. V-A) unless noted."""

    warmup_rounds: int = Field(5, ge=1, description="T_start: global rounds averaging Eq. 3")
    scaling_eq3: Scaling = Field(
        "model",
        description="S of Eq. 3 (the model discrepancy of the warm-up, which builds the "
        "group graph): model (the literal reading: each model scaled by the smallest and "
        "largest value of its whole weight vector, 'the smallest value in w'), layer "
        "(each layer of each model by its own min/max), shared_model (one min/max over "
        "all the models compared) or shared_layer (one min/max per layer over them)",
    )
    scaling_eq5: Scaling = Field(
        "layer",
        description="S of Eq. 5 (the layer discrepancy that sets each layer's "
        "aggregation interval, Eq. 6): layer (the literal reading, S(w_{l,i}): each "
        "layer of each member and of the group model by its own min/max), model, "
        "shared_model or shared_layer (one min/max over the members and the group model)",
    )
    scaling: Scaling | None = Field(
        None,
        description="shorthand that sets scaling_eq3 and scaling_eq5 to the same value "
        "(the single switch of earlier versions, kept so that their scenarios and run "
        "folders load and resume as they ran); give it or those two, not both",
    )
    dynamic: bool = Field(True, description="dynamic clustering (False: NoDC)")
    fixed_gamma_tilde: float = Field(
        0.8, ge=0, le=1, description="gamma_tilde when dynamic is False (NoDC)"
    )
    gamma_step: float = Field(0.2, gt=0, le=1, description="lambda: decrease of gamma_tilde")
    loss_window: int = Field(5, ge=1, description="s: rounds in the loss smoothing window")
    observe_rounds: int = Field(3, ge=1, description="t_obv: rounds r(t) must not decrease")
    hold_rounds: int = Field(6, ge=0, description="t_sp: rounds kept after a rejected split")
    layerwise: bool = Field(True, description="layer-wise aggregation (False: NoLA)")
    tau_rounds: int = Field(1, ge=1, description="tau in rounds (a round = training.epochs)")
    alpha: int = Field(3, ge=1, description="low-discrepancy layers every alpha * tau rounds")
    low_ratio: float = Field(0.1, gt=0, description="low-discrepancy: D_gl < low_ratio * D_g")
    trial_loss: Literal["train", "heldout"] = Field(
        "train",
        description="what a trial round compares: the training loss after local "
        "SGD (train, Sec. III-C as printed; it always favours smaller groups) or the loss "
        "on a held-out part of each client's training data that it never trains on "
        "(heldout)",
    )
    heldout_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="share of each client's training data held out with trial_loss: heldout",
    )

    @model_validator(mode="before")
    @classmethod
    def _scaling_shorthand(cls, data: object) -> object:
        """``scaling: X`` (one switch for both equations, as before they were separate)
        sets ``scaling_eq3`` and ``scaling_eq5`` to X; mixed with either, it is refused."""
        if not isinstance(data, dict) or data.get("scaling") is None:
            return data
        both = [k for k in ("scaling_eq3", "scaling_eq5") if k in data]
        if both:
            raise ValueError(
                f"scaling sets both scaling_eq3 and scaling_eq5; give scaling or "
                f"{' and '.join(both)}, not both"
            )
        return {**data, "scaling_eq3": data["scaling"], "scaling_eq5": data["scaling"]}


class NoLAParams(DCPFLParams):
    layerwise: bool = Field(
        default=False,
        description="the ablation's setting: whole models are aggregated, not layer by "
        "layer (DC-PFL without layer-wise aggregation)",
    )


class NoDCParams(DCPFLParams):
    dynamic: bool = Field(
        default=False,
        description="the ablation's setting: the clusters are fixed after the first "
        "clustering (DC-PFL without dynamic clustering); true is refused: use dcpfl",
    )

    @model_validator(mode="after")
    def _static(self) -> NoDCParams:
        if self.dynamic:
            raise ValueError(
                "dcpfl_nodc is DC-PFL without dynamic clustering; use dcpfl for dynamic: true"
            )
        return self


# ================================================================== server


class DCPFLServer(ServerAlgorithm):
    name = "dcpfl"
    personalised_downloads = True  # see ServerAlgorithm
    Params = DCPFLParams
    params: DCPFLParams
    round_metrics = (
        "comm_round",
        "groups",
        "gamma_tilde",
        "trial",
        "split_accepted",
        "layers_aggregated",
        "smoothed_loss",
        "curvature_radius",
        "rdp_detected",
        "rdp_earliest",
        "la_updates",
        "la_low_layers",
        "la_min_ratio",
    )

    @classmethod
    def check_scenario(cls, params, *, train, model, layout, clients, participation):
        if participation < 1.0:
            return [
                (
                    "topology.participation",
                    f"{cls.name} needs every client in every "
                    f"round (topology.participation: 1), got {participation:g}",
                )
            ]
        return []

    def __init__(self, layout, init_weights, client_samples, fraction, params) -> None:
        super().__init__(layout, init_weights, client_samples, fraction, params)
        if fraction < 1.0:
            raise ValueError(
                f"{self.name} needs every client in every round "
                f"(topology.participation = 1), got {fraction}"
            )
        p = self.params
        self.ids = sorted(self.client_samples)
        self.index = {cid: k for k, cid in enumerate(self.ids)}
        n, num_layers = len(self.ids), layout.num_layers
        self.all_layers = np.ones(num_layers, dtype=bool)
        # the server's copy of each client's layers as last uploaded (rows in id order)
        self.view = np.tile(init_weights.astype(np.float32), (n, 1))
        self.disc_sum = np.zeros((n, n))
        self.disc_count = np.zeros((n, n))
        self.discrepancy: np.ndarray | None = None  # Eq. 3 averaged over T_start rounds
        self.z: np.ndarray | None = None
        self.gamma_global = 0.0
        self.gamma_tilde = 1.0
        self.labels = np.zeros(n, dtype=np.int64)  # one group during the warm-up
        self.group_models: dict[int, np.ndarray] = {0: self.weights.copy()}
        self.intervals: dict[int, np.ndarray] = {}
        self.formed: dict[int, int] = {}
        self.pending: dict[int, np.ndarray] = {0: self.all_layers.copy()}  # next download
        self.losses: list[float] = []
        self.radii: list[float] = []
        self.dynamic_active = p.dynamic
        self.trial: tuple[np.ndarray, float] | None = None  # candidate for the next round
        self.hold_until = 0
        self.outcome: str | None = None  # "new"/"old": tells clients the trial's result
        self._comm_round = False
        self._la: list[tuple[int, float]] = []  # this round's Eq. 6 updates: (low, min ratio)
        self._planned_flops = 0.0  # averages formed by this round's plan (a trial's models)

    @classmethod
    def run_notes(cls, rows: list[dict], params: DCPFLParams) -> list[str]:
        """Warnings: the layer-wise aggregation never acted (no layer under the
        low-discrepancy threshold at any Eq. 5-6 update); the end of an RDP detected at the
        earliest round the rule could fire (rounds counted from 1)."""

        def col(key: str) -> np.ndarray:
            return np.array([float(r.get(key, math.nan)) for r in rows], dtype=float)

        notes = []
        updates, low, ratio = col("la_updates"), col("la_low_layers"), col("la_min_ratio")
        n_updates = int(np.nansum(updates))
        if params.layerwise and n_updates > 0 and np.nansum(low) == 0:
            smallest = np.nanmin(ratio) if np.isfinite(ratio).any() else math.nan
            notes.append(
                f"Warning: the layer-wise aggregation never acted: at none of the "
                f"{n_updates} layer-interval updates (Eq. 5-6) did a layer's "
                f"discrepancy fall under {params.low_ratio:g} x the group's mean "
                f"(smallest ratio {smallest:.3f}; scaling_eq5 {params.scaling_eq5}), so "
                f"every layer was aggregated every tau rounds, as in NoLA."
            )
        found = rdp_detections(rows, params.loss_window, params.observe_rounds)
        at = [int(rows[k]["round"]) + 1 for k, unseen in found if unseen]
        if at:
            notes.append(
                f"Warning: {len(at)} of {len(found)} ends of a rapid-decrease period "
                f"were detected without a minimum of r(t) ever being seen (round"
                f"{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}): r rose from "
                f"the first round it was defined. r(t) = (1 + l'^2)^1.5 / l'' is "
                f"about 1 / l'' once |l'| << 1 and rises as the loss flattens, so "
                f"'r not decreasing for t_obv rounds' fires on the clock, not at a "
                f"knee of the loss curve (docs/dcpfl.md)."
            )
        return notes

    # ------------------------------------------------------------------ helpers
    def _members(self, labels: np.ndarray, g: int) -> list[int]:
        return [self.ids[k] for k in np.flatnonzero(labels == g)]

    def _view_average(self, members: list[int]) -> np.ndarray:
        return weighted_average(
            [self.view[self.index[c]] for c in members], [self.client_samples[c] for c in members]
        )

    def _layers(self, mask: np.ndarray) -> list[int]:
        return [int(x) for x in np.flatnonzero(mask)]

    def _base_config(self) -> dict:
        cfg: dict = {"report_loss": self.dynamic_active}
        if self.outcome is not None:
            cfg["trial_outcome"] = self.outcome
        return cfg

    def _warmup(self, rnd: int) -> bool:
        return rnd < self.params.warmup_rounds

    # ------------------------------------------------------------------ plan
    def configure_fit(self, rnd: int, selected: list[int]) -> list[ClientTask]:
        if self.trial is not None:
            tasks = self._configure_trial(selected)
        else:
            tasks = []
            all_layers = self._layers(self.all_layers)
            for c in selected:
                cfg = self._base_config()
                if self._warmup(rnd):
                    cfg.update(download_layers=all_layers, upload_layers=all_layers)
                    tasks.append(ClientTask(c, self.weights, self.layout.nbytes, cfg))
                    continue
                g = int(self.labels[self.index[c]])
                if int(np.sum(self.labels == g)) == 1:  # alone: nothing to aggregate
                    cfg.update(download_layers=[], upload_layers=[])
                    tasks.append(ClientTask(c, None, 0, cfg))
                    continue
                down = self.pending.get(g, ~self.all_layers)
                up = layers_due(rnd, self.formed[g], self.intervals[g])
                cfg.update(download_layers=self._layers(down), upload_layers=self._layers(up))
                tasks.append(
                    ClientTask(
                        c,
                        self.group_models[g] if down.any() else None,
                        self.layout.nbytes_of_layers(down),
                        cfg,
                    )
                )
        self.outcome = None
        self._comm_round = any(
            t.download_nbytes > 0 or t.config.get("upload_layers") for t in tasks
        )
        return tasks

    def _configure_trial(self, selected: list[int]) -> list[ClientTask]:
        assert self.trial is not None  # called only with a trial scheduled
        new_labels, _ = self.trial
        full = self.layout.nbytes
        old_models = {
            int(g): self._view_average(self._members(self.labels, g))
            for g in np.unique(self.labels)
        }
        new_models = {
            int(g): self._view_average(self._members(new_labels, g)) for g in np.unique(new_labels)
        }
        # every client is a member of one old and one new group: 2 |w| per client in each
        self._planned_flops = 2 * aggregation_flops(self.layout.size, len(self.ids))
        tasks = []
        for c in selected:
            k = self.index[c]
            g0, g1 = int(self.labels[k]), int(new_labels[k])
            old_members = self._members(self.labels, g0)
            same = old_members == self._members(new_labels, g1)
            cfg = self._base_config()
            cfg["trial"] = True
            if same and len(old_members) == 1:  # alone either way: trains its own model
                cfg.update(trial_weights=None, old_nbytes=0, new_nbytes=0, upload_layers=[])
                tasks.append(ClientTask(c, None, 0, cfg))
                continue
            cfg.update(
                trial_weights=None if same else new_models[g1],
                old_nbytes=full,
                new_nbytes=0 if same else full,
                upload_layers=self._layers(self.all_layers),
            )
            tasks.append(ClientTask(c, old_models[g0], full * (1 if same else 2), cfg))
        return tasks

    def configure_evaluate(self, rnd: int, clients: list[int]) -> list[ClientTask]:
        """Each client's personal model: its own, with its group's latest aggregates."""
        tasks = []
        for c in clients:
            cfg: dict = {}
            if self.outcome is not None:
                cfg["trial_outcome"] = self.outcome
            g = int(self.labels[self.index[c]])
            down = self.pending.get(g)
            if down is None or not down.any():
                tasks.append(ClientTask(c, None, 0, {**cfg, "layers": []}))
            else:
                tasks.append(
                    ClientTask(c, self.group_models[g], 0, {**cfg, "layers": self._layers(down)})
                )
        return tasks

    # ------------------------------------------------------------------ aggregate
    def aggregate_fit(self, rnd: int, results: list[ClientResult]) -> AggregateStats:
        metrics = {
            "comm_round": float(self._comm_round),
            "trial": 0.0,
            "split_accepted": math.nan,
            "layers_aggregated": 0.0,
            "rdp_detected": 0.0,
            "rdp_earliest": math.nan,
        }
        self._la = []
        flops, self._planned_flops = self._planned_flops, 0.0
        if self.trial is not None:
            flops += self._aggregate_trial(rnd, results, metrics)
        elif self._warmup(rnd):
            flops += self._aggregate_warmup(rnd, results, metrics)
        else:
            flops += self._aggregate_groups(rnd, results, metrics)
            self._observe_loss(results)
        detected, earliest = self._maybe_schedule_trial(rnd)
        if detected:
            metrics.update(rdp_detected=1.0, rdp_earliest=float(earliest))
        metrics.update(
            la_updates=float(len(self._la)),
            la_low_layers=float(sum(low for low, _ in self._la)) if self._la else math.nan,
            la_min_ratio=min(ratio for _, ratio in self._la) if self._la else math.nan,
        )
        metrics.update(
            groups=float(len(np.unique(self.labels))),
            gamma_tilde=self.gamma_tilde,
            smoothed_loss=(
                float(smoothed_losses(self.losses, self.params.loss_window)[-1])
                if self.losses
                else math.nan
            ),
            curvature_radius=self.radii[-1] if self.radii else math.nan,
        )
        return AggregateStats(flops=flops, metrics=metrics)

    def _store(self, result: ClientResult, weights: np.ndarray, mask: np.ndarray) -> None:
        row = self.view[self.index[result.client_id]]
        elem = self.layout.mask(mask)
        row[elem] = weights[elem]

    def _observe_loss(self, results: list[ClientResult]) -> None:
        losses = [r.extra["loss"] for r in results if r.extra.get("loss") is not None]
        if not self.dynamic_active or not losses:
            return
        self.losses.append(float(np.mean(losses)))
        self.radii = curvature_radii(self.losses, self.params.loss_window).tolist()

    def _aggregate_warmup(self, rnd: int, results, metrics) -> float:
        uploads = [r for r in results if r.weights is not None]
        d = self.layout.size
        flops = 0.0
        if uploads:
            for r in uploads:
                self._store(r, r.weights, self.all_layers)
            self.weights = weighted_average(
                [r.weights for r in uploads], [r.num_samples for r in uploads]
            )
            idx = [self.index[r.client_id] for r in uploads]
            disc = discrepancy_matrix(
                np.stack([r.weights for r in uploads]), self.layout, self.params.scaling_eq3
            )
            self.disc_sum[np.ix_(idx, idx)] += disc
            self.disc_count[np.ix_(idx, idx)] += 1
            m = len(uploads)
            flops = (
                aggregation_flops(d, m)
                + SCALE_OPS_PER_ELEMENT * d * m
                + L1_OPS_PER_ELEMENT * d * m * (m - 1) / 2
            )
            metrics["layers_aggregated"] = float(self.layout.num_layers)
        self.group_models = {0: self.weights.copy()}
        self.pending = {0: self.all_layers.copy()}
        self._observe_loss(results)
        if rnd == self.params.warmup_rounds - 1:
            flops += self._form_groups(rnd, uploads)
        return flops

    def _form_groups(self, rnd: int, uploads: list[ClientResult]) -> float:
        """End of the warm-up: Eq. 3 averaged over T_start rounds -> group graph -> groups."""
        if np.any(self.disc_count + np.eye(len(self.ids)) == 0):
            raise RuntimeError(
                f"{self.name}: some client pairs never uploaded together in the "
                f"warm-up, so their discrepancy (Eq. 3) is unknown"
            )
        self.discrepancy = np.where(
            self.disc_count > 0, self.disc_sum / np.maximum(self.disc_count, 1), 0.0
        )
        self.z, self.gamma_global = group_graph(self.discrepancy)
        self.gamma_tilde = 1.0 if self.params.dynamic else self.params.fixed_gamma_tilde
        labels = groups_at(self.z, self.gamma_global, self.gamma_tilde)
        return self._sync_structure(
            rnd, labels, cast("dict[int, np.ndarray]", {r.client_id: r.weights for r in uploads})
        )

    def _sync_structure(
        self, rnd: int, labels: np.ndarray, full_uploads: dict[int, np.ndarray]
    ) -> float:
        """Adopt ``labels``; every group's model is the average of its members' full uploads
        (their server view when missing), its layer intervals come from Eq. 5-6, and its
        aggregation schedule starts next round."""
        self.labels = labels
        self.group_models, self.intervals, self.formed, self.pending = {}, {}, {}, {}
        flops = 0.0
        for g in np.unique(labels):
            g = int(g)
            members = self._members(labels, g)
            self.group_models[g] = self._view_average(members)
            flops += aggregation_flops(self.layout.size, len(members))  # alone too
            self.formed[g] = rnd + 1
            if len(members) == 1:
                continue
            self.pending[g] = self.all_layers.copy()
            present = [c for c in members if c in full_uploads]
            flops += self._update_intervals(g, [full_uploads[c] for c in present])
        return flops

    def _update_intervals(self, g: int, member_weights: list[np.ndarray]) -> float:
        p = self.params
        if not p.layerwise or not member_weights:
            self.intervals[g] = np.full(self.layout.num_layers, p.tau_rounds, dtype=np.int64)
            return 0.0
        disc = layer_discrepancy(
            np.stack(member_weights), self.group_models[g], self.layout, p.scaling_eq5
        )
        self.intervals[g] = layer_intervals(disc, p.tau_rounds, p.alpha, p.low_ratio)
        mean = float(disc.mean())
        self._la.append(
            (
                int(np.sum(self.intervals[g] > p.tau_rounds)),
                float(disc.min() / mean) if mean > 0 else math.nan,
            )
        )
        m, d = len(member_weights), self.layout.size
        return float(
            (SCALE_OPS_PER_ELEMENT + L1_OPS_PER_ELEMENT) * d * m + SCALE_OPS_PER_ELEMENT * d
        )

    def _aggregate_groups(self, rnd: int, results, metrics) -> float:
        by_group: dict[int, list[ClientResult]] = {}
        for r in results:
            if r.weights is not None:
                by_group.setdefault(int(self.labels[self.index[r.client_id]]), []).append(r)
        self.pending = {}
        flops = 0.0
        for g, rs in sorted(by_group.items()):
            due = layers_due(rnd, self.formed[g], self.intervals[g])
            for r in rs:
                self._store(r, cast(np.ndarray, r.weights), due)  # rs: the uploads
            elem = self.layout.mask(due)
            avg = weighted_average(
                [cast(np.ndarray, r.weights)[elem] for r in rs], [r.num_samples for r in rs]
            )
            self.group_models[g][elem] = avg
            self.pending[g] = due
            flops += aggregation_flops(int(elem.sum()), len(rs))
            metrics["layers_aggregated"] += float(due.sum())
            if due.all():  # a full synchronisation: refresh Eq. 5-6
                flops += self._update_intervals(
                    g, cast("list[np.ndarray]", [r.weights for r in rs])
                )
        return flops

    def _aggregate_trial(self, rnd: int, results, metrics) -> float:
        assert self.trial is not None  # called only in a trial round
        new_labels, new_gamma = self.trial
        self.trial = None
        loss_old = float(np.mean([r.extra["loss_old"] for r in results]))
        loss_new = float(np.mean([r.extra["loss_new"] for r in results]))
        accept = trial_accepts(loss_old, loss_new)
        uploads = {}
        for r in results:
            if r.weights is None:  # alone in both structures: nothing uploaded
                continue
            w = (
                r.weights
                if accept or r.extra.get("weights_old") is None
                else r.extra["weights_old"]
            )
            uploads[r.client_id] = w
            self._store(r, w, self.all_layers)
        metrics.update(
            trial=1.0, split_accepted=float(accept), layers_aggregated=float(self.layout.num_layers)
        )
        if accept:
            self.gamma_tilde = new_gamma
            self.losses, self.radii = [], []  # a new RDP starts
            if len(np.unique(new_labels)) == len(self.ids):
                self.dynamic_active = False  # everyone alone: nothing left to split
        else:
            self.hold_until = rnd + 1 + self.params.hold_rounds
        self.outcome = "new" if accept else "old"
        return self._sync_structure(rnd, new_labels if accept else self.labels, uploads)

    def _maybe_schedule_trial(self, rnd: int) -> tuple[bool, bool]:
        """Schedule a trial for the next round when the RDP has ended; (detected, whether
        no minimum of r was seen before the detection: :func:`rdp_end_unseen`)."""
        p = self.params
        if (
            not self.dynamic_active
            or self.z is None
            or self.trial is not None
            or rnd + 1 < self.hold_until
            or rnd + 1 < p.warmup_rounds
        ):
            return False, False
        if not rdp_ended(self.radii, p.observe_rounds):
            return False, False
        earliest = rdp_end_unseen(self.radii, p.loss_window, p.observe_rounds)
        cand = next_split(self.z, self.gamma_global, self.gamma_tilde, p.gamma_step, self.labels)
        if cand is None:
            self.dynamic_active = False
        else:
            self.trial = cand
        return True, earliest


class NoLAServer(DCPFLServer):
    name = "dcpfl_nola"
    Params = NoLAParams


class NoDCServer(DCPFLServer):
    name = "dcpfl_nodc"
    Params = NoDCParams


# ================================================================== client


def train_loss(ctx: ClientContext) -> tuple[float, float]:
    """(mean cross-entropy of ``ctx.model`` on the client's training data, FLOPs of that
    forward pass), the FLOPs counted once per data size and reused."""
    n = int(ctx.y_train.shape[0])
    cost = ctx.costs.get(n, "train-loss")
    if cost is None:
        counter = FlopCounterMode(display=False)
        with counter:
            _, loss = evaluate(ctx.model, ctx.x_train, ctx.y_train)
        cost = StepCost(float(counter.get_total_flops()), 0)
        ctx.costs.put(n, cost, "train-loss")
    else:
        _, loss = evaluate(ctx.model, ctx.x_train, ctx.y_train)
    return loss, cost.flops


def _merge(
    local: np.ndarray, group: np.ndarray | None, layout: ModelLayout, layers: list[int] | None
) -> np.ndarray:
    """The local model with ``layers`` (all if None) taken from the group model."""
    if group is None or (layers is not None and len(layers) == 0):
        return local
    if layers is None:
        return group.copy()
    out = local.copy()
    elem = layout.mask(layers)
    out[elem] = group[elem]
    return out


class DCPFLClient(ClientAlgorithm):
    name = "dcpfl"
    Params = DCPFLParams
    params: DCPFLParams

    def _local(self, ctx: ClientContext, config: dict) -> np.ndarray:
        """The client's own model, after applying a trial outcome the server announced."""
        outcome = config.get("trial_outcome")
        if "weights_old" in ctx.state and outcome is not None:
            old = ctx.state.pop("weights_old")
            if outcome == "old":
                ctx.state["weights"] = old
        own = ctx.state.get("weights")
        return ctx.init_weights.copy() if own is None else own

    def _result(
        self, ctx, weights, up, loss_extra, trace, flops, steps, peak, mean_loss, start
    ) -> ClientResult:
        return ClientResult(
            client_id=ctx.client_id,
            weights=weights if up else None,
            upload_nbytes=up,
            num_samples=int(ctx.y_train.shape[0]),
            train_loss=mean_loss,
            trace=tuple(trace),
            flops=flops,
            steps=steps,
            peak_memory_bytes=peak,
            host_seconds=time.perf_counter() - start,
            extra=loss_extra,
        )

    def _split(self, ctx: ClientContext) -> tuple[ClientContext, ClientContext | None]:
        """(the context it trains on, the held-out context its trial losses are measured
        on; None with trial_loss: train). The held-out samples are drawn once, at the
        client's first round, and kept in its state."""
        if self.params.trial_loss != "heldout":
            return ctx, None
        n = int(ctx.y_train.shape[0])
        held = ctx.state.get("heldout_index")
        if held is None:
            k = min(max(1, int(round(self.params.heldout_fraction * n))), n - 1)
            held = np.sort(torch.randperm(n, generator=ctx.generator)[:k].numpy())
            ctx.state["heldout_index"] = held
        mask = np.ones(n, dtype=bool)
        mask[held] = False
        keep = torch.from_numpy(np.flatnonzero(mask))
        idx = torch.from_numpy(np.asarray(held))
        return (
            dataclasses.replace(ctx, x_train=ctx.x_train[keep], y_train=ctx.y_train[keep]),
            dataclasses.replace(ctx, x_train=ctx.x_train[idx], y_train=ctx.y_train[idx]),
        )

    def fit(self, ctx: ClientContext, task: ClientTask) -> ClientResult:
        start = time.perf_counter()
        cfg = task.config
        local = self._local(ctx, cfg)
        ctx, held = self._split(ctx)
        if cfg.get("trial"):
            return self._fit_trial(ctx, task, local, start, held)
        model = _merge(local, task.weights, ctx.layout, cfg.get("download_layers"))
        set_flat(ctx.model, ctx.layout, model)
        trace: list = []
        flops = 0.0
        if task.download_nbytes:
            trace.append(Download(task.download_nbytes, "layers"))
        loss = None
        if cfg.get("report_loss"):
            loss, loss_flops = train_loss(ctx)
            flops += loss_flops
            trace += [Compute(loss_flops, 0, "loss"), Upload(LOSS_REPORT_NBYTES, "loss")]
        stats = local_sgd(ctx, cost_key=self.name)
        flops += stats.flops
        trace.append(Compute(stats.flops, stats.steps))
        weights = get_flat(ctx.model, ctx.layout)
        ctx.state["weights"] = weights
        up_layers = cfg.get("upload_layers") or []
        up = ctx.layout.nbytes_of_layers(up_layers) if up_layers else 0
        if up:
            trace.append(Upload(up, "layers"))
        return self._result(
            ctx,
            weights,
            up,
            {"loss": loss},
            trace,
            flops,
            stats.steps,
            stats.peak_memory_bytes,
            stats.mean_loss,
            start,
        )

    def _fit_trial(
        self,
        ctx: ClientContext,
        task: ClientTask,
        local: np.ndarray,
        start: float,
        held: ClientContext | None = None,
    ) -> ClientResult:
        """Download the old and the new group model, train each, report both losses (on
        the training data, or on ``held`` with trial_loss: heldout), wait for the server's
        decision, then upload the model trained from the structure it chose (a client
        alone in both structures trains its own model once and uploads nothing)."""
        cfg = task.config
        trace: list = []
        if task.weights is None:
            candidates = [local]
        else:
            candidates = [task.weights]
            trace.append(Download(cfg["old_nbytes"], "group model"))
        if cfg.get("trial_weights") is not None:
            candidates.append(cfg["trial_weights"])
            trace.append(Download(cfg["new_nbytes"], "trial group model"))
        shuffle = ctx.generator.get_state()
        trained, losses = [], []
        flops, steps, peak, mean_loss = 0.0, 0, 0, 0.0
        for w in candidates:
            ctx.generator.set_state(shuffle)  # the same mini-batches for both models
            set_flat(ctx.model, ctx.layout, w)
            stats = local_sgd(ctx, cost_key=self.name)
            loss, loss_flops = train_loss(held if held is not None else ctx)
            trace += [Compute(stats.flops, stats.steps), Compute(loss_flops, 0, "loss")]
            trained.append(get_flat(ctx.model, ctx.layout))
            losses.append(loss)
            flops += stats.flops + loss_flops
            steps += stats.steps
            peak = max(peak, stats.peak_memory_bytes)
            mean_loss = stats.mean_loss
        trace.append(Upload(LOSS_REPORT_NBYTES * 2, "loss"))
        up = ctx.layout.nbytes if cfg.get("upload_layers") else 0
        if up:  # the server decides once every client's losses are in; then the upload
            trace += [
                Barrier("trial_decision"),
                Download(DECISION_NBYTES, "trial_decision"),
                Upload(up, "model"),
            ]
        new = trained[-1]
        old = trained[0] if len(trained) == 2 else None
        ctx.state["weights"] = new
        if old is not None:
            ctx.state["weights_old"] = old
        extra = {"loss_old": losses[0], "loss_new": losses[-1], "weights_old": old}
        return self._result(ctx, new, up, extra, trace, flops, steps, peak, mean_loss, start)

    def evaluate(self, ctx: ClientContext, task: ClientTask) -> tuple[float, float]:
        local = self._local(ctx, task.config)
        model = _merge(local, task.weights, ctx.layout, task.config.get("layers", []))
        set_flat(ctx.model, ctx.layout, model)
        return evaluate(ctx.model, ctx.x_test, ctx.y_test)


class NoLAClient(DCPFLClient):
    name = "dcpfl_nola"
    Params = NoLAParams


class NoDCClient(DCPFLClient):
    name = "dcpfl_nodc"
    Params = NoDCParams


#: registered as ``dcpfl`` (:data:`mecsim.registry.ALGORITHMS`)
DCPFL = (DCPFLServer, DCPFLClient)

#: registered as ``dcpfl_nola`` (:data:`mecsim.registry.ALGORITHMS`)
DCPFL_NOLA = (NoLAServer, NoLAClient)

#: registered as ``dcpfl_nodc`` (:data:`mecsim.registry.ALGORITHMS`)
DCPFL_NODC = (NoDCServer, NoDCClient)
