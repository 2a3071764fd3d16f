"""Co-channel interference from a scenario's geometry (``channel.interference.model:
geometric``; docs/mobility.md, "Interference from geometry").

Pure functions of numpy arrays:

- channel groups of a reuse factor: :func:`hex_reuse_groups` (the standard hexagonal
  patterns of a hexagonal grid), :func:`greedy_reuse_groups` (explicit site lists),
  :func:`reuse_groups_of` (a scenario's geometry);
- one round's interference in watts at each selected client's receiver:
  :func:`uplink_interference_w` (at its serving site, from the selected clients of the
  other co-channel cells) and :func:`downlink_interference_w` (at the client, from the
  other co-channel sites that serve a selected client).

Interference is evaluated **per round** by these two: every selected client of a round
is taken to transmit for the whole upload phase, every site serving one of them for the
whole download phase. **Per instant** (``channel.interference.timing: instant``), the
uplinks are solved from event to event by :class:`InstantUplink` (clients that move
under ``rate: step``: the gains of each step of the mobility grid, too). Powers are mean
powers: the path loss of each link (the channel's model, with each link's LOS state and
shadowing as the geometry draws them), no small-scale fading on interfering links.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from mecsim.emulation.engine import RateSchedule, TimeVaryingRate
from mecsim.scenario import GeometryConfig

#: the reuse factors with a hexagonal pattern: N = i² + i·j + j² for (i, j) = (0, 1),
#: (1, 1), (2, 1)
REUSE_FACTORS: tuple[int, ...] = (1, 3, 7)
#: a site further than this fraction of D from a point of the hexagonal lattice is not on
#: it (the grid's positions are computed in floating point, so not exactly on it)
_LATTICE_TOLERANCE = 1e-6


# ----------------------------------------------------------------------------- groups


def hex_axial(sites_m: ArrayLike, centre_m: ArrayLike, inter_site_distance_m: float) -> np.ndarray:
    """``(S, 2)`` integer axial coordinates (q, r) of sites on a hexagonal grid with
    inter-site distance D centred on ``centre_m``: a site is at
    ``centre + q·D·(1, 0) + r·D·(1/2, √3/2)`` (the grid's neighbours are at 0°, 60°, ...,
    as :func:`mecsim.emulation.geometry.hex_grid_sites` lays them out)."""
    rel = (np.asarray(sites_m, dtype=float).reshape(-1, 2) - np.asarray(centre_m, float)) / (
        inter_site_distance_m
    )
    r = rel[:, 1] / (math.sqrt(3.0) / 2.0)
    q = rel[:, 0] - r / 2.0
    qr = np.rint(np.column_stack([q, r]))
    if np.abs(qr - np.column_stack([q, r])).max(initial=0.0) > _LATTICE_TOLERANCE:
        raise ValueError("hex_axial: a site is not on the hexagonal grid")
    out: np.ndarray = qr.astype(np.int64)
    return out


def hex_reuse_groups(axial: ArrayLike, reuse: int) -> np.ndarray:
    """Each site's channel group (0 .. N − 1) under the standard hexagonal reuse pattern
    of cluster size N (Rappaport, *Wireless Communications*, §3.2: N = i² + i·j + j²):

    - N = 1: every site group 0 (all co-channel);
    - N = 3 (i = j = 1): ``(q − r) mod 3``, co-channel sites √3·D apart;
    - N = 7 (i = 2, j = 1): ``(q + 3·r) mod 7``, co-channel sites √7·D apart.

    Each formula is constant on the co-channel lattice (N = 3: spanned by (1, 1) and
    (−1, 2); N = 7: by (1, 2) and (−3, 1)) and differs between neighbours (steps (±1, 0),
    (0, ±1), ±(1, −1) change q − r by ±1 or ±2, q + 3r by ±1, ±3 or ±2)."""
    qr = np.asarray(axial, dtype=np.int64).reshape(-1, 2)
    q, r = qr[:, 0], qr[:, 1]
    if reuse == 1:
        return np.zeros(len(qr), dtype=np.int64)
    if reuse == 3:
        out: np.ndarray = np.mod(q - r, 3)
        return out
    if reuse == 7:
        out = np.mod(q + 3 * r, 7)
        return out
    raise ValueError(f"reuse {reuse} is not one of {REUSE_FACTORS}")


def greedy_reuse_groups(sites_m: ArrayLike, reuse: int) -> np.ndarray:
    """Channel groups of an explicit site list: sites in index order, each takes the group
    whose nearest site already in it is the farthest (a group with no site yet counts as
    infinitely far; ties: the lower group). So the first N sites get N different groups,
    and each later site joins the group whose co-channel sites are farthest from it."""
    sites = np.asarray(sites_m, dtype=float).reshape(-1, 2)
    if reuse not in REUSE_FACTORS:
        raise ValueError(f"reuse {reuse} is not one of {REUSE_FACTORS}")
    groups = np.zeros(len(sites), dtype=np.int64)
    for k in range(len(sites)):
        nearest = np.full(reuse, np.inf)
        for g in range(reuse):
            members = np.flatnonzero(groups[:k] == g)
            if members.size:
                d = np.hypot(*(sites[members] - sites[k]).T)
                nearest[g] = d.min()
        groups[k] = int(np.argmax(nearest))  # ties (inf, inf, ...): the lower group
    return groups


def reuse_groups_of(geometry: GeometryConfig, reuse: int) -> np.ndarray:
    """The sites' channel groups of a scenario's geometry: the hexagonal pattern
    (:func:`hex_reuse_groups`) for ``layout: hex``, :func:`greedy_reuse_groups` for
    explicit sites."""
    sites = np.asarray(geometry.sites_m(), dtype=float).reshape(-1, 2)
    s = geometry.sites
    if s.layout == "hex":
        axial = hex_axial(sites, sites[0], s.inter_site_distance_m)
        return hex_reuse_groups(axial, reuse)
    return greedy_reuse_groups(sites, reuse)


# ----------------------------------------------------------------------------- one round


def _gain(path_loss_db: np.ndarray) -> np.ndarray:
    """Linear power gain 10^(−PL/10) of path losses in dB."""
    out: np.ndarray = 10.0 ** (-path_loss_db / 10.0)
    return out


def uplink_interference_w(
    path_loss_db: ArrayLike,
    tx_power_w: ArrayLike,
    serving: ArrayLike,
    groups: ArrayLike,
    selected: ArrayLike,
) -> np.ndarray:
    """Uplink interference (W) at each selected client's serving site, in selection order:

    ``I_U,i = Σ_j p_j · 10^(−PL_{j,s_i}/10)`` over the selected clients j whose serving
    site s_j is another site of s_i's channel group (``s_j ≠ s_i``,
    ``group(s_j) = group(s_i)``): clients of one cell are orthogonal (each on its own
    band), every co-channel cell's clients are heard with their whole transmit power.

    ``path_loss_db`` (n, S): every client's path loss to every site (dB);
    ``tx_power_w`` (n,); ``serving`` (n,); ``groups`` (S,); ``selected`` (k,) client ids.
    """
    sel = np.asarray(selected, dtype=np.int64)
    pl = np.asarray(path_loss_db, dtype=float)
    grp = np.asarray(groups, dtype=np.int64)
    srv = np.asarray(serving, dtype=np.int64)[sel]
    n_sites = pl.shape[1]
    # (k, S): what selected client j puts into site s, where s hears it as interference
    heard = np.asarray(tx_power_w, dtype=float)[sel, None] * _gain(pl[sel])
    co_channel = (grp[srv][:, None] == grp[None, :]) & (srv[:, None] != np.arange(n_sites))
    at_site = np.where(co_channel, heard, 0.0).sum(axis=0)
    out: np.ndarray = at_site[srv]
    return out


def downlink_interference_w(
    path_loss_db: ArrayLike,
    server_tx_power_w: float,
    serving: ArrayLike,
    groups: ArrayLike,
    selected: ArrayLike,
) -> np.ndarray:
    """Downlink interference (W) at each selected client, in selection order:

    ``I_D,i = Σ_s p_S · 10^(−PL_{i,s}/10)`` over the sites s ≠ s_i of s_i's channel group
    that serve at least one selected client this round (a site with no one to serve does
    not transmit), each at the server's transmit power ``p_S``."""
    sel = np.asarray(selected, dtype=np.int64)
    pl = np.asarray(path_loss_db, dtype=float)
    grp = np.asarray(groups, dtype=np.int64)
    srv = np.asarray(serving, dtype=np.int64)[sel]
    n_sites = pl.shape[1]
    active = np.zeros(n_sites, dtype=bool)
    active[srv] = True
    co_channel = (
        (grp[srv][:, None] == grp[None, :]) & (srv[:, None] != np.arange(n_sites)) & active[None, :]
    )
    out: np.ndarray = (server_tx_power_w * np.where(co_channel, _gain(pl[sel]), 0.0)).sum(axis=1)
    return out


