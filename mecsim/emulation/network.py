"""From the scenario's channel and devices to what the engine times each round.

Client radio properties (distance, bandwidth, transmit power) are drawn once from the
scenario seed; with a 3GPP TR 38.901 path loss (``channel.path_loss``) each client's LOS
state and shadow fading are drawn once too, from a stream of the seed of their own (so
the other draws are those of the exponent model, number for number); per-round
quantities (interference, fading) are drawn from a stream of
the seed keyed by the round, so a round's channel does not depend on earlier rounds'
draws. Latency jitter has a stream of its own (keyed by the round too), so switching
latency or loss on does not change the channel's draws. Every draw is returned per
client-round for the records.

Each link's rate is then turned into a goodput and a latency (:mod:`mecsim.channel.transport`):
``transfer = latency + 8 * bytes / goodput`` with ``goodput = min(rate, Mathis bound)``
where the scenario sets a loss rate. On a shared medium a flow the bound caps below its
link rate needs only ``goodput / rate`` of the medium's time (its max share), and the
medium's time is shared max-min fairly (water-filling: :mod:`mecsim.emulation.engine.sharing`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

import mecsim.registry as registry
from mecsim.channel import FixedRateChannel, ShannonChannel, Tr38901PathLoss, TraceChannel
from mecsim.channel.pathloss import RECORD_KEYS as PATH_LOSS_RECORD_KEYS
from mecsim.channel.phy_models import NrPhy, TruncatedShannonPhy, WifiAxPhy
from mecsim.channel.tcp import CONNECTION_SETUP_ROUND_TRIPS, TcpColumns, TcpFlow, header_efficiency
from mecsim.channel.transport import jittered_latency_s, mathis_goodput_bps
from mecsim.channel.units import db_to_linear, dbm_to_w
from mecsim.channel.wireless import RECORD_KEYS, RoundChannel, large_scale_gain
from mecsim.emulation.devices import DeviceProfile, all_profiles
from mecsim.emulation.energy import air_rate_bps, power_array
from mecsim.emulation.engine import (
    ClientColumns,
    ClientSpec,
    NetworkSpec,
    RateSchedule,
    ServerSpec,
    TimeVaryingRate,
)
from mecsim.emulation.geometry import StaticCells, cells_of, distances_m, path_loss_db
from mecsim.emulation.handover import MovingCells, RoundCells, area_of, initial_trace_positions
from mecsim.emulation.interference import (
    InstantUplink,
    downlink_interference_w,
    uplink_interference_w,
)
from mecsim.emulation.moving_rate import MovingLinks, UplinkGainsOnGrid
from mecsim.scenario import (
    ChannelConfig,
    FixedRateChannelConfig,
    LinkTransport,
    PluginChannelConfig,
    Scenario,
    ShannonChannelConfig,
    TraceChannelConfig,
    personalised_downloads,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

_CLIENTS_STREAM = 2
_ROUND_STREAM = 3
_TRANSPORT_STREAM = 4
#: each client's LOS state and shadow fading under a 3GPP path loss (once per run)
_LARGE_SCALE_STREAM = 0x38901
#: the clients' initial positions of a scenario's geometry (once per run): "GEO"
_GEOMETRY_STREAM = 0x47454F
#: the spatially consistent LOS-state and shadowing fields of a geometry's sites (once
#: per run, mecsim.channel.spatial): "SPAT"
_SPATIAL_STREAM = 0x53504154
#: the per client-round columns a run with a geometry adds to clients.csv: the client's
#: position (m, the area's coordinates)
GEOMETRY_KEYS = ("x_m", "y_m")
#: the per client-round column a run whose clients move adds after GEOMETRY_KEYS: 1 if
#: the client changed edge server at this round's start, else 0 (also a rounds.csv
#: column: the round's handovers, all clients)
HANDOVER_KEYS = ("handovers",)
#: the per client-round columns of handover during a round (``geometry.handover``),
#: after the channel's and GEOMETRY_KEYS: the client's handovers in the round (at
#: measurement times from the round's start to its end), the first one's time (s since
#: the round's start; empty without one) and the transfers that one or more of them
#: handed over mid-way or held up (``download``, ``upload``, ``download;upload``, or
#: empty: none was in progress)
DURING_ROUND_KEYS = ("handovers_in_round", "handover_s", "handover_transfer")

#: Per client-round transport columns added to the channel records.
TRANSPORT_KEYS = (
    "uplink_latency_s",
    "downlink_latency_s",
    "uplink_goodput_bps",
    "downlink_goodput_bps",
    "backhaul_latency_s",
    "backhaul_goodput_bps",
)


def device_profiles(scenario: Scenario) -> dict[str, DeviceProfile]:
    """Built-in profiles, with the scenario's own added or overriding them."""
    profiles = all_profiles()
    for name, p in scenario.devices.profiles.items():
        profiles[name] = DeviceProfile(name=name, **p.model_dump())
    return profiles


def _range(value: float | tuple[float, float]) -> tuple[float, float]:
    return (
        (float(value), float(value))
        if isinstance(value, (int, float))
        else cast("tuple[float, float]", tuple(value))
    )


def spatially_consistent(scenario: Scenario) -> bool:
    """Are the scenario's LOS states and shadowing spatially consistent
    (``channel.path_loss.spatial_consistency``; null: where clients move)? Only a 3GPP
    path loss of a Shannon channel with a geometry has them."""
    cfg, g = scenario.channel, scenario.geometry
    if not isinstance(cfg, ShannonChannelConfig) or g is None:
        return False
    if cfg.path_loss.model == "exponent":
        return False
    on = cfg.path_loss.spatial_consistency
    return g.moves() if on is None else on


