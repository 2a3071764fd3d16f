"""The rectangular area clients move in, and its border rule: specular reflection.

Every mobility model moves its clients inside an axis-aligned rectangle
``[x_min_m, x_max_m] × [y_min_m, y_max_m]`` (metres, borders included). A model that
could step outside (Gauss–Markov, random walk) runs its motion in the unbounded plane and
the position is *folded* back into the rectangle: per axis, with ``L = hi − lo``,

    r = (u − lo) mod 2L,    x = lo + r          if r ≤ L
                            x = lo + 2L − r     otherwise

which is exactly the path of a point that bounces off the borders like a billiard ball
(angle of incidence = angle of reflection), however many times it bounces in one step.
Random waypoint needs no rule: its waypoints are inside the rectangle and a straight line
between two points of a rectangle stays in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Area:
    """An axis-aligned rectangle in metres, borders included."""

    x_min_m: float
    y_min_m: float
    x_max_m: float
    y_max_m: float

    def __post_init__(self) -> None:
        values = (self.x_min_m, self.y_min_m, self.x_max_m, self.y_max_m)
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"area: every bound must be a finite number of metres, got {values}")
        if not (self.x_max_m > self.x_min_m and self.y_max_m > self.y_min_m):
            raise ValueError(
                "area: x_max_m must exceed x_min_m and y_max_m must exceed y_min_m, got "
                f"x [{self.x_min_m:g}, {self.x_max_m:g}], y [{self.y_min_m:g}, {self.y_max_m:g}]"
            )

    @classmethod
    def of_size(cls, width_m: float, height_m: float) -> Area:
        """``[0, width_m] × [0, height_m]``."""
        return cls(0.0, 0.0, float(width_m), float(height_m))

    @property
    def width_m(self) -> float:
        return self.x_max_m - self.x_min_m

    @property
    def height_m(self) -> float:
        return self.y_max_m - self.y_min_m

    @property
    def low_m(self) -> FloatArray:
        return np.array([self.x_min_m, self.y_min_m])

    @property
    def size_m(self) -> FloatArray:
        return np.array([self.width_m, self.height_m])

    def contains(self, points_m: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Per point (the last axis is x, y): inside the rectangle, borders included
        (NaN is outside)."""
        p = np.asarray(points_m, dtype=np.float64)
        x, y = p[..., 0], p[..., 1]
        inside: npt.NDArray[np.bool_] = (
            (x >= self.x_min_m) & (x <= self.x_max_m) & (y >= self.y_min_m) & (y <= self.y_max_m)
        )
        return inside

    def fold(self, unfolded_m: FloatArray) -> FloatArray:
        """Positions of the unbounded plane folded into the rectangle (the reflection
        rule of the module docstring); the last axis is x, y."""
        low, size = self.low_m, self.size_m
        r = np.mod(unfolded_m - low, 2.0 * size)
        folded: FloatArray = low + np.where(r > size, 2.0 * size - r, r)
        return folded
