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

Interference is evaluated **per round, not per instant**: every selected client of a
round is taken to transmit for the whole upload phase, every site serving one of them
for the whole download phase. Powers are mean powers: the path loss of each link (the
channel's model, with each link's LOS state and shadowing as the geometry draws them),
no small-scale fading on interfering links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

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

    (:meth:`rates_bps`): with every selected client on, the per-round rate."""

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

    def interference_w(self, on: np.ndarray) -> np.ndarray:
        """(k,) the uplink interference (W) at each client's site with the clients
        ``on`` (bool (k,)) transmitting."""
        srv = self.serving
        grp = self.groups
        co = (grp[srv][:, None] == grp[srv][None, :]) & (srv[:, None] != srv[None, :])
        heard = self.heard_w[:, srv].T  # [i, j]: j at i's site
        out: np.ndarray = np.where(co & on[None, :], heard, 0.0).sum(axis=1)
        return out

    def rates_bps(self, on: np.ndarray) -> np.ndarray:
        """(k,) each client's uplink goodput with the clients ``on`` transmitting."""
        i_w = self.interference_w(on)
        noise_w = i_w + self.noise_psd_w_per_hz * self.bandwidth_hz
        s = 10.0 ** (self.snr_offset_db / 10.0) * self.tx_power_w * self.gain / noise_w
        out: np.ndarray = np.minimum(
            self.cap_bps, self.share * self.bandwidth_hz * np.log2(1.0 + s)
        )
        return out

    def solve(
        self, start_s: np.ndarray, nbits: np.ndarray
    ) -> tuple[np.ndarray, list[tuple[tuple[float, ...], tuple[float, ...]]]]:
        """The uploads, exactly: client i sends ``nbits[i]`` from ``start_s[i]`` (s since
        the round's start; NaN: no upload), every rate constant between two consecutive
        starts or ends (the set of transmitters fixed). Returns each upload's end (NaN
        without one; inf: never, at rate 0) and each client's rate as a schedule
        ``(times, rates)`` from 0 (the rate of each interval from its upload's start to
        its end; before the start, the first interval's)."""
        k = len(self.clients)
        start = np.asarray(start_s, dtype=float)
        left = np.where(np.isnan(start), 0.0, np.asarray(nbits, dtype=float))
        end = np.full(k, np.nan)
        on = np.zeros(k, dtype=bool)
        pending = sorted((float(start[i]), i) for i in range(k) if not np.isnan(start[i]))
        steps: list[list[tuple[float, float]]] = [[] for _ in range(k)]
        t, p = 0.0, 0
        while p < len(pending) or on.any():
            while p < len(pending) and pending[p][0] <= t:
                i = pending[p][1]
                if left[i] > 0:
                    on[i] = True
                else:
                    end[i] = pending[p][0]
                p += 1
            if not on.any():
                t = pending[p][0]
                continue
            rate = self.rates_bps(on)
            active = np.flatnonzero(on)
            for i in active.tolist():
                steps[i].append((t, float(rate[i])))
            with np.errstate(divide="ignore"):
                due = np.where(rate[active] > 0, left[active] / rate[active], np.inf)
            t_next = pending[p][0] if p < len(pending) else math.inf
            t_done = t + float(due.min())
            if t_done == math.inf and t_next == math.inf:  # nobody can finish
                end[active] = math.inf
                break
            if t_done <= t_next:
                dt = t_done - t
                first = due <= due.min()
                for i, fin in zip(active.tolist(), first.tolist(), strict=True):
                    if fin:
                        end[i], left[i], on[i] = t_done, 0.0, False
                    else:
                        left[i] -= rate[i] * dt
                t = t_done
            else:
                left[active] -= rate[active] * (t_next - t)
                t = t_next
        schedules: list[tuple[tuple[float, ...], tuple[float, ...]]] = []
        for i in range(k):
            if not steps[i]:
                schedules.append(((0.0,), (float(self.rates_bps(on)[i]),)))
                continue
            times: tuple[float, ...] = tuple(s for s, _ in steps[i])
            rates: tuple[float, ...] = tuple(r for _, r in steps[i])
            if times[0] > 0.0:
                times, rates = (0.0, *times), (rates[0], *rates)
            schedules.append((times, rates))
        return end, schedules
