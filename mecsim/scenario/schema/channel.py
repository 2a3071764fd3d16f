"""The ``channel:`` section: the wireless links' rate models (``shannon`` with its
path loss, PHY and interference, ``fixed_rate``, ``trace``, a plugin's)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

import mecsim.registry as registry
from mecsim.scenario.schema.base import (
    DecibelRange,
    Decibels,
    PositiveFloat,
    PositiveRange,
    _loc,
    _resolvable,
    _Strict,
    every_field,
)
from mecsim.scenario.schema.links import LinkTransport, _check_client_loss, personalised_downloads


class Interference(_Strict):
    """Co-channel interference (docs/channel.md, docs/mobility.md).

    ``model: distribution`` (the default): drawn per client-round from N(mean, std^2),
    clipped at 0. The KAPC paper (Table 4) gives N(1, 4) uplink and N(1, 9) downlink
    without a unit, so the unit must be named here.

    ``model: geometric``: computed each round from the ``geometry:`` section's positions,
    the path-loss model and the channel groups of a reuse factor (``reuse``): on the
    uplink from the round's selected clients of the other co-channel cells, on the
    downlink from the other co-channel sites serving one of them
    (:mod:`mecsim.emulation.interference`). The draws' fields do not apply.
    """

    model: Literal["distribution", "geometric"] = Field(
        default="distribution",
        description="distribution: drawn per client-round from N(mean, std^2); geometric: "
        "from the geometry's positions and path loss (needs a geometry: section)",
    )
    unit: Literal["W", "mW", "dBm", "noise"] | None = Field(
        default=None,
        description="unit of the draws (model distribution: required); 'noise' = "
        "multiples of the link's thermal noise N0*B",
    )
    uplink_mean: float = 1.0
    uplink_std: float = Field(default=2.0, ge=0)
    downlink_mean: float = 1.0
    downlink_std: float = Field(default=3.0, ge=0)
    reuse: Literal[1, 3, 7] = Field(
        default=1,
        description="model geometric: the frequency reuse factor; sites get channel groups "
        "(1: all co-channel; 3, 7: the hexagonal reuse patterns) and only sites of one "
        "group interfere",
    )
    timing: Literal["round", "instant"] = Field(
        default="round",
        description="model geometric: round (the default) counts every co-channel "
        "transmitter of the round for the whole upload / download phase (an upper bound); "
        "instant counts an uplink interferer only while its upload is on the air, the "
        "rates re-computed at each upload's start and end (and, for clients that move "
        "under geometry.mobility.rate: step, at the mobility grid's times)",
    )

    @model_serializer(mode="wrap")
    def _without_default_timing(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> Any:
        """``timing`` left out of a dump at its default (runs recorded before it keep
        their scenario digests and their scenario.yaml)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("timing") == "round" and not every_field(info):
            data.pop("timing")
        return data

    @model_validator(mode="after")
    def _fields_of_the_model(self) -> Interference:
        """Each model's fields only (checked by value, not by presence: a scenario's dump,
        re-validated by an override, states every field at its default)."""
        if self.model == "distribution":
            if self.unit is None:
                raise ValueError(
                    "unit: Field required (the unit of the draws of model distribution: "
                    "W, mW, dBm or noise)"
                )
            if self.reuse != 1:
                raise ValueError(
                    "reuse: applies to model geometric only (model distribution draws "
                    "the interference)"
                )
            if self.timing != "round":
                raise ValueError(
                    "timing: applies to model geometric only (model distribution draws "
                    "the interference per client-round)"
                )
            return self
        defaults = {"uplink_mean": 1.0, "uplink_std": 2.0, "downlink_mean": 1.0}
        defaults["downlink_std"] = 3.0
        given = ["unit"] if self.unit is not None else []
        given += [k for k, v in defaults.items() if getattr(self, k) != v]
        if given:
            raise ValueError(
                f"{given[0]}: applies to model distribution only (model geometric "
                "computes the interference from the geometry)"
            )
        return self


#: What a client's Shannon uplink is (``channel.uplink.access``, docs/channel.md).
UplinkAccess = Literal["dedicated", "shared_cell", "shared_own_band"]