def _path_loss(cfg: ShannonChannelConfig) -> Tr38901PathLoss | None:
    """A Shannon channel's 3GPP path loss; None for the exponent model."""
    pl = cfg.path_loss
    if pl.model == "exponent":
        return None
    assert pl.carrier_ghz is not None  # the schema requires it for the 38.901 models
    return Tr38901PathLoss(
        model=pl.model,
        carrier_ghz=pl.carrier_ghz,
        bs_height_m=pl.bs_height_m,
        ut_height_m=pl.ut_height_m,
        los=pl.los,
        shadowing=pl.shadowing,
    )


def _phy(cfg: ShannonChannelConfig) -> Any:
    """The rate model of ``channel.phy`` (:mod:`mecsim.channel.phy_models`); None for
    ``shannon`` (the channel's own B · log2(1 + SINR), float for float as before)."""
    p = cfg.phy
    if p.model == "truncated_shannon":
        return TruncatedShannonPhy(p.alpha, p.sinr_min_db, p.max_spectral_efficiency)
    if p.model == "wifi_ax":
        return WifiAxPhy(p.spatial_streams, p.guard_interval_ns)
    if p.model == "nr":
        return NrPhy(p.subcarrier_spacing_khz, p.layers, p.cqi_table, p.frequency_range)
    return None


def build_channel(cfg: ChannelConfig) -> Any:
    """The link model of a scenario's ``channel`` section: a built-in one, or a channel
    plugin's class built with its validated ``Params`` (the
    :class:`~mecsim.channel.wireless.ChannelModel` protocol)."""
    if isinstance(cfg, PluginChannelConfig):
        cls = registry.CHANNELS.get(cfg.name)
        params_model = getattr(cls, "Params", None)
        channel = cls(params_model(**cfg.params)) if params_model is not None else cls()
        for method in ("draw_clients", "draw_round"):
            if not callable(getattr(channel, method, None)):
                raise registry.PluginError(
                    f"channel plugin {cfg.name!r} has no {method}(): it must implement "
                    "mecsim.api.ChannelModel"
                )
        return channel
    if isinstance(cfg, ShannonChannelConfig):
        inter = cfg.interference
        return ShannonChannel(
            uplink_bandwidth_range_hz=_range(cfg.uplink.bandwidth_hz),
            tx_power_range_dbm=_range(cfg.uplink.tx_power_dbm),
            distance_range_m=_range(cfg.distance_m),
            path_loss_db=cfg.path_loss_db,
            reference_distance_m=cfg.reference_distance_m,
            path_loss_exponent=cfg.path_loss_exponent,
            fading=cfg.fading,
            noise_psd_dbm_per_hz=cfg.noise_psd_dbm_per_hz,
            # geometric interference is computed per round from the cells (links()), not drawn
            interference=inter is not None and inter.model == "distribution",
            interference_unit=inter.unit if inter and inter.unit else "noise",
            ul_interference_mean=inter.uplink_mean if inter else 0.0,
            ul_interference_std=inter.uplink_std if inter else 0.0,
            dl_interference_mean=inter.downlink_mean if inter else 0.0,
            dl_interference_std=inter.downlink_std if inter else 0.0,
            server_bandwidth_hz=cfg.downlink.bandwidth_hz,
            server_tx_power_dbm=cfg.downlink.tx_power_dbm,
            downlink_mode="equal_split" if cfg.downlink.mode == "equal_split" else "full",
            snr_offset_db=cfg.snr_offset_db,
            path_loss=_path_loss(cfg),
            phy=_phy(cfg),
            noise_figure_db=cfg.noise_figure_db,
        )
    if isinstance(cfg, FixedRateChannelConfig):
        return FixedRateChannel(cfg.uplink.rate_bps, cfg.downlink.rate_bps)
    if isinstance(cfg, TraceChannelConfig):
        return TraceChannel(cfg.path)
    raise TypeError(f"unknown channel config {type(cfg).__name__}")


def channel_record_keys(cfg: ChannelConfig) -> tuple[str, ...]:
    """A channel's per-client quantities beyond mecsim's own columns: extra columns of
    clients.csv, after mecsim's. A channel plugin's are its class's ``record_keys``; a
    Shannon channel with a 3GPP path loss records each client's path loss, LOS state and
    shadow fading (:data:`mecsim.channel.pathloss.RECORD_KEYS`); the other built-in
    models none."""
    if isinstance(cfg, ShannonChannelConfig):
        return () if cfg.path_loss.model == "exponent" else PATH_LOSS_RECORD_KEYS
    if not isinstance(cfg, PluginChannelConfig):
        return ()
    keys = tuple(getattr(registry.CHANNELS.get(cfg.name), "record_keys", ()))
    clash = [k for k in keys if k in RESERVED_CLIENT_KEYS]
    if clash:
        raise registry.PluginError(
            f"channel plugin {cfg.name!r}: record_keys {clash} are mecsim's own columns"
        )
    return keys


def client_record_keys(scenario: Scenario) -> tuple[str, ...]:
    """clients.csv's columns after mecsim's own: the channel's
    (:func:`channel_record_keys`), then, with a geometry, :data:`GEOMETRY_KEYS`."""
    g = scenario.geometry
    geometry = GEOMETRY_KEYS if g is not None else ()
    during = DURING_ROUND_KEYS if g is not None and g.handover is not None else ()
    return (
        *channel_record_keys(scenario.channel),
        *geometry,
        *round_record_keys(scenario),
        *during,
    )


