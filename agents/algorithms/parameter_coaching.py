"""The mathematics of KAPC (knowledge-aware parameter coaching): the relation cube and
the personalised regulariser it weights, as pure functions.

Zhi et al., AAAI 2024 ("A.") and IEEE TMC 2024 Sec. 4 ("T."). The server and client
classes that use them are in :mod:`mecsim.agents.algorithms.kapc`; the layer selection of
KAPC+BLS is in :mod:`mecsim.agents.algorithms.layer_selection`.

* the layer view: a model's trainable parameters as one vector, grouped into the layers
  that R, mu and Omega are indexed by (:func:`param_view`, :func:`layer_groups`);
* the relation cube R (client x layer x client): row normalisation, the objective
  f(r_i) of A. Eq. 10, its gradient (A. Eq. 11-12) and E_r steps of it
  (:func:`update_relations`), the self-relationship filter of T. Algorithm 3;
* the personalised regulariser s_i^l = sum_j r_ij^l w_j^l (A. Eq. 14) and the coaching
  loss lam * sum_l ||w_i^l - s_i^l||^2 (A. Eq. 15);
* the server's FLOPs for one round (:func:`kapc_server_flops`).

Server FLOPs are counted analytically (:func:`kapc_server_flops`), per round, for what
this code computes:

* Gram matrices of the selected clients' layers, G^l = X^l X^l^T (X^l: K x n_l):
  K(K+1)/2 distinct inner products of 2 n_l FLOPs each -> K(K+1) * sum_l n_l;
* E_r gradient steps: per client and layer G r (2K^2) and 7K element-wise operations
  (subtract g_i, scale by 2 lam, r - 1/N, scale by beta, add, scale by lr, subtract)
  -> E_r * K * L * (2K^2 + 7K);
* normalisations, 3 FLOPs per entry (clamp, sum, divide): the slice before and after
  the steps and the K written-back rows of N -> K * L * (6K + 3N);
* s_i: one multiply and one add per element per contributing client, for the layers
  sent to client i -> sum_i sum_{l sent to i} 2 K n_l (FedAvg's count is 2 |w| K).

Storing the uploads costs no FLOPs. For 10 selected ResNet18 clients (P = 11.17 M
parameters) this is about 1.23 + 2.23 = 3.46 GFLOPs per round with full downloads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from mecsim.agents.models import BYTES_PER_ELEMENT, ModelLayout

# =========================================================================== layer view


@dataclass(frozen=True)
class ParamView:
    """The trainable parameters of a model as one vector P, grouped by layer.

    ``index`` holds the positions of the parameter elements in the flat state vector of
    :mod:`mecsim.agents.models` (buffers such as BatchNorm running statistics are left out);
    layer l occupies ``P[bounds[l]:bounds[l + 1]]``. ``out_dim`` (d^l) and ``in_cols``
    (n^l) describe each layer's weight as a matrix (rows = outputs, columns =
    weight.numel() / rows: in_features for Linear, in_channels * kh * kw for Conv2d, 1
    for a BatchNorm's per-channel scale), as BLS's bounds need (T. Eq. 23).
    """

    index: np.ndarray
    bounds: np.ndarray
    out_dim: np.ndarray
    in_cols: np.ndarray
    param_slots: tuple[tuple[str, tuple[int, ...], int, int], ...]  # name, shape, P-offset, layer

    @property
    def num_layers(self) -> int:
        return len(self.bounds) - 1

    @property
    def size(self) -> int:
        return int(self.bounds[-1])

    def numel(self) -> np.ndarray:
        return np.diff(self.bounds)

    def extract(self, flat: np.ndarray) -> np.ndarray:
        """P (float32) from a flat model state."""
        return np.asarray(flat, dtype=np.float32)[self.index]

    def layer(self, p: np.ndarray, layer: int) -> np.ndarray:
        return p[self.bounds[layer] : self.bounds[layer + 1]]

    def select(self, p: np.ndarray, layers: Sequence[int]) -> np.ndarray:
        """The elements of the given layers of P, concatenated in layer order (what is sent)."""
        parts = [self.layer(p, int(layer)) for layer in sorted(layers)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=p.dtype)

    def nbytes(self, layers: Sequence[int]) -> int:
        """Bytes on the air for the parameters of these layers."""
        numel = self.numel()
        return int(sum(int(numel[int(layer)]) for layer in set(layers))) * BYTES_PER_ELEMENT

    def split(self, compact: np.ndarray, layers: Sequence[int]) -> dict[int, np.ndarray]:
        """Inverse of :meth:`select`: layer -> its part of ``compact``."""
        out, at, numel = {}, 0, self.numel()
        for layer in sorted(layers):
            n = int(numel[int(layer)])
            out[int(layer)] = compact[at : at + n]
            at += n
        if at != len(compact):
            raise ValueError(
                f"{len(compact)} elements received for layers {sorted(layers)}, which hold {at}"
            )
        return out


LAYER_GROUPINGS = ("conv_bn", "module")


def layer_groups(layout: ModelLayout, grouping: str = "conv_bn") -> np.ndarray:
    """The KAPC layer of every parameterised module of ``layout`` (one entry per module).

    ``module``: every parameterised module is a layer (a BatchNorm is a layer of its own:
    ResNet18 has 41). ``conv_bn``: a BatchNorm directly after a Conv or Linear module
    belongs to that module's layer (ResNet18: 21 layers, the 17 + 3 shortcut convolutions
    and the FC, the count the KAPC+BLS paper's Fig. 8 implies); models without BatchNorm
    are the same under both.
    """
    if grouping not in LAYER_GROUPINGS:
        raise ValueError(f"unknown layer grouping {grouping!r}; known: {LAYER_GROUPINGS}")
    groups = np.zeros(layout.num_layers, dtype=np.int64)
    g = -1
    for m, kind in enumerate(layout.layer_kinds):
        merge = (
            grouping == "conv_bn"
            and m > 0
            and kind.startswith("BatchNorm")
            and layout.layer_kinds[m - 1].startswith(("Conv", "Linear"))
        )
        if not merge:
            g += 1
        groups[m] = g
    return groups


def param_view(layout: ModelLayout, grouping: str = "module") -> ParamView:
    """The trainable parameters of ``layout`` grouped into KAPC layers (:func:`layer_groups`).

    ``out_dim`` / ``in_cols`` of a layer describe the weight of its first module (the Conv
    or Linear of a conv_bn group)."""
    group_of = layer_groups(layout, grouping)
    n_groups = int(group_of.max()) + 1 if len(group_of) else 0
    index: list[np.ndarray] = []
    slots = []
    counts = np.zeros(n_groups, dtype=np.int64)
    out_dim = np.ones(n_groups, dtype=np.int64)
    in_cols = np.ones(n_groups, dtype=np.int64)
    shaped = np.zeros(n_groups, dtype=bool)
    last_layer, at = -1, 0
    for s in layout.slots:
        if not s.is_param:
            continue
        layer = int(group_of[s.layer])
        if layer < last_layer:
            raise ValueError(
                f"parameters of layer {layer} ({s.name}) come after layer "
                f"{last_layer}: layers must be contiguous in the flat state"
            )
        last_layer = layer
        index.append(np.arange(s.offset, s.offset + s.numel))
        slots.append((s.name, s.shape, at, layer))
        at += s.numel
        counts[layer] += s.numel
        if s.name.endswith("weight") and len(s.shape) >= 1 and not shaped[layer]:
            out_dim[layer] = s.shape[0]
            in_cols[layer] = max(1, s.numel // s.shape[0])
            shaped[layer] = True
    if np.any(counts == 0):
        raise ValueError("every layer needs trainable parameters for KAPC")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return ParamView(np.concatenate(index), bounds, out_dim, in_cols, tuple(slots))


# =========================================================================== relation cube


def normalise_rows(r: np.ndarray, method: str = "clamp", temperature: float = 1.0) -> np.ndarray:
    """Normalise the last axis of ``r`` (one row = one client's relation to the others on
    one layer). ``clamp``: negatives -> 0, divide by the sum, uniform if the sum is 0.
    ``softmax``: softmax(r / temperature)."""
    r = np.asarray(r, dtype=np.float64)
    if method == "softmax":
        z = r / temperature
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        return z / z.sum(axis=-1, keepdims=True)
    if method != "clamp":
        raise ValueError(f"unknown normalisation {method!r}; known: clamp, softmax")
    pos = np.maximum(r, 0.0)
    total = pos.sum(axis=-1, keepdims=True)
    uniform = np.full_like(pos, 1.0 / r.shape[-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, pos / np.where(total > 0, total, 1.0), uniform)


def relation_objective(
    r_i: np.ndarray, grams: np.ndarray, i: int, lam: float, beta: float, n_clients: int
) -> float:
    """f(r_i) of A. Eq. 10: lam * sum_l ||sum_j r_ij^l w_j^l - w_i^l||^2 + beta/2 ||r_i - 1/N||^2,
    from the Gram matrices G^l_jk = <w_j^l, w_k^l> (r_i: L x K, grams: L x K x K; ``i``:
    client i's position in the slice)."""
    quad = np.einsum("lj,ljk,lk->", r_i, grams, r_i)
    cross = np.einsum("lj,lj->", r_i, grams[:, :, i])
    const = float(grams[:, i, i].sum())
    coach = quad - 2.0 * cross + const
    return float(lam * coach + beta / 2.0 * np.sum((r_i - 1.0 / n_clients) ** 2))


def relation_gradient(
    r_i: np.ndarray, grams: np.ndarray, i: int, lam: float, beta: float, n_clients: int
) -> np.ndarray:
    """Gradient of f(r_i) (A. Eq. 11-12): 2 lam (G^l r_i^l - G^l[:, i]) + beta (r_i^l - 1/N)."""
    g_r = np.einsum("ljk,lk->lj", grams, r_i)
    return 2.0 * lam * (g_r - grams[:, :, i]) + beta * (r_i - 1.0 / n_clients)


def update_relations(
    r_slice: np.ndarray,
    grams: np.ndarray,
    *,
    lam: float,
    beta: float,
    lr: float,
    steps: int,
    n_clients: int,
) -> np.ndarray:
    """E_r steps of A. Eq. 11 on every r_i of a normalised slice (K x L x K); slice row a
    belongs to the client at position a of the slice. Not normalised afterwards."""
    r = np.array(r_slice, dtype=np.float64)
    for _ in range(steps):
        grads = np.stack(
            [relation_gradient(r[a], grams, a, lam, beta, n_clients) for a in range(r.shape[0])]
        )
        r = r - lr * grads  # all r_i from the same W^k: Jacobi order, as Eq. 9 stacks them
    return r


def self_relation_filter(self_relation: np.ndarray, mu: float) -> np.ndarray:
    """T. Algorithm 3: layer l of s_i is sent unless r_ii^l > mu (True = send)."""
    return ~(np.asarray(self_relation) > mu)


def personalised_regulariser(
    r_i: np.ndarray, layer_stacks: Sequence[np.ndarray], layers: Sequence[int]
) -> list[np.ndarray]:
    """s_i^l = sum_j r_ij^l w_j^l (A. Eq. 14, T. Eq. 15/34) for the given layers;
    ``layer_stacks[l]`` is the K x n_l matrix of the slice's parameters of layer l."""
    return [r_i[layer] @ layer_stacks[layer] for layer in layers]


def kapc_server_flops(
    k: int, n_clients: int, layer_numel: np.ndarray, steps: int, sent: np.ndarray
) -> float:
    """Analytic server FLOPs of one round (see the module docstring).

    ``layer_numel``: n_l per layer; ``sent``: K x L booleans, layer l of s_i sent to the
    client at slice position i."""
    numel = np.asarray(layer_numel, dtype=np.float64)
    n_layers = len(numel)
    gram = k * (k + 1) * numel.sum()
    relation = steps * k * n_layers * (2 * k * k + 7 * k)
    normalisation = k * n_layers * (6 * k + 3 * n_clients)
    regulariser = 2.0 * k * float((np.asarray(sent, dtype=np.float64) @ numel).sum())
    return float(gram + relation + normalisation + regulariser)


# =========================================================================== coaching loss


def coaching_pairs(
    model: nn.Module, view: ParamView, received: dict[int, np.ndarray]
) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """(parameter, its target s) for every parameter tensor of the received layers."""
    params = dict(model.named_parameters())
    pairs = []
    for name, shape, at, layer in view.param_slots:
        if layer not in received:
            continue
        start = at - int(view.bounds[layer])
        n = int(np.prod(shape)) if shape else 1
        target = torch.from_numpy(
            np.array(received[layer][start : start + n], dtype=np.float32)
        ).view(shape)
        pairs.append((params[name], target))
    return pairs


def coaching_loss(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], lam: float) -> torch.Tensor:
    """lam * sum_l f_s(s_i^l, w_i^l), f_s = squared L2 distance (A. Eq. 15; T. Eq. 16)."""
    # cast: a tensor, pairs being never empty (sum's start 0 is for mypy a possible int)
    return cast(torch.Tensor, lam * sum((p - t).pow(2).sum() for p, t in pairs))
