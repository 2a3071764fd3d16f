"""Synthetic mobility models, vectorised over clients: static, random waypoint,
Gauss–Markov and random walk (docs/mobility-models.md).

Each model is a small state machine that fills the grid ``t_k = k · step_s`` one step
at a time (:meth:`MobilityModel.advance`), so a run can ask for more grid points later
and get the same positions as if it had asked for them at once. Every random number comes
from one :class:`numpy.random.Generator` of the mobility's own stream of the scenario
seed (:func:`mobility_rng`), drawn in client order: the same seed gives the same
positions, on every backend.

Motion between the model's own events (a waypoint reached, a pause over, a new speed and
direction) is a straight line at constant speed, computed exactly in float64; only the
grid positions are stored (float32). The border rule is the area's reflection
(:mod:`mecsim.emulation.mobility.area`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np
import numpy.typing as npt

from mecsim.emulation.mobility.area import Area, FloatArray
from mecsim.emulation.mobility.trajectory import Float32Array, Trajectory, grid_points

#: the scenario seed's stream for mobility draws ("MOB"); the network's streams are 2-4,
#: faults' 7, the 38.901 large-scale draws' 0x38901
MOBILITY_STREAM = 0x4D4F42

#: event times within this fraction of a step of a grid time are that grid time
_EPS = 1e-9


def mobility_rng(seed: int) -> np.random.Generator:
    """The generator of every mobility draw of a run with scenario seed ``seed``."""
    return np.random.default_rng([seed, MOBILITY_STREAM])


def _pair(
    name: str, value: float | tuple[float, float], *, low: float, strict: bool
) -> tuple[float, float]:
    """``value`` as ``(lo, hi)``: a number is ``(v, v)``; each bound finite and above
    ``low`` (at or above when not ``strict``), ``lo <= hi``."""
    lo, hi = (value, value) if isinstance(value, (int, float)) else value
    lo, hi = float(lo), float(hi)
    for v in (lo, hi):
        ok = math.isfinite(v) and (v > low if strict else v >= low)
        if not ok:
            raise ValueError(f"{name}: must be {'>' if strict else '>='} {low:g}, got {v!r}")
    if lo > hi:
        raise ValueError(f"{name}: the pair [lo, hi] has lo {lo:g} > hi {hi:g}")
    return lo, hi


def _positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a positive finite number, got {value!r}")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    return float(value)


class MobilityModel(ABC):
    """Clients starting at ``initial_m`` (``(n, 2)``, metres, inside ``area``), moving on
    the grid of ``step_s``. :meth:`advance` fills the next grid points."""

    def __init__(self, initial_m: npt.ArrayLike, area: Area, step_s: float) -> None:
        initial = np.array(initial_m, dtype=np.float64)
        if initial.ndim != 2 or initial.shape[1] != 2:
            raise ValueError(f"initial positions must have shape (clients, 2), got {initial.shape}")
        outside = np.flatnonzero(~area.contains(initial))
        if outside.size:
            i = int(outside[0])
            raise ValueError(
                f"initial position of client {i} ({initial[i, 0]:g}, {initial[i, 1]:g}) m is "
                f"outside the area x [{area.x_min_m:g}, {area.x_max_m:g}], "
                f"y [{area.y_min_m:g}, {area.y_max_m:g}] ({outside.size} clients outside)"
            )
        self.initial_m = initial
        self.area = area
        self.step_s = _positive("step_s", step_s)
        self.n_clients = int(initial.shape[0])
        self._grid = 0  # index of the last grid point filled (0: the initial positions)

    @abstractmethod
    def advance(self, out: Float32Array) -> None:
        """Fill ``out[:, j]`` (``(n, m, 2)``) with the positions at the next ``m`` grid
        points, ``t = (g + 1 + j) · step_s`` after the last one filled ``g``."""


def trajectory(model: MobilityModel, horizon_s: float) -> Trajectory:
    """The model's positions on the grid over ``[0, horizon_s]``: float32 ``(n, T, 2)``
    with ``T = ceil(horizon_s / step_s) + 1``, from the model's first grid point."""
    if model._grid != 0:
        raise ValueError("trajectory() needs a fresh model (this one has advanced already)")
    n_points = grid_points(horizon_s, model.step_s)
    if isinstance(model, Static):
        # one position per client, broadcast over the grid: no memory per step
        first = model.initial_m.astype(np.float32)
        view = np.broadcast_to(first[:, None, :], (model.n_clients, n_points, 2))
        return Trajectory(view, model.step_s)
    out = np.empty((model.n_clients, n_points, 2), dtype=np.float32)
    out[:, 0] = model.initial_m
    model.advance(out[:, 1:])
    return Trajectory(out, model.step_s)


class Static(MobilityModel):
    """Nobody moves: every grid point is the initial position."""

    def advance(self, out: Float32Array) -> None:
        out[:] = self.initial_m[:, None, :]
        self._grid += out.shape[1]