class ShannonUplink(LinkTransport):
    """A client's uplink is either a band of its own or a share of its edge server's
    (cell's) medium; ``access`` says which, and validation refuses a scenario that gives
    each client its own band (``bandwidth_hz`` a pair, drawn per client) and time-shares
    it too (``shared: true``) without saying so."""

    bandwidth_hz: PositiveRange = Field(
        default=(10e6, 30e6),
        description="per-client, uniform in [lo, hi] (access dedicated, shared_own_band); "
        "the edge server's band, one number (access shared_cell)",
    )
    tx_power_dbm: DecibelRange = Field(
        default=(23.0, 30.0), description="per-client, uniform in [lo, hi]"
    )
    shared: bool = Field(
        default=False,
        description="uplinks of an edge server's clients share one medium (processor "
        "sharing); follows access when only access is given",
    )
    access: UplinkAccess | None = Field(
        default=None,
        description="dedicated: each client transmits on a band of its own (bandwidth_hz, "
        "drawn per client from a pair) and no upload waits for another (shared: false); "
        "shared_cell: bandwidth_hz (one number) is the edge server's band, and its "
        "clients' concurrent uploads time-share it, each at its own SNR over the whole band "
        "(shared: true); shared_own_band: each client's own band, time-shared with the "
        "edge server's other clients as well (shared: true; what shared: true with a "
        "per-client pair computed before this field existed: kept to reproduce such runs, "
        "no physical link works so). null: from shared (false: dedicated; true with one "
        "bandwidth_hz: shared_cell; true with a pair [lo, hi] is refused: say which)",
    )

    @model_validator(mode="before")
    @classmethod
    def _shared_follows_access(cls, data: Any) -> Any:
        """``access`` alone sets ``shared`` (dedicated: false, the others: true)."""
        if isinstance(data, dict) and "shared" not in data:
            access = data.get("access")
            if access in ("dedicated", "shared_cell", "shared_own_band"):
                return {**data, "shared": access != "dedicated"}
        return data

    def per_client_band(self) -> bool:
        """Does ``bandwidth_hz`` draw a different band for each client (a pair lo < hi)?"""
        b = self.bandwidth_hz
        return isinstance(b, tuple) and b[0] != b[1]

    @model_validator(mode="after")
    def _one_link_model(self) -> ShannonUplink:
        pair = self.per_client_band()
        if self.access is None:
            if self.shared and pair:
                lo, hi = cast("tuple[float, float]", self.bandwidth_hz)
                raise ValueError(
                    f"access: shared: true time-shares the edge server's uplink medium "
                    f"among its clients, but bandwidth_hz [{lo:g}, {hi:g}] gives each "
                    "client a band of its own; say which you mean: access: dedicated "
                    "(each client its own band, not shared), shared_cell (one "
                    "bandwidth_hz, the edge server's band, time-shared) or "
                    "shared_own_band (each client's own band, time-shared too: how such "
                    "scenarios ran before access existed; docs/channel.md)"
                )
            return self
        wants_shared = self.access != "dedicated"
        if self.shared != wants_shared:
            what = "a share of the cell's medium" if wants_shared else "a band of its own"
            raise ValueError(
                f"access: {self.access} is {what}, but shared is "
                f"{str(self.shared).lower()}: leave shared out or set it "
                f"{str(wants_shared).lower()}"
            )
        if self.access == "shared_cell" and pair:
            raise ValueError(
                "access: shared_cell makes bandwidth_hz the edge server's band, one "
                "number, not a per-client pair [lo, hi]"
            )
        return self


class ShannonDownlink(LinkTransport):
    bandwidth_hz: PositiveFloat = 50e6
    tx_power_dbm: Decibels = 30.0
    mode: Literal["auto", "full", "equal_split", "shared"] = Field(
        default="auto",
        description="auto: shared for algorithms whose downloads differ per client, full "
        "for broadcasts; full: whole band per client; equal_split: band/n per client; "
        "shared: processor sharing of the band among concurrent downloads "
        "(docs/channel.md)",
    )


#: Table 7.4.1-1 of 3GPP TR 38.901: the 2D distances its UMi and UMa rows are valid for (m)
TR38901_DISTANCE_RANGE_M = (10.0, 5000.0)


