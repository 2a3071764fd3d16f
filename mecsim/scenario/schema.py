"""The scenario schema: typed, validated pydantic models of every section.

Parsed once, validated once, then typed (:mod:`mecsim.scenario.loader` reads the YAML).
Every number must be finite (no ``.inf`` or ``.nan`` anywhere) and names and run ids are
safe folder names; checks that need more than the file (paths, ports, memory, cross-field
checks of an algorithm) are in :mod:`mecsim.run.preflight`. What a validator needs of an
algorithm or a device profile it asks :mod:`mecsim.registry` by name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

import mecsim.registry as registry
from mecsim.scenario.aggregation import AggregationConfig
from mecsim.scenario.mobility import MobilityConfig

PositiveFloat = Annotated[float, Field(gt=0)]
#: the longest emulated time a scenario may name (s; ~32 years): a finite-but-absurd
#: time (1e308) would overflow the emulation's sums to inf, then pass as a number
MAX_EMULATED_S = 1e9
#: an emulated time of that range (s)
EmulatedSeconds = Annotated[float, Field(ge=0, le=MAX_EMULATED_S)]
PositiveEmulatedSeconds = Annotated[float, Field(gt=0, le=MAX_EMULATED_S)]


#: Quantities in dB or dBm: finite, and small enough that 10^(x/10) is a finite float.
Decibels = Annotated[float, Field(ge=-300, le=300)]


#: Every generator mecsim seeds (numpy's SeedSequence and legacy RandomState, torch)
#: accepts 0 .. 2^32 - 1.
MAX_SEED = 2**32 - 1


MAX_NAME_LENGTH = 64


MAX_RUN_ID_LENGTH = 128


MAX_COUNT = 10**9  # samples, batch sizes: far beyond any machine, far below int64 overflow


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _safe_name(max_length: int):
    """A folder name: letters, digits, ``-_.``, not starting with ``.`` or ``-``, no
    ``..``, at most ``max_length`` characters (a run's records go to ``dir/<run id>``)."""

    def check(value: str) -> str:
        if not 1 <= len(value) <= max_length or not _NAME_RE.fullmatch(value) or ".." in value:
            shown = value if len(value) <= 40 else value[:37] + "..."
            raise ValueError(
                f"{shown!r} is not a safe name: use 1-{max_length} letters, "
                "digits, '-', '_' or '.', starting with a letter or digit, "
                "without '..'"
            )
        return value

    return AfterValidator(check)


SafeName = Annotated[str, _safe_name(MAX_NAME_LENGTH)]


RunId = Annotated[str, _safe_name(MAX_RUN_ID_LENGTH)]


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("must be a number or a pair [lo, hi]")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ValueError("must be a number or a pair [lo, hi]") from None
    if not math.isfinite(number):
        raise ValueError("must be a finite number")
    return number


def _range_type(*, gt: float | None = None, ge: float | None = None, le: float | None = None):
    """A value drawn per client uniformly in ``[lo, hi]``, or fixed: a finite number or a
    pair ``[lo, hi]`` with ``lo <= hi``, every value within the bounds."""

    def check(value: Any) -> float | tuple[float, float]:
        single = not isinstance(value, (list, tuple))
        if not single and len(value) != 2:
            raise ValueError("must be a number or a pair [lo, hi]")
        numbers = [_number(value)] if single else [_number(v) for v in value]
        for v in numbers:
            if gt is not None and not v > gt:
                raise ValueError(f"must be greater than {gt:g}")
            if ge is not None and not v >= ge:
                raise ValueError(f"must be at least {ge:g}")
            if le is not None and not v <= le:
                raise ValueError(f"must be at most {le:g}")
        if single:
            return numbers[0]
        if numbers[0] > numbers[1]:
            raise ValueError(f"the pair [lo, hi] has lo {numbers[0]:g} > hi {numbers[1]:g}")
        return numbers[0], numbers[1]

    number: dict[str, Any] = {"type": "number"}
    if gt is not None:
        number["exclusiveMinimum"] = gt
    if ge is not None:
        number["minimum"] = ge
    if le is not None:
        number["maximum"] = le
    schema = {"anyOf": [number, {"type": "array", "items": number, "minItems": 2, "maxItems": 2}]}
    return Annotated[float | tuple[float, float], BeforeValidator(check), WithJsonSchema(schema)]


class _Strict(BaseModel):
    # allow_inf_nan=False: every float field refuses inf and nan
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class IidPartition(_Strict):
    method: Literal["iid"] = "iid"
    samples_per_client: int | None = Field(
        default=None,
        gt=0,
        description="null: split each pool into equal disjoint parts; N: each "
        "client draws N train samples uniformly from the pool (without replacement within "
        "a client; clients may share samples), for more clients than the pool has samples",
    )
    test_samples_per_client: int | None = Field(
        default=None,
        gt=0,
        description="with samples_per_client: each client's test samples (default: 1)",
    )


class DirichletPartition(_Strict):
    method: Literal["dirichlet"]
    alpha: PositiveFloat = Field(description="Dirichlet concentration over clients, per class")
    min_samples: int = Field(default=1, ge=0, description="redraw until every client has this many")


class ShardsPartition(_Strict):
    method: Literal["shards"]
    shards_per_client: int = Field(default=2, ge=1)


class PrimarySecondaryPartition(_Strict):
    method: Literal["primary_secondary"]
    samples_per_client: int = Field(gt=0, le=MAX_COUNT)
    test_samples_per_client: int = Field(gt=0, le=MAX_COUNT)


Partition = Annotated[
    IidPartition | DirichletPartition | ShardsPartition | PrimarySecondaryPartition,
    Field(discriminator="method"),
]


class DatasetConfig(_Strict):
    name: str = Field(
        default="mnist-embedded",
        min_length=1,
        description="mnist-embedded, mnist-embedded-3x32 (the embedded MNIST padded to "
        "32x32 and repeated over 3 channels: a CIFAR-shaped stand-in; nothing is "
        "downloaded), mnist, fashion-mnist, cifar10, cifar100, or a dataset plugin "
        "(`mecsim plugins`)",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        return _resolvable(registry.DATASETS, name)

    root: str | None = Field(
        default=None, min_length=1, description="directory holding the dataset files"
    )
    train_size: int | None = Field(default=None, gt=0, description="train pool size (subsample)")
    test_size: int | None = Field(default=None, gt=0, description="test pool size (subsample)")
    partition: Partition = Field(default_factory=IidPartition)


class ModelConfig(_Strict):
    name: str = Field(
        default="mlp_2nn",
        min_length=1,
        description="mlp_2nn, mtfl_cnn, kapc_cnn, phsfl_cnn, resnet18, or a model plugin "
        "(`mecsim plugins`)",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        return _resolvable(registry.MODELS, name)


def _resolvable(reg: registry.Registry, name: str) -> str:
    """``name`` if ``reg`` has it (an installed entry point, a registered plugin, or an
    import string where imports are allowed), else the one-line reason as a ValueError."""
    if name not in reg:
        raise ValueError(f"unknown {reg.kind} {name!r}; known: {', '.join(reg.names())}")
    try:
        reg.info(name)  # a conflict, or an import string where imports are not allowed
    except registry.PluginError as exc:
        raise ValueError(str(exc)) from None
    return name


class TrainingConfig(_Strict):
    epochs: int = Field(default=1, ge=1, description="local epochs per round (E)")
    batch_size: int = Field(default=32, ge=1, le=MAX_COUNT)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: PositiveFloat = 0.01
    momentum: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)


class AlgorithmConfig(_Strict):
    name: str = Field(default="fedavg", description="fedavg, local, ... (see `mecsim algorithms`)")
    params: dict[str, Any] = Field(default_factory=dict, description="algorithm hyper-parameters")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        _resolvable(registry.ALGORITHMS, name)
        registry.algorithm(name)  # PluginError (a ValueError): fails to import, not a pair
        return name

    @model_validator(mode="after")
    def _params_fit(self) -> AlgorithmConfig:
        """Validate ``params`` against the algorithm's own Params model."""
        server_cls, _ = registry.algorithm(self.name)
        try:
            server_cls.Params(**self.params)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(
                f"params.{_loc(err['loc'])}: {err['msg']} (algorithm {self.name})"
            ) from None
        return self


class CompressorConfig(_Strict):
    """What clients' uploads become on the air (docs/compressors.md): a compressor of the
    ``mecsim.compressors`` group, or none."""

    name: str | None = Field(
        default=None,
        description="quantize, topk, random_mask, or a compressor plugin (`mecsim plugins "
        "--kind compressor`); null: uploads go as they are",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="the compressor's parameters (its Params)"
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str | None) -> str | None:
        if name is None:
            return None
        _resolvable(registry.COMPRESSORS, name)
        registry.COMPRESSORS.get(name)  # PluginError (a ValueError): fails to import
        return name

    @model_validator(mode="after")
    def _params_fit(self) -> CompressorConfig:
        if self.name is None:
            if self.params:
                raise ValueError("params: no compressor is named (compressor.name is null)")
            return self
        params_model = getattr(registry.COMPRESSORS.get(self.name), "Params", None)
        if params_model is not None:
            try:
                params_model(**self.params)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(
                    f"params.{_loc(err['loc'])}: {err['msg']} (compressor {self.name})"
                ) from None
        return self


class TopologyConfig(_Strict):
    clients: int = Field(
        default=10, ge=1, le=1_000_000, description="number of clients (virtual; not processes)"
    )
    edge_servers: int = Field(default=1, ge=1)
    participation: float = Field(
        default=1.0, gt=0, le=1, description="fraction of clients selected per round (C)"
    )


class CustomProfile(_Strict):
    flops_per_s: float = Field(ge=1, description="at least 1 FLOP/s")
    step_overhead_s: float = Field(ge=0, le=3600)
    ram_bytes: int = Field(gt=0)
    description: str = ""
    flops_source: str = Field(description="where flops_per_s comes from")
    step_overhead_source: str = Field(description="where step_overhead_s comes from")
    ram_source: str = ""
    active_power_w: float | None = Field(
        default=None,
        gt=0,
        description="whole board, every core busy (W); with idle_power_w: energy per round",
    )
    idle_power_w: float | None = Field(default=None, ge=0, description="whole board, idle (W)")
    radio_tx_power_w: float | None = Field(
        default=None,
        ge=0,
        description="a measured transmit draw above idle (W); replaces P_tx/eta + P_circuit",
    )
    radio_rx_power_w: float | None = Field(
        default=None, ge=0, description="the radio's extra draw above idle while receiving (W)"
    )
    radio_pa_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="power amplifier efficiency eta_PA (0, 1]"
    )
    radio_circuit_power_w: float | None = Field(
        default=None,
        ge=0,
        description="transmit chain's circuit draw above idle (W): P_tx/eta_PA + P_circuit",
    )
    radio_tx_power_dbm: float | None = Field(
        default=None,
        ge=-50,
        le=40,
        description="radiated power where the channel gives none (fixed_rate, trace) (dBm)",
    )
    power_source: str = Field(default="", description="where active/idle_power_w come from")
    radio_power_source: str = Field(default="", description="where the radio_* figures come from")
    sleep_power_w: float | None = Field(
        default=None, ge=0, description="whole board asleep (W): energy.idle_policy sleep"
    )
    sleep_power_source: str = Field(default="", description="where sleep_power_w comes from")
    aggregate_flops_per_s: float | None = Field(
        default=None,
        ge=1,
        description="FLOP/s of a server's aggregation (element-wise folds of the uploads, "
        "memory-bound); omit: flops_per_s",
    )
    aggregate_flops_source: str = Field(
        default="", description="where aggregate_flops_per_s comes from"
    )

    @model_validator(mode="after")
    def _power_sourced(self) -> CustomProfile:
        if self.aggregate_flops_per_s is not None and not self.aggregate_flops_source.strip():
            raise ValueError(
                "aggregate_flops_source: say where aggregate_flops_per_s comes from "
                "(a measurement, e.g. benchmarks/speed/aggregation_rate.py, or 'estimate: ...')"
            )
        board = (self.active_power_w, self.idle_power_w)
        given = [v is not None for v in board]
        if any(given) and not all(given):
            missing = ("active_power_w", "idle_power_w")[given.index(False)]
            raise ValueError(f"{missing}: give active_power_w and idle_power_w together")
        if any(given) and not self.power_source.strip():
            raise ValueError(
                "power_source: say where active_power_w and idle_power_w come from (a "
                "measurement, a datasheet, or 'estimate: ...')"
            )
        self._radio_sourced()
        if self.sleep_power_w is not None:
            if not self.sleep_power_source.strip():
                raise ValueError(
                    "sleep_power_source: say where sleep_power_w comes from (a "
                    "measurement, a datasheet, or 'estimate: ...')"
                )
            if self.idle_power_w is not None and self.sleep_power_w > self.idle_power_w:
                raise ValueError(
                    f"sleep_power_w: {self.sleep_power_w} W is above idle_power_w "
                    f"({self.idle_power_w} W)"
                )
        return self

    def _radio_sourced(self) -> None:
        """The radio: a receive draw, and a transmit draw (measured, or eta_PA and
        P_circuit together), with their source."""
        pa = (self.radio_pa_efficiency, self.radio_circuit_power_w)
        radio = (self.radio_tx_power_w, self.radio_rx_power_w, *pa, self.radio_tx_power_dbm)
        if all(v is None for v in radio):
            return
        if (pa[0] is None) != (pa[1] is None):
            missing = "radio_pa_efficiency" if pa[0] is None else "radio_circuit_power_w"
            raise ValueError(
                f"{missing}: give radio_pa_efficiency and radio_circuit_power_w together"
            )
        if self.radio_rx_power_w is None:
            raise ValueError("radio_rx_power_w: give it with the transmit figures")
        if self.radio_tx_power_w is None and pa[0] is None:
            raise ValueError(
                "radio_pa_efficiency: give radio_pa_efficiency and radio_circuit_power_w "
                "(the transmit draw P_tx/eta_PA + P_circuit), or a measured radio_tx_power_w"
            )
        if not self.radio_power_source.strip():
            raise ValueError(
                "radio_power_source: say where the radio figures come from (a "
                "measurement, a datasheet, or 'estimate: ...')"
            )


class DeviceGroup(_Strict):
    profile: str
    count: int | None = Field(
        default=None, ge=1, description="clients in this group; omit: the rest"
    )


class DevicesConfig(_Strict):
    clients: list[DeviceGroup] = Field(
        default_factory=lambda: [DeviceGroup(profile="rpi4")],
        description="groups assigned to clients in id order",
    )
    edge_server: str = "edge-server-x86"
    profiles: dict[str, CustomProfile] = Field(
        default_factory=dict, description="extra or overriding device profiles"
    )


class EnergyConfig(_Strict):
    """How a client's round is charged (mecsim.emulation.energy, docs/devices.md)."""

    idle_policy: Literal["idle", "sleep"] = Field(
        default="sleep",
        description="sleep: a client that has finished its round sleeps (the profile's "
        "sleep_power_w) until the round ends; idle: it idles (idle_power_w)",
    )


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


if TYPE_CHECKING:  # what the checks below let through, as mypy cannot run _range_type
    PositiveRange = float | tuple[float, float]
    DecibelRange = float | tuple[float, float]
    SlowdownRange = float | tuple[float, float]
else:
    PositiveRange = _range_type(gt=0)
    DecibelRange = _range_type(ge=-300, le=300)
    SlowdownRange = _range_type(ge=1)


class LinkTransport(_Strict):
    """Latency, jitter, packet loss and transport of one link class (uplink, downlink or
    backhaul).

    The latency is drawn per client-round as ``max(0, latency_s + jitter_s * U[-1, 1])``
    from the scenario seed. ``transport: tcp`` (the default) times each transfer as a
    finite TCP flow on an open connection: header bytes on the wire, slow start from
    ``initial_window_segments``, the connection's set-up and, with a loss rate, the
    expected loss recovery and congestion avoidance of ``congestion_control``
    (:mod:`mecsim.channel.tcp`). ``transport: ideal`` keeps ``latency + 8*n / goodput``,
    a loss rate limiting the goodput to the Mathis et al. bound
    ``min(rate, 8*MSS/(RTT*sqrt(p)) * sqrt(3/2))`` (docs/channel.md, "Transport").
    """

    latency_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="one-way propagation + queueing delay added to every transfer (s)",
    )
    jitter_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="latency varies per client-round "
        "uniformly in [latency_s - jitter_s, latency_s + jitter_s], "
        "clipped at 0 (s)",
    )
    loss_rate: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="packet-loss probability: tcp, a finite flow's expected time over "
        "sample paths of its loss recovery (docs/channel.md); ideal, the Mathis et al. "
        "bound on the goodput",
    )
    transport: Literal["tcp", "ideal"] = Field(
        default="tcp",
        description="tcp: a finite TCP flow per transfer (headers, slow start, set-up, "
        "loss recovery); ideal: latency + 8*bytes/goodput, for papers that time bits/rate "
        "(docs/channel.md)",
    )
    mss_bytes: int | None = Field(
        default=None,
        gt=0,
        le=65495,
        description="TCP payload per segment (bytes); null: 1448 under tcp (a 1,500-byte "
        "MTU with timestamps), 1460 under ideal (what its Mathis bound assumes)",
    )
    header_bytes: int = Field(
        default=52,
        ge=0,
        le=65535,
        description="tcp: bytes on the wire per segment besides its payload (IPv4 20 + TCP "
        "20 + timestamps 12)",
    )
    initial_window_segments: int = Field(
        default=10,
        ge=1,
        le=10000,
        description="tcp: the initial congestion window in segments (RFC 6928: 10)",
    )
    connection: Literal["persistent", "new", "tls"] = Field(
        default="persistent",
        description="tcp: persistent (FL clients keep their connection: no set-up), new "
        "(one round trip of handshake per transfer) or tls (two)",
    )
    congestion_control: Literal["cubic", "newreno"] = Field(
        default="cubic", description="tcp: the congestion control whose loss recovery is timed"
    )
    min_rto_s: float = Field(
        default=0.2,
        gt=0,
        le=60,
        description="tcp: the retransmission timeout's floor (s; Linux 0.2, RFC 6298 1.0)",
    )
    queue: Literal["fq_codel", "fifo"] = Field(
        default="fq_codel",
        description="tcp: the bottleneck's queue. fq_codel (Linux's and ns-3's default) "
        "drops from the queue slow start leaves once it has stood above 5 ms for 100 ms "
        "(one-way latencies from about 24 ms), and the window's cut idles the link; fifo "
        "(a deep drop-tail buffer, as on many cellular links) never drops and keeps the "
        "link busy (docs/channel.md, Transport)",
    )

    def segment_bytes(self) -> int:
        """The MSS in force: ``mss_bytes``, or the transport's (tcp 1448, ideal 1460)."""
        if self.mss_bytes is not None:
            return self.mss_bytes
        return TCP_MSS_BYTES if self.tcp() else IDEAL_MSS_BYTES

    def tcp(self) -> bool:
        """Are this link's transfers finite TCP flows (``transport: tcp``)?"""
        return self.transport == "tcp"