class RandomWaypoint(MobilityModel):
    """Random waypoint (Johnson & Maltz 1996; Camp, Boleng & Davies 2002, §2.2).

    From its position at t = 0 each client picks a waypoint uniform over the area and a
    speed ``v ~ U[speed_mps]``, goes there in a straight line (arriving after
    ``|w − p| / v``), pauses ``~ U[pause_s]``, then picks the next waypoint and speed.
    Events are exact within a step (a client may arrive, pause and leave again between
    two grid points). The slowest speed must be above 0 (with speeds down to 0 the mean
    speed decays over the run: Yoon, Liu & Noble 2003).
    """

    def __init__(
        self,
        initial_m: npt.ArrayLike,
        area: Area,
        step_s: float,
        rng: np.random.Generator,
        *,
        speed_mps: float | tuple[float, float],
        pause_s: float | tuple[float, float] = 0.0,
    ) -> None:
        super().__init__(initial_m, area, step_s)
        self.speed_mps = _pair("speed_mps", speed_mps, low=0.0, strict=True)
        self.pause_s = _pair("pause_s", pause_s, low=0.0, strict=False)
        self.rng = rng
        n = self.n_clients
        self._pos = self.initial_m.copy()
        self._target = np.empty((n, 2))
        self._speed = np.empty(n)
        self._pause_left = np.zeros(n)
        self._moving = np.ones(n, dtype=bool)
        self._new_legs(np.arange(n))

    def _new_legs(self, idx: npt.NDArray[np.intp]) -> None:
        """Clients ``idx`` (ascending) pick their next waypoint and speed."""
        k = idx.size
        self._target[idx] = self.area.low_m + self.rng.random((k, 2)) * self.area.size_m
        self._speed[idx] = self.rng.uniform(self.speed_mps[0], self.speed_mps[1], k)
        self._moving[idx] = True

    def advance(self, out: Float32Array) -> None:
        eps = _EPS * self.step_s
        for j in range(out.shape[1]):
            left = np.full(self.n_clients, self.step_s)  # time left in this step
            while True:
                active = np.flatnonzero(left > eps)
                if active.size == 0:
                    break
                # 1. pausing clients spend their pause (or the step)
                pausing = active[~self._moving[active]]
                if pausing.size:
                    spent = np.minimum(self._pause_left[pausing], left[pausing])
                    self._pause_left[pausing] -= spent
                    left[pausing] -= spent
                    over = pausing[self._pause_left[pausing] <= eps]
                    self._pause_left[over] = 0.0
                    self._new_legs(over)
                # 2. moving clients travel toward their waypoint (or to the step's end)
                moving = active[self._moving[active] & (left[active] > eps)]
                if moving.size == 0:
                    continue
                delta = self._target[moving] - self._pos[moving]
                dist = np.hypot(delta[:, 0], delta[:, 1])
                t_arrive = dist / self._speed[moving]
                arrive = t_arrive <= left[moving] + eps
                on = moving[~arrive]
                frac = (left[on] / t_arrive[~arrive])[:, None]
                self._pos[on] += frac * delta[~arrive]
                left[on] = 0.0
                there = moving[arrive]
                self._pos[there] = self._target[there]
                left[there] = np.maximum(left[there] - t_arrive[arrive], 0.0)
                self._moving[there] = False
                self._pause_left[there] = self.rng.uniform(
                    self.pause_s[0], self.pause_s[1], there.size
                )
            out[:, j] = self._pos
            self._grid += 1


class _LegModel(MobilityModel):
    """Motion in legs of ``interval_s``: during leg ``k`` (``[k τ, (k + 1) τ)``) every
    client moves in a straight line at the velocity :meth:`_next_velocity` gave it at the
    leg's start, in the unbounded plane; the grid position is that folded into the area
    (reflection). Leg changes between grid points are exact."""

    def __init__(
        self, initial_m: npt.ArrayLike, area: Area, step_s: float, interval_s: float
    ) -> None:
        super().__init__(initial_m, area, step_s)
        self.interval_s = _positive("interval_s", interval_s)
        self._unfolded = self.initial_m.copy()
        self._t = 0.0
        self._leg = 0
        self._velocity: FloatArray = np.zeros((self.n_clients, 2))

    @abstractmethod
    def _next_velocity(self) -> FloatArray:
        """The velocity (m/s, ``(n, 2)``) of leg ``self._leg`` for every client."""

    def _start(self) -> None:
        self._velocity = self._next_velocity()

    def advance(self, out: Float32Array) -> None:
        tau = self.interval_s
        for j in range(out.shape[1]):
            self._grid += 1
            t_next = self._grid * self.step_s
            while (self._leg + 1) * tau <= t_next + _EPS * self.step_s:
                t_change = (self._leg + 1) * tau
                self._unfolded += self._velocity * (t_change - self._t)
                self._t = t_change
                self._leg += 1
                self._velocity = self._next_velocity()
            self._unfolded += self._velocity * (t_next - self._t)
            self._t = t_next
            out[:, j] = self.area.fold(self._unfolded)