def round_record_keys(scenario: Scenario) -> tuple[str, ...]:
    """rounds.csv's columns after the algorithm's: ``handovers`` when the scenario's
    clients move (a geometry with a mobility model other than static), else none (static
    clients never hand over; their records keep the columns they had)."""
    g = scenario.geometry
    return HANDOVER_KEYS if g is not None and g.moves() else ()


#: per client-round names a channel plugin's record_keys may not take
RESERVED_CLIENT_KEYS = frozenset(
    (*RECORD_KEYS, *TRANSPORT_KEYS, *GEOMETRY_KEYS, *HANDOVER_KEYS, *DURING_ROUND_KEYS)
)


def downlink_note(scenario: Scenario) -> str | None:
    """The sentence printed under a run's tables when personalised downloads each use the
    whole band (``downlink.mode: full``); None when the assumption does not arise."""
    if scenario.downlink_mode() != "full" or not personalised_downloads(scenario.algorithm.name):
        return None
    cfg = cast(ShannonChannelConfig, scenario.channel)  # downlink_mode() is None for others
    k = scenario.clients_per_round()
    mhz = cfg.downlink.bandwidth_hz / 1e6
    return (
        f"Downlink: {scenario.algorithm.name} sends each client its own model and "
        f"channel.downlink.mode is full, so the {k} concurrent downloads each use the "
        f"whole {mhz:g} MHz band (the KAPC paper's assumption; K times the spectrum and "
        "power of one transmitter). downlink.mode auto or shared time-shares the band "
        "(docs/channel.md)."
    )


def transport_of(cfg: ChannelConfig) -> tuple[LinkTransport, LinkTransport]:
    """(uplink, downlink) :class:`~mecsim.scenario.LinkTransport` of a channel config."""
    return cfg.uplink, cfg.downlink


def schedule_from(times_s: ArrayLike, rates_bps: ArrayLike, start_s: float) -> RateSchedule:
    """An absolute piecewise-constant schedule, re-based to start at ``start_s``."""
    times = np.asarray(times_s, dtype=float)
    rates = np.asarray(rates_bps, dtype=float)
    k = int(np.searchsorted(times, start_s, side="right")) - 1
    rel_times = (0.0, *(float(t - start_s) for t in times[k + 1 :]))
    return RateSchedule(rel_times, tuple(float(r) for r in rates[k:]))


@dataclass(frozen=True, eq=False)
class RoundLinks:
    """One round's links (:meth:`NetworkModel.links`), per selected client in selection
    order, and its edge servers."""

    channel: RoundChannel
    uplink_goodput_bps: np.ndarray  # the channel's rate under the Mathis cap
    downlink_goodput_bps: np.ndarray
    uplink_latency_s: np.ndarray  # one way, jittered
    downlink_latency_s: np.ndarray
    uplink_cap_bps: np.ndarray  # the Mathis bound alone
    downlink_cap_bps: np.ndarray
    servers: list[ServerSpec]
    backhaul_latency_s: np.ndarray  # per edge server
    backhaul_goodput_bps: np.ndarray
    # goodput / rate where the Mathis bound caps the flow below its link rate, else 1.0:
    # the largest share of a shared medium's time the flow can use
    # None: no loss in that direction, so every share is 1.0 (nothing to compute)
    uplink_max_share: np.ndarray | None
    downlink_max_share: np.ndarray | None
    # each selected client's TCP flow per direction (None: transport ideal)
    uplink_tcp: tuple[TcpFlow, ...] | None = None
    downlink_tcp: tuple[TcpFlow, ...] | None = None