# ----------------------------------------------------------------------------- per instant

#: grid times within this fraction of a step of a time are that time (as the moving
#: links' pieces: mecsim.emulation.moving_rate)
_GRID_TOLERANCE = 1e-9


class UplinkMotion(Protocol):
    """What per-instant interference needs of clients that move
    (``geometry.mobility.rate: step``): the round's uplinks' gains and what each puts
    into every site, constant over each step of the mobility grid (absolute emulated time
    [k · step_s, (k + 1) · step_s]). Implemented by
    :class:`mecsim.emulation.moving_rate.UplinkGainsOnGrid`."""

    @property
    def step_s(self) -> float: ...

    @property
    def round_start_s(self) -> float: ...

    def last_step(self) -> int:
        """The last grid step whose gains may differ from the one before (after it the
        clients are held: the round's deadline, or as far as a transfer may go)."""
        ...

    def at_step(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(gain (n,), heard_w (n, S)) over grid step ``k``: each link's gain (path loss
        and fading) and what each client puts into every site (W)."""
        ...


@dataclass(frozen=True, eq=False)
class InstantUplink:
    """A round's uplinks under per-instant geometric interference
    (``channel.interference.timing: instant``), per selected client in selection order:
    its id, bandwidth B (Hz), transmit power p (W), the gain g of its own link (path loss
    and fading), the noise N0 (W/Hz), its serving site; ``heard_w`` (k, S) what each
    selected client puts into every site (p_j · 10^(−PL_{j,s}/10)); the sites' channel
    groups; each link's Mathis cap (b/s) and payload share. Client i's uplink rate while
    the selected clients ``on`` transmit:

        r_i = min(cap_i, share · B_i · log2(1 + 10^(offset/10) · p_i g_i / (I_i + N0 B_i))),
        I_i = Σ_{j ∈ on, s_j ≠ s_i, group(s_j) = group(s_i)} heard_w[j, s_i]

    (:meth:`rates_bps`): with every selected client on, the per-round rate.

    ``motion``: clients that move (``geometry.mobility.rate: step``): g_i and
    ``heard_w`` are those of each step of the mobility grid (:class:`UplinkMotion`;
    ``gain`` and ``heard_w`` above are then the round's start's, what the per-round
    rates use), so the rates change at grid times as well as at uploads' starts and
    ends."""

    clients: np.ndarray
    bandwidth_hz: np.ndarray
    tx_power_w: np.ndarray
    gain: np.ndarray
    noise_psd_w_per_hz: float
    snr_offset_db: float
    serving: np.ndarray
    heard_w: np.ndarray
    groups: np.ndarray
    cap_bps: np.ndarray
    share: float
    motion: UplinkMotion | None = None
    #: (S, k) True where site s hears client j as interference (another site of its
    #: group): the terms of the per-site sums
    _co: np.ndarray = field(init=False, repr=False, compare=False)
    _co_t: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grp = np.asarray(self.groups, dtype=np.int64)
        srv = np.asarray(self.serving, dtype=np.int64)
        sites = np.arange(len(grp))
        co = (grp[srv][None, :] == grp[:, None]) & (srv[None, :] != sites[:, None])
        object.__setattr__(self, "_co", co)
        object.__setattr__(self, "_co_t", np.ascontiguousarray(co.T))

    def _heard_at_sites(self, heard_w: np.ndarray) -> np.ndarray:
        """(S, k) ``heard_w`` (k, S) transposed, 0 where a site does not hear a client."""
        out: np.ndarray = np.where(self._co, heard_w.T, 0.0)
        return out

    def _rates(
        self, rows: np.ndarray, on: np.ndarray, gain: np.ndarray, heard_at_sites: np.ndarray
    ) -> np.ndarray:
        """The goodputs of clients ``rows`` with the clients ``on`` transmitting, of the
        gains ``gain`` and the per-site terms ``heard_at_sites``. Each site's
        interference is one sum over the clients in selection order (the numbers of
        summing, client by client, what each hears)."""
        at_site = np.where(on[None, :], heard_at_sites, 0.0).sum(axis=1)
        return self._rates_at(rows, at_site, gain)

    def _rates_at(self, rows: np.ndarray, at_site: np.ndarray, gain: np.ndarray) -> np.ndarray:
        """The goodputs of clients ``rows`` with each site's interference ``at_site``."""
        i_w = at_site[self.serving[rows]]
        b = self.bandwidth_hz[rows]
        noise_w = i_w + self.noise_psd_w_per_hz * b
        s = 10.0 ** (self.snr_offset_db / 10.0) * self.tx_power_w[rows] * gain[rows] / noise_w
        out: np.ndarray = np.minimum(self.cap_bps[rows], self.share * b * np.log2(1.0 + s))
        return out

    def interference_w(self, on: np.ndarray) -> np.ndarray:
        """(k,) the uplink interference (W) at each client's site with the clients
        ``on`` (bool (k,)) transmitting (the round's start's path losses)."""
        at_site = np.where(on[None, :], self._heard_at_sites(self.heard_w), 0.0).sum(axis=1)
        out: np.ndarray = at_site[self.serving]
        return out

    def rates_bps(self, on: np.ndarray) -> np.ndarray:
        """(k,) each client's uplink goodput with the clients ``on`` transmitting (the
        round's start's gains)."""
        rows = np.arange(len(self.clients))
        return self._rates(rows, on, self.gain, self._heard_at_sites(self.heard_w))

    def solve(
        self, start_s: np.ndarray, nbits: np.ndarray
    ) -> tuple[np.ndarray, list[tuple[tuple[float, ...], tuple[float, ...]]]]:
        """:meth:`solved`'s ends, and each client's rate schedule (:meth:`_schedules`)."""
        end, log = self.solved(start_s, nbits)
        return end, log.schedules()

    def rates(
        self, start_s: np.ndarray, nbits: np.ndarray, tolerance_s: np.ndarray | None = None
    ) -> list[TimeVaryingRate]:
        """Each client's uplink as the engine times it after :meth:`solved`: standing
        clients, its rate schedule (:class:`RateSchedule`); clients that move, an
        :class:`InstantRate`, which gives the solution's end for the upload solved (a
        schedule has an entry per event of the client's upload: at 10,000 walkers,
        tens of millions a round, so none is kept); ``tolerance_s``: how far from its
        solved start an upload asked about is that upload (default
        :data:`SAME_START_RTOL` of the start)."""
        end, log = self.solved(start_s, nbits, log=self.motion is None)
        if self.motion is None:
            return [RateSchedule(t, r) for t, r in log.schedules()]
        start = np.asarray(start_s, dtype=float)
        bits = np.asarray(nbits, dtype=float)
        tol = (
            SAME_START_RTOL * np.maximum(1.0, np.abs(start))
            if tolerance_s is None
            else np.asarray(tolerance_s, dtype=float)
        )
        return [
            InstantRate(log, i, float(start[i]), float(bits[i]), float(end[i]), float(tol[i]))
            for i in range(len(self.clients))
        ]

    def solved(
        self, start_s: np.ndarray, nbits: np.ndarray, *, log: bool = True
    ) -> tuple[np.ndarray, _Log]:
        """The uploads, exactly: client i sends ``nbits[i]`` from ``start_s[i]`` (s since
        the round's start; NaN: no upload), every rate constant between two consecutive
        events: an upload's start or end, and, for clients that move, a grid time at
        which the gains change (a grid step whose gains are those of the step before is
        no event). Returns each upload's end (NaN without one; inf: never, at rate 0)
        and each client's rate as a schedule ``(times, rates)`` from 0 (the rate of each
        interval from its upload's start to its end; before the start, the first
        interval's: :class:`_Log`; ``log=False``: only who transmitted is kept)."""
        k = len(self.clients)
        start = np.asarray(start_s, dtype=float)
        left = np.where(np.isnan(start), 0.0, np.asarray(nbits, dtype=float))
        end = np.full(k, np.nan)
        on = np.zeros(k, dtype=bool)
        pending = sorted((float(start[i]), i) for i in range(k) if not np.isnan(start[i]))
        grid = _Grid(self) if self.motion is not None else None
        gain, heard = self.gain, self._heard_at_sites(self.heard_w)
        if grid is not None:
            gain, heard = grid.at(0.0)
        log_t: list[float] = []
        log_rows: list[np.ndarray] = []
        log_rates: list[np.ndarray] = []
        ever = np.zeros(k, dtype=bool)
        # each site's interference and each transmitting client's rate, recomputed at an
        # event only where it changes: the sites that hear a client that started or
        # stopped, the clients of those sites and those that started (every one after
        # a grid time). Each site's sum is the same sum (a row of the (S, k) terms), so
        # the numbers are those of recomputing everything
        at_site = np.zeros(len(self.groups))
        terms = np.zeros((len(self.groups), k))  # heard where on, else 0
        rate_all = np.zeros(k)
        changed: list[int] | None = None  # None: everything
        current = (gain, heard)
        t, p, n_on = 0.0, 0, 0
        while p < len(pending) or n_on:
            while p < len(pending) and pending[p][0] <= t:
                i = pending[p][1]
                if left[i] > 0:
                    on[i] = True
                    n_on += 1
                    if changed is not None:
                        changed.append(i)
                else:
                    end[i] = pending[p][0]
                p += 1
            if not n_on:
                t = pending[p][0]
                if grid is not None:
                    gain, heard = grid.at(t)
                continue
            active = np.flatnonzero(on)
            if changed is None or current[0] is not gain or current[1] is not heard:
                terms = np.where(on[None, :], heard, 0.0)
                at_site = terms.sum(axis=1)
                rate_all[active] = self._rates_at(active, at_site, gain)
                current = (gain, heard)
            elif changed:
                who = np.asarray(changed, dtype=np.int64)
                terms[:, who] = np.where(on[who][None, :], heard[:, who], 0.0)
                hit = np.asarray(self._co_t[who].any(axis=0), dtype=bool)
                sites = np.flatnonzero(hit)
                if sites.size:
                    at_site[sites] = terms[sites].sum(axis=1)
                again: np.ndarray = hit[self.serving[active]]
                again[np.searchsorted(active, who[on[who]])] = True
                rows = active[again]
                rate_all[rows] = self._rates_at(rows, at_site, gain)
            changed = []
            rate = rate_all[active]
            if log:
                log_t.append(t)
                log_rows.append(active)
                log_rates.append(rate)
            else:
                ever[active] = True
            with np.errstate(divide="ignore"):
                due = np.where(rate > 0, left[active] / rate, np.inf)
            t_next = pending[p][0] if p < len(pending) else math.inf
            t_done = t + float(due.min())
            t_grid = math.inf if grid is None else grid.next_change(t, min(t_done, t_next))
            if t_done == math.inf and t_next == math.inf and t_grid == math.inf:
                end[active] = math.inf  # nobody can finish
                break
            if t_grid < t_done and t_grid < t_next:  # the gains change: a grid time
                assert grid is not None
                left[active] -= rate * (t_grid - t)
                t = t_grid
                gain, heard = grid.at(t)
            elif t_done <= t_next:
                dt = t_done - t
                first = due <= due.min()
                done = active[first]
                going = active[~first]
                end[done], left[done], on[done] = t_done, 0.0, False
                n_on -= len(done)
                changed.extend(done.tolist())
                left[going] -= rate[~first] * dt
                t = t_done
            else:
                left[active] -= rate * (t_next - t)
                t = t_next
            if grid is not None:  # the step t is in (t may be a grid time itself)
                gain, heard = grid.at(t)
        return end, _Log(self, log_t, log_rows, log_rates, (on, gain, heard), None if log else ever)


