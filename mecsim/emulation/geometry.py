"""Edge servers (base stations) and clients on a plane, and which site serves each client.

Pure functions of numpy arrays (docs/mobility.md, "Geometry" and "Association"):

- sites: :func:`hex_grid_sites` (1 + 3·R·(R + 1) sites of R rings, inter-site distance D);
- client positions: :func:`place_uniform`, :func:`place_per_cell`, :func:`place_hotspots`
  (an ``(n_clients, 2)`` array in metres: the clients' positions at a time; static clients
  keep their initial ones), each seeded by the ``numpy.random.Generator`` it is given;
- :func:`distances_m` (client × site, 2D), :func:`path_loss_db` (the channel's model:
  exponent or 3GPP TR 38.901 with each link's LOS state and shadowing),
  :func:`received_power_dbm`, :func:`sinr_db`;
- association: :func:`association_metric` (what the rule compares, larger is better),
  :func:`associate` (the best site: a run's start) and :func:`a3_handover` (a later
  re-evaluation with A3 hysteresis and time-to-trigger).

:func:`cells_of` puts them together for a scenario's ``geometry:`` section
(:class:`StaticCells`): what :class:`mecsim.emulation.network.NetworkModel` uses.
Coordinates are the area's: its lower-left corner is the origin, x to the right, y up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from mecsim.channel.pathloss import LargeScaleDraw, Tr38901PathLoss
from mecsim.channel.spatial import SpatialLargeScale
from mecsim.channel.wireless import ShannonChannel
from mecsim.emulation.interference import reuse_groups_of
from mecsim.scenario import GeometryConfig, Scenario
from mecsim.scenario.plane import hex_grid_offsets_m, split_evenly

AssociationRule = Literal["nearest", "strongest", "sinr"]
RULES: tuple[str, ...] = ("nearest", "strongest", "sinr")

#: the most candidate points one rejection-sampling batch draws
_MAX_BATCH = 1_000_000
#: batches a placement may draw before it gives up (the region is (almost) empty)
_MAX_BATCHES = 200


# ----------------------------------------------------------------------------- sites


def hex_grid_sites(
    rings: int, inter_site_distance_m: float, centre_m: ArrayLike = (0.0, 0.0)
) -> np.ndarray:
    """``(1 + 3·R·(R + 1), 2)`` site positions (m) of a hexagonal grid of ``rings`` rings
    centred on ``centre_m``, in edge-server order: the centre, then ring 1, 2, ...; ring k
    starts at k·D on the +x axis and walks counter-clockwise (its corners are
    k·D·(cos 60°j, sin 60°j), its edges hold k − 1 more sites each)."""
    offsets = np.asarray(hex_grid_offsets_m(rings, inter_site_distance_m), dtype=float)
    out: np.ndarray = offsets + np.asarray(centre_m, dtype=float)
    return out


def hex_site_count(rings: int) -> int:
    """1 + 3·R·(R + 1): 1 centre and 6k sites on ring k."""
    return 1 + 3 * rings * (rings + 1)


# ----------------------------------------------------------------------------- distances


def distances_m(positions_m: ArrayLike, sites_m: ArrayLike) -> np.ndarray:
    """``(n_clients, n_sites)`` 2D distances (m) from each client to each site."""
    p = np.asarray(positions_m, dtype=float).reshape(-1, 2)
    s = np.asarray(sites_m, dtype=float).reshape(-1, 2)
    out: np.ndarray = np.hypot(p[:, None, 0] - s[None, :, 0], p[:, None, 1] - s[None, :, 1])
    return out


def nearest_site(positions_m: ArrayLike, sites_m: ArrayLike) -> np.ndarray:
    """Each client's nearest site (ties: the lower index)."""
    out: np.ndarray = np.argmin(distances_m(positions_m, sites_m), axis=1)
    return out


# ----------------------------------------------------------------------------- placement


def _in_area(points: np.ndarray, area_m: tuple[float, float]) -> np.ndarray:
    w, h = area_m
    return (points[:, 0] >= 0) & (points[:, 0] <= w) & (points[:, 1] >= 0) & (points[:, 1] <= h)


