"""How clients move: the ``geometry.mobility`` section of a scenario
(docs/mobility-models.md).

One mapping: ``model`` picks the model, ``step_s`` the time grid, and the model's own
parameters sit beside them (units in their names). A parameter of another model is
refused naming the field (``pause_s`` under ``gauss_markov`` is a mistake, not
something to ignore); parameters left out take the defaults below, filled in at
validation so a resolved scenario shows what ran.

This module imports nothing of mecsim: the schema imports it (``GeometryConfig.mobility``)
and it must not import the schema back.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

#: what a trace file may weigh by default (its .gz, decompressed, too)
DEFAULT_TRACE_MAX_BYTES = 50 * 2**20

#: no client is faster than this (m/s): far above any vehicle a MEC study moves, low
#: enough that nothing overflows
MAX_SPEED_MPS = 1000.0

MobilityModelName = Literal["static", "random_waypoint", "gauss_markov", "random_walk", "trace"]

#: each model's parameters and their defaults (None: a per-client draw, see the field)
MODEL_PARAMETERS: dict[str, dict[str, Any]] = {
    "static": {},
    "random_waypoint": {"speed_mps": (0.5, 1.5), "pause_s": 0.0},
    "gauss_markov": {
        "mean_speed_mps": 1.0,
        "alpha": 0.75,
        "speed_std_mps": 0.5,
        "direction_std_rad": 0.5,
        "mean_direction_rad": None,
        "update_interval_s": 1.0,
    },
    "random_walk": {"speed_mps": (0.5, 1.5), "interval_s": 10.0},
    "trace": {"trace": None},
}


def _range_check(*, gt: float | None = None, ge: float | None = None, le: float | None = None):
    """A number, or a pair ``[lo, hi]`` (a per-client or per-leg uniform draw), each
    finite and within the bounds, ``lo <= hi``."""

    def number(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("must be a number or a pair [lo, hi]")
        v = float(value)
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        if gt is not None and not v > gt:
            raise ValueError(f"must be greater than {gt:g}")
        if ge is not None and not v >= ge:
            raise ValueError(f"must be at least {ge:g}")
        if le is not None and not v <= le:
            raise ValueError(f"must be at most {le:g}")
        return v

    def check(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            if len(value) != 2:
                raise ValueError("must be a number or a pair [lo, hi]")
            lo, hi = number(value[0]), number(value[1])
            if lo > hi:
                raise ValueError(f"the pair [lo, hi] has lo {lo:g} > hi {hi:g}")
            return (lo, hi)
        return number(value)

    bound: dict[str, Any] = {"type": "number"}
    if gt is not None:
        bound["exclusiveMinimum"] = gt
    if ge is not None:
        bound["minimum"] = ge
    if le is not None:
        bound["maximum"] = le
    schema = {
        "anyOf": [
            bound,
            {"type": "array", "items": bound, "minItems": 2, "maxItems": 2},
            {"type": "null"},
        ]
    }
    return Annotated[Any, BeforeValidator(check), WithJsonSchema(schema)]


if TYPE_CHECKING:
    SpeedRange = float | tuple[float, float] | None
    PauseRange = float | tuple[float, float] | None
else:
    SpeedRange = _range_check(ge=0, le=MAX_SPEED_MPS)
    PauseRange = _range_check(ge=0, le=86400 * 365)


class _Strict(BaseModel):
    # as the schema's: unknown keys refused, frozen, no inf or nan in any float
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _node_id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("a trace node id must be a string or an integer")
    return str(value)


class TraceConfig(_Strict):
    """A trace file the clients follow (``model: trace``)."""

    format: Literal["sumo_fcd", "ns2", "one", "bonnmotion"] = Field(
        description="sumo_fcd: `sumo --fcd-output` XML; ns2: an ns-2 mobility script "
        '($node_(i) set X_ x, $ns_ at t "$node_(i) setdest x y v"); one: the ONE '
        "simulator's external movement format; bonnmotion: BonnMotion's native .movements"
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="the trace file (.gz is decompressed); relative paths are relative to "
        "the scenario file",
    )
    node_map: dict[Annotated[str, BeforeValidator(_node_id)], int] | None = Field(
        default=None,
        description="{trace node id: client index}, naming every client once; null: client i "
        "follows the i-th node in order of first appearance",
    )
    max_bytes: int = Field(
        default=DEFAULT_TRACE_MAX_BYTES,
        ge=1,
        le=2**31,
        description="a larger file (or .gz content) is refused before it is read (bytes)",
    )
    start_s: float = Field(
        default=0.0,
        ge=0,
        le=1e9,
        description="the trace time at the run's emulated time 0 (s): skips a warm-up",
    )
    after_end: Literal["hold", "refuse"] = Field(
        default="hold",
        description="hold: a trace that ends before the run does warns and every node stays "
        "at its last position; refuse: such a trace is refused",
    )

    @model_validator(mode="after")
    def _one_node_per_client(self) -> TraceConfig:
        if self.node_map is None:
            return self
        if not self.node_map:
            raise ValueError("node_map: empty; leave it out to map clients in order")
        seen: dict[int, str] = {}
        for node_id, client in self.node_map.items():
            if client < 0:
                raise ValueError(f"node_map: client {client} of node {node_id!r} is negative")
            if client in seen:
                raise ValueError(
                    f"node_map: client {client} is given two nodes ({seen[client]!r} and "
                    f"{node_id!r})"
                )
            seen[client] = node_id
        return self


class MobilityConfig(_Strict):
    """How every client moves over the run (docs/mobility-models.md).

    ``static`` (the default): nobody moves. ``random_waypoint``: ``speed_mps``,
    ``pause_s``. ``gauss_markov``: ``mean_speed_mps``, ``alpha``, ``speed_std_mps``,
    ``direction_std_rad``, ``mean_direction_rad``, ``update_interval_s``.
    ``random_walk``: ``speed_mps``, ``interval_s``. ``trace``: ``trace``.
    """

    model: MobilityModelName = Field(
        default="static",
        description="static, random_waypoint, gauss_markov, random_walk or trace",
    )
    step_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="the time grid (s): positions are computed every step_s and linear "
        "between; a link's rate is taken as constant over one step",
    )
    rate: Literal["step", "round"] = Field(
        default="step",
        description="how a moving client's link rate follows it during a round: step (the "
        "default) takes the rate at its distance to its serving site piece by piece over "
        "the step_s grid and integrates it over each transfer (docs/mobility.md, Mobility "
        "in a run); round freezes it at the round's start (mecsim before this field). "
        "Static clients: no difference",
    )
    speed_mps: SpeedRange = Field(
        default=None,
        description="random_waypoint (> 0) and random_walk (>= 0): speed in m/s, a number or "
        "[lo, hi] drawn uniformly per leg; default [0.5, 1.5]",
    )
    pause_s: PauseRange = Field(
        default=None,
        description="random_waypoint: pause at each waypoint (s), a number or [lo, hi] drawn "
        "uniformly per pause; default 0",
    )
    mean_speed_mps: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SPEED_MPS,
        description="gauss_markov: the mean speed s̄ (m/s); default 1",
    )
    alpha: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="gauss_markov: the memory α in [0, 1] (1: constant velocity, 0: a fresh "
        "draw each update); default 0.75",
    )
    speed_std_mps: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SPEED_MPS,
        description="gauss_markov: the speed's standard deviation σ_s (m/s); default 0.5",
    )
    direction_std_rad: float | None = Field(
        default=None,
        ge=0,
        le=2 * math.pi,
        description="gauss_markov: the direction's standard deviation σ_d (rad); default 0.5",
    )
    mean_direction_rad: float | None = Field(
        default=None,
        ge=-2 * math.pi,
        le=2 * math.pi,
        description="gauss_markov: the mean direction d̄ (rad, 0 = +x, π/2 = +y); null (the "
        "default): each client's own, drawn uniformly in [0, 2π)",
    )
    update_interval_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="gauss_markov: the time between speed and direction updates Δt (s); default 1",
    )
    interval_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="random_walk: the time between direction (and speed) changes (s); a leg "
        "is speed_mps · interval_s metres; default 10",
    )
    trace: TraceConfig | None = Field(
        default=None, description="trace: the trace file the clients follow"
    )

    @model_validator(mode="before")
    @classmethod
    def _model_parameters(cls, data: Any) -> Any:
        """Refuse another model's parameters; fill this model's defaults."""
        if not isinstance(data, dict):
            return data
        model = data.get("model", "static")
        if not isinstance(model, str) or model not in MODEL_PARAMETERS:
            return data  # the Literal refuses it, naming the field
        own = MODEL_PARAMETERS[model]
        for key, value in data.items():
            if key in ("model", "step_s", "rate") or key in own or value is None:
                continue
            owners = [m for m, params in MODEL_PARAMETERS.items() if key in params]
            if owners:
                mine = ", ".join(own) or "none"
                raise ValueError(
                    f"{key}: a parameter of {' and '.join(owners)}, not of model {model} "
                    f"(its parameters: {mine})"
                )
        if model == "trace" and data.get("trace") is None:
            raise ValueError(
                "trace: model trace needs the trace file, e.g. trace: {format: sumo_fcd, "
                "path: traces/highway-fcd.xml}"
            )
        filled = dict(data)
        for key, default in own.items():
            if filled.get(key) is None and default is not None:
                filled[key] = default
        return filled

    @model_validator(mode="after")
    def _waypoint_speeds_above_zero(self) -> MobilityConfig:
        if self.model == "random_waypoint" and self.speed_mps is not None:
            v = self.speed_mps
            lo = v if isinstance(v, (int, float)) else v[0]
            if lo <= 0:
                raise ValueError(
                    "speed_mps: random_waypoint needs speeds above 0 m/s (with speeds down to "
                    "0 the mean speed decays over the run), e.g. [0.5, 1.5]"
                )
        return self

    def parameters(self) -> dict[str, Any]:
        """This model's parameters, by name (what :mod:`mecsim.emulation.mobility`
        builds the model from)."""
        return {key: getattr(self, key) for key in MODEL_PARAMETERS[self.model]}