class _Log:
    """A solution's log (at each event, the transmitting clients and their rates), from
    which each client's rate schedule is built: the rate of each interval from its
    upload's start to its end (before the start, the first interval's); a client that
    never transmitted: its rate with nobody on as its one step."""

    def __init__(
        self,
        uplink: InstantUplink,
        log_t: list[float],
        log_rows: list[np.ndarray],
        log_rates: list[np.ndarray],
        last: tuple[np.ndarray, np.ndarray, np.ndarray],
        ever: np.ndarray | None = None,
    ) -> None:
        self.uplink, self.last = uplink, last
        #: without a log: who transmitted (None: the log has it)
        self.ever = ever
        self.log_t, self.log_rows, self.log_rates = log_t, log_rows, log_rates
        self._by_client: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._alone: np.ndarray | None = None

    def _sorted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._by_client is None:
            k = len(self.uplink.clients)
            rows = np.concatenate(self.log_rows) if self.log_rows else np.zeros(0, np.int64)
            sizes = [len(r) for r in self.log_rows]
            times = np.repeat(np.asarray(self.log_t, dtype=float), sizes)
            rates = np.concatenate(self.log_rates) if self.log_rates else np.zeros(0)
            order = np.argsort(rows, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=k))])
            self._by_client = (times[order], rates[order], bounds)
        return self._by_client

    def transmitted(self, i: int) -> bool:
        if self.ever is not None:
            return bool(self.ever[i])
        _, _, bounds = self._sorted()
        return bool(bounds[i + 1] > bounds[i])

    def schedule(self, i: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Client ``i``'s rate schedule ``(times, rates)`` from 0 (a solution without
        its log: only that of a client that did not transmit)."""
        if not self.transmitted(i):
            if self._alone is None:
                on, gain, heard = self.last
                every = np.arange(len(self.uplink.clients))
                self._alone = self.uplink._rates(every, on, gain, heard)
            return (0.0,), (float(self._alone[i]),)
        if self.ever is not None:
            raise ValueError("the solution's log was not kept")
        times, rates, bounds = self._sorted()
        a, b = int(bounds[i]), int(bounds[i + 1])
        ts: tuple[float, ...] = tuple(times[a:b].tolist())
        rs: tuple[float, ...] = tuple(rates[a:b].tolist())
        if ts[0] > 0.0:
            ts, rs = (0.0, *ts), (rs[0], *rs)
        return ts, rs

    def schedules(self) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
        return [self.schedule(i) for i in range(len(self.uplink.clients))]


#: an upload asked about within this fraction of its solved start's scale (the finish it
#: was read off, as finish − duration: a few ulps off) is the upload solved
SAME_START_RTOL = 1e-12


class InstantRate(TimeVaryingRate):
    """A moving client's uplink under per-instant interference
    (:meth:`InstantUplink.rates`): the upload solved (``nbits`` from ``start_s``, or
    from within ``tolerance_s`` of it) ends at the solution's ``end_s``. Another
    transfer: a client that did not transmit in the solution has its rate with nobody
    on (as a standing client's schedule); one that did, its solved upload's mean rate
    (bits over its duration). Only a solution that is solved again asks so
    (:meth:`mecsim.emulation.timing.EmulatedRound.time` repeats the solutions until the
    uploads start where the one before had them: the round kept asks about the uploads
    solved)."""

    __slots__ = ("end_s", "i", "log", "nbits", "start_s", "tolerance_s")

    def __init__(
        self, log: _Log, i: int, start_s: float, nbits: float, end_s: float, tolerance_s: float
    ) -> None:
        self.log, self.i = log, i
        self.start_s, self.nbits, self.end_s = start_s, nbits, end_s
        self.tolerance_s = tolerance_s

    def __repr__(self) -> str:
        return (
            f"InstantRate(client={int(self.log.uplink.clients[self.i])}, "
            f"start_s={self.start_s}, end_s={self.end_s})"
        )

    def schedule(self) -> RateSchedule:
        if not self.log.transmitted(self.i):
            return RateSchedule(*self.log.schedule(self.i))
        duration_s = self.end_s - self.start_s
        mean = self.nbits / duration_s if duration_s > 0 else 0.0
        return RateSchedule((0.0,), (mean,))

    def transfer_time_s(self, nbits: float, start_s: float) -> float:
        if nbits <= 0:
            return 0.0
        if nbits == self.nbits and abs(start_s - self.start_s) <= self.tolerance_s:
            return self.end_s - start_s
        return self.schedule().transfer_time_s(nbits, start_s)

    def segments(self, start_s: float) -> Iterator[tuple[float, float]]:
        return self.schedule().segments(start_s)


class _Grid:
    """The mobility grid of an :class:`InstantUplink` with ``motion``: the gains at a
    time (s since the round's start) and the next grid time at which they change."""

    def __init__(self, uplink: InstantUplink) -> None:
        motion = uplink.motion
        assert motion is not None
        self.uplink, self.motion = uplink, motion
        self.step_s, self.start_s = motion.step_s, motion.round_start_s
        self.last = motion.last_step()
        self._data: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.k = -1  # the step whose gains are current
        self.same_to = -1  # steps k .. same_to have the same gains
        self.differs: int | None = None  # same_to + 1, known to have other gains

    def step_of(self, t_s: float) -> int:
        """The grid step a time (s since the round's start) falls in; a time within a
        tolerance of a grid time is in the step it starts."""
        a = self.start_s + t_s
        k = math.floor(a / self.step_s + _GRID_TOLERANCE)
        if (k + 1) * self.step_s - a <= _GRID_TOLERANCE * self.step_s:
            k += 1
        return min(k, self.last)

    def _step(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        got = self._data.get(k)
        if got is None:
            gain, heard_w = self.motion.at_step(k)
            got = (gain, self.uplink._heard_at_sites(heard_w))
            self._data[k] = got
        return got

    def at(self, t_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The gains and per-site terms at ``t_s``, made the current ones."""
        k = self.step_of(t_s)
        if not self.k <= k <= self.same_to:
            self.k = self.same_to = k
            self.differs = None
        return self._step(self.k)

    def next_change(self, t_s: float, before_s: float) -> float:
        """The first grid time after ``t_s`` and before ``before_s`` (s since the round's
        start) at which the gains differ from the current ones; inf if none."""
        if self.differs is not None:  # found before, while the same step was current
            t_grid = self.differs * self.step_s - self.start_s
            return t_grid if t_grid < before_s else math.inf
        gain, heard = self._step(self.k)
        k = self.same_to + 1
        while k <= self.last:
            t_grid = k * self.step_s - self.start_s
            if t_grid >= before_s:
                return math.inf
            g, h = self._step(k)
            if not (np.array_equal(g, gain) and np.array_equal(h, heard)):
                self.differs = k
                return t_grid
            self.same_to = k
            k += 1
        return math.inf
