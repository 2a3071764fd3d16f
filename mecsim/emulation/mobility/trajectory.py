"""Positions on a time grid: ``positions_m[i, k]`` is client ``i``'s position (x, y in
metres) at emulated time ``t_k = k · step_s``, ``k = 0 .. T − 1``.

Stored as float32, ``(n, T, 2)``: 10,000 clients over 1,000 steps are 80 MB (float32
keeps positions of a 10 km area to ~1 mm). Between grid points a client moves in a
straight line (:meth:`Trajectory.position_at` interpolates linearly); after the last grid
point it stays where it was (held), before 0 there is no position.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]

#: grid times within this fraction of a step of each other are the same time (a horizon
#: of 10 s at 0.1 s steps is 100 steps, not 101 because 10 / 0.1 = 100.00000000000001)
_GRID_TOLERANCE = 1e-9


def grid_points(horizon_s: float, step_s: float) -> int:
    """How many grid points cover ``[0, horizon_s]`` at ``step_s``: ``ceil(horizon/step)
    + 1`` (the last point at or just after the horizon)."""
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a positive number of seconds, got {step_s!r}")
    if not (math.isfinite(horizon_s) and horizon_s >= 0):
        raise ValueError(f"horizon_s must be a finite number of seconds >= 0, got {horizon_s!r}")
    return math.ceil(horizon_s / step_s - _GRID_TOLERANCE) + 1


class Trajectory:
    """Every client's position on the grid ``t_k = k · step_s``.

    ``positions_m`` is float32 ``(n, T, 2)``; it may be a read-only view (a static
    model's is one position broadcast over the grid, no memory per step).
    """

    def __init__(self, positions_m: Float32Array, step_s: float) -> None:
        if positions_m.dtype != np.float32 or positions_m.ndim != 3 or positions_m.shape[2] != 2:
            raise ValueError(
                "positions_m must be a float32 array of shape (clients, grid points, 2), got "
                f"{positions_m.dtype} {positions_m.shape}"
            )
        if positions_m.shape[1] < 1:
            raise ValueError("positions_m needs at least one grid point")
        if not (math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"step_s must be a positive number of seconds, got {step_s!r}")
        self.positions_m = positions_m
        self.step_s = float(step_s)

    @property
    def n_clients(self) -> int:
        return int(self.positions_m.shape[0])

    @property
    def n_points(self) -> int:
        """T, the number of grid points (``T − 1`` steps)."""
        return int(self.positions_m.shape[1])

    @property
    def end_s(self) -> float:
        """The last grid time, ``(T − 1) · step_s``: positions are held after it."""
        return (self.n_points - 1) * self.step_s

    def times_s(self) -> FloatArray:
        """The grid times ``k · step_s`` (float64)."""
        return np.arange(self.n_points, dtype=np.float64) * self.step_s

    def _index(self, t_s: float) -> tuple[int, float]:
        """(k, w): t lies between grid points k and k + 1, at the fraction w of the step
        (w = 0 and k = T − 1 at or after the end)."""
        if not math.isfinite(t_s) or t_s < 0:
            raise ValueError(f"t_s must be a finite time >= 0 (s), got {t_s!r}")
        last = self.n_points - 1
        x = t_s / self.step_s
        if x >= last - _GRID_TOLERANCE:
            return last, 0.0
        k = int(math.floor(x))
        return k, x - k

    def position_at(self, t_s: float) -> FloatArray:
        """Every client's position at emulated time ``t_s`` (float64, ``(n, 2)``):
        linear between the two grid points around it, ``(1 − w) p_k + w p_{k+1}`` with
        ``w = t/step − k``; the last grid point's position at or after the end."""
        k, w = self._index(t_s)
        p = self.positions_m[:, k].astype(np.float64)
        if w > 0.0:
            p += w * (self.positions_m[:, k + 1].astype(np.float64) - p)
        return p

    def piece_bounds(self, t0_s: float, t1_s: float) -> FloatArray:
        """The times cutting ``[t0_s, t1_s]`` into the pieces of the grid: ``t0_s``,
        every grid time strictly between, ``t1_s`` (after the grid's end the rest is one
        piece: nobody moves). The engine takes a link's rate as constant over a piece."""
        if not (math.isfinite(t1_s) and t1_s >= t0_s):
            raise ValueError(f"need t0_s <= t1_s, got {t0_s!r}, {t1_s!r}")
        k0, _ = self._index(t0_s)
        inside = np.arange(k0 + 1, self.n_points, dtype=np.float64) * self.step_s
        eps = _GRID_TOLERANCE * self.step_s
        inside = inside[(inside > t0_s + eps) & (inside < t1_s - eps)]
        bounds: FloatArray = np.concatenate([[t0_s], inside, [t1_s]])
        return bounds