def _far_from_sites(points: np.ndarray, sites_m: np.ndarray, min_distance_m: float) -> np.ndarray:
    if min_distance_m <= 0 or len(points) == 0:
        return np.ones(len(points), dtype=bool)
    out: np.ndarray = distances_m(points, sites_m).min(axis=1) >= min_distance_m
    return out


def _rejection(
    n: int,
    propose: Callable[[int], np.ndarray],
    accept: Callable[[np.ndarray], np.ndarray],
    what: str,
) -> np.ndarray:
    """``n`` points of ``propose`` that ``accept`` keeps, in the order drawn. Batches of
    ``max(16, 2·remaining / acceptance so far)`` candidates (deterministic given the
    generator behind ``propose``)."""
    out: list[np.ndarray] = []
    got, proposed, accepted = 0, 0, 0
    for _ in range(_MAX_BATCHES):
        if got >= n:
            break
        rate = accepted / proposed if accepted else 1.0 / 64
        k = int(min(_MAX_BATCH, max(16, np.ceil(2 * (n - got) / rate))))
        cand = propose(k)
        keep = cand[accept(cand)]
        proposed, accepted = proposed + k, accepted + len(keep)
        keep = keep[: n - got]
        out.append(keep)
        got += len(keep)
    if got < n:
        raise ValueError(
            f"geometry: cannot place {n} clients {what}: the region left by "
            f"geometry.min_distance_m is (almost) empty"
        )
    return np.concatenate(out) if out else np.zeros((0, 2))