#: the MSS of an ideal link's Mathis bound when none is given (bytes)
IDEAL_MSS_BYTES = 1460
#: a TCP link's when none is given: a 1,500-byte MTU less IPv4, TCP and timestamps (bytes)
TCP_MSS_BYTES = 1448


def personalised_downloads(algorithm: str) -> bool:
    """Do the algorithm's clients download different bytes (its server class's
    ``personalised_downloads``)?"""
    server_cls, _ = registry.algorithm(algorithm)
    return bool(getattr(server_cls, "personalised_downloads", False))


def _check_client_loss(uplink: LinkTransport, downlink: LinkTransport) -> None:
    """A loss rate needs a round trip: TCP's loss recovery runs in round trips, and the
    Mathis bound (``transport: ideal``) divides by the RTT."""
    if uplink.latency_s + downlink.latency_s > 0:
        return
    for name, link in (("uplink", uplink), ("downlink", downlink)):
        if link.loss_rate > 0:
            raise ValueError(
                f"{name}.loss_rate: a loss rate needs a round-trip time (TCP recovers "
                "losses in round trips; RTT = uplink.latency_s + downlink.latency_s); "
                "set a latency_s > 0"
            )


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


class BackhaulConfig(LinkTransport):
    """Each edge server's wired link to the central server (RTT = 2 * latency)."""

    bandwidth_bps: float = Field(default=1e9, ge=1, description="at least 1 b/s")
    latency_s: float = Field(
        default=0.005, ge=0, le=3600, description="one-way latency of each transfer (s)"
    )

    @model_validator(mode="after")
    def _loss_needs_rtt(self) -> BackhaulConfig:
        if self.loss_rate > 0 and self.latency_s == 0:
            raise ValueError(
                "loss_rate: a loss rate needs a round-trip time (TCP recovers losses "
                "in round trips; RTT = 2 * latency_s); set latency_s > 0"
            )
        return self


