"""The ``geometry:`` section: edge servers and clients on a plane, the association
of clients to edge servers, and how clients move (docs/mobility.md). The arithmetic of
the plane (hexagonal grids, areas, even splits) is :mod:`mecsim.scenario.plane`'s."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

import mecsim.scenario.plane as plane
from mecsim.scenario.mobility import MobilityConfig
from mecsim.scenario.schema.base import Decibels, _Strict, every_field

#: The largest coordinate, area side or distance a geometry takes (m): 10,000 km, far
#: beyond any cell layout, far below where float arithmetic loses the metre
MAX_GEOMETRY_M = 1e7
#: the most rings a hexagonal grid may have (1 + 3·R·(R+1) = 1,261 sites at 20)
MAX_HEX_RINGS = 20

Metres = Annotated[float, Field(ge=0, le=MAX_GEOMETRY_M)]
PositiveMetres = Annotated[float, Field(gt=0, le=MAX_GEOMETRY_M)]
#: a point [x, y] of the plane, metres, in the area's coordinates (its lower-left corner
#: is the origin)
Point = tuple[Metres, Metres]


class AreaConfig(_Strict):
    """The rectangle clients live in: [0, width_m] × [0, height_m] (m)."""

    width_m: PositiveMetres
    height_m: PositiveMetres


class SitesConfig(_Strict):
    """Where the edge servers (base stations) are: edge server k at site k."""

    layout: Literal["hex", "explicit"] = Field(
        default="hex",
        description="hex: a hexagonal grid of `rings` rings with `inter_site_distance_m`, "
        "centred in the area; explicit: `positions_m`, one [x, y] per edge server",
    )
    rings: int = Field(
        default=1, ge=0, le=MAX_HEX_RINGS, description="hex: rings around the centre site"
    )
    inter_site_distance_m: PositiveMetres = Field(
        default=200.0, description="hex: the distance between neighbouring sites (m)"
    )
    positions_m: list[Point] | None = Field(
        default=None,
        max_length=100_000,
        description="explicit: each edge server's [x, y] (m), in edge-server order",
    )

    @model_validator(mode="after")
    def _positions_for_explicit(self) -> SitesConfig:
        if self.layout == "explicit" and not self.positions_m:
            raise ValueError("positions_m: layout explicit needs one [x, y] per edge server")
        if self.layout == "hex" and self.positions_m is not None:
            raise ValueError("positions_m: given with layout hex; use layout: explicit")
        return self

    def offsets_or_positions_m(self) -> list[tuple[float, float]]:
        if self.layout == "hex":
            return plane.hex_grid_offsets_m(self.rings, self.inter_site_distance_m)
        return [(float(x), float(y)) for x, y in self.positions_m or []]


class Hotspot(_Strict):
    """A cluster of clients: uniform over the disc of ``radius_m`` around ``centre_m``."""

    centre_m: Point
    radius_m: PositiveMetres
    clients: int | None = Field(
        default=None, ge=0, description="clients in this hotspot; null: an equal share"
    )


class ClientPlacementConfig(_Strict):
    """Each client's initial position."""

    placement: Literal["uniform", "per_cell", "hotspots", "explicit"] = Field(
        default="uniform",
        description="uniform: over the area; per_cell: each edge server's share of the "
        "clients (the topology's contiguous blocks) uniform over its Voronoi cell within "
        "the area; hotspots: uniform over discs; explicit: positions_m",
    )
    hotspots: list[Hotspot] | None = Field(default=None, max_length=100_000)
    positions_m: list[Point] | None = Field(
        default=None,
        max_length=1_000_000,
        description="explicit: each client's [x, y] (m), in client-id order",
    )

    @model_validator(mode="after")
    def _fields_of_placement(self) -> ClientPlacementConfig:
        if self.placement == "hotspots" and not self.hotspots:
            raise ValueError("hotspots: placement hotspots needs at least one hotspot")
        if self.placement != "hotspots" and self.hotspots is not None:
            raise ValueError(f"hotspots: given with placement {self.placement}")
        if self.placement == "explicit" and self.positions_m is None:
            raise ValueError("positions_m: placement explicit needs one [x, y] per client")
        if self.placement != "explicit" and self.positions_m is not None:
            raise ValueError(f"positions_m: given with placement {self.placement}")
        if self.hotspots:
            given = [h.clients is not None for h in self.hotspots]
            if any(given) and not all(given):
                raise ValueError("hotspots: give every hotspot's clients, or none")
        return self


class AssociationConfig(_Strict):
    """Which edge server serves each client (docs/mobility.md, "Association")."""

    rule: Literal["nearest", "strongest", "sinr"] = Field(
        default="nearest",
        description="nearest: the nearest site (2D); strongest: the highest received power "
        "of the sites' downlink (path loss and shadowing); sinr: the best downlink SINR, "
        "every other site co-channel (under channel.interference.model geometric: the "
        "sites of its reuse group)",
    )
    hysteresis_db: Decibels = Field(
        default=0.0,
        ge=0,
        description="strongest / sinr: a handover needs a site better by this much (A3 "
        "offset, dB); used when the association is re-evaluated",
    )
    hysteresis_m: Metres = Field(
        default=0.0, description="nearest: a handover needs a site nearer by this much (m)"
    )
    time_to_trigger_s: float = Field(
        default=0.0,
        ge=0,
        le=1e9,
        description="the handover condition must hold this long (emulated s) before it is acted on",
    )

    @model_validator(mode="after")
    def _hysteresis_of_rule(self) -> AssociationConfig:
        if self.rule == "nearest" and self.hysteresis_db:
            raise ValueError("hysteresis_db: rule nearest compares distances; use hysteresis_m")
        if self.rule != "nearest" and self.hysteresis_m:
            raise ValueError(f"hysteresis_m: rule {self.rule} compares dB; use hysteresis_db")
        return self