def place_uniform(
    n: int,
    area_m: tuple[float, float],
    sites_m: ArrayLike,
    min_distance_m: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """``n`` positions uniform over the area [0, W] × [0, H], none nearer than
    ``min_distance_m`` to a site (redrawn). Each candidate is one ``rng.random(2)`` pair
    scaled by (W, H)."""
    sites = np.asarray(sites_m, dtype=float).reshape(-1, 2)
    size = np.asarray(area_m, dtype=float)
    return _rejection(
        n,
        lambda k: rng.random((k, 2)) * size,
        lambda p: _far_from_sites(p, sites, min_distance_m),
        "uniformly over the area",
    )


def place_per_cell(
    counts: list[int],
    area_m: tuple[float, float],
    sites_m: ArrayLike,
    min_distance_m: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """``counts[k]`` positions uniform over site k's Voronoi cell within the area (the
    points nearer to site k than to any other: for an inner site of a hexagonal grid its
    hexagon), sites in order, each site's clients after the previous site's. Candidates
    are drawn uniformly over the area and kept if their nearest site is k (so the result
    is exactly uniform over the cell)."""
    sites = np.asarray(sites_m, dtype=float).reshape(-1, 2)
    size = np.asarray(area_m, dtype=float)

    def in_cell(k: int) -> Callable[[np.ndarray], np.ndarray]:
        def accept(p: np.ndarray) -> np.ndarray:
            out: np.ndarray = (nearest_site(p, sites) == k) & _far_from_sites(
                p, sites, min_distance_m
            )
            return out

        return accept

    parts = [
        _rejection(
            count, lambda m: rng.random((m, 2)) * size, in_cell(k), f"in the cell of site {k}"
        )
        for k, count in enumerate(counts)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 2))


def place_hotspots(
    counts: list[int],
    centres_m: ArrayLike,
    radii_m: ArrayLike,
    area_m: tuple[float, float],
    sites_m: ArrayLike,
    min_distance_m: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """``counts[j]`` positions uniform over hotspot j's disc (centre, radius) within the
    area, hotspots in order. A candidate is ``r = radius·√u1, θ = 2π·u2`` (uniform over
    the disc's area) from one ``rng.random(2)`` pair; those outside the area or nearer
    than ``min_distance_m`` to a site are redrawn."""
    sites = np.asarray(sites_m, dtype=float).reshape(-1, 2)
    centres = np.asarray(centres_m, dtype=float).reshape(-1, 2)
    radii = np.asarray(radii_m, dtype=float).reshape(-1)

    def disc(centre: np.ndarray, radius: float) -> Callable[[int], np.ndarray]:
        def propose(k: int) -> np.ndarray:
            u = rng.random((k, 2))
            r, theta = radius * np.sqrt(u[:, 0]), 2 * np.pi * u[:, 1]
            return centre + np.column_stack([r * np.cos(theta), r * np.sin(theta)])

        return propose

    parts = [
        _rejection(
            count,
            disc(centres[j], float(radii[j])),
            lambda p: _in_area(p, area_m) & _far_from_sites(p, sites, min_distance_m),
            f"in hotspot {j}",
        )
        for j, count in enumerate(counts)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 2))


# ----------------------------------------------------------------------------- power


def path_loss_db(
    distance_m: ArrayLike,
    channel: ShannonChannel,
    large_scale: LargeScaleDraw | None = None,
) -> np.ndarray:
    """Each link's path loss (dB, a loss: positive) under the channel's model.

    Exponent model (KAPC Table 4): ``PL = −PL0 + 10·γ·log10(d / d0)`` (PL0 the channel's
    ``path_loss_db``, −40 dB by default: 139.1 dB at 300 m), no shadowing. A 3GPP model:
    :meth:`Tr38901PathLoss.path_loss_db` of each link's LOS state and shadow fading
    (``large_scale``, drawn per link)."""
    d = np.asarray(distance_m, dtype=float)
    pl: Tr38901PathLoss | None = channel.path_loss
    if pl is None:
        return -channel.path_loss_db + 10.0 * channel.path_loss_exponent * np.log10(
            d / channel.reference_distance_m
        )
    if large_scale is None:
        raise ValueError("a 3GPP path loss needs each link's LOS state and shadowing")
    return pl.link_path_loss_db(d, large_scale)


def received_power_dbm(tx_power_dbm: float, loss_db: ArrayLike) -> np.ndarray:
    """``P_rx = P_tx − PL`` (dBm): a site's downlink power at a client (no small-scale
    fading: the mean a client measures)."""
    return tx_power_dbm - np.asarray(loss_db, dtype=float)


def sinr_db(
    rx_power_dbm: ArrayLike, noise_dbm: float, groups: ArrayLike | None = None
) -> np.ndarray:
    """Each site's downlink SINR at each client (dB):

    ``SINR_s = P_s / (Σ_{s' ≠ s, group(s') = group(s)} P_s' + N)``, powers in mW,
    ``N = N0·B`` the noise; ``groups`` (S,): the sites' channel groups of a reuse factor
    (:mod:`mecsim.emulation.interference`), None: every other site co-channel.

    With every other site co-channel and one power per site this is increasing in
    ``P_s`` (the denominator is the total minus ``P_s``), so its best site is the
    strongest one; it differs from received power in the dB margins hysteresis compares.
    With reuse groups a weaker site of a quieter group can have the best SINR.
    """
    p_mw = 10.0 ** (np.asarray(rx_power_dbm, dtype=float) / 10.0)
    noise_mw = 10.0 ** (noise_dbm / 10.0)
    if groups is None:
        others = p_mw.sum(axis=-1, keepdims=True) - p_mw
    else:
        grp = np.asarray(groups, dtype=np.int64)
        same = (grp[:, None] == grp[None, :]) & ~np.eye(len(grp), dtype=bool)
        others = p_mw @ same.astype(float)  # [c, s] = Σ_{s' co-channel with s, s' ≠ s}
    out: np.ndarray = 10.0 * np.log10(p_mw / (others + noise_mw))
    return out


# ----------------------------------------------------------------------------- association


def association_metric(
    rule: str,
    distance_m: ArrayLike,
    rx_power_dbm: ArrayLike | None = None,
    noise_dbm: float | None = None,
    groups: ArrayLike | None = None,
) -> np.ndarray:
    """What the rule compares, per client and site, larger is better: ``nearest``
    −d (m); ``strongest`` the received power (dBm); ``sinr`` the SINR (dB; only sites of
    one channel group interfere when ``groups`` is given, :func:`sinr_db`)."""
    if rule == "nearest":
        return -np.asarray(distance_m, dtype=float)
    if rx_power_dbm is None:
        raise ValueError(f"association rule {rule} needs the received powers")
    if rule == "strongest":
        return np.asarray(rx_power_dbm, dtype=float)
    if rule == "sinr":
        if noise_dbm is None:
            raise ValueError("association rule sinr needs the noise power")
        return sinr_db(rx_power_dbm, noise_dbm, groups)
    raise ValueError(f"association rule {rule!r} is not one of {RULES}")


def associate(metric: ArrayLike) -> np.ndarray:
    """The best site of each client (the largest metric; ties: the lower index): the
    association at a run's start, without hysteresis (no site is serving yet)."""
    out: np.ndarray = np.argmax(np.asarray(metric, dtype=float), axis=1)
    return out


def a3_handover(
    metric: ArrayLike,
    serving: ArrayLike,
    held_s: ArrayLike,
    elapsed_s: float,
    hysteresis: float,
    time_to_trigger_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """One re-evaluation of the association with an A3-style event (3GPP TS 38.331's
    "neighbour becomes offset better than serving"), for every client at once.

    ``metric`` (n, S): this evaluation's :func:`association_metric`; ``serving`` (n,):
    each client's serving site; ``held_s`` (n, S): how long the entering condition has
    held for each (client, site), NaN where it did not hold at the previous evaluation;
    ``elapsed_s``: emulated time since the previous evaluation.

    Rule: site s ≠ serving enters when ``m_s > m_serving + hysteresis`` (dB, or metres
    for ``nearest``). A site that enters now has held 0 s; one that held at the previous
    evaluation and still does has held ``held + elapsed_s`` (the condition is seen only
    at evaluations, so it counts from the first one at which it held); a site that stops
    satisfying it restarts (NaN). Once a site has held for at least
    ``time_to_trigger_s``, the client hands over to it (to the best such site, by the
    metric) and its timers restart. Returns (serving, held_s) after this evaluation.
    """
    m = np.asarray(metric, dtype=float)
    n = m.shape[0]
    srv = np.asarray(serving, dtype=np.int64).copy()
    held = np.asarray(held_s, dtype=float).copy()
    rows = np.arange(n)
    enter = m > (m[rows, srv] + hysteresis)[:, None]
    enter[rows, srv] = False
    held = np.where(enter, np.where(np.isnan(held), 0.0, held + elapsed_s), np.nan)
    triggered = enter & (held >= time_to_trigger_s)
    move = triggered.any(axis=1)
    if move.any():
        best = np.argmax(np.where(triggered, m, -np.inf), axis=1)
        srv[move] = best[move]
        held[move] = np.nan
    return srv, held


# ----------------------------------------------------------------------------- a scenario


@dataclass(frozen=True, eq=False)
class StaticCells:
    """A scenario's geometry at the start of a run.

    ``sites_m`` (S, 2) and ``positions_m`` (n, 2) in metres; ``distance_m`` (n, S);
    ``large_scale``: each link's LOS state and shadowing under a 3GPP path loss (else
    None); ``path_loss_db`` and ``rx_power_dbm`` (n, S) under a Shannon channel (else
    None); ``metric`` (n, S) what the association rule compares; ``serving`` (n,) each
    client's edge server; ``groups`` (S,) the sites' channel groups (or None)."""

    area_m: tuple[float, float]
    sites_m: np.ndarray
    positions_m: np.ndarray
    distance_m: np.ndarray
    large_scale: LargeScaleDraw | None
    path_loss_db: np.ndarray | None
    rx_power_dbm: np.ndarray | None
    metric: np.ndarray
    serving: np.ndarray
    #: (S,) the sites' channel groups under ``channel.interference.model: geometric``
    #: (mecsim.emulation.interference); None: every site co-channel
    groups: np.ndarray | None = None
    #: spatially consistent LOS states and shadowing (mecsim.channel.spatial): each
    #: link's are functions of the client's position; None: drawn once per run
    spatial: SpatialLargeScale | None = None

    def large_scale_at(self, positions_m: np.ndarray) -> LargeScaleDraw | None:
        """Every link's LOS state and shadowing with the clients at ``positions_m``:
        the fields' values there (spatial consistency), else the draws of the run."""
        if self.spatial is None or self.large_scale is None:
            return self.large_scale
        return self.spatial.draw(positions_m, self.large_scale.environment_u)

    def serving_distance_m(self) -> np.ndarray:
        out: np.ndarray = self.distance_m[np.arange(len(self.serving)), self.serving]
        return out

    def serving_large_scale(self) -> LargeScaleDraw | None:
        if self.large_scale is None:
            return None
        return self.large_scale.take((np.arange(len(self.serving)), self.serving))


def initial_positions(
    geometry: GeometryConfig, n_clients: int, sites_m: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """The clients' initial positions (n, 2) of ``geometry.clients``."""
    c, area, dmin = geometry.clients, geometry.area_m(), geometry.min_distance_m
    if c.placement == "explicit":
        return np.asarray(c.positions_m, dtype=float).reshape(-1, 2)
    if c.placement == "uniform":
        return place_uniform(n_clients, area, sites_m, dmin, rng)
    if c.placement == "per_cell":
        return place_per_cell(split_evenly(n_clients, len(sites_m)), area, sites_m, dmin, rng)
    spots = c.hotspots or []
    return place_hotspots(
        geometry.hotspot_counts(n_clients),
        [h.centre_m for h in spots],
        [h.radius_m for h in spots],
        area,
        sites_m,
        dmin,
        rng,
    )


def cells_of(
    scenario: Scenario,
    channel: object,
    placement_rng: np.random.Generator,
    large_scale_rng: np.random.Generator,
    positions_m: np.ndarray | None = None,
    spatial_rng: np.random.Generator | None = None,
) -> StaticCells:
    """The scenario's sites, the clients' initial positions (from ``placement_rng``),
    each link's LOS state and shadowing under a 3GPP path loss (from ``large_scale_rng``:
    one U[0, 1) per link, then one N(0, 1) per link, links in client-major order,
    :meth:`Tr38901PathLoss.draw`), and the association at the start. ``positions_m``: the
    clients' initial positions when they come from elsewhere (a mobility trace's
    positions at the run's start: the placement is then not drawn). ``spatial_rng``:
    under a 3GPP path loss, each link's LOS state and shadowing are spatially consistent
    (mecsim.channel.spatial: the fields drawn from it; the per-link draws are still
    made, their h_E draws used), else None."""
    g = scenario.geometry
    if g is None:
        raise ValueError("the scenario has no geometry section")
    sites = np.asarray(g.sites_m(), dtype=float).reshape(-1, 2)
    positions = (
        initial_positions(g, scenario.topology.clients, sites, placement_rng)
        if positions_m is None
        else np.asarray(positions_m, dtype=float).reshape(-1, 2)
    )
    d = distances_m(positions, sites)
    large_scale = None
    spatial = None
    if isinstance(channel, ShannonChannel) and channel.path_loss is not None:
        large_scale = channel.path_loss.draw(d, large_scale_rng)
        if spatial_rng is not None:
            spatial = SpatialLargeScale(channel.path_loss, g.area_m(), sites, spatial_rng)
            large_scale = spatial.draw(positions, large_scale.environment_u)
    inter = getattr(scenario.channel, "interference", None)
    groups = (
        reuse_groups_of(g, inter.reuse)
        if inter is not None and inter.model == "geometric"
        else None
    )
    loss, rx, metric = link_metric(g.association.rule, d, channel, large_scale, groups)
    return StaticCells(
        g.area_m(),
        sites,
        positions,
        d,
        large_scale,
        loss,
        rx,
        metric,
        associate(metric),
        groups,
        spatial,
    )


def link_metric(
    rule: str,
    distance_m: np.ndarray,
    channel: object,
    large_scale: LargeScaleDraw | None,
    groups: np.ndarray | None = None,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    """(path loss, received power, association metric), each (n, S), of the links at
    ``distance_m`` (n, S) under the channel's model and each link's LOS state and
    shadowing (``large_scale``, drawn once per run); the path loss and power are None
    for a channel without a radio model (the rule is then ``nearest``). ``groups``: the
    sites' channel groups (only co-channel sites interfere in ``sinr``), or None."""
    loss = rx = None
    noise_dbm = None
    if isinstance(channel, ShannonChannel):
        loss = path_loss_db(distance_m, channel, large_scale)
        rx = received_power_dbm(channel.server_tx_power_dbm, loss)
        noise_dbm = channel.noise_psd_dbm_per_hz + 10.0 * np.log10(channel.server_bandwidth_hz)
    return loss, rx, association_metric(rule, distance_m, rx, noise_dbm, groups)
