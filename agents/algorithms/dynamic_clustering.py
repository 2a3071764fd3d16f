"""The mathematics of DC-PFL's dynamic clustering (Liu et al.), as pure functions.

What the server computes to group its clients and decide when to split a group:

* the model discrepancy of Eq. 3, D_ij = |S(w_i) - S(w_j)|_1 / dim(w) with the min-max
  scaling S, and the layer discrepancies and aggregation intervals of Eq. 5-6
  (:func:`discrepancy_matrix`, :func:`layer_discrepancy`, :func:`layer_intervals`);
* the hierarchical group graph of Sec. III-B: average-linkage clustering of the
  discrepancies, and the groups at a threshold (:func:`group_graph`, :func:`groups_at`,
  :func:`next_split`);
* the end of the rapid-decrease period (Sec. III-C, Eq. 4): the smoothed loss, its radius
  of curvature, and when the radius stops decreasing (:func:`curvature_radii`,
  :func:`rdp_ended`); the trial's verdict (:func:`trial_accepts`).

The choices where the paper is not explicit are listed in
:mod:`mecsim.agents.algorithms.dcpfl`, whose server and client classes call these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from mecsim.agents.models import ModelLayout

SCALE_OPS_PER_ELEMENT = 4  # min, max, subtract, divide
L1_OPS_PER_ELEMENT = 3  # subtract, abs, add


# ============================================================== Eq. 3 and 5: discrepancy


SCALINGS = ("model", "layer", "shared_model", "shared_layer")
Scaling = Literal["model", "layer", "shared_model", "shared_layer"]


def minmax_scale(w: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """``S(w) = (w - min) / (max - min)`` in float64, with ``w``'s own min and max unless
    given; a constant vector (max == min) scales to 0."""
    w = np.asarray(w, dtype=np.float64)
    if w.size == 0:
        raise ValueError("cannot scale an empty vector")
    lo = float(w.min()) if lo is None else lo
    hi = float(w.max()) if hi is None else hi
    if hi == lo:
        return np.zeros_like(w)
    return (w - lo) / (hi - lo)


def _check_scaling(scaling: str) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")


def scale_rows(rows: np.ndarray, layout: ModelLayout, scaling: str) -> np.ndarray:
    """S applied to each row (a flat state vector) of ``rows`` (float32 stays float32).

    ``model`` / ``layer``: each row with its own min and max, over the whole vector or per
    layer (Eq. 3 as printed). ``shared_model`` / ``shared_layer``: one min and max for all
    the rows compared (over the whole vector, or per layer), so the rows stay on a common
    scale.
    """
    _check_scaling(scaling)
    rows = np.atleast_2d(np.asarray(rows))
    rows = rows.astype(np.result_type(rows.dtype, np.float32), copy=False)
    if rows.shape[1] != layout.size:
        raise ValueError(f"rows must have {layout.size} columns, got {rows.shape[1]}")
    groups = (
        [[slice(0, layout.size)]]
        if scaling.endswith("model")
        else [layout.layer_slices(layer) for layer in range(layout.num_layers)]
    )
    out = np.zeros_like(rows)
    for slices in groups:
        los = np.min([rows[:, s].min(axis=1) for s in slices], axis=0)
        his = np.max([rows[:, s].max(axis=1) for s in slices], axis=0)
        if scaling.startswith("shared"):
            los, his = np.full_like(los, los.min()), np.full_like(his, his.max())
        span = his - los
        for k in np.flatnonzero(span > 0):  # a constant part scales to 0
            for s in slices:
                out[k, s] = (rows[k, s] - los[k]) / span[k]
    return out


def model_discrepancy(
    w_i: np.ndarray, w_j: np.ndarray, layout: ModelLayout, scaling: str = "model"
) -> float:
    """Eq. 3: ``|S(w_i) - S(w_j)|_1 / dim(w)`` (default S: each model by its own min and
    max over all its weights, as Eq. 3 prints it)."""
    if w_i.shape != (layout.size,) or w_j.shape != (layout.size,):
        raise ValueError(f"weights must have shape ({layout.size},)")
    s = scale_rows(np.stack([w_i, w_j]), layout, scaling)
    return float(np.abs(s[0] - s[1]).sum(dtype=np.float64) / layout.size)


def discrepancy_matrix(
    weights: np.ndarray, layout: ModelLayout, scaling: str = "model"
) -> np.ndarray:
    """Eq. 3 for every pair of rows of ``weights`` (clients x dim): symmetric, zero diagonal.
    With a ``shared_*`` scaling, the min and max are taken over all the rows."""
    weights = np.asarray(weights)
    if weights.ndim != 2 or weights.shape[1] != layout.size:
        raise ValueError(f"weights must be (clients x {layout.size}), got {weights.shape}")
    scaled = scale_rows(weights, layout, scaling)
    n = len(scaled)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            out[i, j] = out[j, i] = (
                np.abs(scaled[i] - scaled[j]).sum(dtype=np.float64) / layout.size
            )
    return out


def layer_discrepancy(
    members: np.ndarray, group_model: np.ndarray, layout: ModelLayout, scaling: str = "layer"
) -> np.ndarray:
    """Eq. 5: ``D_{g,l} = 1/m sum_i |S(w_{l,i}) - S(w^g_l)|_1 / dim(w_l)``, one per layer
    (default S: each layer of each model by its own min and max, as Eq. 5 prints it).
    With a ``shared_*`` scaling, the min and max are taken over the members and the group
    model together."""
    members = np.atleast_2d(np.asarray(members))
    if members.shape[1] != layout.size or group_model.shape != (layout.size,):
        raise ValueError("members and group model must match the layout")
    scaled = scale_rows(np.vstack([members, group_model[None]]), layout, scaling)
    diff = np.abs(scaled[:-1] - scaled[-1]).sum(axis=0, dtype=np.float64)  # over members
    numel = layout.layer_numel()
    out = np.array(
        [
            sum(diff[s].sum() for s in layout.layer_slices(layer))
            for layer in range(layout.num_layers)
        ]
    )
    return out / numel / len(members)


def layer_intervals(
    layer_disc: np.ndarray, tau_rounds: int, alpha: int, low_ratio: float = 0.1
) -> np.ndarray:
    """Eq. 6: ``alpha * tau`` for a layer with ``D_{g,l} < low_ratio * D_g``, else ``tau``;
    ``D_g`` is the mean of the group's layer discrepancies."""
    d = np.asarray(layer_disc, dtype=np.float64)
    if d.ndim != 1 or d.size == 0 or np.any(d < 0) or not np.all(np.isfinite(d)):
        raise ValueError("layer discrepancies must be a non-empty vector of finite values >= 0")
    if tau_rounds < 1 or alpha < 1:
        raise ValueError("tau_rounds and alpha must be >= 1")
    return np.where(d < low_ratio * d.mean(), alpha * tau_rounds, tau_rounds).astype(np.int64)