Fraction = Annotated[float, Field(gt=0, le=1)]


class EvaluationConfig(_Strict):
    every: int = Field(
        default=1, ge=1, description="evaluate user accuracy every N rounds (and last)"
    )
    clients: Literal["all", "selected"] = "all"
    target_accuracy: list[Fraction] = Field(
        default_factory=list,
        description="target mean user accuracies (fractions, e.g. 0.97): "
        "the run's summary reports the rounds and emulated seconds until each is first "
        "reached (MTFL Table 2's figure), or X",
    )


class OutputsConfig(_Strict):
    dir: str = Field(default="runs", min_length=1)
    run_id: RunId | None = Field(
        default=None,
        description="default: <scenario name>-<timestamp>-<random suffix>; letters, "
        "digits, '-', '_', '.'",
    )
    table_format: Literal["parquet", "csv"] = "parquet"
    save_optraces: bool = True


class MetricsConfig(_Strict):
    enabled: bool = True
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=9464, ge=0, le=65535, description="0 = any free port")
    public: bool = Field(
        default=False,
        description="allow a host that is not a loopback address "
        "(/metrics reachable from other machines; mecsim run "
        "--metrics-public)",
    )


#: execution.call_timeout_s by default: an hour for one client's fit or one aggregation
#: is far beyond real work on a host (a round of the paper scenarios' clients takes
#: seconds), short enough that a hung call does not hold a run (or a service's worker)
#: for days
DEFAULT_CALL_TIMEOUT_S = 3600.0
#: the largest call_timeout_s (a week); null for none
MAX_CALL_TIMEOUT_S = 7 * 86400.0


