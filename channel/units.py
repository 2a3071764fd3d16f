"""Power and gain unit conversions (numpy-vectorised).

``dBm = 10·log10(P / 1 mW)``, ``dB = 10·log10(x)``. Scalars in give numpy scalars out;
arrays in give arrays out.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["db_to_linear", "dbm_to_w", "linear_to_db", "w_to_dbm"]


def db_to_linear(db: ArrayLike) -> np.ndarray:
    """``x = 10^(dB/10)``."""
    return np.power(10.0, np.asarray(db, dtype=float) / 10.0)


def linear_to_db(x: ArrayLike) -> np.ndarray:
    """``dB = 10·log10(x)``; ``x = 0`` gives ``-inf`` (no warning)."""
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.asarray(x, dtype=float))


def dbm_to_w(dbm: ArrayLike) -> np.ndarray:
    """``P_W = 10^((dBm − 30)/10)``: 30 dBm = 1 W, 0 dBm = 1 mW."""
    return np.power(10.0, (np.asarray(dbm, dtype=float) - 30.0) / 10.0)


def w_to_dbm(w: ArrayLike) -> np.ndarray:
    """``dBm = 10·log10(P_W) + 30``; 0 W gives ``-inf`` (no warning)."""
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.asarray(w, dtype=float)) + 30.0