def layers_due(rnd: int, formed_round: int, intervals: np.ndarray) -> np.ndarray:
    """Boolean mask of the layers aggregated in round ``rnd`` by a group whose schedule
    started at ``formed_round``: layer l is due when ``(rnd - formed + 1) % tau_l == 0``."""
    if rnd < formed_round:
        raise ValueError(f"round {rnd} precedes the group's formation ({formed_round})")
    return (rnd - formed_round + 1) % np.asarray(intervals) == 0


# ================================================== Sec. III-B: hierarchical group graph


def group_graph(discrepancy: np.ndarray) -> tuple[np.ndarray, float]:
    """Average-linkage clustering of a discrepancy matrix: (linkage Z, gamma_global).

    ``gamma_global`` is the height of the last merge: the smallest threshold at which
    ``fcluster(..., criterion="distance")`` returns one group.
    """
    d = np.asarray(discrepancy, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or d.shape[0] == 0:
        raise ValueError(f"discrepancy must be a non-empty square matrix, got {d.shape}")
    if not np.all(np.isfinite(d)) or np.any(d < 0):
        raise ValueError("discrepancy must be finite and non-negative")
    if not np.allclose(d, d.T) or np.any(np.diag(d) != 0):
        raise ValueError("discrepancy must be symmetric with a zero diagonal")
    if len(d) == 1:
        return np.zeros((0, 4)), 0.0
    z = linkage(squareform(d, checks=False), method="average")
    return z, float(z[-1, 2])


def canonical(labels: Sequence[int] | np.ndarray) -> np.ndarray:
    """Relabel groups 0, 1, ... in order of their first member (a canonical partition)."""
    first: dict[int, int] = {}
    return np.array([first.setdefault(int(x), len(first)) for x in labels], dtype=np.int64)


def groups_at(z: np.ndarray, gamma_global: float, gamma_tilde: float) -> np.ndarray:
    """Canonical group labels at the normalised threshold ``gamma_tilde`` in [0, 1]."""
    if not 0.0 <= gamma_tilde <= 1.0:
        raise ValueError(f"gamma_tilde must be in [0, 1], got {gamma_tilde}")
    if len(z) == 0:
        return np.zeros(1, dtype=np.int64)
    return canonical(fcluster(z, t=gamma_tilde * gamma_global, criterion="distance"))


def next_split(
    z: np.ndarray, gamma_global: float, gamma_tilde: float, step: float, current: np.ndarray
) -> tuple[np.ndarray, float] | None:
    """The first structure below ``gamma_tilde`` (steps of ``step``) that differs from
    ``current``: (labels, new gamma_tilde), or None when no smaller threshold splits more."""
    if step <= 0:
        raise ValueError("step must be > 0")
    current = canonical(current)
    g = gamma_tilde
    while g > 0:
        g = max(0.0, round(g - step, 10))
        labels = groups_at(z, gamma_global, g)
        if not np.array_equal(labels, current):
            return labels, g
    return None


# ======================================================== Sec. III-C, Eq. 4: the RDP


def smoothed_losses(losses: Sequence[float], window: int) -> np.ndarray:
    """``l_w(t)``: the mean of the last ``min(window, t)`` losses, for every t."""
    if window < 1:
        raise ValueError("window must be >= 1")
    x = np.asarray(losses, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(x)])
    t = np.arange(1, len(x) + 1)
    lo = np.maximum(0, t - window)
    return (c[t] - c[lo]) / (t - lo)


