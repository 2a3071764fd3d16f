"""Clients that move through a run's cells, at round granularity (docs/mobility.md,
"Handover").

At each round's start, emulated time ``t`` (the time the previous rounds took):

1. every client's position at ``t`` (:class:`ClientPositions`: the mobility model's grid,
   linear between grid points, computed as far as the run has got);
2. the distances to every site, each link's path loss at its new distance (a 3GPP
   model: each link's LOS state and shadowing where the client is, when they are
   spatially consistent, mecsim.channel.spatial; else those drawn once per run), and
   the association rule's metric (:func:`mecsim.emulation.geometry.link_metric`);
3. the association re-evaluated with A3 hysteresis and time-to-trigger
   (:func:`mecsim.emulation.geometry.a3_handover`), the condition's held time counted in
   emulated seconds between these evaluations.

The round's links then use each client's serving link at ``t`` for the whole round.

With ``geometry.handover`` (handover during a round) the A3 rule is evaluated at the
measurement times ``k · measurement_period_s`` instead, for every client, whatever the
rounds (:class:`HandoverTimeline`): a round's start takes the serving cells of the last
measurement at or before it, and a moving client's transfers follow its serving cell
during the round (:mod:`mecsim.emulation.moving_rate`).

Evaluations depend on each other (the A3 timers), so a round is evaluated after the
rounds before it; :meth:`MovingCells.at_round` keeps every round's result and answers a
round asked again from it, at whatever time (a Flower app's follow-up batches, timed
after the round's aggregation, use the cells of the round's start; a round re-executed
after an actor died starts at the same time).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mecsim.channel.pathloss import LargeScaleDraw
from mecsim.emulation.geometry import StaticCells, a3_handover, distances_m, link_metric
from mecsim.emulation.mobility import Area, Trajectory, build_model, check_trace
from mecsim.emulation.mobility.traces import NodeTrack, TraceError, TraceWarning
from mecsim.emulation.mobility.trajectory import _GRID_TOLERANCE
from mecsim.scenario import GeometryConfig, HandoverConfig
from mecsim.scenario.mobility import MobilityConfig

#: grid points computed at a time: the grid grows in blocks of this many points, so the
#: positions do not depend on how far a run (or a replay) asked for them
GRID_BLOCK = 64


class ClientPositions:
    """Every client's position at any emulated time of a run: the grid ``k · step_s`` of
    a mobility model (or a trace sampled on it), float32 as
    :class:`~mecsim.emulation.mobility.Trajectory` stores it, computed block by block as
    the run gets further; linear between grid points. At ``t = 0`` the initial positions
    themselves (float64: those the association at the start was computed from)."""

    def __init__(
        self,
        config: MobilityConfig,
        initial_m: np.ndarray,
        area: Area,
        seed: int,
        tracks: list[NodeTrack] | None = None,
        trace_end_s: float = math.inf,
    ) -> None:
        self.config = config
        self.initial_m = np.asarray(initial_m, dtype=np.float64)
        self.step_s = float(config.step_s)
        n = len(self.initial_m)
        self._tracks = tracks
        self._trace_end_s = trace_end_s
        self._warned = False
        self._model = None if tracks is not None else build_model(config, initial_m, area, seed)
        self._grid = np.empty((n, GRID_BLOCK, 2), dtype=np.float32)
        self._grid[:, 0] = self.initial_m
        self._filled = 1
        self._extend(GRID_BLOCK)

    @property
    def start_s(self) -> float:
        trace = self.config.trace
        return trace.start_s if (trace is not None and self._tracks is not None) else 0.0

    def _extend(self, points: int) -> None:
        """Fill the grid up to ``points`` points (a multiple of :data:`GRID_BLOCK`)."""
        if points <= self._filled:
            return
        if points > self._grid.shape[1]:
            # the capacity at least doubles, so that a run's growing grid is copied
            # O(log T) times, not once every block (quadratic in the run's length); the
            # points computed are the same (only those up to ``points`` are filled)
            capacity = max(points, 2 * self._grid.shape[1])
            grown = np.empty((self._grid.shape[0], capacity, 2), dtype=np.float32)
            grown[:, : self._filled] = self._grid[:, : self._filled]
            self._grid = grown
        part = self._grid[:, self._filled : points]
        if self._tracks is not None:
            times = self.start_s + np.arange(self._filled, points, dtype=np.float64) * self.step_s
            for i, track in enumerate(self._tracks):
                part[i] = track.position_at(times)
        else:
            assert self._model is not None
            self._model.advance(part)
        self._filled = points

    def _check_trace_end(self, t_s: float) -> None:
        trace = self.config.trace
        if self._tracks is None or trace is None:
            return
        needed = self.start_s + t_s
        if needed <= self._trace_end_s:
            return
        message = (
            f"{trace.path}: the trace ends at {self._trace_end_s:g} s but the run needs "
            f"positions at {needed:g} s (trace time)"
        )
        if trace.after_end == "refuse":
            raise TraceError(message + " (geometry.mobility.trace.after_end: refuse)")
        if not self._warned:
            self._warned = True
            warnings.warn(
                message + "; every node stays at its last position after the end",
                TraceWarning,
                stacklevel=3,
            )

    def at(self, t_s: float) -> np.ndarray:
        """Every client's position (m, float64 ``(n, 2)``) at emulated time ``t_s``."""
        if not (math.isfinite(t_s) and t_s >= 0):
            raise ValueError(f"t_s must be a finite time >= 0 (s), got {t_s!r}")
        self._check_trace_end(t_s)
        if t_s == 0.0:
            start: np.ndarray = self.initial_m.copy()
            return start
        need = int(math.floor(t_s / self.step_s)) + 2
        self._extend(GRID_BLOCK * math.ceil(need / GRID_BLOCK))
        out: np.ndarray = Trajectory(self._grid[:, : self._filled], self.step_s).position_at(t_s)
        return out

    def client_at(self, client: int, times_s: np.ndarray) -> np.ndarray:
        """One client's positions (m, float64 ``(m, 2)``) at the emulated times
        ``times_s``: :meth:`clients_at` of that client."""
        t = np.asarray(times_s, dtype=np.float64)
        return self.clients_at(np.full(t.shape, client, dtype=np.int64), t)

    def clients_at(self, clients: np.ndarray, times_s: np.ndarray) -> np.ndarray:
        """Positions (m, float64, ``times_s.shape + (2,)``) of client ``clients[...]``
        at emulated time ``times_s[...]`` (each >= 0; the two arrays broadcast): the
        numbers :meth:`at` gives (linear between grid points), without interpolating
        every client (a moving client's rate during a round asks for its own positions,
        piece by piece: :mod:`mecsim.emulation.moving_rate`). The grid is extended as far
        as the latest time needs."""
        t = np.asarray(times_s, dtype=np.float64)
        c = np.broadcast_to(np.asarray(clients, dtype=np.int64), t.shape)
        if t.size == 0:
            return np.empty((*t.shape, 2))
        t_max = float(t.max())
        if not (math.isfinite(t_max) and float(t.min()) >= 0):
            raise ValueError(f"times_s must be finite and >= 0 (s), got {t_max!r}")
        self._check_trace_end(t_max)
        need = int(math.floor(t_max / self.step_s)) + 2
        self._extend(GRID_BLOCK * math.ceil(need / GRID_BLOCK))
        # Trajectory.position_at, element by element
        last = self._filled - 1
        x = t / self.step_s
        held = x >= last - _GRID_TOLERANCE
        k = np.where(held, last, np.floor(x)).astype(np.int64)
        w = np.where(held, 0.0, x - k)
        p = self._grid[c, k].astype(np.float64)
        nxt = self._grid[c, np.minimum(k + 1, last)].astype(np.float64)
        out: np.ndarray = p + w[..., None] * (nxt - p)
        return out