class PathLossConfig(_Strict):
    """The path-loss model of a Shannon channel (``channel.path_loss``, docs/channel.md
    "Path-loss models").

    ``exponent`` (the default) is the KAPC Table 4 model, ``PL0 · (d/d0)^(−γ)`` with the
    channel's ``path_loss_db``, ``reference_distance_m`` and ``path_loss_exponent``; it
    uses none of the fields below. ``38.901-umi`` / ``38.901-uma`` are 3GPP TR 38.901
    Table 7.4.1-1's UMi-Street Canyon and UMa with the LOS probability of Table 7.4.2-1
    and log-normal shadow fading; the client's ``distance_m`` is the 2D distance.
    """

    model: Literal["exponent", "38.901-umi", "38.901-uma"] = Field(
        default="exponent",
        description="exponent: KAPC Table 4 (path_loss_db, reference_distance_m, "
        "path_loss_exponent); 38.901-umi / 38.901-uma: 3GPP TR 38.901 UMi-Street Canyon / "
        "UMa",
    )
    carrier_ghz: float | None = Field(
        default=None,
        ge=0.5,
        le=100.0,
        description="carrier frequency f_c (GHz), 0.5-100 (TR 38.901's range); required by "
        "the 38.901 models",
    )
    bs_height_m: float | None = Field(
        default=None,
        gt=1.0,
        le=1000.0,
        description="base-station (edge server) antenna height h_BS (m); null: the table's "
        "(UMi 10 m, UMa 25 m); must be above h_E = 1 m",
    )
    ut_height_m: float = Field(
        default=1.5,
        ge=1.5,
        le=22.5,
        description="client (UT) antenna height h_UT (m), 1.5-22.5 (TR 38.901's range)",
    )
    los: Literal["random", "always", "never"] = Field(
        default="random",
        description="random: each client's LOS state drawn once per run with the table's "
        "LOS probability of its distance; always / never: every client LOS / NLOS",
    )
    shadowing: bool = Field(
        default=True,
        description="log-normal shadow fading, drawn once per client per run with the "
        "table's standard deviation (UMi 4 / 7.82 dB, UMa 4 / 6 dB, LOS / NLOS); false: 0 dB",
    )
    spatial_consistency: bool | None = Field(
        default=None,
        description="LOS state and shadowing as spatially correlated fields of the "
        "client's position (TR 38.901 §7.6.3, docs/channel.md); null: on for clients "
        "that move (geometry.mobility), off otherwise; true needs a geometry",
    )

    @model_validator(mode="after")
    def _carrier_given(self) -> PathLossConfig:
        if self.model != "exponent" and self.carrier_ghz is None:
            raise ValueError(
                f"carrier_ghz: model {self.model} needs the carrier frequency in GHz "
                "(0.5-100), e.g. carrier_ghz: 3.5"
            )
        return self


#: 802.11ax channel widths (Hz); NR's (bandwidth MHz, SCS kHz) pairs of TS 38.101-1/-2
WIFI_AX_BANDWIDTHS_HZ = (20e6, 40e6, 80e6, 160e6)
NR_BANDWIDTHS_MHZ = {
    (1, 15): (5, 10, 15, 20, 25, 30, 40, 50),
    (1, 30): (5, 10, 15, 20, 25, 30, 40, 50, 60, 70, 80, 90, 100),
    (1, 60): (10, 15, 20, 25, 30, 40, 50, 60, 70, 80, 90, 100),
    (2, 60): (50, 100, 200),
    (2, 120): (50, 100, 200, 400),
}


class PhyConfig(_Strict):
    """What an SINR is worth in b/s (``channel.phy``, docs/channel.md "The radio's
    rate"): ``shannon`` (B·log2(1+SINR), the default), ``truncated_shannon`` (3GPP TR
    36.942 Annex A.2), ``wifi_ax`` (802.11ax HE-MCS with ns-3's IdealWifiManager
    thresholds and the cell's MAC) or ``nr`` (5G NR CQI tables, TS 38.214 / 38.306)."""

    model: Literal["shannon", "truncated_shannon", "wifi_ax", "nr"] = "shannon"
    alpha: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="truncated_shannon: the attenuation α "
        "(null: the annex's, uplink 0.4 / downlink 0.6)",
    )
    sinr_min_db: float | None = Field(
        default=None, ge=-50, le=50, description="truncated_shannon: SINR_MIN (dB; null: -10)"
    )
    max_spectral_efficiency: float | None = Field(
        default=None,
        gt=0,
        le=50,
        description="truncated_shannon: Thr_MAX (b/s/Hz; null: uplink 2.0 / downlink 4.4)",
    )
    spatial_streams: int = Field(default=1, ge=1, le=4, description="wifi_ax: 1-4")
    guard_interval_ns: Literal[800, 1600, 3200] = Field(
        default=800, description="wifi_ax: the HE guard interval (ns)"
    )
    subcarrier_spacing_khz: Literal[15, 30, 60, 120] = Field(
        default=30, description="nr: the numerology's subcarrier spacing 15 · 2^μ kHz"
    )
    layers: int = Field(default=1, ge=1, le=8, description="nr: MIMO layers")
    cqi_table: Literal[1, 2] = Field(default=2, description="nr: CQI table 1 (64QAM) or 2 (256QAM)")
    frequency_range: Literal[1, 2] = Field(default=1, description="nr: FR1 or FR2")

    @model_validator(mode="after")
    def _fields_of_the_model(self) -> PhyConfig:
        owners = {
            "truncated_shannon": ("alpha", "sinr_min_db", "max_spectral_efficiency"),
            "wifi_ax": ("spatial_streams", "guard_interval_ns"),
            "nr": ("subcarrier_spacing_khz", "layers", "cqi_table", "frequency_range"),
        }
        for owner, names in owners.items():
            if owner == self.model:
                continue
            for name in names:  # a resolved scenario.yaml carries them all at defaults
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(f"{name}: a field of model {owner}, not of {self.model}")
        if self.model == "nr" and (self.frequency_range, self.subcarrier_spacing_khz) not in (
            NR_BANDWIDTHS_MHZ
        ):
            raise ValueError(
                f"subcarrier_spacing_khz: {self.subcarrier_spacing_khz} kHz is not a "
                f"numerology of FR{self.frequency_range} (FR1: 15, 30, 60; FR2: 60, 120)"
            )
        return self

    def check_bandwidth(self, name: str, bandwidth_hz: float) -> None:
        """Refuse a band this PHY does not have, naming the field ``name``."""
        if self.model == "wifi_ax" and bandwidth_hz not in WIFI_AX_BANDWIDTHS_HZ:
            raise ValueError(
                f"{name}: 802.11ax has channel widths of 20, 40, 80 and 160 MHz, not "
                f"{bandwidth_hz / 1e6:g} MHz"
            )
        if self.model == "nr":
            allowed = NR_BANDWIDTHS_MHZ[(self.frequency_range, self.subcarrier_spacing_khz)]
            if bandwidth_hz / 1e6 not in allowed:
                raise ValueError(
                    f"{name}: an NR carrier of FR{self.frequency_range} at "
                    f"{self.subcarrier_spacing_khz} kHz has a bandwidth of {allowed} MHz, not "
                    f"{bandwidth_hz / 1e6:g} MHz"
                )


