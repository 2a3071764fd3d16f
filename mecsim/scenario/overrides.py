"""Dotted-path overrides of a scenario: ``channel.uplink.bandwidth_hz = 5e6``.

A path walks the resolved scenario (``mecsim.scenario.resolved_yaml``): mapping keys by
name, list items by index (``devices.clients.0.profile``). The overridden data is
validated again as a whole scenario, so a bad value is reported with its field name.

Which paths a *replay* can answer is decided here too: replay re-times the recorded
op-traces, so it can change only what the timing depends on (channel, devices,
deadline, backhaul). Anything else changes what the clients execute and needs training.

Command-line values are parsed here once: a sweep's grid axis (``--set path=v1,v2,...``)
by :func:`parse_set`, the one value of ``mecsim run / validate / submit --set path=value``
(and of the service's form) by :func:`parse_assignment`, the same syntax.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from mecsim.scenario import Scenario, ScenarioError, scenario_from_dict
from mecsim.scenario.loader import MAX_DEPTH, parse_yaml
from mecsim.scenario.schema.base import EVERY_FIELD

# Top-level sections whose changes only change timing (and energy): replay re-times
# recorded traces.
TIMING_PATHS = ("channel", "devices", "deadline_s", "backhaul", "energy")


class OverrideError(ValueError):
    """An override that cannot be applied; ``str()`` names the path and what is valid."""


#: Fields of ``geometry`` a replay answers too (what-if axes without retraining): whether a
#: moving client's rate follows it during a round (``rate``), the mobility models' speeds
#: and the hexagonal grid's inter-site distance. A replay
#: re-derives the positions and every round's association from the scenario, so they
#: change the links only — for flat algorithms; a hierarchical algorithm (its edge servers
#: aggregate the clients they serve) refuses them (mecsim.analysis.replay.
#: geometry_axis_refusal). ``channel.interference.reuse`` and ``channel.path_loss.*`` are
#: ``channel`` paths.
GEOMETRY_AXES = (
    "geometry.mobility.rate",
    "geometry.mobility.speed_mps",
    "geometry.mobility.mean_speed_mps",
    "geometry.mobility.speed_std_mps",
    "geometry.sites.inter_site_distance_m",
)


def is_geometry_axis(path: str) -> bool:
    """Is ``path`` one of :data:`GEOMETRY_AXES` (or an item of one: ``speed_mps.1``)?"""
    return any(path == axis or path.startswith(axis + ".") for axis in GEOMETRY_AXES)


def is_timing_path(path: str) -> bool:
    """Does ``path`` change only timing (so replaying recorded op-traces answers it)?
    The timing sections, and the geometry's :data:`GEOMETRY_AXES` (for flat algorithms:
    :func:`mecsim.analysis.replay.geometry_axis_refusal`)."""
    return path.split(".", 1)[0] in TIMING_PATHS or is_geometry_axis(path)


def _keys_of(node: Any) -> str:
    if isinstance(node, dict):
        return ", ".join(str(k) for k in node) or "(none)"
    if isinstance(node, list):
        return f"indices 0..{len(node) - 1}" if node else "(an empty list)"
    return "(none: it is a value, not a section)"


def _step(node: Any, part: str, walked: str, path: str) -> Any:
    """The child ``part`` of ``node``; OverrideError naming the valid alternatives."""
    where = walked or "the top level"
    if isinstance(node, dict):
        if part not in node:
            raise OverrideError(
                f"unknown override path {path!r}: {part!r} is not a field of "
                f"{where}; valid: {_keys_of(node)}"
            )
        return node[part]
    if isinstance(node, list):
        if not re.fullmatch(r"\d+", part) or int(part) >= len(node):
            raise OverrideError(
                f"unknown override path {path!r}: {where} is a list; "
                f"use an index, valid: {_keys_of(node)}"
            )
        return node[int(part)]
    if node is None:
        raise OverrideError(
            f"override path {path!r}: {where} is null in this scenario; set "
            f"{where} whole, e.g. {where}={{key: value, ...}}"
        )
    raise OverrideError(f"unknown override path {path!r}: {where} is a value, not a section")


def check_path(data: dict[str, Any], path: str) -> None:
    """Raise OverrideError unless ``path`` names a field of the scenario ``data``."""
    if not path or any(not p for p in path.split(".")):
        raise OverrideError(
            f"override path {path!r} is empty or has an empty part; "
            f"valid top-level fields: {_keys_of(data)}"
        )
    node: Any = data
    walked = ""
    for part in path.split("."):
        node = _step(node, part, walked, path)
        walked = f"{walked}.{part}" if walked else part


def set_paths(data: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Set each ``path: value`` of ``overrides`` in the scenario mapping ``data`` (in
    place, in order); OverrideError, naming the path, for one that is not a field."""
    for path, value in overrides.items():
        check_path(data, path)
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = copy.deepcopy(value)
        else:
            node[last] = copy.deepcopy(value)


def apply_overrides(
    scenario: Scenario, overrides: Mapping[str, Any], source: str = "scenario"
) -> Scenario:
    """A new scenario with each ``path: value`` of ``overrides`` set, validated again."""
    data = scenario.model_dump(mode="json", context=EVERY_FIELD)
    set_paths(data, overrides)
    if not overrides:
        return scenario
    text = ", ".join(f"{p}={v!r}" for p, v in overrides.items())
    try:
        return scenario_from_dict(data, f"{source} with {text}")
    except ScenarioError as exc:
        raise OverrideError(str(exc)) from None


# --------------------------------------------------------------------------- CLI values