#: ``geometry.handover.measurement_period_s``'s default (s): the layer-1 measurement
#: period of ns-3's LTE and NR UEs (``LteUePhy`` / ``NrUePhy`` attribute
#: ``UeMeasurementsFilterPeriod``, default 200 ms), the intra-frequency measurement period
#: TS 36.133 / TS 38.133 give for a UE without DRX
MEASUREMENT_PERIOD_S = 0.2
#: ``geometry.handover.interruption_s``'s default (s): a break-before-make handover with
#: random access interrupts the user plane for some 30-60 ms in LTE (3GPP's
#: latency-reduction study TR 36.881 breaks it into its parts); 50 ms, the middle, here
INTERRUPTION_S = 0.05


class HandoverConfig(_Strict):
    """Handover during a round (docs/mobility.md, "Handover during a round"): the A3 rule
    of ``association`` evaluated every ``measurement_period_s`` of emulated time, and a
    client that hands over in the middle of a transfer stops for ``interruption_s``, then
    goes on at the new cell's rate."""

    measurement_period_s: float = Field(
        default=MEASUREMENT_PERIOD_S,
        gt=0,
        le=3600,
        description="the A3 rule (hysteresis, time-to-trigger) is evaluated at the emulated "
        "times k · this (s); default 0.2 s, ns-3's UeMeasurementsFilterPeriod (LTE and NR "
        "UEs' layer-1 measurement period, TS 36.133 / 38.133 without DRX)",
    )
    interruption_s: float = Field(
        default=INTERRUPTION_S,
        ge=0,
        le=10,
        description="a handover stops the client's transfers for this long (s) from the "
        "moment it is triggered, then they go on at the new cell's rate; default 0.05 s, "
        "the middle of the 30-60 ms an LTE break-before-make handover with random access "
        "interrupts the user plane (3GPP TR 36.881 studies its parts)",
    )


class GeometryConfig(_Strict):
    """Edge servers and clients on a plane (docs/mobility.md, "Geometry"). With it, each
    client's distance to its serving edge server comes from positions (not from
    ``channel.distance_m``) and the serving edge server from ``association``."""

    area: AreaConfig | None = Field(
        default=None,
        description="[0, width_m] × [0, height_m]; null: the sites' extent and margin_m",
    )
    margin_m: Metres | None = Field(
        default=None,
        description="with no area: the space around the sites (hex: default the cell's "
        "circumradius D/√3; explicit sites: required)",
    )
    sites: SitesConfig = Field(default_factory=SitesConfig)
    clients: ClientPlacementConfig = Field(default_factory=ClientPlacementConfig)
    min_distance_m: PositiveMetres = Field(
        default=10.0,
        description="no client is placed nearer than this to any site (m); 10 m: the "
        "lower end of TR 38.901's distances",
    )
    association: AssociationConfig = Field(default_factory=AssociationConfig)
    mobility: MobilityConfig = Field(
        default_factory=MobilityConfig,
        description="how the clients move (docs/mobility-models.md); static: nobody "
        "moves. With clients that move, the association is re-evaluated at each round's "
        "start (docs/mobility.md, Handover)",
    )
    handover: HandoverConfig | None = Field(
        default=None,
        description="null (the default): the association is re-evaluated at round starts "
        "only; a mapping: also during the round, every measurement_period_s, a transfer in "
        "progress handed over with an interruption (clients that move, rate: step, "
        "dedicated links, flat algorithms)",
    )

    @model_serializer(mode="wrap")
    def _without_unset_handover(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> Any:
        """``handover`` left out of a dump while null (runs recorded before it keep
        their scenario digests and their scenario.yaml)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("handover", 0) is None and not every_field(info):
            data.pop("handover")
        return data

    def moves(self) -> bool:
        """Do the clients move (a mobility model other than static)?"""
        return self.mobility.model != "static"

    @model_validator(mode="after")
    def _area_or_margin(self) -> GeometryConfig:
        if self.area is not None and self.margin_m is not None:
            raise ValueError("margin_m: given with an area; give one of them")
        if self.area is None and self.margin_m is None and self.sites.layout == "explicit":
            raise ValueError(
                "area: explicit sites need the area (width_m, height_m) or a margin_m around them"
            )
        return self

    def area_m(self) -> tuple[float, float]:
        """(width, height) of the area (m)."""
        if self.area is not None:
            return self.area.width_m, self.area.height_m
        return plane.area_m(
            self.sites.offsets_or_positions_m(),
            hex_layout=self.sites.layout == "hex",
            inter_site_distance_m=self.sites.inter_site_distance_m,
            margin_m=self.margin_m,
        )

    def sites_m(self) -> list[tuple[float, float]]:
        """Each edge server's [x, y] (m), in edge-server order: a hexagonal grid centred in
        the area, or the explicit positions."""
        points = self.sites.offsets_or_positions_m()
        if self.sites.layout == "explicit":
            return points
        w, h = self.area_m()
        return [(w / 2 + x, h / 2 + y) for x, y in points]

    def hotspot_counts(self, n_clients: int) -> list[int]:
        """Clients per hotspot, in hotspot order (client ids in contiguous blocks)."""
        return plane.hotspot_counts([h.clients for h in self.clients.hotspots or []], n_clients)