def max_share(rate_bps: ArrayLike, goodput_bps: ArrayLike) -> np.ndarray:
    """``goodput / rate`` where the goodput is below the link's rate (a Mathis cap binds),
    else 1.0: the largest fraction of a shared medium's time a flow can use. Exactly 1.0
    without loss (goodput = rate), so such media stay processor-shared."""
    rate = np.asarray(rate_bps, dtype=float)
    good = np.asarray(goodput_bps, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(good < rate, good / rate, 1.0)


def payload_share(link: LinkTransport) -> float:
    """The share of a link's rate that carries payload: ``mss / (mss + header)`` under
    ``transport: tcp`` (:func:`~mecsim.channel.tcp.header_efficiency`), 1.0 under ideal."""
    return header_efficiency(link.segment_bytes(), link.header_bytes) if link.tcp() else 1.0


def tcp_flows(
    link: LinkTransport,
    rtt_s: np.ndarray,
    flows: np.ndarray,
    mac: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[TcpFlow, ...] | None:
    """Each client's :class:`~mecsim.channel.tcp.TcpFlow` on ``link`` (round trips
    ``rtt_s``, ``flows`` sharing its medium; ``mac``: an aggregating MAC's air time of
    an MPDU and MPDUs an A-MPDU, per client, :meth:`WifiAxPhy.exchanges`), or None
    under ``transport: ideal``."""
    if not link.tcp():
        return None
    made: dict[tuple[float, int, float, float], TcpFlow] = {}  # one object per kind

    def flow(rtt: float, k: int, air_s: float = 0.0, mpdus: float = 1.0) -> TcpFlow:
        key = (rtt, k, air_s, mpdus)
        found = made.get(key)
        if found is None:
            found = made[key] = TcpFlow(
                rtt_s=rtt,
                mss_bytes=link.segment_bytes(),
                initial_window=link.initial_window_segments,
                setup_round_trips=CONNECTION_SETUP_ROUND_TRIPS[link.connection],
                loss_rate=link.loss_rate,
                congestion_control=link.congestion_control,
                min_rto_s=link.min_rto_s,
                flows=k,
                queue=link.queue,
                mpdu_air_s=air_s,
                ampdu_mpdus=mpdus,
            )
        return found

    n = len(rtt_s)
    if mac is not None:
        return tuple(map(flow, rtt_s.tolist(), flows.tolist(), *(a.tolist() for a in mac)))
    if n and (rtt_s == rtt_s[0]).all() and (flows == flows[0]).all():
        return (flow(float(rtt_s[0]), int(flows[0])),) * n  # one object, shared
    return tuple(map(flow, rtt_s.tolist(), flows.tolist()))


def _air_rate(goodput_bps: np.ndarray, rate_bps: np.ndarray, loss_rate: float) -> np.ndarray:
    """:func:`air_rate_bps`; without loss the goodput itself (equal to it, uncomputed)."""
    return air_rate_bps(goodput_bps, rate_bps, loss_rate) if loss_rate > 0 else goodput_bps


class NetworkModel:
    """Per-round ClientSpecs (rates, device), edge servers and media for the engine."""

    def __init__(self, scenario: Scenario, profiles: dict[str, DeviceProfile]) -> None:
        self.scenario = scenario
        self.channel = build_channel(scenario.channel)
        seed = scenario.seed
        clients_rng = np.random.default_rng([seed, _CLIENTS_STREAM])
        n = scenario.topology.clients
        #: the sites, the clients' positions and the association at the start (None
        #: without a geometry section: distances drawn, clients in topology blocks)
        self.cells: StaticCells | None = None
        #: clients that move: the association re-evaluated at each round's start (None:
        #: no geometry, or static clients)
        self.moving: MovingCells | None = None
        #: the cells at the start of the round last drawn (clients that move only)
        self.round_cells: RoundCells | None = None
        g = scenario.geometry
        if g is not None:
            # a trace's clients start where the trace has them (the placement unused)
            tracks, trace_end_s, initial = None, float("inf"), None
            if g.mobility.model == "trace":
                initial, tracks, trace_end_s = initial_trace_positions(g.mobility, n, area_of(g))
            # positions from a stream of their own; LOS states and shadowing per link
            # (client × site) from the 3GPP stream, so with one site they are the
            # numbers a run without a geometry draws per client
            self.cells = cells_of(
                scenario,
                self.channel,
                np.random.default_rng([seed, _GEOMETRY_STREAM]),
                np.random.default_rng([seed, _LARGE_SCALE_STREAM]),
                positions_m=initial,
                spatial_rng=(
                    np.random.default_rng([seed, _SPATIAL_STREAM])
                    if spatially_consistent(scenario)
                    else None
                ),
            )
            self.edge_server = self.cells.serving.astype(np.int64)
            if g.moves():
                self.moving = MovingCells(
                    self.cells, g, self.channel, seed, tracks=tracks, trace_end_s=trace_end_s
                )
        else:
            self.edge_server = np.array(
                [scenario.edge_server_of(c) for c in range(n)], dtype=np.int64
            )
        if isinstance(self.channel, ShannonChannel) and self.cells is not None:
            # each client's distance to its serving site replaces the distance draw (still
            # drawn: bandwidth and power are the numbers a run without geometry draws)
            self.radio = self.channel.draw_clients(
                n,
                clients_rng,
                distance_m=self.cells.serving_distance_m(),
                large_scale=self.cells.serving_large_scale(),
            )
        elif isinstance(self.channel, ShannonChannel):
            # the LOS states and shadowing of a 3GPP path loss (unused by the exponent
            # model) come from a stream of their own: the clients' draws stay the same
            self.radio = self.channel.draw_clients(
                scenario.topology.clients,
                clients_rng,
                large_scale_rng=np.random.default_rng([seed, _LARGE_SCALE_STREAM]),
            )
        else:
            self.radio = self.channel.draw_clients(scenario.topology.clients, clients_rng)
        #: each client's position (m) at the start of the round last drawn
        self.positions_m = None if self.cells is None else self.cells.positions_m
        #: a moving client's rate follows it during the round (geometry.mobility.rate:
        #: step) where the rate is a function of its distance (a Shannon channel); the
        #: round's links as MovingLinks (up, down), else None (constant rates)
        self.follows = (
            self.moving is not None
            and g is not None
            and g.mobility.rate == "step"
            and isinstance(self.channel, ShannonChannel)
        )
        self.moving_links: tuple[MovingLinks, MovingLinks] | None = None
        #: per-instant uplink interference (channel.interference.timing: instant): the
        #: round's uplinks as :class:`InstantUplink` (the round's timing solves them,
        #: mecsim.emulation.timing), else None
        inter = getattr(scenario.channel, "interference", None)
        self.instant = (
            inter is not None and inter.model == "geometric" and inter.timing == "instant"
        )
        self.instant_uplink: InstantUplink | None = None
        self.devices = [profiles[name] for name in scenario.client_profiles()]
        # each client's device as columns (ClientColumns of a round index them)
        self.step_overhead_s = np.array([float(d.step_overhead_s) for d in self.devices])
        self.flops_per_s = np.array([float(d.flops_per_s) for d in self.devices])
        # each client's radiated power as the channel draws it (NaN where the channel has
        # none: the device profile's radio_tx_power_dbm), and its watts (POWER_COLUMNS of
        # mecsim.emulation.energy: the transmit draw from that power)
        self.tx_power_dbm = np.asarray(self.radio.tx_power_dbm, dtype=float)
        self.power_w = power_array(self.devices, self.tx_power_dbm)
        server = profiles[scenario.devices.edge_server]
        self.server_profile = server
        self.uplink, self.downlink = transport_of(scenario.channel)
        up_shared, down_shared = scenario.channel.shared_media(scenario.algorithm.name)
        self.network = NetworkSpec(
            uplink_shared=up_shared, downlink_shared=down_shared, deadline_s=scenario.deadline_s
        )

    def _backhaul(
        self, rng: np.random.Generator
    ) -> tuple[list[ServerSpec], np.ndarray, np.ndarray]:
        """This round's edge servers: each one's backhaul latency (jittered) and goodput."""
        bh = self.scenario.backhaul  # each edge server's wired link to the central server
        n = self.scenario.topology.edge_servers
        lat = jittered_latency_s(bh.latency_s, bh.jitter_s, rng.uniform(-1.0, 1.0, size=n))
        # under tcp the backhaul's headers (its window and losses are not modelled)
        bps = (
            np.full(n, bh.bandwidth_bps * payload_share(bh))
            if bh.tcp()
            else mathis_goodput_bps(
                np.full(n, bh.bandwidth_bps), 2.0 * lat, bh.loss_rate, bh.segment_bytes()
            )
        )
        server = self.server_profile
        servers = [
            ServerSpec(
                server.flops_per_s,
                server.step_overhead_s,
                backhaul_bps=float(bps[k]),
                backhaul_latency_s=float(lat[k]),
            )
            for k in range(n)
        ]
        return servers, lat, bps

    def _cells(self, selected: list[int]) -> dict[str, np.ndarray | None]:
        """For a PHY whose MAC depends on who else sends (802.11ax): which of the round's
        clients share a medium in each direction (their edge server on a shared medium,
        else each its own); nothing for the other channels."""
        if getattr(self.channel, "phy", None) is None:
            return {}
        es = self.edge_server[np.asarray(selected, dtype=np.int64)]
        own = np.arange(len(selected))
        return {
            "ul_cells": es if self.network.uplink_shared else own,
            "dl_cells": es if self.network.downlink_shared else own,
        }

    def _geometric_interference(self, selected: list[int]) -> dict[str, np.ndarray]:
        """Under ``channel.interference.model: geometric``, the round's uplink and
        downlink interference (W) of the selected clients, per round from the cells'
        path losses (:mod:`mecsim.emulation.interference`); else nothing (the draws).
        Clients that move: the path losses at the round's start, those the association
        was evaluated with (:attr:`RoundCells.path_loss_db`), and the round's serving
        cells (``self.edge_server``, set by :meth:`move_to`)."""
        cells = self.cells
        if cells is None or cells.groups is None or cells.path_loss_db is None:
            return {}
        path_loss = cells.path_loss_db
        if self.round_cells is not None and self.round_cells.path_loss_db is not None:
            path_loss = self.round_cells.path_loss_db
        return {
            "ul_interference_w": uplink_interference_w(
                path_loss,
                dbm_to_w(self.tx_power_dbm),
                self.edge_server,
                cells.groups,
                selected,
            ),
            "dl_interference_w": downlink_interference_w(
                path_loss,
                float(dbm_to_w(self.channel.server_tx_power_dbm)),
                self.edge_server,
                cells.groups,
                selected,
            ),
        }

    def links(self, rnd: int, selected: list[int], elapsed_s: float = 0.0) -> RoundLinks:
        """Round ``rnd``'s links of the ``selected`` clients, as arrays in selection
        order: the channel drawn from the scenario seed and the round, each link's
        latency jitter, Mathis cap and goodput, and the edge servers' backhaul. Clients
        that move are first put where they are at the round's start (:meth:`move_to`)."""
        if self.moving is not None:
            self.move_to(rnd, elapsed_s)
        rng = np.random.default_rng([self.scenario.seed, _ROUND_STREAM, rnd])
        ch = self.channel.draw_round(
            self.radio,
            np.asarray(selected, dtype=np.int64),
            rng,
            time_s=elapsed_s,
            **self._geometric_interference(selected),
            **self._cells(selected),
        )
        # latency jitter: (uplink, downlink) per selected client in selection order, then
        # one per edge server's backhaul
        t_rng = np.random.default_rng([self.scenario.seed, _TRANSPORT_STREAM, rnd])
        u = t_rng.uniform(-1.0, 1.0, size=(len(selected), 2))
        up_lat = jittered_latency_s(self.uplink.latency_s, self.uplink.jitter_s, u[:, 0])
        down_lat = jittered_latency_s(self.downlink.latency_s, self.downlink.jitter_s, u[:, 1])
        rtt = up_lat + down_lat  # data one way, acknowledgements the other
        phy = getattr(self.channel, "phy", None)
        mac: tuple[np.ndarray, np.ndarray] | None = None
        if isinstance(phy, WifiAxPhy):  # the cell's exchanges, for a window-limited flow
            mac = phy.exchanges(ch.uplink_snr_db, ch.bandwidth_hz)
        # transport ideal: the Mathis bound alone (rate inf), applied to constant rates and
        # to every segment of a trace schedule; tcp: no cap (a finite flow's losses are
        # timed per transfer, TcpFlow), the payload's share of the rate
        up_cap, down_cap = self._cap(self.uplink, rtt), self._cap(self.downlink, rtt)
        up_share, down_share = payload_share(self.uplink), payload_share(self.downlink)
        up_rate = ch.uplink_rate_bps * up_share
        down_rate = ch.downlink_rate_bps * down_share
        up_good = np.minimum(up_rate, up_cap)
        down_good = np.minimum(down_rate, down_cap)
        servers, bh_lat, bh_bps = self._backhaul(t_rng)
        # the round's links as arrays in selection order, for the energy of its clients:
        # (up, down) air rates (the link rate with the loss rate's retransmissions, never
        # below the goodput: mecsim.emulation.energy.air_rate_bps; NaN where a rate
        # schedule applies) and latencies
        self.moving_links = (
            self._moving_links(ch, selected, elapsed_s, up_cap, down_cap, up_share, down_share)
            if self.follows
            else None
        )
        # a rate trace or a moving client's rate on a dedicated link: the air time is the
        # transfer's duration; a moving client's on a shared medium (where the duration
        # includes the other flows' shares) is its bits at its air rate at the round's
        # start (mecsim.emulation.energy)
        trace = isinstance(self.channel, TraceChannel)
        up_schedule = trace or (self.follows and not self.network.uplink_shared) or self.instant
        self.instant_uplink = (
            self._instant_uplink(ch, selected, up_cap, up_share, elapsed_s)
            if self.instant
            else None
        )
        down_schedule = trace or (self.follows and not self.network.downlink_shared)
        self.round_links = (
            np.column_stack(
                [
                    np.full(len(selected), np.nan)
                    if up_schedule
                    else _air_rate(up_good, up_rate, self.uplink.loss_rate),
                    np.full(len(selected), np.nan)
                    if down_schedule
                    else _air_rate(down_good, down_rate, self.downlink.loss_rate),
                ]
            ),
            np.column_stack([up_lat, down_lat]),
        )
        return RoundLinks(
            ch,
            up_good,
            down_good,
            up_lat,
            down_lat,
            up_cap,
            down_cap,
            servers,
            bh_lat,
            bh_bps,
            max_share(up_rate, up_good) if self._capped(self.uplink) else None,
            max_share(down_rate, down_good) if self._capped(self.downlink) else None,
            tcp_flows(self.uplink, rtt, self._flows(selected, self.network.uplink_shared), mac),
            tcp_flows(self.downlink, rtt, self._flows(selected, self.network.downlink_shared), mac),
        )

    def _instant_uplink(
        self,
        ch: RoundChannel,
        selected: list[int],
        cap: np.ndarray,
        share: float,
        elapsed_s: float = 0.0,
    ) -> InstantUplink:
        """The round's uplinks for per-instant interference (:class:`InstantUplink`):
        the round's draws (bandwidth, power, fading), each link's gain as the channel
        computes it, and what every selected client puts into every site (the path
        losses of the round's start, those of the per-round interference)."""
        cells = self.cells
        assert cells is not None and cells.groups is not None and cells.path_loss_db is not None
        channel = cast(ShannonChannel, self.channel)
        at = np.asarray(selected, dtype=np.int64)
        h = np.asarray(ch.fading_gain, dtype=float)
        if channel.path_loss is None:
            gain = large_scale_gain(
                ch.distance_m,
                channel.path_loss_db,
                channel.reference_distance_m,
                channel.path_loss_exponent,
                h,
            )
        else:
            assert self.radio.path_loss_db is not None
            gain = h * db_to_linear(-self.radio.path_loss_db[at])
        path_loss = cells.path_loss_db
        if self.round_cells is not None and self.round_cells.path_loss_db is not None:
            path_loss = self.round_cells.path_loss_db
        p_w = np.asarray(dbm_to_w(ch.tx_power_dbm), dtype=float)
        heard_power_w = dbm_to_w(self.tx_power_dbm)[at]
        heard = heard_power_w[:, None] * db_to_linear(-path_loss[at])
        return InstantUplink(
            at,
            np.asarray(ch.bandwidth_hz, dtype=float),
            p_w,
            np.asarray(gain, dtype=float),
            float(channel.noise_psd_w_per_hz),
            float(channel.snr_offset_db),
            self.edge_server[at].astype(np.int64),
            np.asarray(heard, dtype=float),
            cells.groups,
            np.broadcast_to(np.asarray(cap, dtype=float), len(at)).copy(),
            float(share),
            self._uplink_motion(at, h, heard_power_w, elapsed_s) if self.follows else None,
        )

    def _uplink_motion(
        self, at: np.ndarray, fading: np.ndarray, heard_power_w: np.ndarray, elapsed_s: float
    ) -> UplinkGainsOnGrid:
        """Per-instant interference with clients that move (``rate: step``): the
        selected clients' path losses to every site where they are at each step of the
        mobility grid, by the model the association uses (:func:`path_loss_db`, each
        link's LOS state and shadowing where the client is, or drawn per run), and
        their own links' gains to the round's serving sites with the round's fading, as
        :meth:`_instant_uplink` computes them at the round's start."""
        assert self.moving is not None and self.cells is not None
        cells = self.cells
        channel = cast(ShannonChannel, self.channel)
        serving = self.edge_server[at]
        rows = np.arange(len(at))
        ls = cells.large_scale
        env = None if ls is None or ls.environment_u is None else ls.environment_u[at]
        per_run = None if ls is None else ls.take(at)
        spatial = cells.spatial

        def losses(positions_m: np.ndarray) -> np.ndarray:
            d = distances_m(positions_m, cells.sites_m)
            if spatial is not None and ls is not None:
                return path_loss_db(d, channel, spatial.draw(positions_m, env))
            return path_loss_db(d, channel, per_run)

        def own_gain(positions_m: np.ndarray, loss_db: np.ndarray) -> np.ndarray:
            if channel.path_loss is None:
                d = distances_m(positions_m, cells.sites_m)[rows, serving]
                return large_scale_gain(
                    d,
                    channel.path_loss_db,
                    channel.reference_distance_m,
                    channel.path_loss_exponent,
                    fading,
                )
            out: np.ndarray = fading * db_to_linear(-loss_db[rows, serving])
            return out

        deadline_s = self.network.deadline_s
        return UplinkGainsOnGrid(
            self.moving.positions,
            elapsed_s,
            at,
            np.asarray(heard_power_w, dtype=float),
            losses,
            own_gain,
            horizon_s=math.inf if deadline_s is None else elapsed_s + deadline_s,
        )

    @staticmethod
    def _cap(link: LinkTransport, rtt_s: np.ndarray) -> np.ndarray:
        """The Mathis bound of an ideal link with loss (b/s); inf otherwise."""
        if link.tcp():
            return np.full(len(rtt_s), np.inf)
        return mathis_goodput_bps(np.inf, rtt_s, link.loss_rate, link.segment_bytes())

    @staticmethod
    def _capped(link: LinkTransport) -> bool:
        """Can a flow on this link be capped below its rate (an ideal link with loss)?"""
        return link.loss_rate > 0 and not link.tcp()

    def _flows(self, selected: list[int], shared: bool) -> np.ndarray:
        """How many of the round's flows share each selected client's medium: the
        round's clients of its edge server on a shared medium, else 1 (its own link)."""
        if not shared:
            return np.ones(len(selected), dtype=np.int64)
        es = self.edge_server[np.asarray(selected, dtype=np.int64)]
        counts = np.bincount(es, minlength=int(es.max(initial=0)) + 1)
        return counts[es]

    def _moving_links(
        self,
        ch: RoundChannel,
        selected: list[int],
        elapsed_s: float,
        up_cap: np.ndarray,
        down_cap: np.ndarray,
        up_share: float = 1.0,
        down_share: float = 1.0,
    ) -> tuple[MovingLinks, MovingLinks]:
        """The round's (uplink, downlink) links of clients that move, as functions of
        their distance to their serving site (:mod:`mecsim.emulation.moving_rate`): the
        round's draws of :meth:`ShannonChannel.draw_round` held (bandwidth, power,
        fading, interference), the serving site and, under TR 38.901, the link's LOS
        state and shadowing those of the round's start."""
        assert self.moving is not None and self.cells is not None
        channel = cast(ShannonChannel, self.channel)
        at = np.asarray(selected, dtype=np.int64)
        n = len(at)
        n0 = channel.noise_psd_w_per_hz
        offset = float(db_to_linear(channel.snr_offset_db))
        h = np.asarray(ch.fading_gain, dtype=float)
        b_ul = np.asarray(ch.bandwidth_hz, dtype=float)
        b_dl = np.full(
            n, channel.server_bandwidth_hz / (n if channel.downlink_mode == "equal_split" else 1)
        )
        k_ul = offset * dbm_to_w(ch.tx_power_dbm) * h / (ch.ul_interference_w + n0 * b_ul)
        k_dl = (
            offset
            * float(dbm_to_w(channel.server_tx_power_dbm))
            * h
            / (ch.dl_interference_w + n0 * b_dl)
        )
        site = self.cells.sites_m[self.edge_server[at]]
        radio = self.radio
        pl = channel.path_loss
        common: dict[str, Any] = dict(
            path_loss_db=channel.path_loss_db,
            reference_distance_m=channel.reference_distance_m,
            path_loss_exponent=channel.path_loss_exponent,
            tr38901=pl,
            los=None if pl is None or radio.los is None else radio.los[at],
            shadow_fading_db=(
                None if pl is None or radio.shadow_fading_db is None else radio.shadow_fading_db[at]
            ),
            environment_u=(
                None if pl is None or radio.environment_u is None else radio.environment_u[at]
            ),
            spatial=self.cells.spatial,
            site_index=self.edge_server[at],
        )
        # with a deadline, the clients are held where they are at it (MovingLinks.horizon_s)
        deadline_s = self.network.deadline_s
        common["horizon_s"] = math.inf if deadline_s is None else elapsed_s + deadline_s
        # handover during the round: the serving site follows the A3 timeline
        common["handover"] = self.moving.timeline
        common["all_sites_m"] = self.cells.sites_m
        positions = self.moving.positions
        # the rate is B log2(1 + SINR): the payload's share of it by the bandwidth's factor
        up = MovingLinks(
            positions,
            elapsed_s,
            at,
            site,
            b_ul * up_share,
            k_ul,
            np.broadcast_to(up_cap, n),
            **common,
        )
        down = MovingLinks(
            positions,
            elapsed_s,
            at,
            site,
            b_dl * down_share,
            k_dl,
            np.broadcast_to(down_cap, n),
            **common,
        )
        return up, down

    def handovers_in_round(
        self, selected: list[int], elapsed_s: float, round_time_s: float
    ) -> dict[int, dict[str, Any]]:
        """Handover during a round: each selected client's :data:`DURING_ROUND_KEYS` for
        the round from ``elapsed_s`` lasting ``round_time_s`` (after it was timed: the
        transfers its links handed over); empty without ``geometry.handover``."""
        timeline = None if self.moving is None else self.moving.timeline
        if timeline is None:
            return {}
        end_s = elapsed_s + round_time_s if math.isfinite(round_time_s) else elapsed_s
        which: dict[int, set[str]] = {}
        for name, links in zip(("upload", "download"), self.moving_links or (), strict=False):
            for j, _, _ in links.handed_over:
                which.setdefault(int(links.clients[j]), set()).add(name)
        out: dict[int, dict[str, Any]] = {}
        for cid in selected:
            times = timeline.between(cid, elapsed_s, end_s)
            out[cid] = {
                "handovers_in_round": int(times.size),
                "handover_s": float(times[0] - elapsed_s) if times.size else math.nan,
                "handover_transfer": ";".join(sorted(which.get(cid, ()))),
            }
        return out

    def move_to(self, rnd: int, elapsed_s: float) -> RoundCells:
        """Clients that move, at round ``rnd``'s start ``elapsed_s`` (emulated s): their
        positions, the association re-evaluated (A3: :class:`MovingCells`), each
        client's edge server and its serving link's distance (and, under a 3GPP path
        loss, its LOS state, shadowing and path loss at that distance) for the round."""
        assert self.moving is not None
        rc = self.moving.at_round(rnd, elapsed_s)
        self.round_cells = rc
        self.edge_server = rc.serving
        self.positions_m = rc.positions_m
        if isinstance(self.channel, ShannonChannel):
            ls = rc.large_scale
            if ls is None or self.channel.path_loss is None:
                self.radio = dataclasses.replace(self.radio, distance_m=rc.distance_m)
            else:
                pl = self.channel.path_loss.link_path_loss_db(rc.distance_m, ls)
                self.radio = dataclasses.replace(
                    self.radio,
                    distance_m=rc.distance_m,
                    los=ls.los,
                    shadow_fading_db=ls.shadow_fading_db,
                    path_loss_db=pl,
                    environment_u=ls.environment_u,
                )
        return rc

    def columns(self, links: RoundLinks, selected: list[int]) -> ClientColumns | None:
        """The selected clients' specs as columns (what :meth:`round` puts in each
        ClientSpec, without the objects; moving clients' links as their MovingLinks), or
        None when the links are rate schedules."""
        if isinstance(self.channel, TraceChannel) or self.instant:
            # per-instant interference: the round is solved on ClientSpecs
            # (mecsim.emulation.timing.EmulatedRound.time)
            return None
        moving = self.moving_links
        if moving is not None and (self.network.uplink_shared or self.network.downlink_shared):
            # a moving client on a shared medium: its ClientSpecs (time_round re-rates the
            # medium where a rate changes: engine.sharing.VaryingSharing)
            return None
        at = np.asarray(selected, dtype=np.int64)
        # moving clients (rate: step): their links time the transfers, all at once
        rows = np.arange(len(selected), dtype=np.int64)
        return ClientColumns(
            links.downlink_goodput_bps,
            links.uplink_goodput_bps,
            links.downlink_latency_s,
            links.uplink_latency_s,
            self.step_overhead_s[at],
            self.flops_per_s[at],
            links.downlink_max_share,
            links.uplink_max_share,
            downlink_moving=None if moving is None else (moving[1], rows),
            uplink_moving=None if moving is None else (moving[0], rows),
            downlink_tcp=TcpColumns.of(links.downlink_tcp or ()),
            uplink_tcp=TcpColumns.of(links.uplink_tcp or ()),
        )

    def round(
        self, rnd: int, selected: list[int], elapsed_s: float = 0.0, *, records: bool = True
    ) -> tuple[dict[int, ClientSpec], list[ServerSpec], NetworkSpec, dict[int, dict[str, Any]]]:
        """(client specs by id, server specs, network spec, channel records by id).

        ``records=False`` skips building the channel records (an empty dict is returned):
        a replay, which re-draws the same channel, does not need them.
        """
        links = self.links(rnd, selected, elapsed_s)
        up_good, down_good = links.uplink_goodput_bps, links.downlink_goodput_bps
        up_lat, down_lat = links.uplink_latency_s, links.downlink_latency_s
        bh_lat, bh_bps = links.backhaul_latency_s, links.backhaul_goodput_bps
        up_share, down_share = links.uplink_max_share, links.downlink_max_share
        rows: dict[int, dict[str, Any]] = (
            {int(r["client_id"]): r for r in links.channel.records()} if records else {}
        )
        specs: dict[int, ClientSpec] = {}
        for i, cid in enumerate(selected):
            up: float | TimeVaryingRate = float(up_good[i])
            down: float | TimeVaryingRate = float(down_good[i])
            if self.moving_links is not None:
                up, down = self.moving_links[0].rate(i), self.moving_links[1].rate(i)
            if isinstance(self.channel, TraceChannel):
                (ut, ur), (dt, dr) = self.channel.schedules(cid)
                up = schedule_from(
                    ut,
                    np.minimum(
                        np.asarray(ur, float) * payload_share(self.uplink), links.uplink_cap_bps[i]
                    ),
                    elapsed_s,
                )
                down = schedule_from(
                    dt,
                    np.minimum(
                        np.asarray(dr, float) * payload_share(self.downlink),
                        links.downlink_cap_bps[i],
                    ),
                    elapsed_s,
                )
            dev = self.devices[cid]
            es = int(self.edge_server[cid])
            specs[cid] = ClientSpec(
                cid,
                up,
                down,
                dev.step_overhead_s,
                dev.flops_per_s,
                es,
                uplink_latency_s=float(up_lat[i]),
                downlink_latency_s=float(down_lat[i]),
                uplink_max_share=1.0 if up_share is None else float(up_share[i]),
                downlink_max_share=1.0 if down_share is None else float(down_share[i]),
                uplink_tcp=None if links.uplink_tcp is None else links.uplink_tcp[i],
                downlink_tcp=None if links.downlink_tcp is None else links.downlink_tcp[i],
            )
            if records:
                rows[int(cid)].update(
                    uplink_latency_s=float(up_lat[i]),
                    downlink_latency_s=float(down_lat[i]),
                    uplink_goodput_bps=float(up_good[i]),
                    downlink_goodput_bps=float(down_good[i]),
                    backhaul_latency_s=float(bh_lat[es]),
                    backhaul_goodput_bps=float(bh_bps[es]),
                )
        if records and self.positions_m is not None:  # each client's position (m)
            for cid in selected:
                x, y = self.positions_m[cid]
                rows[int(cid)].update(x_m=float(x), y_m=float(y))
        for rec in rows.values():
            rec.pop("client_id", None)
        return specs, links.servers, self.network, rows