_QUOTES = "'\""


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets/braces and quotes: ``1,[2,3],{a: 1, b: 2}`` -> 3
    parts, ``"a, b",c`` -> 2. A quote opens a quoted string only at the start of a value
    (``O'Brien`` is plain text)."""
    cur: list[str]
    parts, depth, cur = [], 0, []
    quote = ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
            cur.append(ch)
            continue
        if ch in _QUOTES and not "".join(cur).strip(" [{"):
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth < 0:
                raise OverrideError(f"unbalanced brackets in {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise OverrideError(f"unbalanced brackets in {text!r}")
    if quote:
        raise OverrideError(f"unterminated quote {quote} in {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def parse_scalar(text: str) -> Any:
    """``5e6`` -> 5000000.0, ``3`` -> 3, ``true``/``false``, ``null``/``none``, else text.

    (YAML 1.1 would read ``5e6`` as a string; here any Python number literal is a number.)
    """
    low = text.lower()
    if low in ("null", "none", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_value(text: str) -> Any:
    """One value: a scalar, a quoted string (``"a, b"`` or ``'3'``: the text between the
    quotes, never a number), a ``[a, b]`` list (of values) or a ``{k: v}`` YAML mapping."""
    text = text.strip()
    if len(text) >= 2 and text[0] in _QUOTES and text[-1] == text[0]:
        return text[1:-1]
    if text.startswith("["):
        if not text.endswith("]"):
            raise OverrideError(f"a list value must end with ']': {text!r}")
        inner = text[1:-1].strip()
        return [parse_value(p) for p in _split_top(inner)] if inner else []
    if text.startswith("{"):
        try:  # the scenario's bounded reader: no alias bombs, no deep nesting
            value = parse_yaml(text, "value")
        except ScenarioError as exc:
            raise OverrideError(f"invalid mapping {text[:80]!r}: {exc}") from None
        return _numbers_in(value)
    return parse_scalar(text)


def _numbers_in(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _numbers_in(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_in(v) for v in value]
    return parse_scalar(value) if isinstance(value, str) else value


_LINSPACE = re.compile(r"^([^:\[\]{}]+):([^:\[\]{}]+):(\d+)$")


#: Most values one ``--set`` may give (``start:stop:count`` included): a grid axis.
MAX_VALUES = 1_000_000


def parse_values(text: str, max_values: int = MAX_VALUES) -> list[Any]:
    """The values of ``--set path=v1,v2,...``.

    ``v1,v2,...`` is a comma-separated list (commas inside ``[...]`` or ``{...}`` do not
    split), or ``start:stop:count`` for ``count`` evenly spaced numbers from ``start`` to
    ``stop`` inclusive (``1e6:50e6:50``). More than ``max_values`` values are refused
    before any is made.
    """
    depth = deepest = 0
    for ch in text:  # bounded before anything recursive reads it
        depth += ch in "[{"
        depth -= ch in "]}"
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        raise OverrideError(f"values nested deeper than {MAX_DEPTH} levels")
    m = _LINSPACE.match(text.strip())
    if m:
        start, stop = parse_scalar(m.group(1)), parse_scalar(m.group(2))
        digits = m.group(3).lstrip("0") or "0"
        count = int(digits) if len(digits) <= 12 else max_values + 1
        if not all(isinstance(x, (int, float)) for x in (start, stop)) or count < 1:
            raise OverrideError(f"{text!r}: start:stop:count needs two numbers and count >= 1")
        if count > max_values:
            raise OverrideError(
                f"{text[:60]!r}: {m.group(3)[:20]} values, more than the {max_values:,} "
                "one axis may have"
            )
        if count == 1:
            return [float(start)]
        step = (stop - start) / (count - 1)
        return [float(start + i * step) for i in range(count - 1)] + [float(stop)]
    parts = _split_top(text)
    if len(parts) > max_values:
        one = " (a list is one value, written [a, b])" if max_values == 1 else ""
        raise OverrideError(
            f"{len(parts):,} values, more than the {max_values:,} one axis may have{one}"
        )
    values = [parse_value(p) for p in parts]
    if any(v == "" for v in values):
        raise OverrideError(f"empty value in {text!r}")
    return values


def parse_set(text: str, max_values: int = MAX_VALUES) -> tuple[str, list[Any]]:
    """``path=v1,v2`` -> (path, [v1, v2]) (at most ``max_values`` values)."""
    path, sep, values = text.partition("=")
    if not sep or not path.strip() or not values.strip():
        raise OverrideError(
            f"--set {text!r}: expected path=value[,value...], e.g. "
            "channel.uplink.bandwidth_hz=5e6,10e6,20e6"
        )
    return path.strip(), parse_values(values, max_values)


def parse_assignment(text: str) -> tuple[str, Any]:
    """``path=value`` -> (path, value): the one value of ``mecsim run / validate / submit
    --set`` and of the service's form, in a sweep's syntax (:func:`parse_set`) with at most
    one value, so a list of values is never made: ``topology.clients=4``, ``5e6``, ``[a,
    b]`` (a list is one value), ``{k: v}``, ``"a, b"`` (a quoted string)."""
    path, values = parse_set(text, max_values=1)
    return path, values[0]


def parse_sets(texts: list[str]) -> dict[str, Any]:
    """The ``--set PATH=VALUE`` options of a command, in order, as ``{path: value}``;
    OverrideError naming the option for the first that cannot be parsed."""
    out: dict[str, Any] = {}
    for text in texts:
        try:
            path, value = parse_assignment(text)
        except OverrideError as exc:
            message = str(exc)
            if not message.startswith("--set"):
                message = f"--set {text}: {message}"
            raise OverrideError(message) from None
        out[path] = value
    return out
