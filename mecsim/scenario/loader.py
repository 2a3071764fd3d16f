"""Scenario files: YAML -> a validated :class:`~mecsim.scenario.schema.Scenario`.

:func:`load_scenario` turns every problem (unreadable file, not UTF-8, bad YAML, duplicate
keys, an empty file, unknown or ill-typed field) into a :class:`ScenarioError` whose lines
each name the file and the field. The YAML is read with limits checked while it is read,
so that a small file cannot make a large document: nesting deeper than
:data:`MAX_DEPTH`, more than :data:`MAX_NODES` nodes (an alias counts as the nodes it
stands for, so ``&a [...]`` used a thousand times costs a thousand copies), more than
:data:`MAX_KEYS` keys in a mapping and scalars longer than :data:`MAX_SCALAR_CHARS` are
refused before anything is built from them. At most :data:`MAX_PROBLEM_LINES` problems are
listed, then how many more there are.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from mecsim.scenario.schema import Scenario
from mecsim.scenario.schema.base import _loc

MAX_SCENARIO_BYTES = 1 << 20  # scenario files are a few KiB
MAX_DEPTH = 64  # the schema nests 5 levels deep
#: A scenario is a few hundred nodes; long lists (link outages' clients, device groups)
#: stay far below this. Aliases count as the nodes they stand for.
MAX_NODES = 100_000
MAX_KEYS = 1_000  # in one mapping (a section has a few dozen)
MAX_SCALAR_CHARS = 65_536  # a description, a path
MAX_PROBLEM_LINES = 50  # then "... and N more problems"


class ScenarioError(Exception):
    """A scenario that cannot be used; ``str()`` is one line per problem."""


#: Parts of a dotted field path as _loc writes them: a name (an index after the first),
#: or a quoted key.
_QUOTED = r"""'(?:[^'\\]|\\.)*'"""
_FIRST = rf"(?:[A-Za-z_<>][\w<>-]*|{_QUOTED})"
_PART = rf"(?:[\w<>-]+|{_QUOTED})"


def problem_lines(lines: list[str], limit: int = MAX_PROBLEM_LINES) -> str:
    """``lines`` without repeats (in their order), at most ``limit`` of them, then how many
    more there are: one line per problem, in time linear in their number."""
    unique = list(dict.fromkeys(lines))
    if len(unique) > limit:
        unique = [*unique[:limit], f"... and {len(unique) - limit} more problems"]
    return "\n".join(unique)