class ExecutionConfig(_Strict):
    backend: Literal["ray", "local"] = Field(
        default="ray", description="ray: host actors in Ray; local: in-process (tests, debugging)"
    )
    hosts: int | None = Field(default=None, ge=1, description="host actors; default one per core")
    ray_address: str | None = Field(default=None, description="attach to an existing Ray cluster")
    stream_aggregation: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: fold the uploads into the aggregate while the clients "
        "train, when the round's aggregated clients are known before it is timed (no "
        "deadline, no wait_for_fraction, no link or edge-server outages, no rate traces) "
        "and the algorithm can (FedAvg, FedProx, Per-FedAvg); off: hold every upload "
        "until the round is timed. The same bits either way",
    )
    call_timeout_s: float | None = Field(
        default=DEFAULT_CALL_TIMEOUT_S,
        gt=0,
        le=MAX_CALL_TIMEOUT_S,
        description="the longest one call into an algorithm's code may take (s): a "
        "client's fit or evaluate, the server's select, configure_fit, aggregate_fit, "
        "..., a Flower ClientApp's message or the ServerApp's turn; a call still running "
        "then fails the run (exit 1), naming the algorithm, the call and the round. "
        "null: no limit (the calls then run in the caller's thread). See "
        "docs/reliability.md for what a call that overran can still do",
    )


