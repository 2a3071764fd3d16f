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
``--tolerance``) and ``benchmarks/dcpfl_table.py`` both use it.

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


def trailing_mean(values: Sequence[float], window: int) -> np.ndarray:
    """Mean of the last ``min(window, k)`` values at each position k (1-based)."""
    x = np.asarray(values, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(x)])
    k = np.arange(1, len(x) + 1)
    lo = np.maximum(0, k - window)
    return (c[k] - c[lo]) / (k - lo)


def convergence_round(accuracy: Sequence[float], window: int = WINDOW_ROUNDS,
                      tol: float = TOLERANCE) -> int:
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


def to_convergence(rows: Sequence[Mapping[str, Any]], window: int = WINDOW_ROUNDS,
                   tol: float = TOLERANCE) -> dict[str, float]:
    """The table's columns for one run's round rows (see the module docstring)."""
    if not rows:
        raise ValueError("no rounds")
    acc = [float(r["mean_accuracy"]) for r in rows]
    r_conv = convergence_round(acc, window, tol)
    upto = rows[: r_conv + 1]
    return {
        "final_accuracy": final_accuracy(acc, window),
        "convergence_round": float(r_conv),
        "training_rounds": float(len(upto)),
        "comm_rounds": float(sum(_is_comm_round(r) for r in upto)),
        "comm_time_s": float(sum(_seconds(r, "dl_time_s") + _seconds(r, "ul_time_s")
                                 + _seconds(r, "backhaul_time_s") for r in upto)),
        "compute_time_s": float(sum(_seconds(r, "client_time_s") for r in upto)),
        "total_time_s": float(upto[-1]["elapsed_s"]),
        "bytes_total": float(sum(float(r["bytes_up"]) + float(r["bytes_down"]) for r in upto)),
    }
