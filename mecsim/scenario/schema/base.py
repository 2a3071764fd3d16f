"""What the sections' models share: the strict base model (unknown keys refused,
frozen, every float finite), bounded numbers, ranges drawn per client, safe names, the
name of a plugin a registry must resolve, and the dotted location of an error."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

import mecsim.registry as registry

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


#: ``model_dump(context=EVERY_FIELD)``: a scenario's dump with the fields a dump leaves
#: out while at their defaults (``geometry.handover``, ``channel.interference.timing``),
#: so that an override (``--set``, a sweep's axis) can name them
EVERY_FIELD = {"every_field": True}


def every_field(info: Any) -> bool:
    """Was the dump asked for :data:`EVERY_FIELD`?"""
    context = getattr(info, "context", None)
    return isinstance(context, dict) and bool(context.get("every_field"))


class _Strict(BaseModel):
    # allow_inf_nan=False: every float field refuses inf and nan
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


if TYPE_CHECKING:  # what the checks below let through, as mypy cannot run _range_type
    PositiveRange = float | tuple[float, float]
    DecibelRange = float | tuple[float, float]
    SlowdownRange = float | tuple[float, float]
else:
    PositiveRange = _range_type(gt=0)
    DecibelRange = _range_type(ge=-300, le=300)
    SlowdownRange = _range_type(ge=1)


Fraction = Annotated[float, Field(gt=0, le=1)]


Probability = Annotated[float, Field(ge=0, le=1)]


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