class CheckpointConfig(_Strict):
    every: int = Field(
        default=1,
        ge=0,
        description="checkpoint after every N rounds (and after "
        "the last); 0: never (a killed run then resumes from its start)",
    )
    keep: int = Field(default=2, ge=1, description="how many of the newest checkpoints to keep")


Probability = Annotated[float, Field(ge=0, le=1)]


class StragglerConfig(_Strict):
    fraction: Probability = Field(
        default=0.0, description="share of the clients that straggle (drawn once per run)"
    )
    slowdown: SlowdownRange = Field(
        default=(2.0, 4.0),
        description="compute slow-down factor "
        "(>= 1) of a straggler, uniform in [lo, hi], drawn once "
        "per straggler",
    )


class LinkOutage(_Strict):
    start_s: EmulatedSeconds = Field(description="emulated seconds since the run started")
    duration_s: PositiveEmulatedSeconds
    clients: Literal["all"] | list[Annotated[int, Field(ge=0)]] = "all"
    direction: Literal["both", "uplink", "downlink"] = "both"


class EdgeServerOutage(_Strict):
    edge_server: int = Field(ge=0)
    start_s: EmulatedSeconds = Field(description="emulated seconds since the run started")
    duration_s: PositiveEmulatedSeconds


class FaultsConfig(_Strict):
    """Emulated faults, drawn from the scenario seed (see docs/reliability.md)."""

    crash_prob: Probability = Field(
        default=0.0,
        description="per client-round: the device crashes during local training; its work is lost",
    )
    dropout_prob: Probability = Field(
        default=0.0, description="per client-round: the client trains, then leaves before uploading"
    )
    outage_prob: Probability = Field(
        default=0.0, description="per client-round: the client's link is down for the whole round"
    )
    straggler: StragglerConfig | None = None
    link_outages: list[LinkOutage] = Field(default_factory=list)
    edge_server_outages: list[EdgeServerOutage] = Field(default_factory=list)
    wait_for_fraction: Fraction = Field(
        default=1.0,
        description="aggregate once this fraction of "
        "the selected clients has delivered (MTFL step 5); "
        "later ones are dropped",
    )


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