class GaussMarkov(_LegModel):
    """Gauss–Markov (Liang & Haas 1999; Camp, Boleng & Davies 2002, §2.5).

    Every ``update_interval_s`` = Δt each client's speed and direction are updated

        s_n = α s_{n−1} + (1 − α) s̄ + sqrt(1 − α²) σ_s w_n
        d_n = α d_{n−1} + (1 − α) d̄ + sqrt(1 − α²) σ_d w'_n

    with ``w, w'`` independent standard normal draws; during ``[nΔt, (n+1)Δt)`` it moves
    at ``max(s_n, 0)`` in direction ``d_n`` (Camp et al.'s
    ``x_n = x_{n−1} + s_{n−1} cos d_{n−1} Δt``). α = 1 keeps the speed and direction, α = 0
    draws them afresh each update (``N(s̄, σ_s²)``, ``N(d̄, σ_d²)``); the stationary
    standard deviations are σ_s and σ_d for every α. It starts at ``s_0 = s̄``,
    ``d_0 = d̄``; ``d̄`` is ``mean_direction_rad`` or, when None, each client's own draw
    ``U[0, 2π)``. The process runs in the unbounded plane; the area folds it (reflection
    also mirrors the direction and its mean, so nobody sticks to a border).
    """

    def __init__(
        self,
        initial_m: npt.ArrayLike,
        area: Area,
        step_s: float,
        rng: np.random.Generator,
        *,
        mean_speed_mps: float,
        alpha: float,
        speed_std_mps: float,
        direction_std_rad: float,
        mean_direction_rad: float | None = None,
        update_interval_s: float = 1.0,
    ) -> None:
        super().__init__(initial_m, area, step_s, update_interval_s)
        if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
            raise ValueError(f"alpha: must be in [0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self.mean_speed_mps = _non_negative("mean_speed_mps", mean_speed_mps)
        self.speed_std_mps = _non_negative("speed_std_mps", speed_std_mps)
        self.direction_std_rad = _non_negative("direction_std_rad", direction_std_rad)
        self.rng = rng
        n = self.n_clients
        if mean_direction_rad is None:
            self.mean_direction_rad = rng.uniform(0.0, 2.0 * math.pi, n)
        else:
            if not math.isfinite(mean_direction_rad):
                raise ValueError(f"mean_direction_rad: must be finite, got {mean_direction_rad!r}")
            self.mean_direction_rad = np.full(n, float(mean_direction_rad))
        self._speed = np.full(n, self.mean_speed_mps)
        self._direction = self.mean_direction_rad.copy()
        self._start()

    def _next_velocity(self) -> FloatArray:
        if self._leg > 0:  # leg 0 moves at s_0 = s̄, d_0 = d̄
            a = self.alpha
            noise = math.sqrt(max(1.0 - a * a, 0.0))
            w_speed = self.rng.standard_normal(self.n_clients)
            w_direction = self.rng.standard_normal(self.n_clients)
            self._speed = (
                a * self._speed
                + (1 - a) * self.mean_speed_mps
                + noise * self.speed_std_mps * w_speed
            )
            self._direction = (
                a * self._direction
                + (1 - a) * self.mean_direction_rad
                + noise * self.direction_std_rad * w_direction
            )
        speed = np.maximum(self._speed, 0.0)
        velocity: FloatArray = np.stack(
            [speed * np.cos(self._direction), speed * np.sin(self._direction)], axis=1
        )
        return velocity


class RandomWalk(_LegModel):
    """Random walk (Camp, Boleng & Davies 2002, §2.1): every ``interval_s`` each client
    draws a direction ``U[0, 2π)`` and a speed ``U[speed_mps]`` and walks in a straight
    line until the next change, a leg of ``speed · interval_s`` metres; reflection at the
    border."""

    def __init__(
        self,
        initial_m: npt.ArrayLike,
        area: Area,
        step_s: float,
        rng: np.random.Generator,
        *,
        speed_mps: float | tuple[float, float],
        interval_s: float,
    ) -> None:
        super().__init__(initial_m, area, step_s, interval_s)
        self.speed_mps = _pair("speed_mps", speed_mps, low=0.0, strict=False)
        self.rng = rng
        self._start()

    def _next_velocity(self) -> FloatArray:
        n = self.n_clients
        direction = self.rng.uniform(0.0, 2.0 * math.pi, n)
        speed = self.rng.uniform(self.speed_mps[0], self.speed_mps[1], n)
        velocity: FloatArray = np.stack(
            [speed * np.cos(direction), speed * np.sin(direction)], axis=1
        )
        return velocity
