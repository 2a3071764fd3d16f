"""The mathematics of KAPC+BLS's bidirectional layer selection: how many leading layers
a client uploads (T. Algorithm 4 with the criterion of Eq. 29), as pure functions.

Zhi et al., IEEE TMC 2024, Sec. 5-6 ("T."). The bounds B^l (Eq. 30) and tau^l (Eq. 31),
M(Omega) of Eq. 27, the criterion of Eq. 29 (:func:`criterion_log_lhs`, in logs), the
search of Algorithm 4 (:func:`search_omega`), the whole of Algorithm 4 for one client's
selection (:func:`algorithm4`, its state between selections in :class:`BlsClientState`)
and the client FLOPs of that selection (:func:`selection_flops`). The client class that
calls them is :class:`mecsim.agents.algorithms.kapc.KapcBlsClient`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from mecsim.agents.algorithms.parameter_coaching import ParamView


def layer_norms(p: np.ndarray, view: ParamView) -> np.ndarray:
    """B^l = ||w^l||_F (T. Eq. 30) for every layer."""
    return np.array(
        [
            float(np.linalg.norm(view.layer(p, layer).astype(np.float64)))
            for layer in range(view.num_layers)
        ]
    )


def log_m(tau: np.ndarray, b: np.ndarray, n_cols: np.ndarray, omega: int) -> float:
    """log M(Omega) of T. Eq. 27:
    M(Omega) = tau^Omega / (2 B^Omega) + sum_{k=1}^{Omega-1} tau^{Omega-k}
               prod_{j=1}^{k} sqrt(n^{Omega+1-j}) / (2 B^{Omega-k}),
    i.e. sum over layers l <= Omega of tau^l / (2 B^l) * prod_{i=l+1}^{Omega} sqrt(n^i);
    M = M(L). (Arrays are indexed from 0 for layer 1.) Zero bounds B are floored at 1e-12."""
    tau = np.asarray(tau, dtype=np.float64)[:omega]
    b = np.maximum(np.asarray(b, dtype=np.float64)[:omega], 1e-12)
    half_log_n = 0.5 * np.log(np.asarray(n_cols, dtype=np.float64)[:omega])
    # prod_{i=l+1}^{omega} sqrt(n^i): suffix sums of the half logs, excluding layer l itself
    suffix = np.concatenate([np.cumsum(half_log_n[::-1])[::-1][1:], [0.0]])
    with np.errstate(divide="ignore"):
        terms = np.log(tau) - np.log(2.0 * b) + suffix
    return float(np.logaddexp.reduce(terms)) if len(terms) else -np.inf


@dataclass(frozen=True)
class BlsConstants:
    """The data- and model-dependent constants of T. Eq. 23-29 for one client."""

    n_cols: np.ndarray  # n^l, columns of layer l's weight
    out_dim: np.ndarray  # d^l, output width of layer l
    classes: int  # c_i
    samples: int  # m_i
    rho: float = 1.0
    input_bound: float = 1.0  # A_i
    delta: float = 0.05
    loss_range: float = math.log(10.0)  # b - a
    confidence_term: bool = False


def criterion_log_lhs(
    omega: int,
    tau_hat: np.ndarray,
    b_hat: np.ndarray,
    tau: np.ndarray,
    b: np.ndarray,
    k: BlsConstants,
) -> float:
    """log of the left side of T. Eq. 29 divided by its right side, so that the layer
    selection criterion holds iff the result is < 0:

        L d_Omega M^(Omega) / (Omega c 2^(L-Omega) M)  <  prod_{l=Omega+1}^{L} B^l     (29)

    M^(Omega) is built from the partial bounds (tau_hat, b_hat), M = M(L) and the product
    from the full bounds (tau, b). With ``k.confidence_term`` the second term of Eq. 28 is
    kept, i.e. Definition 1 with Theorems 3-4 in full:
    (L - Omega) * 3 (b-a) sqrt(ln(2/delta) / (2 m)) / (Omega * 2 sqrt(2) rho A / sqrt(m)
    * c 2^L prod_{l<=L} B^l M) is added to the left side of (29) divided by its right side
    (derived from L E_partial < Omega E_full, with E the bounds of Eq. 23 and Eq. 26).
    """
    n_layers = len(b)
    if not 1 <= omega <= n_layers:
        raise ValueError(f"Omega={omega} outside [1, {n_layers}]")
    log_b = np.log(np.maximum(np.asarray(b, dtype=np.float64), 1e-12))
    log_m_full = log_m(tau, b, k.n_cols, n_layers)
    if log_m_full == -np.inf:  # no regulariser bound known (tau = 0): (29) is undefined;
        return math.inf  # we read it as "not satisfied", so more layers go up
    main = (
        math.log(n_layers * k.out_dim[omega - 1])
        + log_m(tau_hat, b_hat, k.n_cols, omega)
        - math.log(omega * k.classes)
        - (n_layers - omega) * math.log(2.0)
        - log_m_full
        - float(log_b[omega:].sum())
    )
    if not k.confidence_term or omega == n_layers:
        return float(main)
    gap = 3.0 * k.loss_range * math.sqrt(math.log(2.0 / k.delta) / (2.0 * k.samples))
    lip = 2.0 * math.sqrt(2.0) * k.rho * k.input_bound / math.sqrt(k.samples)
    second = (
        math.log((n_layers - omega) * gap)
        - math.log(omega * lip * k.classes)
        - n_layers * math.log(2.0)
        - float(log_b.sum())
        - log_m_full
    )
    return float(np.logaddexp(main, second))


def search_omega(
    omega_prev: int, holds: Callable[[int], bool], n_layers: int, as_written: bool = False
) -> int:
    """T. Algorithm 4 lines 15-24: start from last round's Omega; if the criterion holds,
    decrease Omega while it still holds; otherwise increase Omega until it holds.

    Written literally, the decreasing loop ("repeat Omega <- Omega - 1 until (29) is not
    satisfied") returns the first Omega that FAILS the criterion (``as_written=True``).
    By default we return the last one that satisfies it (the smallest Omega of the run),
    since the criterion is what makes an upload of Omega layers acceptable (Definition
    1). The increasing loop stops at L if no Omega satisfies it (L never does strictly
    when the bounds are current: both sides of (29) are then equal); Omega stays in [1, L].
    """
    omega = min(max(int(omega_prev), 1), n_layers)
    if holds(omega):
        if as_written:
            while omega > 1:
                omega -= 1
                if not holds(omega):
                    break
            return omega
        while omega > 1 and holds(omega - 1):
            omega -= 1
        return omega
    while omega < n_layers:
        omega += 1
        if holds(omega):
            return omega
    return n_layers


@dataclass
class BlsClientState:
    """What T. Algorithm 4 keeps for a client between its selections."""

    n_layers: int
    times_selected: int = 0  # q
    omega: int = 0  # Omega of the last selection (0: never selected)
    # b_full: B^l, full-layer parameter bounds; tau_full: tau^l, full-layer regulariser
    # bounds. None (the default) only until __post_init__ (cast: arrays from then on)
    b_full: np.ndarray = field(default=cast(np.ndarray, None))
    tau_full: np.ndarray = field(default=cast(np.ndarray, None))

    def __post_init__(self) -> None:
        # Alg. 4 line 2: "initialize B^l = 0 and tau^l = 0" — once, for the client's first
        # selection (re-initialising every call would make line 6's max meaningless)
        if self.b_full is None:
            self.b_full = np.zeros(self.n_layers)
        if self.tau_full is None:
            self.tau_full = np.zeros(self.n_layers)


def algorithm4(
    state: BlsClientState,
    b_now: np.ndarray,
    tau_now: np.ndarray,
    k: BlsConstants,
    as_written: bool = False,
    withheld: int | None = None,
    evaluations: list[int] | None = None,
) -> int:
    """T. Algorithm 4 (with Algorithm 6 line 7): the number of leading layers to upload.

    ``withheld`` (``omega_policy: withhold_last``): a repeat selection uploads L - withheld
    layers (at least 1) instead of searching Eq. 29; the bounds are kept as below.

    ``evaluations``: if given, ``evaluations[0]`` is increased by the number of times
    inequality (29) was evaluated (for :func:`selection_flops`).

    ``b_now`` = Eq. 30 of the trained parameters; ``tau_now`` = Eq. 31 for the layers whose
    regulariser the client received this round, NaN for the others.

    * first selection, or last round's upload was full (Omega = L): the full bounds become
      max(stored, current) and Omega = L - 1 (lines 3-9); a layer without a regulariser
      this round keeps its stored tau;
    * otherwise the partial bounds are the current ones (tau of a layer not received: the
      stored one, "estimated with the staled information") and the full bounds the stored
      ones (lines 10-14), and Omega is searched from last round's value (lines 15-24).
    """
    L = state.n_layers
    b_now = np.asarray(b_now, dtype=np.float64)
    tau_now = np.asarray(tau_now, dtype=np.float64)
    if state.times_selected == 0 or state.omega == L:
        state.b_full = np.maximum(state.b_full, b_now)
        state.tau_full = np.fmax(state.tau_full, tau_now)  # NaN (not received) keeps stored
        omega = max(L - 1, 1)
    elif withheld is not None:
        omega = min(max(L - withheld, 1), L)
    else:
        tau_hat = np.where(np.isnan(tau_now), state.tau_full, tau_now)
        b_full, tau_full = state.b_full, state.tau_full

        def holds(om: int) -> bool:
            if evaluations is not None:
                evaluations[0] += 1
            return criterion_log_lhs(om, tau_hat, b_now, tau_full, b_full, k) < 0.0

        omega = search_omega(state.omega, holds, L, as_written)
    state.omega = omega
    state.times_selected += 1
    return omega


#: FLOPs of one evaluation of inequality (29) per layer of the model: log M(L) and log
#: M(Omega) (a log, a scaled log, a suffix sum and a log-add-exp per layer: about 5 + 5),
#: the logs of the bounds and their tail sum (2); scalar work, negligible beside the norms
CRITERION_FLOPS_PER_LAYER = 12


def selection_flops(
    layer_numel: np.ndarray,
    tau_layers: Sequence[int],
    criterion_evaluations: int,
    input_elements: int = 0,
) -> float:
    """Client FLOPs of T. Algorithm 4 as :class:`KapcBlsClient` computes it, charged as
    client computation (the paper attributes KAPC+BLS's longer client time to it):

    * B^l = ||w^l||_F for every layer (Eq. 30): a multiply and an add per element and a
      square root -> sum_l (2 n_l + 1);
    * tau^l = ||w^l - s^l||_F for the layers coached towards a received s^l (Eq. 31): a
      subtraction more per element -> sum_{l received} (3 n_l + 1);
    * each evaluation of inequality (29): ``CRITERION_FLOPS_PER_LAYER`` L (none under
      ``omega_policy: withhold_last``, which does not search);
    * the input bound A_i = max ||x|| (Eq. 23), once per client (its first selection):
      2 FLOPs per input element (``input_elements``; 0 when already known).
    """
    numel = np.asarray(layer_numel, dtype=np.float64)
    norms = float((2.0 * numel + 1.0).sum())
    taus = float(sum(3.0 * numel[int(layer)] + 1.0 for layer in tau_layers))
    criterion = float(criterion_evaluations * CRITERION_FLOPS_PER_LAYER * len(numel))
    return norms + taus + criterion + 2.0 * float(input_elements)