def hex_grid_offsets_m(rings: int, inter_site_distance_m: float) -> list[tuple[float, float]]:
    """The sites of a hexagonal grid of ``rings`` rings around a centre site, as offsets
    from that centre (m), in edge-server order: the centre, then ring 1, ring 2, ...

    Ring k has 6k sites on the hexagon whose corners are k·D·(cos 60°j, sin 60°j),
    j = 0..5 (D the inter-site distance): each ring starts at its corner on the +x axis
    and walks counter-clockwise, k sites per side (the corner, then k − 1 evenly spaced
    points towards the next corner). 1 + 3·R·(R + 1) sites in all; every site's six
    nearest neighbours are D away. (Kept in the scenario layer because validation needs
    the sites; :func:`mecsim.emulation.geometry.hex_grid_sites` is its numpy form.)
    """
    out = [(0.0, 0.0)]
    for k in range(1, rings + 1):
        corners = [
            (
                k * inter_site_distance_m * math.cos(math.pi / 3 * j),
                k * inter_site_distance_m * math.sin(math.pi / 3 * j),
            )
            for j in range(7)
        ]
        for j in range(6):
            (x0, y0), (x1, y1) = corners[j], corners[j + 1]
            out += [(x0 + (x1 - x0) * t / k, y0 + (y1 - y0) * t / k) for t in range(k)]
    return out


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
            return hex_grid_offsets_m(self.rings, self.inter_site_distance_m)
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
        points = self.sites.offsets_or_positions_m()
        if self.sites.layout == "hex":
            margin = (
                self.sites.inter_site_distance_m / math.sqrt(3)
                if self.margin_m is None
                else self.margin_m
            )
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            return max(xs) - min(xs) + 2 * margin, max(ys) - min(ys) + 2 * margin
        margin = self.margin_m or 0.0
        return max(p[0] for p in points) + margin, max(p[1] for p in points) + margin

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
        spots = self.clients.hotspots or []
        if spots and spots[0].clients is not None:
            return [int(h.clients or 0) for h in spots]
        return split_evenly(n_clients, len(spots))