@dataclass(frozen=True, eq=False)
class RoundCells:
    """The cells at one round's start: ``t_s``; each client's position (n, 2), serving
    edge server (n,), whether it handed over at this evaluation (n,), its distance (m)
    to the serving site and, under a 3GPP path loss, that link's LOS state and
    shadowing; ``held_s`` (n, S) the A3 timers after this evaluation; ``path_loss_db``
    (n, S) every link's path loss at the round's start under a Shannon channel (the
    association's, reused by geometric interference), else None."""

    t_s: float
    positions_m: np.ndarray
    serving: np.ndarray
    handovers: np.ndarray
    distance_m: np.ndarray
    large_scale: LargeScaleDraw | None
    held_s: np.ndarray
    path_loss_db: np.ndarray | None = None


def initial_trace_positions(
    config: MobilityConfig, n_clients: int, area: Area, base_dir: str | Path | None = None
) -> tuple[np.ndarray, list[NodeTrack], float]:
    """A trace's clients: their positions at the run's start (trace time ``start_s``),
    the node each follows, and the trace's end (s, trace time). Read and checked with
    file and line (:func:`mecsim.emulation.mobility.check_trace`)."""
    trace = check_trace(config, n_clients, area, base_dir)
    assert trace is not None and config.trace is not None
    tracks = trace.assign(n_clients, config.trace.node_map)
    t0 = np.array([config.trace.start_s])
    initial = np.array([track.position_at(t0)[0] for track in tracks], dtype=np.float64)
    return initial.reshape(-1, 2), tracks, trace.end_s