class ShannonChannelConfig(_Strict):
    model: Literal["shannon"] = "shannon"
    phy: PhyConfig = Field(
        default_factory=PhyConfig,
        description="the rate of an SINR: shannon (the default), truncated_shannon, "
        "wifi_ax or nr (docs/channel.md)",
    )
    noise_figure_db: float = Field(
        default=0.0,
        ge=0,
        le=30,
        description="the receivers' noise figure (dB), added to "
        "the thermal noise (ns-3's Wi-Fi default: 7)",
    )
    uplink: ShannonUplink = Field(default_factory=ShannonUplink)
    downlink: ShannonDownlink = Field(default_factory=ShannonDownlink)
    interference: Interference | None = Field(default=None, description="null: no interference")
    distance_m: PositiveRange = Field(
        default=(100.0, 500.0), description="per-client, uniform in [lo, hi]"
    )
    path_loss_db: Decibels = Field(
        default=-40.0, description="path-loss constant PL0 of the exponent model (dB)"
    )
    reference_distance_m: PositiveFloat = Field(
        default=1.0, description="reference distance d0 of the exponent model (m)"
    )
    path_loss_exponent: PositiveFloat = Field(
        default=4.0, description="path-loss exponent γ of the exponent model"
    )
    path_loss: PathLossConfig = Field(
        default_factory=PathLossConfig,
        description="the path-loss model: exponent (the three fields above, the default) "
        "or 3GPP TR 38.901 UMi / UMa (docs/channel.md)",
    )
    fading: Literal["none", "rayleigh"] = "none"
    noise_psd_dbm_per_hz: Decibels = -174.0
    snr_offset_db: Decibels = Field(
        default=0.0, description="calibration added to every SNR (dB); 0 = the literal model"
    )

    @model_validator(mode="after")
    def _loss_needs_rtt(self) -> ShannonChannelConfig:
        _check_client_loss(self.uplink, self.downlink)
        return self

    @model_validator(mode="after")
    def _bands_the_phy_has(self) -> ShannonChannelConfig:
        b = self.uplink.bandwidth_hz
        for value in (b,) if isinstance(b, (int, float)) else b:
            self.phy.check_bandwidth("uplink.bandwidth_hz", float(value))
        self.phy.check_bandwidth("downlink.bandwidth_hz", float(self.downlink.bandwidth_hz))
        if self.phy.model == "wifi_ax" and self.downlink.mode == "equal_split":
            raise ValueError(
                "downlink.mode: equal_split gives each client a sub-band of the "
                "802.11ax channel, which has no such widths; use full or shared"
            )
        return self

    @model_validator(mode="after")
    def _distances_in_tr38901_range(self) -> ShannonChannelConfig:
        """TR 38.901's UMi and UMa rows hold for 2D distances of 10 m to 5 km."""
        model = self.path_loss.model
        if model == "exponent":
            return self
        d = self.distance_m
        lo, hi = (d, d) if isinstance(d, (int, float)) else d
        low, high = TR38901_DISTANCE_RANGE_M
        if lo < low or hi > high:
            shown = f"{lo:g}" if lo == hi else f"[{lo:g}, {hi:g}]"
            raise ValueError(
                f"distance_m: path_loss.model {model} holds for 2D distances of "
                f"{low:g} m to {high / 1000:g} km (TR 38.901 Table 7.4.1-1), got {shown} m"
            )
        return self

    def downlink_mode(self, algorithm: str | None) -> str:
        """The downlink discipline in force: ``auto`` is ``shared`` when the algorithm's
        downloads are personalised (K unicasts time-share the server's band) and ``full``
        when they are one broadcast."""
        if self.downlink.mode != "auto":
            return self.downlink.mode
        return "shared" if algorithm and personalised_downloads(algorithm) else "full"

    def shared_media(self, algorithm: str | None = None) -> tuple[bool, bool]:
        """(uplink shared, downlink shared)."""
        return self.uplink.shared, self.downlink_mode(algorithm) == "shared"