def split_evenly(n: int, parts: int) -> list[int]:
    """``n`` into ``parts`` contiguous blocks of ⌈n / parts⌉ (the last ones smaller):
    the blocks :meth:`Scenario.edge_server_of` gives without a geometry."""
    per = math.ceil(n / parts)
    return [max(0, min(per, n - k * per)) for k in range(parts)]


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


def _is_tag(part: Any) -> bool:
    """pydantic puts union members into error locations ('shannon', 'float',
    'function-after[check(), str]'); they are not field names."""
    return isinstance(part, str) and (
        part in _UNION_TAGS
        or part.startswith("function-")
        or bool(re.fullmatch(r"[a-z_]+\[.*\]", part))
    )


def _loc(loc: tuple[Any, ...]) -> str:
    """A dotted path; a key that is not a plain name (an unknown key with spaces, dots,
    colons or invisible characters in it) is quoted, escapes and all."""
    parts = [
        str(p) if re.fullmatch(r"[\w<>-]+", str(p), re.ASCII) else repr(str(p))
        for p in loc
        if not _is_tag(p)
    ]
    return ".".join(parts) or "(top level)"


_UNION_TAGS = {
    "shannon",
    "fixed_rate",
    "trace",
    "iid",
    "dirichlet",
    "shards",
    "primary_secondary",
    "float",
    "int",
    "str",
    "bool",
    "none",
}