def scenario_from_dict(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate parsed scenario data (``None``: every default); ScenarioError lists one
    line per problem, ``source: field: message``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: the top level must be a mapping of sections")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field, msg = _loc(err["loc"]), err["msg"].removeprefix("Value error, ")
            if err["type"] == "union_tag_not_found":  # e.g. a channel without 'model'
                key = str(err.get("ctx", {}).get("discriminator", "")).strip("'")
                field, msg = f"{field}.{key}", "Field required (it selects the kind)"
            # checks spanning several fields name the field at the start of the message
            inner = re.match(rf"^({_FIRST}(?:\.{_PART})*): (.*)$", msg, re.S)
            if err["type"] == "value_error" and inner:
                prefix = "" if field == "(top level)" else field + "."
                field, msg = prefix + inner.group(1), inner.group(2)
            lines.append(f"{source}: {field}: {' '.join(msg.split())}")
        raise ScenarioError(problem_lines(lines)) from None


class _ScenarioLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys and the limits of the module docstring
    while composing (before any Python object is built): nesting deeper than MAX_DEPTH
    (PyYAML's composer recurses once per level: 20,000 levels end in RecursionError),
    more than MAX_NODES nodes with aliases expanded, mappings of more than MAX_KEYS keys,
    scalars of more than MAX_SCALAR_CHARS characters."""

    _depth = 0
    _nodes = 0  # composed so far, aliases counted as the nodes they stand for

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # node -> its nodes, aliases expanded

    def _refuse(self, what: str, mark: Any) -> None:
        raise yaml.composer.ComposerError(None, None, what, mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        alias = self.check_event(yaml.AliasEvent)
        mark = self.peek_event().start_mark
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                self._refuse(f"nested more than {MAX_DEPTH} levels deep", mark)
            if isinstance(parent, yaml.MappingNode) and len(parent.value) >= MAX_KEYS:
                # checked as the mapping is read, not after all its keys are
                self._refuse(f"a mapping of more than {MAX_KEYS:,} keys", mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if alias:  # the same node again: its nodes count once more
            size = self._sizes.get(id(node), 1)
        else:
            size = 1
            if isinstance(node, yaml.ScalarNode):
                if len(node.value) > MAX_SCALAR_CHARS:
                    self._refuse(f"a value longer than {MAX_SCALAR_CHARS:,} characters", mark)
            elif isinstance(node, yaml.SequenceNode):
                size += sum(self._sizes.get(id(child), 1) for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                size += sum(
                    self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value
                )
            self._sizes[id(node)] = size
            size = 1  # its children were counted as they were composed
        self._nodes += size
        if self._nodes > MAX_NODES:
            self._refuse(
                f"more than {MAX_NODES:,} values (aliases count as what they stand for)", mark
            )
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<: *base' merges are meant to be overridden
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first_line.get(key)
                except TypeError:
                    continue  # unhashable: the base class reports it
                if seen is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first on line {seen + 1})",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> Any:
    """Parse scenario YAML; ScenarioError naming the line for every YAML problem."""
    loader = None
    try:
        loader = _ScenarioLoader(text)  # reading starts here: may raise already
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{source}:{where} invalid YAML: {problem}") from None
    except RecursionError:
        raise ScenarioError(f"{source}: invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_scenario_text(path: str | Path) -> str:
    """The text of a scenario file: a regular file (or a pipe) of at most
    MAX_SCENARIO_BYTES, UTF-8. ScenarioError otherwise."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise ScenarioError(f"{path}: cannot read scenario file ({kind})")
        with path.open("rb") as fh:
            raw = fh.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(
            f"{path}: cannot read scenario file ({exc.strerror or type(exc).__name__})"
        ) from None
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ScenarioError(
            f"{path}: the file is larger than {MAX_SCENARIO_BYTES // 1024} KiB;"
            " a scenario is a few KiB of YAML"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ScenarioError(
            f"{path}: line {line}: not valid UTF-8 text (byte "
            f"0x{raw[exc.start]:02x}); save the file as UTF-8"
        ) from None
    return text.removeprefix("\ufeff")


def load_scenario(path: str | Path, *, beside_file: bool = True) -> Scenario:
    """The scenario of a YAML file, validated. ``beside_file``: a relative trace path
    not found from the working directory is looked for next to the file
    (:func:`_find_relative_files`; the service, which confines paths, does not)."""
    path = Path(path)
    data = parse_yaml(read_scenario_text(path), str(path))
    if data is None:
        raise ScenarioError(
            f"{path}: empty scenario; run `mecsim run` without a file for the defaults"
        )
    if beside_file:
        _find_relative_files(data, path.parent)
    return scenario_from_dict(data, str(path))


def _find_relative_files(data: Any, folder: Path) -> None:
    """A file a scenario names by a relative path (``geometry.mobility.trace.path``, a
    trace channel's ``channel.path``, ``availability.trace``) is read relative to the
    working directory; when it is not there but is next to the scenario file
    (``folder``), that one is meant: its path is made absolute in ``data``, so the run's
    resolved scenario.yaml names it too (a shipped scenario then runs from any
    directory)."""
    if not isinstance(data, dict):
        return
    holders = []
    channel = data.get("channel")
    if isinstance(channel, dict) and channel.get("model") == "trace":
        holders.append(channel)
    geometry = data.get("geometry")
    mobility = geometry.get("mobility") if isinstance(geometry, dict) else None
    trace = mobility.get("trace") if isinstance(mobility, dict) else None
    if isinstance(trace, dict):
        holders.append(trace)
    availability = data.get("availability")
    if isinstance(availability, dict) and isinstance(availability.get("trace"), str):
        # (its file is ``trace``, not ``path``: a holder of its own)
        holders.append({"path": availability["trace"], "_in": availability})
    for holder in holders:
        name = holder.get("path")
        if not isinstance(name, str) or not name or Path(name).is_absolute():
            continue
        beside = folder / name
        if not Path(name).exists() and beside.is_file():
            holder["path"] = str(beside.resolve())
            if "_in" in holder:
                holder["_in"]["trace"] = holder["path"]


def load_recorded_scenario(path: str | Path) -> Scenario:
    """A run folder's ``scenario.yaml``, which may predate a field that validation now
    asks for: a Shannon uplink with ``shared: true`` and per-client bands written before
    ``channel.uplink.access`` existed ran as ``access: shared_own_band`` (the network
    reads only ``shared`` and the band) and loads so, for reports, replays, sweeps and
    resumes; a link (uplink, downlink, backhaul) without ``transport`` was written before
    transfers were timed as TCP flows and loads as ``transport: ideal``. Everything else
    is validated as :func:`load_scenario` does."""
    path = Path(path)
    data = parse_yaml(read_scenario_text(path), str(path))
    if data is None:
        raise ScenarioError(f"{path}: empty scenario")
    channel = data.get("channel") if isinstance(data, dict) else None
    uplink = channel.get("uplink") if isinstance(channel, dict) else None
    # a link written before ``transport`` existed was timed as latency + bits / goodput
    # (a section left out took every default then: ideal too)
    if isinstance(data, dict):
        holders = (
            [(channel, k) for k in ("uplink", "downlink")] if isinstance(channel, dict) else []
        )
        for holder, key in [*holders, (data, "backhaul")]:
            if holder.get(key) is None:
                holder[key] = {}
            link = holder[key]
            if isinstance(link, dict) and "transport" not in link:
                link["transport"] = "ideal"
    if isinstance(uplink, dict):
        band = uplink.get("bandwidth_hz")
        if (
            uplink.get("access") is None
            and uplink.get("shared") is True
            and isinstance(band, list)
            and len(band) == 2
            and band[0] != band[1]
        ):
            uplink["access"] = "shared_own_band"
    return scenario_from_dict(data, str(path))


def default_scenario_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("mecsim.scenario").joinpath("default.yaml")))


def json_schema() -> dict[str, Any]:
    schema = Scenario.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "mecsim scenario"
    return schema


def resolved_yaml(scenario: Scenario) -> str:
    """The scenario with every default filled in, as YAML."""
    return yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False)