class FixedLink(LinkTransport):
    rate_bps: float = Field(ge=1, description="at least 1 b/s")
    shared: bool = False


class FixedRateChannelConfig(_Strict):
    model: Literal["fixed_rate"]
    uplink: FixedLink
    downlink: FixedLink

    @model_validator(mode="after")
    def _loss_needs_rtt(self) -> FixedRateChannelConfig:
        _check_client_loss(self.uplink, self.downlink)
        return self

    def shared_media(self, algorithm: str | None = None) -> tuple[bool, bool]:
        """(uplink shared, downlink shared)."""
        return self.uplink.shared, self.downlink.shared


class TraceChannelConfig(_Strict):
    model: Literal["trace"]
    path: str = Field(min_length=1, description="CSV: time_s,client_id,uplink_mbps,downlink_mbps")
    uplink: LinkTransport = Field(
        default_factory=LinkTransport, description="latency, jitter, loss of the uplinks"
    )
    downlink: LinkTransport = Field(
        default_factory=LinkTransport, description="latency, jitter, loss of the downlinks"
    )

    @model_validator(mode="after")
    def _loss_needs_rtt(self) -> TraceChannelConfig:
        _check_client_loss(self.uplink, self.downlink)
        return self

    def shared_media(self, algorithm: str | None = None) -> tuple[bool, bool]:
        """(uplink shared, downlink shared): a trace's rates are each client's own."""
        return False, False


class PluginLink(LinkTransport):
    shared: bool = Field(
        default=False,
        description="links of this direction of an edge server's clients share one medium",
    )


class PluginChannelConfig(_Strict):
    """A link model of a plugin (the ``mecsim.channels`` entry-point group): its class is
    built with ``params`` (validated by its own ``Params`` model, if it has one) and draws
    each round's rates; the transport (latency, jitter, loss) and the media are mecsim's,
    as for the built-in models."""

    model: Literal["plugin"]
    name: str = Field(min_length=1, description="the channel plugin (`mecsim plugins`)")
    params: dict[str, Any] = Field(default_factory=dict, description="the plugin's parameters")
    uplink: PluginLink = Field(default_factory=PluginLink)
    downlink: PluginLink = Field(default_factory=PluginLink)

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name in BUILTIN_CHANNELS:
            raise ValueError(f"{name!r} is built in: write `model: {name}` instead")
        _resolvable(registry.CHANNELS, name)
        return name

    @model_validator(mode="after")
    def _params_fit(self) -> PluginChannelConfig:
        cls = registry.CHANNELS.get(self.name)  # PluginError (a ValueError): one line
        params_model = getattr(cls, "Params", None)
        if params_model is not None:
            try:
                params_model(**self.params)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(
                    f"params.{_loc(err['loc'])}: {err['msg']} (channel {self.name})"
                ) from None
        elif self.params:
            raise ValueError(f"params: channel {self.name} takes no parameters")
        _check_client_loss(self.uplink, self.downlink)
        return self

    def shared_media(self, algorithm: str | None = None) -> tuple[bool, bool]:
        """(uplink shared, downlink shared)."""
        return self.uplink.shared, self.downlink.shared


#: the link models built into mecsim (``channel.model``)
BUILTIN_CHANNELS = ("shannon", "fixed_rate", "trace")

ChannelConfig = Annotated[
    ShannonChannelConfig | FixedRateChannelConfig | TraceChannelConfig | PluginChannelConfig,
    Field(discriminator="model"),
]
