"""The whole scenario: every section, and the checks that need more than one of them
(faults against the topology, device groups, a geometry against the channel)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field, PrivateAttr, model_validator

import mecsim.registry as registry
from mecsim.scenario.aggregation import AggregationConfig
from mecsim.scenario.availability import AvailabilityConfig
from mecsim.scenario.schema.base import MAX_EMULATED_S, MAX_SEED, SafeName, _Strict
from mecsim.scenario.schema.channel import (
    TR38901_DISTANCE_RANGE_M,
    ChannelConfig,
    ShannonChannelConfig,
)
from mecsim.scenario.schema.data import DatasetConfig, ModelConfig
from mecsim.scenario.schema.execution import (
    CheckpointConfig,
    EvaluationConfig,
    ExecutionConfig,
    MetricsConfig,
    OutputsConfig,
)
from mecsim.scenario.schema.faults import EdgeServerOutage, FaultsConfig, LinkOutage
from mecsim.scenario.schema.geometry import GeometryConfig
from mecsim.scenario.schema.links import BackhaulConfig
from mecsim.scenario.schema.topology import DevicesConfig, EnergyConfig, TopologyConfig
from mecsim.scenario.schema.training import AlgorithmConfig, CompressorConfig, TrainingConfig


class Scenario(_Strict):
    """A complete mecsim scenario. Every field has a default except where noted."""

    name: SafeName = Field(
        default="scenario",
        description="letters, digits, '-', '_', '.'; the default run id starts with it",
    )
    description: str = ""
    seed: int = Field(
        default=0, ge=0, le=MAX_SEED, strict=True, description="an integer 0 .. 2^32 - 1"
    )
    rounds: int = Field(default=10, ge=1)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    energy: EnergyConfig = Field(default_factory=EnergyConfig)
    channel: ChannelConfig = Field(default_factory=ShannonChannelConfig)
    backhaul: BackhaulConfig = Field(default_factory=BackhaulConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    compressor: CompressorConfig = Field(default_factory=CompressorConfig)
    availability: AvailabilityConfig = Field(
        default_factory=AvailabilityConfig,
        description="when each client is online (docs/async.md, Availability); default: always",
    )
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    deadline_s: float | None = Field(
        default=None, gt=0, le=MAX_EMULATED_S, description="round deadline (emulated s)"
    )
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    outputs: OutputsConfig = Field(default_factory=OutputsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    faults: FaultsConfig | None = Field(default=None, description="emulated faults; null: none")
    geometry: GeometryConfig | None = Field(
        default=None,
        description="edge servers and clients on a plane, and the association of clients "
        "to edge servers (docs/mobility.md); null: distances drawn from "
        "channel.distance_m, clients in contiguous blocks per edge server",
    )
    # the association a run computed from the geometry (with_association); None: the
    # contiguous blocks of edge_server_of, or not computed yet
    _association: tuple[int, ...] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _faults_fit(self) -> Scenario:
        f = self.faults
        if f is None:
            return self
        o: EdgeServerOutage | LinkOutage
        for i, o in enumerate(f.edge_server_outages):
            if o.edge_server >= self.topology.edge_servers:
                raise ValueError(
                    f"faults.edge_server_outages.{i}.edge_server: no edge server "
                    f"{o.edge_server} (topology.edge_servers is "
                    f"{self.topology.edge_servers})"
                )
        for i, o in enumerate(f.link_outages):
            if o.clients != "all" and any(c >= self.topology.clients for c in o.clients):
                raise ValueError(
                    f"faults.link_outages.{i}.clients: client ids must be below "
                    f"topology.clients ({self.topology.clients})"
                )
        if f.link_outages or f.edge_server_outages:
            if any(self.channel.shared_media(self.algorithm.name)):
                raise ValueError(
                    "faults: outage intervals need dedicated links; this "
                    "channel shares a medium (a shared medium's rate cannot "
                    "vary in time yet)"
                )
        return self

    @model_validator(mode="after")
    def _compressor_fits(self) -> Scenario:
        """A compressor encodes an update against the downloaded model: only algorithms
        whose clients upload the whole flat model as one Upload (the client class's
        ``compressible_uploads``), flat, and not driving their own rounds."""
        name = self.compressor.name
        if name is None:
            return self
        server_cls, client_cls = registry.algorithm(self.algorithm.name)
        why = ""
        if self.aggregation.mode != "sync":
            raise ValueError(
                f"compressor.name: compressor {name!r} cannot be applied with "
                f"aggregation.mode {self.aggregation.mode}: the emulated-time loop does not "
                "time the server's decoding (a ServerCompute op) yet; use mode: sync"
            )
        if server_cls.Edge is not None:
            why = "is hierarchical (its clients upload to edge servers)"
        elif getattr(server_cls, "drives_rounds", False):
            why = "drives its own rounds (its messages are not one flat model upload)"
        elif not getattr(client_cls, "compressible_uploads", False):
            why = (
                "does not upload the whole flat model as one Upload every round (its "
                "client class does not set compressible_uploads)"
            )
        if why:
            able = [
                n
                for n in registry.ALGORITHMS.names()
                if registry.ALGORITHMS.check(n) is None
                and getattr(registry.algorithm(n)[1], "compressible_uploads", False)
                and registry.algorithm(n)[0].Edge is None
            ]
            raise ValueError(
                f"compressor.name: compressor {name!r} cannot be applied: algorithm "
                f"{self.algorithm.name!r} {why}; algorithms it works with: "
                f"{', '.join(able) or '(none installed)'}"
            )
        return self

    @model_validator(mode="after")
    def _moving_rates_are_shannon(self) -> Scenario:
        """A moving client's rate followed during the round is B·log2(1+SINR(d(t))):
        another PHY's rate steps (MCS, CQI) are not integrated along a path yet."""
        g, ch = self.geometry, self.channel
        if (
            g is not None
            and g.moves()
            and g.mobility.rate == "step"
            and isinstance(ch, ShannonChannelConfig)
            and ch.phy.model != "shannon"
        ):
            raise ValueError(
                f"geometry.mobility.rate: step follows a Shannon rate along the path; "
                f"channel.phy.model {ch.phy.model} is not built for it: set rate: round"
            )
        return self

    @model_validator(mode="after")
    def _handover_during_round_fits(self) -> Scenario:
        """Handover during a round (``geometry.handover``) re-routes a moving client's
        dedicated links mid-transfer: built for clients that move under ``rate: step`` on
        a Shannon channel, dedicated links, flat synchronous algorithms and no outage
        faults (docs/mobility.md, "Handover during a round")."""
        g = self.geometry
        if g is None or g.handover is None:
            return self
        why = ""
        if not g.moves():
            why = "the clients do not move (geometry.mobility.model: static)"
        elif g.mobility.rate != "step":
            why = "geometry.mobility.rate is round (the rate does not follow the client)"
        elif not isinstance(self.channel, ShannonChannelConfig):
            why = f"channel.model {self.channel.model} has no rate that depends on the cell"
        elif registry.algorithm(self.algorithm.name)[0].Edge is not None:
            why = (
                f"algorithm {self.algorithm.name} is hierarchical (its edge servers group "
                "their clients at the round's start)"
            )
        elif any(self.channel.shared_media(self.algorithm.name)):
            why = (
                "a link is a shared medium (a flow leaving one cell's sharing for "
                "another's mid-transfer is not built); use dedicated links"
            )
        elif self.aggregation.mode != "sync":
            why = f"aggregation.mode is {self.aggregation.mode} (built for sync rounds)"
        elif self.faults is not None and (
            self.faults.link_outages or self.faults.edge_server_outages
        ):
            why = "faults has outage intervals (not combined with handover interruptions)"
        if why:
            raise ValueError(
                f"geometry.handover: handover during a round cannot be applied: {why}; "
                "leave geometry.handover out (association at round starts only)"
            )
        return self

    @model_validator(mode="after")
    def _instant_interference_fits(self) -> Scenario:
        """Per-instant interference (``channel.interference.timing: instant``) solves a
        round's uploads on dedicated links: built for flat synchronous algorithms,
        clients that stand or move (under ``rate: step`` the gains change at the
        mobility grid's times; not with handover during rounds), B · log2(1 + SINR) and
        no outage faults."""
        inter = getattr(self.channel, "interference", None)
        if inter is None or inter.timing != "instant":
            return self
        g = self.geometry
        ch = self.channel
        assert isinstance(ch, ShannonChannelConfig)  # the only channel with interference
        why = ""
        if registry.algorithm(self.algorithm.name)[0].Edge is not None:
            why = f"algorithm {self.algorithm.name} is hierarchical"
        elif ch.shared_media(self.algorithm.name)[0]:
            why = "the uplink is a shared medium (built for dedicated links)"
        elif g is not None and g.moves() and g.handover is not None:
            why = (
                "geometry.handover is set (a serving cell that changes during the round is "
                "not built with per-instant interference)"
            )
        elif ch.phy.model != "shannon":
            why = f"channel.phy.model is {ch.phy.model} (built for B · log2(1 + SINR))"
        elif self.aggregation.mode != "sync":
            why = f"aggregation.mode is {self.aggregation.mode} (built for sync rounds)"
        elif self.faults is not None and (
            self.faults.link_outages or self.faults.edge_server_outages
        ):
            why = "faults has outage intervals"
        if why:
            raise ValueError(
                f"channel.interference.timing: instant cannot be applied: {why}; use "
                "timing: round (every co-channel transmitter on for the whole phase)"
            )
        return self

    @model_validator(mode="after")
    def _device_groups_fit(self) -> Scenario:
        known = set(registry.device_profiles()) | set(self.devices.profiles)
        for i, group in enumerate(self.devices.clients):
            if group.profile not in known:
                raise ValueError(
                    f"devices.clients.{i}.profile: unknown device profile {group.profile!r}; "
                    f"known: {', '.join(sorted(known))}"
                )
        if self.devices.edge_server not in known:
            raise ValueError(
                f"devices.edge_server: unknown device profile {self.devices.edge_server!r}"
            )
        counted = sum(g.count or 0 for g in self.devices.clients)
        open_groups = sum(g.count is None for g in self.devices.clients)
        if counted > self.topology.clients or (
            open_groups == 0 and counted != self.topology.clients
        ):
            raise ValueError(
                f"devices.clients: the groups cover {counted} clients but "
                f"topology.clients is {self.topology.clients}"
            )
        if open_groups > 1:
            raise ValueError("devices.clients: only one group may omit 'count'")
        if self.topology.edge_servers > self.topology.clients:
            raise ValueError("topology.edge_servers: more edge servers than clients")
        return self

    @model_validator(mode="after")
    def _geometry_fits(self) -> Scenario:
        g = self.geometry
        inter = getattr(self.channel, "interference", None)
        if g is None and inter is not None and inter.model == "geometric":
            raise ValueError(
                "channel.interference.model: geometric computes the interference from "
                "the positions of a geometry: section, and this scenario has none; add "
                "one (docs/mobility.md) or use model: distribution"
            )
        path_loss = getattr(self.channel, "path_loss", None)
        if g is None and path_loss is not None and path_loss.spatial_consistency:
            raise ValueError(
                "channel.path_loss.spatial_consistency: true makes each link's LOS state "
                "and shadowing functions of the client's position, and this scenario has "
                "no geometry: section; add one (docs/mobility.md) or leave the field out"
            )
        if (
            path_loss is not None
            and path_loss.spatial_consistency
            and (path_loss.model == "exponent")
        ):
            raise ValueError(
                "channel.path_loss.spatial_consistency: the exponent model has no LOS "
                "state or shadowing; use model: 38.901-umi or 38.901-uma, or leave the "
                "field out"
            )
        if g is None:
            return self
        sites = g.sites_m()
        n_sites, n = len(sites), self.topology.clients
        if n_sites != self.topology.edge_servers:
            what = (
                f"a hexagonal grid of {g.sites.rings} ring(s) has {n_sites} sites"
                if g.sites.layout == "hex"
                else f"geometry.sites.positions_m has {n_sites} sites"
            )
            raise ValueError(
                f"topology.edge_servers: {what} but topology.edge_servers is "
                f"{self.topology.edge_servers}; set topology.edge_servers: {n_sites} (one "
                "edge server per site)"
            )
        w, h = g.area_m()
        if g.area is not None or g.sites.layout == "explicit":
            for i, (x, y) in enumerate(sites):
                if not (0 <= x <= w and 0 <= y <= h):
                    field = (
                        f"geometry.sites.positions_m.{i}"
                        if g.sites.layout == "explicit"
                        else "geometry.area"
                    )
                    raise ValueError(
                        f"{field}: site {i} at [{x:g}, {y:g}] m is outside the area "
                        f"[0, {w:g}] × [0, {h:g}] m"
                    )
        c = g.clients
        if c.placement == "explicit":
            positions = c.positions_m or []
            if len(positions) != n:
                raise ValueError(
                    f"geometry.clients.positions_m: {len(positions)} positions but "
                    f"topology.clients is {n}"
                )
            for i, (x, y) in enumerate(positions):
                if not (0 <= x <= w and 0 <= y <= h):
                    raise ValueError(
                        f"geometry.clients.positions_m.{i}: [{x:g}, {y:g}] m is outside the "
                        f"area [0, {w:g}] × [0, {h:g}] m"
                    )
                near = min(math.dist((x, y), s) for s in sites)
                if near < g.min_distance_m:
                    raise ValueError(
                        f"geometry.clients.positions_m.{i}: [{x:g}, {y:g}] m is {near:g} m "
                        f"from a site, nearer than geometry.min_distance_m "
                        f"({g.min_distance_m:g} m)"
                    )
        if c.placement == "hotspots":
            counts = g.hotspot_counts(n)
            if sum(counts) != n:
                raise ValueError(
                    f"geometry.clients.hotspots: the hotspots hold {sum(counts)} clients but "
                    f"topology.clients is {n}"
                )
            for i, spot in enumerate(c.hotspots or []):
                x, y = spot.centre_m
                if not (0 <= x <= w and 0 <= y <= h):
                    raise ValueError(
                        f"geometry.clients.hotspots.{i}.centre_m: [{x:g}, {y:g}] m is outside "
                        f"the area [0, {w:g}] × [0, {h:g}] m"
                    )
        if (
            isinstance(self.channel, ShannonChannelConfig)
            and self.channel.path_loss.model != "exponent"
            and g.min_distance_m < TR38901_DISTANCE_RANGE_M[0]
        ):
            raise ValueError(
                f"geometry.min_distance_m: channel.path_loss.model "
                f"{self.channel.path_loss.model} holds from 2D distances of "
                f"{TR38901_DISTANCE_RANGE_M[0]:g} m (TR 38.901 Table 7.4.1-1), got "
                f"{g.min_distance_m:g} m"
            )
        if g.association.rule != "nearest" and not isinstance(self.channel, ShannonChannelConfig):
            raise ValueError(
                f"geometry.association.rule: {g.association.rule} needs received powers, "
                f"which only the shannon channel models (channel.model is "
                f"{self.channel.model}); use rule: nearest"
            )
        return self

    def with_association(self, edge_server_of: Sequence[int]) -> Scenario:
        """A copy whose :meth:`edge_server_of` answers from ``edge_server_of`` (one edge
        server per client, in client-id order): what a run with a geometry computed
        (:class:`mecsim.emulation.network.NetworkModel`'s ``edge_server``). The copy's
        fields, dump and digest are this scenario's."""
        if len(edge_server_of) != self.topology.clients:
            raise ValueError(
                f"an association of {len(edge_server_of)} clients for a scenario of "
                f"{self.topology.clients}"
            )
        copy = self.model_copy()
        copy._association = tuple(int(e) for e in edge_server_of)
        return copy

    def downlink_mode(self) -> str | None:
        """The Shannon downlink discipline in force (``auto`` resolved), None for other
        channel models (see :meth:`ShannonChannelConfig.downlink_mode`)."""
        if not isinstance(self.channel, ShannonChannelConfig):
            return None
        return self.channel.downlink_mode(self.algorithm.name)

    def clients_per_round(self) -> int:
        return max(1, int(round(self.topology.participation * self.topology.clients)))

    def client_profiles(self) -> list[str]:
        """The device profile name of every client, in client-id order."""
        n = self.topology.clients
        fixed = sum(g.count or 0 for g in self.devices.clients)
        out: list[str] = []
        for g in self.devices.clients:
            out += [g.profile] * (g.count if g.count is not None else n - fixed)
        return out[:n]

    def edge_server_of(self, client_id: int) -> int:
        """Without a geometry, clients are split into contiguous, near-equal blocks, one
        per edge server. With one, the association a run computed (attached by
        :meth:`with_association`); asking a scenario with a geometry before that is an
        error (the association needs the channel's draws: ``mecsim.emulation.network``)."""
        if self._association is not None:
            return self._association[client_id]
        if self.geometry is not None:
            raise RuntimeError(
                "this scenario places clients by geometry: its association is computed by "
                "mecsim.emulation.network.NetworkModel (edge_server); attach it with "
                "Scenario.with_association"
            )
        return self.topology_block_of(client_id)

    def topology_block_of(self, client_id: int) -> int:
        """The contiguous, near-equal block (one per edge server) ``client_id`` is in."""
        per = math.ceil(self.topology.clients / self.topology.edge_servers)
        return client_id // per
