"""A moving client's link rate during a round (``geometry.mobility.rate: step``;
docs/mobility.md, "Mobility in a run").

The rate of client i's link at emulated time t of a round that started at R is the
Shannon rate at its distance d(t) = |p_i(t) − s| to its serving site s (fixed for the
round: the association is evaluated at round starts only), every other quantity held at
the round's draws:

    r(t) = B · log2(1 + k · G(d(t))),    k = 10^(offset/10) · p · h / (I + N0 · B)

with G the path-loss gain (the exponent model 10^(PL0/10) (d/d0)^−γ, or TR 38.901's
10^(−PL(d, LOS, SF)/10) with the link's LOS state and shadowing of the run), B, p the
bandwidth and transmit power, h the round's fading, I the round's interference (drawn,
or geometric from the round's start positions). The goodput is min(r(t), Mathis cap),
the cap of the round's latencies, per piece as for a constant link.

The engine integrates the goodput over pieces of the mobility grid (``k · step_s``,
absolute emulated time): the goodput is taken as constant over each piece, at the
piece's midpoint; in the piece where the transfer ends, at the midpoint of the part it
uses, its end found by three fixed-point iterations (the "mid*" rule; within 0.4 % of
the continuous integral at 1 s steps, 0.01 % at 0.1 s,
benchmarks/approximations/mobility_piecewise.py).
Pieces are computed as a transfer needs them, a few at a time, from the client's own
positions (:meth:`mecsim.emulation.handover.ClientPositions.client_at`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from mecsim.channel import Tr38901PathLoss
from mecsim.channel.spatial import SpatialLargeScale
from mecsim.channel.units import db_to_linear
from mecsim.emulation.engine import TimeVaryingRate
from mecsim.emulation.handover import ClientPositions, HandoverTimeline

#: a transfer not through this many grid steps after it started never finishes (an
#: outage: the client is out of range; the positions of every client would otherwise be
#: computed as far as the transfer lasts)
MAX_TRANSFER_STEPS = 3600
#: fixed-point iterations for the end of the last piece (the mid* rule)
END_ITERATIONS = 3
#: pieces evaluated at once (then 4 times as many, ...): most transfers of a round end
#: within a few steps
_FIRST_BATCH = 8
#: grid times within this fraction of a step of a transfer's time are that time
_TOLERANCE = 1e-9
#: grid steps whose midpoint rates a shared medium asks for at once (every link of the
#: round: :meth:`MovingLinks.step_rate_bps`), and the blocks from the round's start so
#: computed for all links; later blocks are computed for the link that asks only
_STEP_BLOCK = 16
_SHARED_BLOCKS = 16
_HELD = (-1, -1)  # MovingLinks._step_rates' key of the rates at the horizon


@dataclass(frozen=True, eq=False)
class MovingLinks:
    """One direction of a round's links of clients that move: per selected client (in
    selection order) the client's index, its serving site (m), bandwidth B (Hz), the SINR
    per unit path-loss gain k, the Mathis cap (b/s) and, under TR 38.901, the link's LOS
    state and shadow fading (dB); the round's start (emulated s) and the positions."""

    positions: ClientPositions
    round_start_s: float
    clients: np.ndarray
    site_m: np.ndarray
    bandwidth_hz: np.ndarray
    sinr_per_gain: np.ndarray
    cap_bps: np.ndarray
    path_loss_db: float = -40.0
    reference_distance_m: float = 1.0
    path_loss_exponent: float = 4.0
    tr38901: Tr38901PathLoss | None = None
    los: np.ndarray | None = None
    shadow_fading_db: np.ndarray | None = None
    #: (n, 2) the links' draws for UMa's h_E (mecsim.channel.pathloss), or None
    environment_u: np.ndarray | None = None
    #: spatially consistent LOS states and shadowing (mecsim.channel.spatial): the
    #: links' are those where the client is (``los``, ``shadow_fading_db`` unused), with
    #: ``site_index`` (n,) each link's serving site; None: ``los``, ``shadow_fading_db``
    spatial: SpatialLargeScale | None = None
    site_index: np.ndarray | None = None
    #: the emulated time (absolute s) after which every client is held where it is then:
    #: the round's deadline when it has one (a transfer still going there is dropped
    #: whatever its rate does after; only its recorded finish time uses the held
    #: position), so that a transfer of a client out of range does not compute
    #: everyone's positions thousands of steps ahead
    horizon_s: float = math.inf
    #: handover during the round (geometry.handover): each client's serving site at any
    #: time (its links' ``site_m`` and ``site_index`` are those of the round's start),
    #: with every site's position (S, 2); a transfer in progress at a handover stops for
    #: the timeline's interruption and goes on at the new site's rate. None: the site of
    #: the round's start for the whole round
    handover: HandoverTimeline | None = None
    all_sites_m: np.ndarray | None = None
    #: the goodput at grid steps' midpoints, computed as shared media ask for them
    #: (:meth:`step_rate_bps`): block b -> (links, _STEP_BLOCK), or (b, link) -> a row
    _step_rates: dict[int | tuple[int, int], np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    #: the transfers handed over as timed: (link, its start (s since the round's
    #: start), the handover's time (absolute s)); the records' ``handover_transfer``
    handed_over: set[tuple[int, float, float]] = field(
        default_factory=set, init=False, repr=False, compare=False
    )

    @property
    def step_s(self) -> float:
        return self.positions.step_s

    def gain(
        self,
        j: np.ndarray | int,
        distance_m: np.ndarray,
        positions_m: np.ndarray | None = None,
        site_index: np.ndarray | None = None,
    ) -> np.ndarray:
        """The path-loss gain G(d) of links ``j`` at distances ``distance_m`` (linear;
        the two broadcast); with spatial consistency, of the LOS state and shadowing at
        the clients' ``positions_m`` (..., 2) to the sites ``site_index`` (default: each
        link's serving site of the round's start)."""
        if self.tr38901 is None:
            out: np.ndarray = db_to_linear(self.path_loss_db) * (
                distance_m / self.reference_distance_m
            ) ** (-self.path_loss_exponent)
            return out
        env = None if self.environment_u is None else self.environment_u[j]
        if self.spatial is not None and positions_m is not None:
            assert self.site_index is not None
            sites = self.site_index[j] if site_index is None else site_index
            _, los, sf = self.spatial.links(positions_m, sites)
            pl = self.tr38901.path_loss_db(distance_m, los, sf, env)
            return np.asarray(db_to_linear(-pl), dtype=float)
        assert self.los is not None and self.shadow_fading_db is not None
        pl = self.tr38901.path_loss_db(distance_m, self.los[j], self.shadow_fading_db[j], env)
        return np.asarray(db_to_linear(-pl), dtype=float)

    def goodput_bps(self, j: np.ndarray | int, t_s: np.ndarray) -> np.ndarray:
        """The goodput min(B log2(1 + k G(d(t))), cap) of links ``j`` at the emulated
        times ``t_s`` (absolute, s; the two broadcast; a time after :attr:`horizon_s` is
        taken as the horizon: the clients held there)."""
        t = np.minimum(np.asarray(t_s, dtype=np.float64), self.horizon_s)
        j = np.broadcast_to(np.asarray(j, dtype=np.int64), t.shape)
        p = self.positions.clients_at(self.clients[j], t)
        at: np.ndarray | None = None
        if self.handover is not None:  # the site serving the client at each time
            assert self.all_sites_m is not None
            at = self.handover.site_at(self.clients[j], t)
            site = self.all_sites_m[at]
        else:
            site = self.site_m[j]
        d = np.hypot(p[..., 0] - site[..., 0], p[..., 1] - site[..., 1])
        g = self.gain(j, d, p, at)
        rate = self.bandwidth_hz[j] * np.log2(1.0 + self.sinr_per_gain[j] * g)
        out: np.ndarray = np.minimum(rate, self.cap_bps[j])
        return out

    def transfer_times_s(
        self,
        j: np.ndarray,
        nbits: np.ndarray,
        start_s: np.ndarray,
        _after_s: np.ndarray | None = None,
    ) -> np.ndarray:
        """Seconds to move ``nbits[i]`` bits over link ``j[i]`` from ``start_s[i]`` (s
        since the round started), by the mid* rule (the module's docstring), all links
        at once; inf for a transfer not through :data:`MAX_TRANSFER_STEPS` steps after
        it started (after :attr:`horizon_s` the rate is constant: the rest of a transfer
        still going there takes rest / rate, inf at rate 0). Each link's arithmetic is
        that of one link alone (pieces in batches of 8, 32, 128, ... for every link), so
        a link's time is the same number whatever links are timed with it.

        With handover during the round, a transfer during which its client hands over
        (at t_h, a measurement time) moves its bits up to t_h on the old site (whole
        pieces at their midpoints' rates, the last part at the midpoint of the part
        used), nothing until t_h + interruption, and the rest on the new site from there
        (this rule again: later handovers alike); one that would start during an
        interruption waits for its end. ``_after_s`` (absolute s, per link): the
        handover a resumed transfer follows (not counted again)."""
        out = self._times_on_sites(j, nbits, start_s)
        ho = self.handover
        if ho is None:
            return out
        j = np.asarray(j, dtype=np.int64)
        bits = np.asarray(nbits, dtype=np.float64)
        start = np.asarray(start_s, dtype=np.float64)
        a0 = self.round_start_s + start
        cap = np.minimum(self.horizon_s, a0 + MAX_TRANSFER_STEPS * self.step_s)
        end = np.minimum(np.where(np.isfinite(out), a0 + out, cap), cap)
        live = np.flatnonzero(bits > 0)
        h = np.full(len(j), np.inf)
        if live.size:
            # a handover up to one interruption before the start still holds it up
            after = a0[live] - ho.interruption_s if _after_s is None else _after_s[live]
            h[live] = ho.next_handover_s(self.clients[j[live]], after, end[live])
        rows = np.flatnonzero(np.isfinite(h))
        if not rows.size:
            return out
        jr, hr, ar = j[rows], h[rows], a0[rows]
        for jj, ss, hh in zip(jr.tolist(), start[rows].tolist(), hr.tolist(), strict=True):
            self.handed_over.add((jj, ss, hh))
        sent = self._bits_by(jr, ar, np.maximum(hr, ar))
        early = sent >= bits[rows]  # through before the handover after all (rare)
        for k in np.flatnonzero(early):
            row = rows[k]
            out[row] = MovingRate(self, int(j[row]))._run_s(
                float(bits[row]), float(start[row]), limit_s=float(hr[k] - self.round_start_s)
            )[0]
        go = np.flatnonzero(~early)
        if go.size:
            resume = hr[go] + ho.interruption_s - self.round_start_s
            rest = self.transfer_times_s(jr[go], bits[rows[go]] - sent[go], resume, _after_s=hr[go])
            out[rows[go]] = resume + rest - start[rows[go]]
        return out

    def _bits_by(self, j: np.ndarray, from_s: np.ndarray, limit_s: np.ndarray) -> np.ndarray:
        """Bits moved over links ``j`` from ``from_s`` to ``limit_s`` (absolute s, per
        link): each whole grid piece at its midpoint's goodput, the piece ``limit_s``
        falls in up to it at the midpoint of the part used (as mid* takes a transfer's
        last piece); all links at once, in batches of pieces."""
        sent = np.zeros(len(j))
        t = np.asarray(from_s, dtype=np.float64).copy()
        limit = np.asarray(limit_s, dtype=np.float64)
        idx = np.flatnonzero(limit > t)
        step, batch = self.step_s, _FIRST_BATCH
        while idx.size:
            ti, li = t[idx], limit[idx]
            first = (np.floor(ti / step + _TOLERANCE) + 1) * step
            first = np.where(first - ti > _TOLERANCE * step, first, first + step)
            ends = np.minimum(
                first[:, None] + np.arange(batch, dtype=np.float64) * step, li[:, None]
            )
            starts = np.concatenate([ti[:, None], ends[:, :-1]], axis=1)
            rates = self.goodput_bps(j[idx][:, None], (starts + ends) / 2.0)
            sent[idx] += np.sum(rates * (ends - starts), axis=1)
            t[idx] = ends[:, -1]
            idx = idx[ends[:, -1] < li]
            batch *= 4
        return sent

    def _times_on_sites(self, j: np.ndarray, nbits: np.ndarray, start_s: np.ndarray) -> np.ndarray:
        """:meth:`transfer_times_s` without the handovers' interruptions (each piece's
        rate that of the site serving the client at its midpoint)."""
        j = np.asarray(j, dtype=np.int64)
        left = np.array(nbits, dtype=np.float64)
        a0 = self.round_start_s + np.asarray(start_s, dtype=np.float64)
        out = np.zeros(len(j))
        t = a0.copy()
        idx = np.flatnonzero(left > 0)
        step = self.step_s
        pieces, batch = 0, _FIRST_BATCH
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            while idx.size and pieces < MAX_TRANSFER_STEPS:
                held = t[idx] >= self.horizon_s
                if held.any():  # past the horizon the rate is constant: the rest at once
                    rows = idx[held]
                    r_h = self.goodput_bps(j[rows], np.full(rows.size, self.horizon_s))
                    end = np.where(r_h > 0, t[rows] + left[rows] / r_h, np.inf)
                    out[rows] = end - a0[rows]
                    idx = idx[~held]
                    if not idx.size:
                        break
                ti, ji, li = t[idx], j[idx], left[idx]
                first = (np.floor(ti / step + _TOLERANCE) + 1) * step
                first = np.where(first - ti > _TOLERANCE * step, first, first + step)
                ends = first[:, None] + np.arange(batch, dtype=np.float64) * step
                starts = np.concatenate([ti[:, None], ends[:, :-1]], axis=1)
                rates = self.goodput_bps(ji[:, None], (starts + ends) / 2.0)
                cum = np.cumsum(rates * (ends - starts), axis=1)
                hit = cum >= li[:, None]
                done = hit.any(axis=1)
                rows = np.flatnonzero(done)
                if rows.size:
                    k = hit[rows].argmax(axis=1)
                    before = np.where(k > 0, cum[rows, np.maximum(k - 1, 0)], 0.0)
                    rest, a, r = li[rows] - before, starts[rows, k], rates[rows, k]
                    end = np.where(r > 0, a + rest / r, np.inf)
                    for _ in range(END_ITERATIONS):  # mid*: the midpoint of the part used
                        go = np.isfinite(end) & (end > a)
                        if not go.any():
                            break
                        r_part = self.goodput_bps(ji[rows][go], (a[go] + end[go]) / 2.0)
                        end[go] = np.where(r_part > 0, a[go] + rest[go] / r_part, np.inf)
                    out[idx[rows]] = end - a0[idx[rows]]
                going = ~done
                left[idx[going]] = li[going] - cum[going, -1]
                t[idx[going]] = ends[going, -1]
                idx = idx[going]
                pieces += batch
                batch *= 4
        out[idx] = np.inf
        return out

    def step_rate_bps(self, j: int, k: int) -> float:
        """Link ``j``'s goodput over grid step ``k`` (absolute emulated time [k · step,
        (k + 1) · step]), at the step's midpoint: what a shared medium re-rates a moving
        flow by (:meth:`MovingRate.segments`). Computed a block of :data:`_STEP_BLOCK`
        steps at a time, for every link of the round at once for the blocks of the
        round's first :data:`_SHARED_BLOCKS` (a shared medium's flows all ask for the same
        steps), for link ``j`` alone after; a number is the same whichever way (numpy
        elementwise, as :meth:`transfer_times_s`)."""
        b, i = divmod(k, _STEP_BLOCK)
        block = self._step_rates.get(b)
        if block is None:
            first = math.floor(self.round_start_s / self.step_s + _TOLERANCE) // _STEP_BLOCK
            every = b - first < _SHARED_BLOCKS
            row = self._step_rates.get((b, j)) if not every else None
            if row is not None:
                return float(row[i])
            steps = np.arange(b * _STEP_BLOCK, (b + 1) * _STEP_BLOCK, dtype=np.float64)
            mids = (steps + 0.5) * self.step_s
            if every:
                n = len(self.clients)
                links = np.arange(n, dtype=np.int64)[:, None]
                block = self.goodput_bps(links, np.broadcast_to(mids, (n, _STEP_BLOCK)).copy())
                self._step_rates[b] = block
            else:
                row = self.goodput_bps(j, mids)
                self._step_rates[(b, j)] = row
                return float(row[i])
        return float(block[j, i])

    def horizon_rate_bps(self, j: int) -> float:
        """Link ``j``'s goodput at :attr:`horizon_s` (where the clients are held), every
        link's computed at once on the first ask."""
        held = self._step_rates.get(_HELD)
        if held is None:
            n = len(self.clients)
            held = self.goodput_bps(np.arange(n, dtype=np.int64), np.full(n, self.horizon_s))
            self._step_rates[_HELD] = held
        return float(held[j])

    def rate(self, j: int) -> MovingRate:
        return MovingRate(self, j)


class MovingRate(TimeVaryingRate):
    """Link ``j`` of :class:`MovingLinks`: how long a transfer takes, by the mid* rule
    (the module's docstring). ``outages``: intervals (s since the round's start) when the
    link is down (0 b/s: :func:`mecsim.emulation.faults.with_outages`)."""

    __slots__ = ("j", "links", "outages")

    def __init__(
        self, links: MovingLinks, j: int, outages: Sequence[tuple[float, float]] = ()
    ) -> None:
        self.links, self.j, self.outages = links, j, tuple(outages)

    def __repr__(self) -> str:
        return f"MovingRate(client={int(self.links.clients[self.j])}, outages={self.outages})"

    @classmethod
    def transfer_times_s(
        cls, rates: Sequence[TimeVaryingRate], nbits: Sequence[float], starts_s: Sequence[float]
    ) -> np.ndarray:
        """:meth:`transfer_time_s` of many links: at once when they are links of one
        :class:`MovingLinks` without outages (the same numbers), else one by one."""
        first = rates[0]
        if isinstance(first, MovingRate) and all(
            isinstance(r, MovingRate) and r.links is first.links and not r.outages for r in rates
        ):
            js = np.array([r.j for r in rates if isinstance(r, MovingRate)], dtype=np.int64)
            return first.links.transfer_times_s(js, np.asarray(nbits), np.asarray(starts_s))
        return super().transfer_times_s(rates, nbits, starts_s)

    def batch_link(self) -> tuple[MovingLinks, int] | None:
        """(its links, its index) without outages: the closed form times a round's
        moving links at once (:meth:`MovingLinks.transfer_times_s`)."""
        return None if self.outages else (self.links, self.j)

    def with_outages(self, cuts: Sequence[tuple[float, float]]) -> MovingRate:
        """The same link, down (0 b/s) during each interval [a, b) of ``cuts`` too."""
        merged = sorted((*self.outages, *cuts))
        return MovingRate(self.links, self.j, merged)

    def _next_bound(self, t_s: float) -> float:
        """The first grid time after ``t_s`` (absolute s), at least a tolerance later."""
        step = self.links.step_s
        k = math.floor(t_s / step + _TOLERANCE)
        end = (k + 1) * step
        return end if end - t_s > _TOLERANCE * step else end + step

    def _pieces(self, t_s: float, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the next ``count`` pieces from ``t_s`` (absolute s)."""
        first = self._next_bound(t_s)
        ends = first + np.arange(count, dtype=np.float64) * self.links.step_s
        starts = np.concatenate([[t_s], ends[:-1]])
        return starts, ends

    def _run_s(self, nbits: float, t0_s: float, limit_s: float = math.inf) -> tuple[float, float]:
        """Without outages: (seconds to move ``nbits`` from ``t0_s``, s since the round
        started, or inf; the bits moved by ``limit_s`` if that comes first)."""
        links = self.links
        if limit_s == math.inf:  # the common case: the links' own (vectorised) rule
            done = links.transfer_times_s(np.array([self.j]), np.array([nbits]), np.array([t0_s]))
            return float(done[0]), math.nan
        a0 = links.round_start_s + t0_s
        t, left, sent = a0, float(nbits), 0.0
        limit = links.round_start_s + limit_s
        pieces, batch = 0, _FIRST_BATCH
        while pieces < MAX_TRANSFER_STEPS:
            starts, ends = self._pieces(t, batch)
            rates = links.goodput_bps(self.j, (starts + ends) / 2.0)
            bits = rates * (ends - starts)
            cum = np.cumsum(bits)
            k = int(np.searchsorted(cum, left))  # the first piece by whose end all is sent
            if k < batch:
                before = float(cum[k - 1]) if k > 0 else 0.0
                rest, a = left - before, float(starts[k])
                r = float(rates[k])
                end = a + rest / r if r > 0 else math.inf
                for _ in range(END_ITERATIONS):  # mid*: the midpoint of the part used
                    if not math.isfinite(end) or end <= a:
                        break
                    r_part = float(links.goodput_bps(self.j, np.array([(a + end) / 2.0]))[0])
                    end = a + rest / r_part if r_part > 0 else math.inf
                if end > limit:
                    return math.inf, sent + self._bits_until(limit, starts, ends, rates)
                return end - a0, math.nan
            if float(ends[-1]) > limit:
                return math.inf, sent + self._bits_until(limit, starts, ends, rates)
            left -= float(cum[-1])
            sent += float(cum[-1])
            t = float(ends[-1])
            pieces += batch
            batch *= 4
        return math.inf, sent

    def _bits_until(
        self, limit: float, starts: np.ndarray, ends: np.ndarray, rates: np.ndarray
    ) -> float:
        """Bits moved by ``limit`` (absolute s) over these pieces: each whole piece at its
        rate; the piece ``limit`` falls in up to it, at the midpoint of the part used
        (as mid* takes the last piece of a transfer)."""
        whole = ends <= limit
        bits = float(np.sum(rates[whole] * (ends[whole] - starts[whole])))
        part = (starts < limit) & ~whole
        if part.any():
            a = float(starts[part][0])
            r = float(self.links.goodput_bps(self.j, np.array([(a + limit) / 2.0]))[0])
            bits += r * (limit - a)
        return bits

    def segments(self, start_s: float) -> Iterator[tuple[float, float]]:
        """The link's goodput from ``start_s`` (s since the round started) on, piece by
        piece of the mobility grid, ``(rate_bps, until_s)``: each piece's rate that at
        the grid step's midpoint (the "mid" rule: the rate a shared medium re-rates its
        flows by, docs/mobility.md "Moving clients on a shared medium"); a piece
        starting at or after :attr:`MovingLinks.horizon_s` holds for ever at the
        horizon's rate; after :data:`MAX_TRANSFER_STEPS` steps without one, 0 b/s
        (never done, as :meth:`transfer_time_s`); 0 b/s in the link's outages."""
        pieces = self._grid_segments(start_s)
        return _cut(pieces, start_s, self.outages) if self.outages else pieces

    def _grid_segments(self, start_s: float) -> Iterator[tuple[float, float]]:
        links = self.links
        step, r0, horizon = links.step_s, links.round_start_s, links.horizon_s
        t = r0 + start_s  # absolute
        k = round(self._next_bound(t) / step) - 1  # the grid step the first piece ends
        for _ in range(MAX_TRANSFER_STEPS):
            if t >= horizon:  # held there: the horizon's rate for ever
                yield links.horizon_rate_bps(self.j), math.inf
                return
            t = (k + 1) * step
            yield links.step_rate_bps(self.j, k), t - r0
            k += 1
        yield 0.0, math.inf

    def transfer_time_s(self, nbits: float, start_s: float) -> float:
        """Seconds to move ``nbits`` bits from ``start_s`` (s since the round started),
        the goodput integrated piece by piece (mid*); inf if never done (down for ever,
        or not through :data:`MAX_TRANSFER_STEPS` steps after it started)."""
        if nbits <= 0:
            return 0.0
        if not self.outages:  # the links' number itself (the closed form's, to the bit)
            return self._run_s(nbits, start_s)[0]
        t, left = start_s, float(nbits)
        for a, b in self.outages:
            if b <= t:
                continue
            if a <= t:  # down now: wait until the link is back
                t = b
                continue
            done_s, sent = self._run_s(left, t, limit_s=a)
            if math.isfinite(done_s):
                return t + done_s - start_s
            left -= sent
            if left <= 0:
                return a - start_s
            t = b
        if not math.isfinite(t):
            return math.inf
        done_s, _ = self._run_s(left, t)
        return t + done_s - start_s


def _cut(
    segments: Iterator[tuple[float, float]],
    start_s: float,
    outages: Sequence[tuple[float, float]],
) -> Iterator[tuple[float, float]]:
    """``segments`` ((rate, until) pairs from ``start_s`` on) at 0 b/s during each
    interval [a, b) of ``outages``: a piece is split at the bounds inside it, and a part
    starting in an interval is down."""
    bounds = sorted({t for ab in outages for t in ab})
    lo = start_s
    for rate, until in segments:
        while lo < until:
            stop = next((b for b in bounds if lo < b < until), until)
            down = any(a <= lo < b for a, b in outages)
            yield (0.0 if down else rate), stop
            lo = stop


@dataclass(frozen=True, eq=False)
class UplinkGainsOnGrid:
    """Per-instant interference with clients that move (``channel.interference.timing:
    instant`` under ``geometry.mobility.rate: step``): the round's uplinks' gains over
    each step of the mobility grid (absolute emulated time [k · step_s, (k + 1) ·
    step_s]), every client where it is at the step's midpoint (the "mid" rule of moving
    clients on a shared medium), held where it is at :attr:`horizon_s` (the round's
    deadline) from the step in which that falls on, and from the step
    :data:`MAX_TRANSFER_STEPS` after the round's start's at the latest. :meth:`at_step` is
    :class:`mecsim.emulation.interference.UplinkMotion`'s.

    ``path_loss_db(positions (k, 2)) -> (k, S)``: every selected client's path loss to
    every site with the clients there (the association's model: spatially consistent
    LOS state and shadowing where they are); ``serving_gain(positions, path_loss) ->
    (k,)``: each client's own link's gain (its path loss to its serving site and the
    round's fading); ``tx_power_w`` (k,): what each puts into a site is its power times
    that link's gain."""

    positions: ClientPositions
    round_start_s: float
    clients: np.ndarray
    tx_power_w: np.ndarray
    path_loss_db: Callable[[np.ndarray], np.ndarray]
    serving_gain: Callable[[np.ndarray, np.ndarray], np.ndarray]
    horizon_s: float = math.inf
    _cache: dict[float, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def step_s(self) -> float:
        return self.positions.step_s

    def last_step(self) -> int:
        first = math.floor(self.round_start_s / self.step_s + _TOLERANCE)
        last = first + MAX_TRANSFER_STEPS
        if math.isfinite(self.horizon_s):
            last = min(last, math.floor(self.horizon_s / self.step_s + _TOLERANCE))
        return last

    def at_step(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(gain (k,), heard_w (k, S)) over grid step ``k``: the clients at the step's
        midpoint (at the horizon from the step it falls in on)."""
        step = self.step_s
        t = self.horizon_s if (k + 1) * step > self.horizon_s else (k + 0.5) * step
        got = self._cache.get(t)
        if got is None:
            p = self.positions.clients_at(self.clients, np.full(len(self.clients), t))
            pl = self.path_loss_db(p)
            heard: np.ndarray = self.tx_power_w[:, None] * db_to_linear(-pl)
            got = (np.asarray(self.serving_gain(p, pl), dtype=float), heard)
            self._cache[t] = got
        return got