def area_of(geometry: GeometryConfig) -> Area:
    """The rectangle clients move in: the geometry's area [0, W] × [0, H]."""
    w, h = geometry.area_m()
    return Area.of_size(w, h)


#: measurement times within this fraction of a period of a time count as at it
_PERIOD_TOLERANCE = 1e-9
#: handovers a client's event table holds before it grows (doubling)
_EVENTS_BLOCK = 4


class HandoverTimeline:
    """The A3 rule evaluated at the measurement times ``t_k = k · period_s`` (k = 1, 2,
    ...) for every client, from the association at the start (t = 0), as far as a run
    asks (:meth:`advance_to`); every handover kept as an event (time, client, new site),
    so the serving cell of any client at any time already evaluated is known
    (:meth:`site_at`), however far ahead a transfer has looked. Each evaluation is
    :func:`a3_handover` with the metric at the clients' positions at t_k (each link's
    path loss there, spatially consistent LOS state and shadowing where the client is)
    and ``elapsed_s = period_s``."""

    def __init__(self, moving: MovingCells, config: HandoverConfig) -> None:
        self.moving = moving
        self.period_s = float(config.measurement_period_s)
        self.interruption_s = float(config.interruption_s)
        start = moving.cells.serving.astype(np.int64)
        n, n_sites = moving.cells.distance_m.shape
        self.serving = start.copy()  # after the last measurement evaluated
        self.held_s = np.full((n, n_sites), np.nan)
        self.measured = 0  # the last measurement evaluated (0: the start)
        self.count = np.zeros(n, dtype=np.int64)
        #: (n, cap) each client's handover times (s; inf past its count), (n, cap + 1)
        #: its serving site from the start and after each
        self.times_s = np.full((n, _EVENTS_BLOCK), np.inf)
        self.sites = np.zeros((n, _EVENTS_BLOCK + 1), dtype=np.int64)
        self.sites[:, 0] = start

    def advance_to(self, t_s: float) -> None:
        """Evaluate every measurement up to emulated time ``t_s``."""
        last = math.floor(t_s / self.period_s + _PERIOD_TOLERANCE)
        while self.measured < last:
            self._measure(self.measured + 1)

    def _measure(self, k: int) -> None:
        m = self.moving
        t = k * self.period_s
        positions = m.positions.at(t)
        d = distances_m(positions, m.cells.sites_m)
        every = m.cells.large_scale_at(positions)
        _, _, metric = link_metric(m.rule, d, m.channel, every, m.cells.groups)
        new, self.held_s = a3_handover(
            metric, self.serving, self.held_s, self.period_s, m.hysteresis, m.time_to_trigger_s
        )
        moved = np.flatnonzero(new != self.serving)
        if moved.size:
            if int(self.count[moved].max()) >= self.times_s.shape[1]:
                self._grow()
            at = self.count[moved]
            self.times_s[moved, at] = t
            self.sites[moved, at + 1] = new[moved]
            self.count[moved] += 1
        self.serving = new
        self.measured = k

    def _grow(self) -> None:
        n, cap = self.times_s.shape
        times = np.full((n, 2 * cap), np.inf)
        times[:, :cap] = self.times_s
        sites = np.zeros((n, 2 * cap + 1), dtype=np.int64)
        sites[:, : cap + 1] = self.sites
        self.times_s, self.sites = times, sites

    def site_at(self, clients: np.ndarray, t_s: np.ndarray) -> np.ndarray:
        """The serving site of client ``clients[...]`` at emulated time ``t_s[...]`` (the
        two broadcast): its site after the last handover at or before that time."""
        t = np.asarray(t_s, dtype=np.float64)
        c = np.broadcast_to(np.asarray(clients, dtype=np.int64), t.shape)
        if t.size:
            self.advance_to(float(t.max()))
        done = (self.times_s[c] <= t[..., None]).sum(axis=-1)
        out: np.ndarray = self.sites[c, done]
        return out

    def serving_at(self, t_s: float) -> np.ndarray:
        """Every client's serving site at emulated time ``t_s``."""
        n = len(self.serving)
        return self.site_at(np.arange(n, dtype=np.int64), np.full(n, float(t_s)))

    def next_handover_s(
        self, clients: np.ndarray, after_s: np.ndarray, until_s: np.ndarray
    ) -> np.ndarray:
        """Each client's first handover in (``after_s``, ``until_s``) (open interval;
        emulated s), inf where none; ``until_s`` must be finite."""
        until = np.asarray(until_s, dtype=np.float64)
        if until.size:
            self.advance_to(float(until.max()))
        c = np.asarray(clients, dtype=np.int64)
        times = self.times_s[c]
        inside = (times > np.asarray(after_s)[:, None]) & (times < until[:, None])
        out: np.ndarray = np.where(inside, times, np.inf).min(axis=1, initial=np.inf)
        return out

    def between(self, client: int, after_s: float, until_s: float) -> np.ndarray:
        """Client ``client``'s handover times in (``after_s``, ``until_s``] (s): after a
        round's start (one at it is the start's cell), up to its end."""
        self.advance_to(until_s)
        times = self.times_s[client]
        out: np.ndarray = times[(times > after_s) & (times <= until_s)]
        return out


