"""Final accuracy and "time to convergence" of a run, as DC-PFL's Tables I-II report them.

The paper reports each method's figures "when training converges" without saying how
convergence is detected. mecsim's definition, applied to the per-round mean user accuracy
``a(t)`` (rounds without an evaluation are skipped):

- **final accuracy** ``A`` = the mean of ``a`` over the last ``window`` evaluated rounds;
- the trailing mean ``m(t)`` = the mean of ``a`` over the last ``min(window, k)``
  evaluated rounds up to t (k: evaluations so far);
- the **convergence round** ``R`` = the first evaluated round from which ``m(t) >= A - tol``
  holds at every later evaluated round ("reached its final accuracy and stayed there");
- up to and including ``R``: the **communication rounds** (rounds in which model weights
  were sent: the algorithm's ``comm_round`` column where it has one, else any bytes
  sent), the **communication time** (sum of the emulated download, upload and backhaul
  time of the rounds' critical paths, ``dl_time_s + ul_time_s + backhaul_time_s``), the
  **computation time**
  (``client_time_s``) and the **total time** (emulated ``elapsed_s`` at the end of ``R``).

This is the one definition: ``mecsim report``'s DC-PFL table (``--window``,
``--tolerance``) and ``benchmarks/papers/dcpfl_table.py`` both use it.

"Converged" compares a run with its own end, so it favours a run that stops improving
early, and a run whose accuracy peaks and falls back "converges" where it is already
falling. The fair comparison of methods is **to a common target accuracy**
(:func:`to_target`): the rounds, communication rounds, emulated times and bytes until a
run's mean user accuracy first reaches the same target as every other method's;
:func:`common_target` picks the highest target (in whole accuracy points) that every
run reaches at the end of its trailing mean.

Defaults: ``window = 5`` rounds, ``tol = 0.01`` (one accuracy point). A run that is still
improving at its end converges late by this definition; its figures are then those of
the whole run, which is the honest reading of a truncated run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

WINDOW_ROUNDS = 5
TOLERANCE = 0.01


def _evaluated(accuracy: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    acc = np.asarray(accuracy, dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(acc))
    if len(idx) == 0:
        raise ValueError("no evaluated round (every accuracy is NaN)")
    return idx, acc[idx]


def final_accuracy(accuracy: Sequence[float], window: int = WINDOW_ROUNDS) -> float:
    """Mean accuracy over the last ``window`` evaluated rounds."""
    if window < 1:
        raise ValueError("window must be >= 1")
    _, acc = _evaluated(accuracy)
    return float(acc[-window:].mean())


def trailing_mean(values: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``min(window, k)`` values at each position k (1-based)."""
    x = np.asarray(values, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(x)])
    k = np.arange(1, len(x) + 1)
    lo = np.maximum(0, k - window)
    return (c[k] - c[lo]) / (k - lo)


def convergence_round(
    accuracy: Sequence[float], window: int = WINDOW_ROUNDS, tol: float = TOLERANCE
) -> int:
    """The round index R of the module docstring (an index into ``accuracy``)."""
    if tol < 0:
        raise ValueError("tol must be >= 0")
    idx, acc = _evaluated(accuracy)
    target = final_accuracy(accuracy, window) - tol
    below = np.flatnonzero(trailing_mean(acc, window) < target)
    first_ok = 0 if len(below) == 0 else int(below[-1]) + 1
    return int(idx[min(first_ok, len(idx) - 1)])


def _seconds(row: Mapping[str, Any], key: str) -> float:
    """A time column of a round row; 0 where the run has no such phase (absent or NaN)."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return 0.0
    return float(value)


def _is_comm_round(row: Mapping[str, Any]) -> bool:
    flag = row.get("comm_round")
    if flag is not None and not (isinstance(flag, float) and math.isnan(flag)):
        return bool(flag)
    return float(row["bytes_up"]) + float(row["bytes_down"]) > 0


def _upto(rows: Sequence[Mapping[str, Any]], last: int) -> dict[str, float]:
    """Communication rounds, times and bytes of ``rows[:last + 1]``."""
    upto = rows[: last + 1]
    return {
        "training_rounds": float(len(upto)),
        "comm_rounds": float(sum(_is_comm_round(r) for r in upto)),
        "comm_time_s": float(
            sum(
                _seconds(r, "dl_time_s") + _seconds(r, "ul_time_s") + _seconds(r, "backhaul_time_s")
                for r in upto
            )
        ),
        "compute_time_s": float(sum(_seconds(r, "client_time_s") for r in upto)),
        "total_time_s": float(upto[-1]["elapsed_s"]),
        "bytes_total": float(sum(float(r["bytes_up"]) + float(r["bytes_down"]) for r in upto)),
    }


def to_target(rows: Sequence[Mapping[str, Any]], target: float) -> dict[str, float]:
    """Up to the first evaluated round whose mean user accuracy is >= ``target``: its
    index (``target_round``), the rounds, communication rounds, communication, computation
    and total emulated time, and bytes (up + down) until then; NaN everywhere when the
    run never reaches it."""
    keys = (
        "target_round",
        "training_rounds",
        "comm_rounds",
        "comm_time_s",
        "compute_time_s",
        "total_time_s",
        "bytes_total",
    )
    for k, r in enumerate(rows):
        a = float(r["mean_accuracy"])
        if math.isfinite(a) and a >= target:
            return {"target_round": float(k), **_upto(rows, k)}
    return dict.fromkeys(keys, math.nan)


def common_target(final_accuracies: Sequence[float], step: float = 0.01) -> float:
    """The highest multiple of ``step`` at or below every run's final accuracy: a target
    every run reached (at least at the end of its trailing mean)."""
    finite = [a for a in final_accuracies if math.isfinite(a)]
    if not finite:
        raise ValueError("no run has a final accuracy")
    return math.floor(min(finite) / step + 1e-9) * step


def to_convergence(
    rows: Sequence[Mapping[str, Any]], window: int = WINDOW_ROUNDS, tol: float = TOLERANCE
) -> dict[str, float]:
    """The table's columns for one run's round rows (see the module docstring), with the
    best trailing-mean accuracy of the run (``best_accuracy``): above the final one when
    the run's accuracy fell back after a peak."""
    if not rows:
        raise ValueError("no rounds")
    acc = [float(r["mean_accuracy"]) for r in rows]
    r_conv = convergence_round(acc, window, tol)
    _, evaluated = _evaluated(acc)
    return {
        "final_accuracy": final_accuracy(acc, window),
        "best_accuracy": float(trailing_mean(evaluated, window).max()),
        "convergence_round": float(r_conv),
        **_upto(rows, r_conv),
    }