def curvature_radii(losses: Sequence[float], window: int) -> np.ndarray:
    """Eq. 4 at every round: ``r = (1 + l'^2)^(3/2) / l''`` with ``l' = l_w(t) - l_w(t-1)``,
    ``l'' = l'(t) - l'(t-1)``; NaN before the ``max(window, 3)``-th loss, +inf where
    ``l'' <= 0``."""
    lw = smoothed_losses(losses, window)
    r = np.full(len(lw), np.nan)
    for k in range(max(window, 3) - 1, len(lw)):
        d1 = lw[k] - lw[k - 1]
        d2 = d1 - (lw[k - 1] - lw[k - 2])
        r[k] = (1.0 + d1 * d1) ** 1.5 / d2 if d2 > 0 else math.inf
    return r


def rdp_ended(radii: Sequence[float], observe_rounds: int) -> bool:
    """True when ``r(m - t_obv) < r(t')`` for every later ``t'`` up to the latest round m."""
    if observe_rounds < 1:
        raise ValueError("observe_rounds must be >= 1")
    r = np.asarray(radii, dtype=np.float64)
    if len(r) < observe_rounds + 1:
        return False
    tail = r[-(observe_rounds + 1) :]
    if np.any(np.isnan(tail)):
        return False
    return bool(np.all(tail[0] < tail[1:]))


def rdp_end_unseen(radii: Sequence[float], loss_window: int, observe_rounds: int) -> bool:
    """Did a detection (``rdp_ended`` true on ``radii``, one loss history) come without a
    minimum of r being observed? True when r(m - t_obv), the radius the rule compares the
    later ones with, is the first finite radius computed from full smoothing windows (from
    loss index ``max(s + 1, 2)`` on: before it l_w is a mean of fewer than s losses, whose
    growing window puts a kink of its own into l' and l''). Then r rose from the first
    round it was defined: the rule fired because a flattening loss makes
    r = (1 + l'^2)^1.5 / l'' ~ 1 / l'' rise, not at a knee of the loss curve."""
    r = np.asarray(radii, dtype=np.float64)
    ref = len(r) - 1 - observe_rounds
    clean_from = max(loss_window + 1, 2)
    return not bool(np.isfinite(r[clean_from : max(ref, clean_from)]).any())


def rdp_detections(
    rows: Sequence[dict], loss_window: int, observe_rounds: int
) -> list[tuple[int, bool]]:
    """(round index, unseen minimum) of every RDP-end detection in a run's round rows,
    rebuilt from the recorded ``trial``, ``split_accepted`` and ``curvature_radius``
    columns: a detection is the round before a trial round; a loss history restarts after
    an accepted split and skips trial rounds (they report no loss)."""
    out: list[tuple[int, bool]] = []
    history: list[float] = []
    for k, r in enumerate(rows):
        if float(r.get("trial", 0) or 0) == 1:
            if k > 0:
                out.append((k - 1, rdp_end_unseen(history, loss_window, observe_rounds)))
            if float(r.get("split_accepted", 0) or 0) == 1:
                history = []
            continue
        radius = r.get("curvature_radius")
        if radius is not None and not (isinstance(radius, str) and radius == ""):
            history.append(float(radius))
    return out


def trial_accepts(loss_old: float, loss_new: float) -> bool:
    """Keep the split iff ``l^{M0} > l^{M1}`` (the mean loss decreased with the new groups)."""
    return bool(loss_old > loss_new)