class MovingCells:
    """The association of clients that move, round by round (the module's docstring)."""

    def __init__(
        self,
        cells: StaticCells,
        geometry: GeometryConfig,
        channel: object,
        seed: int,
        *,
        tracks: list[NodeTrack] | None = None,
        trace_end_s: float = math.inf,
    ) -> None:
        self.cells = cells
        self.channel = channel
        a = geometry.association
        self.rule = a.rule
        self.hysteresis = a.hysteresis_m if a.rule == "nearest" else a.hysteresis_db
        self.time_to_trigger_s = a.time_to_trigger_s
        self.positions = ClientPositions(
            geometry.mobility,
            cells.positions_m,
            area_of(geometry),
            seed,
            tracks=tracks,
            trace_end_s=trace_end_s,
        )
        self.history: list[RoundCells] = []
        #: handover during a round: the A3 rule at every measurement time (None: at
        #: round starts only)
        self.timeline = (
            None if geometry.handover is None else HandoverTimeline(self, geometry.handover)
        )

    def _serving_link(
        self, d: np.ndarray, serving: np.ndarray, ls: LargeScaleDraw | None
    ) -> tuple[np.ndarray, LargeScaleDraw | None]:
        rows = np.arange(len(serving))
        serving_ls = None if ls is None else ls.take((rows, serving))
        return d[rows, serving], serving_ls

    def at_round(self, rnd: int, t_s: float) -> RoundCells:
        """Round ``rnd``'s cells at its start ``t_s`` (emulated s), after rounds
        0 .. rnd − 1 (evaluated before: :meth:`catch_up` after a resume)."""
        if rnd < len(self.history):  # the cells of the round's start, evaluated before
            return self.history[rnd]
        if rnd > len(self.history):
            raise ValueError(
                f"round {rnd}'s cells asked before round {len(self.history)}'s: the A3 "
                "timers need every earlier round's start (MovingCells.catch_up)"
            )
        if self.timeline is not None:
            return self._at_round_measured(rnd, t_s)
        if rnd == 0:
            serving = self.cells.serving.astype(np.int64)
            held = np.full(self.cells.distance_m.shape, np.nan)
            since_s = t_s
        else:
            prev = self.history[-1]
            serving, held, since_s = prev.serving, prev.held_s, t_s - prev.t_s
        positions = self.positions.at(t_s)
        d = distances_m(positions, self.cells.sites_m)
        # spatially consistent: each link's LOS state and shadowing where the client is
        every = self.cells.large_scale_at(positions) if t_s > 0 else self.cells.large_scale
        loss, _, metric = link_metric(self.rule, d, self.channel, every, self.cells.groups)
        new, held = a3_handover(
            metric, serving, held, since_s, self.hysteresis, self.time_to_trigger_s
        )
        distance, large_scale = self._serving_link(d, new, every)
        rc = RoundCells(t_s, positions, new, new != serving, distance, large_scale, held, loss)
        self.history.append(rc)
        return rc

    def _at_round_measured(self, rnd: int, t_s: float) -> RoundCells:
        """:meth:`at_round` with handover during rounds: the serving cells of the last
        measurement at or before ``t_s`` (:class:`HandoverTimeline`); ``handovers``: the
        clients whose cell differs from the previous round's start."""
        assert self.timeline is not None
        before = self.history[-1].serving if rnd > 0 else self.cells.serving.astype(np.int64)
        new = self.timeline.serving_at(t_s)
        positions = self.positions.at(t_s)
        d = distances_m(positions, self.cells.sites_m)
        every = self.cells.large_scale_at(positions) if t_s > 0 else self.cells.large_scale
        loss, _, _ = link_metric(self.rule, d, self.channel, every, self.cells.groups)
        distance, large_scale = self._serving_link(d, new, every)
        held = self.timeline.held_s.copy()
        rc = RoundCells(t_s, positions, new, new != before, distance, large_scale, held, loss)
        self.history.append(rc)
        return rc

    def catch_up(self, starts_s: list[float]) -> None:
        """Evaluate rounds 0 .. len(starts_s) − 1 at their recorded starts (a run resumed
        from a checkpoint continues the A3 timers it had)."""
        for rnd, t in enumerate(starts_s):
            self.at_round(rnd, float(t))
