"""Mobility traces: SUMO FCD XML, ns-2 mobility scripts, the ONE simulator's external
movement format and BonnMotion's native format, read into positions on the grid
(docs/mobility-models.md "Traces").

Everything wrong with a trace is refused when it is read, before anything runs, with
the file and the line (:class:`TraceError`): a file over the size limit, a line that is
not the format's, times that go backwards, one node twice at one time, NaN or infinite
numbers, positions outside the area, more than :data:`MAX_TRACE_NODES` nodes; then, when
the trace is mapped to clients, ids the map names that the trace lacks and fewer trace
nodes than clients.

Memory: the byte limit alone does not bound what a parse holds (52 MB of one-sample
BonnMotion nodes are 8.7 M nodes), so a trace is read line by line (a line's numbers one
by one) without a list of its lines or tokens; every node is checked, but the samples
are kept only of the nodes the scenario's clients follow (``keep``: the first ``n`` in
order of first appearance, or the ids of ``trace.node_map``), as flat float64 arrays
(24 bytes a sample), and the nodes themselves are capped (:data:`MAX_TRACE_NODES`).

Between two samples of a node its position is interpolated linearly; before its first
sample a node is where it was first seen, after its last sample it stays where it was
last seen (held). When the whole trace ends before the run's horizon, that is said
(:class:`TraceWarning`) and positions are held, or refused with ``after_end="refuse"``.

XML: the FCD file is read with the standard library's expat parser, which resolves no
external entities (no file or URL is ever opened for a ``SYSTEM`` id); a document type
declaration is refused outright, so a file cannot declare entities at all and the
"billion laughs" expansion (and its quadratic cousin) has nothing to expand. FCD files
as SUMO writes them have no DOCTYPE. (Expat 2.4.0 and newer also cap entity
amplification itself; the refusal does not rely on that.)
"""

from __future__ import annotations

import gzip
import io
import math
import re
import warnings
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from xml.parsers import expat

import numpy as np

from mecsim.emulation.mobility.area import Area, FloatArray
from mecsim.emulation.mobility.trajectory import Trajectory, grid_points

TraceFormat = Literal["sumo_fcd", "ns2", "one", "bonnmotion"]
FORMATS: tuple[TraceFormat, ...] = ("sumo_fcd", "ns2", "one", "bonnmotion")

#: files (and what a .gz decompresses to) larger than this are refused unread
DEFAULT_MAX_BYTES = 50 * 2**20
#: the most distinct nodes a trace may have: a scenario's clients follow one node each
#: (at most a few thousand), and checking a node costs memory (its last time and line)
#: whether it is followed or not, so the nodes are bounded, not only the bytes
MAX_TRACE_NODES = 100_000

#: which nodes' samples a parse keeps: None every node; n the first n in order of first
#: appearance; a set of ids those nodes (the others are checked, then dropped)
Keep = int | frozenset[str] | None


class TraceError(ValueError):
    """A trace that cannot be used: ``file:line: what is wrong``."""


class TraceWarning(UserWarning):
    """A trace that ends before the run's horizon (positions are held after its end)."""


@dataclass
class NodeTrack:
    """One trace node: its samples (times increasing) and where it first appears."""

    node_id: str
    times_s: FloatArray
    xy_m: FloatArray  # (k, 2)
    first_line: int

    def position_at(self, t_s: FloatArray) -> FloatArray:
        """Linear between samples, held before the first and after the last, ``(m, 2)``."""
        x = np.interp(t_s, self.times_s, self.xy_m[:, 0])
        y = np.interp(t_s, self.times_s, self.xy_m[:, 1])
        return np.stack([x, y], axis=-1)


@dataclass
class Trace:
    """A parsed trace: its nodes in order of first appearance."""

    path: str
    format: TraceFormat
    nodes: list[NodeTrack]
    #: the last time the trace says anything (s, trace time); ``inf`` where the format
    #: defines the motion for ever (ns-2: a node stays at its last destination)
    end_s: float
    #: how many nodes the file has (``nodes`` holds those kept: see ``load_trace``'s
    #: ``keep``), and the first few ids in order of first appearance (for messages)
    n_nodes: int = -1
    first_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n_nodes < 0:
            self.n_nodes = len(self.nodes)
        if not self.first_ids:
            self.first_ids = tuple(node.node_id for node in self.nodes[:5])

    @property
    def node_ids(self) -> list[str]:
        return [node.node_id for node in self.nodes]

    def assign(self, n_clients: int, node_map: Mapping[Any, int] | None = None) -> list[NodeTrack]:
        """The node each client follows: the first ``n_clients`` nodes in order of first
        appearance, or ``node_map`` ({trace id: client}), which must name every client
        once and only ids of the trace."""
        if n_clients < 1:
            raise ValueError(f"n_clients must be at least 1, got {n_clients}")
        if node_map is None:
            if len(self.nodes) < n_clients:
                raise TraceError(
                    f"{self.path}: {self.n_nodes} trace nodes for {n_clients} clients: each "
                    "client follows one node of the trace (in order of first appearance), "
                    "so the trace needs at least as many nodes as there are clients"
                )
            return self.nodes[:n_clients]
        by_id = {node.node_id: node for node in self.nodes}
        out: list[NodeTrack | None] = [None] * n_clients
        for raw_id, client in node_map.items():
            node_id = str(raw_id)
            if node_id not in by_id:
                known = ", ".join(repr(i) for i in self.first_ids[:5])
                more = ", ..." if self.n_nodes > 5 else ""
                raise TraceError(
                    f"trace.node_map: names node {node_id!r}, which {self.path} does not have "
                    f"(its ids: {known}{more})"
                )
            if not 0 <= client < n_clients:
                raise TraceError(
                    f"trace.node_map: maps node {node_id!r} to client {client}, but the "
                    f"clients are 0..{n_clients - 1}"
                )
            if out[client] is not None:
                raise TraceError(
                    f"trace.node_map: client {client} is given two nodes "
                    f"({out[client].node_id!r} and {node_id!r})"  # type: ignore[union-attr]
                )
            out[client] = by_id[node_id]
        missing = [i for i, node in enumerate(out) if node is None]
        if missing:
            shown = ", ".join(str(i) for i in missing[:10]) + (", ..." if len(missing) > 10 else "")
            raise TraceError(
                f"trace.node_map: names no node for clients {shown} ({len(missing)} of "
                f"{n_clients}): a map must give every client one node"
            )
        return [node for node in out if node is not None]

    def trajectory(
        self,
        n_clients: int,
        step_s: float,
        horizon_s: float,
        *,
        node_map: Mapping[Any, int] | None = None,
        start_s: float = 0.0,
        after_end: Literal["hold", "refuse"] = "hold",
    ) -> Trajectory:
        """Positions on the grid ``t_k = k · step_s`` over ``[0, horizon_s]``; emulated
        time ``t`` is trace time ``start_s + t``. A trace that ends before
        ``start_s + horizon_s`` warns (positions held) or, with ``after_end="refuse"``,
        is refused."""
        tracks = self.assign(n_clients, node_map)
        if not (math.isfinite(start_s) and start_s >= 0):
            raise ValueError(f"start_s must be a finite time >= 0 (s), got {start_s!r}")
        n_points = grid_points(horizon_s, step_s)
        needed_s = start_s + (n_points - 1) * step_s
        if self.end_s < needed_s - 1e-9 * step_s:
            message = (
                f"{self.path}: the trace ends at {self.end_s:g} s but the run needs positions "
                f"until {needed_s:g} s (trace time)"
            )
            if after_end == "refuse":
                raise TraceError(message + " (trace.after_end: refuse)")
            warnings.warn(
                message + "; every node stays at its last position after the end",
                TraceWarning,
                stacklevel=2,
            )
        times = start_s + np.arange(n_points, dtype=np.float64) * step_s
        out = np.empty((n_clients, n_points, 2), dtype=np.float32)
        for i, track in enumerate(tracks):
            out[i] = track.position_at(times)
        return Trajectory(out, step_s)


# --- reading ----------------------------------------------------------------------------


def _read_at_most(f: Any, limit: int, chunk: int = 2**20) -> bytes:
    """Up to ``limit`` bytes of ``f``, read in chunks: ``f.read(limit)`` would take a
    buffer of ``limit`` bytes (50 MiB) whatever the file's size."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        part = f.read(min(chunk, limit - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_limited(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The file's bytes (a ``.gz`` file's decompressed bytes), refused when over
    ``max_bytes`` before it is read (and while a .gz decompresses)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    if not p.is_file():
        raise TraceError(f"{path}: not a file")
    if size > max_bytes:
        raise TraceError(
            f"{path}: {size:,} bytes, over the limit of {max_bytes:,} bytes (trace.max_bytes)"
        )
    with p.open("rb") as f:
        data = f.read(size + 1)  # a buffer of the file's size (not of the limit)
        if len(data) > size:  # it grew since it was measured
            data += _read_at_most(f, max_bytes + 1 - len(data))
    if len(data) > max_bytes:  # it grew since it was measured
        raise TraceError(f"{path}: over the limit of {max_bytes:,} bytes (trace.max_bytes)")
    if p.suffix == ".gz":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as g:
                data = _read_at_most(g, max_bytes + 1)
        except (OSError, EOFError) as exc:
            raise TraceError(f"{path}: not a readable gzip file ({exc})") from None
        if len(data) > max_bytes:
            raise TraceError(
                f"{path}: decompresses to over the limit of {max_bytes:,} bytes (trace.max_bytes)"
            )
    return data


#: a line of a text trace: universal newlines (\n, \r\n, \r), found one at a time
_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
#: a token of a line (whitespace-separated), found one at a time
_TOKEN = re.compile(r"\S+")


def _lines(data: bytes, path: str) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line, one at a time (never a list of them: 8.7 M
    short lines would be 500 MB of str objects), each checked to be UTF-8."""
    for number, match in enumerate(_LINE.finditer(data), start=1):
        try:
            yield number, match.group().decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"{path}:{number}: not UTF-8 text") from None


def load_trace(
    path: str | Path,
    format: TraceFormat,
    *,
    area: Area | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    keep: Keep = None,
    max_nodes: int | None = None,
) -> Trace:
    """Read and check a trace file (refused with ``file:line`` on the first problem);
    ``area``: every position must lie inside it (None: not checked). ``keep``: whose
    samples to keep (:data:`Keep`; the others are checked and dropped: a run reads its
    trace with its clients' nodes); a file with more than ``max_nodes`` nodes is
    refused at the line of the first one over (default :data:`MAX_TRACE_NODES`)."""
    if format not in FORMATS:
        raise ValueError(f"format: must be one of {', '.join(FORMATS)}, got {format!r}")
    name = str(path)
    data = read_limited(path, max_bytes)
    tracks = _Tracks(name, area, keep, MAX_TRACE_NODES if max_nodes is None else max_nodes)
    if format == "sumo_fcd":
        return parse_sumo_fcd(data, name, area, tracks=tracks)
    if format == "ns2":
        return parse_ns2(data, name, area, tracks=tracks)
    if format == "one":
        return parse_one(data, name, area, tracks=tracks)
    return parse_bonnmotion(data, name, area, tracks=tracks)


class _Tracks:
    """Samples collected per node, checked as they come: finite numbers, inside the
    area, times increasing per node, at most ``max_nodes`` nodes. Every node's last
    time and line are kept (for the checks); its samples only when ``keep`` says."""

    def __init__(
        self,
        path: str,
        area: Area | None,
        keep: Keep = None,
        max_nodes: int | None = None,
    ) -> None:
        self.path = path
        self.area = area
        self.keep = keep
        self.max_nodes = MAX_TRACE_NODES if max_nodes is None else max_nodes
        self.n_nodes = 0
        self.first_ids: list[str] = []
        self.order: list[str] = []  # the kept nodes, in order of first appearance
        self.samples: dict[str, array[float]] = {}  # kept node -> t, x, y, t, x, y, ...
        self.first_line: dict[str, int] = {}  # kept node -> its first line
        self.last: dict[str, tuple[float, int]] = {}  # every node -> its last time, line
        self.end_s = -math.inf

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"

    def check_position(self, node_id: str, x: float, y: float, line: int) -> None:
        a = self.area
        if a is not None and not (a.x_min_m <= x <= a.x_max_m and a.y_min_m <= y <= a.y_max_m):
            raise TraceError(
                f"{self.where(line)}: node {node_id!r} at ({x:g}, {y:g}) m is outside the area "
                f"x [{a.x_min_m:g}, {a.x_max_m:g}], y [{a.y_min_m:g}, {a.y_max_m:g}]"
            )

    def new_node(self, node_id: str, line: int) -> bool:
        """Count a node seen for the first time (refused past ``max_nodes``); whether
        its samples are kept."""
        self.n_nodes += 1
        if self.n_nodes > self.max_nodes:
            raise TraceError(
                f"{self.where(line)}: node {node_id!r} is the trace's node number "
                f"{self.n_nodes:,}: a trace may have at most {self.max_nodes:,} nodes "
                "(each client follows one; the others are checked all the same, which "
                "costs memory)"
            )
        if len(self.first_ids) < 5:
            self.first_ids.append(node_id)
        keep = self.keep
        kept = (
            keep is None
            or (isinstance(keep, int) and len(self.order) < keep)
            or (isinstance(keep, frozenset) and node_id in keep)
        )
        if kept:
            self.order.append(node_id)
            self.samples[node_id] = array("d")
            self.first_line[node_id] = line
        return kept

    def add(self, node_id: str, t: float, x: float, y: float, line: int) -> None:
        self.check_position(node_id, x, y, line)
        before = self.last.get(node_id)
        if before is None:
            self.new_node(node_id, line)
        elif t <= before[0]:
            if t == before[0]:
                raise TraceError(
                    f"{self.where(line)}: node {node_id!r} appears twice at time {t:g} s "
                    f"(first on line {before[1]}): duplicate node id"
                )
            raise TraceError(
                f"{self.where(line)}: time {t:g} s of node {node_id!r} is before its time "
                f"{before[0]:g} s on line {before[1]}: times must be sorted"
            )
        self.last[node_id] = (t, line)
        self.end_s = max(self.end_s, t)
        samples = self.samples.get(node_id)
        if samples is not None:
            samples.extend((t, x, y))

    def trace(self, format: TraceFormat, end_s: float | None = None) -> Trace:
        if not self.n_nodes:
            raise TraceError(f"{self.path}: the trace has no node positions")
        nodes = []
        for i in self.order:
            flat = np.frombuffer(self.samples.pop(i), dtype=np.float64).reshape(-1, 3)
            nodes.append(
                NodeTrack(
                    node_id=i,
                    times_s=flat[:, 0].copy(),
                    xy_m=flat[:, 1:].copy(),
                    first_line=self.first_line[i],
                )
            )
        return Trace(
            path=self.path,
            format=format,
            nodes=nodes,
            end_s=self.end_s if end_s is None else end_s,
            n_nodes=self.n_nodes,
            first_ids=tuple(self.first_ids),
        )


def _number(token: str, what: str, where: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise TraceError(f"{where}: {what} {token!r} is not a number") from None
    if "_" in token or not math.isfinite(value):
        raise TraceError(f"{where}: {what} {token!r} is not a finite number (NaN or infinite)")
    return value


# --- SUMO FCD ---------------------------------------------------------------------------

#: FCD elements whose x, y are positions of a moving thing (vehicles, persons, containers)
_FCD_MOVERS = ("vehicle", "person", "container")


def parse_sumo_fcd(
    data: bytes, path: str, area: Area | None = None, *, tracks: _Tracks | None = None
) -> Trace:
    """``sumo --fcd-output``: ``<fcd-export><timestep time="t"><vehicle id="v" x="…"
    y="…" …/>…</timestep>…</fcd-export>``; persons and containers count as nodes too,
    other elements are skipped. Timestep times must increase; an id twice in one
    timestep is refused."""
    tracks = tracks or _Tracks(path, area)
    parser = expat.ParserCreate()
    stack: list[str] = []
    state: dict[str, float | None] = {"time": None}
    seen: dict[str, int] = {}  # ids of the current timestep: their lines
    last_time: list[float] = []
    last_line: list[int] = []

    def where() -> str:
        return f"{path}:{parser.CurrentLineNumber}"

    def refuse_doctype(*_args: object) -> None:
        raise TraceError(
            f"{where()}: a document type declaration (<!DOCTYPE ...>) is not allowed in a "
            "trace (it could declare entities); SUMO's FCD output has none"
        )

    def start(name: str, attrs: dict[str, str]) -> None:
        depth = len(stack)
        stack.append(name)
        if depth == 1 and name == "timestep":
            if "time" not in attrs:
                raise TraceError(f"{where()}: a timestep without its time attribute")
            t = _number(attrs["time"], "time", where())
            if last_time and t <= last_time[-1]:
                raise TraceError(
                    f"{where()}: timestep time {t:g} s is not after the previous timestep's "
                    f"{last_time[-1]:g} s (line {last_line[-1]}): times must be sorted"
                )
            last_time[:] = [t]
            last_line[:] = [parser.CurrentLineNumber]
            state["time"] = t
            seen.clear()
        elif depth == 2 and stack[1] == "timestep" and name in _FCD_MOVERS:
            for key in ("id", "x", "y"):
                if key not in attrs:
                    raise TraceError(f"{where()}: a {name} without its {key} attribute")
            node_id = attrs["id"]
            line, here = parser.CurrentLineNumber, where()
            if node_id in seen:
                raise TraceError(
                    f"{here}: id {node_id!r} twice in the timestep of time "
                    f"{state['time']:g} s (first on line {seen[node_id]}): duplicate node id"
                )
            seen[node_id] = line
            x = _number(attrs["x"], "x", here)
            y = _number(attrs["y"], "y", here)
            now = state["time"]
            assert now is not None
            tracks.add(node_id, now, x, y, line)
        elif depth == 1 and name in _FCD_MOVERS:
            raise TraceError(f"{where()}: a {name} outside a timestep")

    def end(_name: str) -> None:
        stack.pop()

    parser.StartDoctypeDeclHandler = refuse_doctype
    parser.EntityDeclHandler = refuse_doctype
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(data, True)
    except expat.ExpatError as exc:
        raise TraceError(
            f"{path}:{exc.lineno}: not well-formed XML ({expat.ErrorString(exc.code)})"
        ) from None
    return tracks.trace("sumo_fcd")


# --- ns-2 -------------------------------------------------------------------------------

_NUM = r"([^\s\"]+)"
_NS2_SET = re.compile(r"^\$node_\((\w+)\)\s+set\s+([XYZ])_\s+" + _NUM + r"$")
_NS2_SETDEST = re.compile(
    r"^\$ns_\s+at\s+" + _NUM + r"\s+\"\$node_\((\w+)\)\s+setdest\s+"
    r"([^\s\"]+)\s+([^\s\"]+)\s+([^\s\"]+)\s*\"$"
)
_NS2_GOD = re.compile(r"^(\$god_\s|\$ns_\s+at\s+\S+\s+\"\$god_\s)")


@dataclass
class _Ns2Node:
    first_line: int
    kept: bool  # whether its moves are kept (the others are checked, then dropped)
    x: tuple[float, int] | None = None  # value, line
    y: tuple[float, int] | None = None
    moves: list[tuple[float, float, float, float, int]] = field(default_factory=list)
    last_move: tuple[float, int] | None = None  # time, line
    first_move_line: int | None = None


def _ns2_samples(
    node_id: str, node: _Ns2Node, path: str
) -> tuple[list[float], list[tuple[float, float]]]:
    """The corners of a node's path: ``(t, (x, y))`` where it starts, turns or arrives.

    ``setdest x y v`` at time t: from wherever it is at t the node heads for (x, y) in a
    straight line at v m/s and stops there; a later setdest replaces the destination from
    the point reached. ns-2's semantics, computed exactly."""
    if node.x is None or node.y is None:
        line = node.first_move_line or node.first_line
        missing = [a for a, v in (("X_", node.x), ("Y_", node.y)) if v is None]
        verb = "are" if len(missing) == 2 else "is"
        raise TraceError(
            f"{path}:{line}: node {node_id!r} has no initial position: its "
            f"{' and '.join(missing)} {verb} never set ($node_(i) set X_ x)"
        )
    pos = np.array([node.x[0], node.y[0]])
    times: list[float] = [0.0]
    points: list[tuple[float, float]] = [(float(pos[0]), float(pos[1]))]
    # the current leg: start time, start point, destination, speed
    leg_t, leg_from, leg_to, leg_v = 0.0, pos, pos, 0.0

    def at(t: float) -> np.ndarray:
        d = leg_to - leg_from
        dist = float(np.hypot(d[0], d[1]))
        if dist == 0.0 or leg_v == 0.0:
            return leg_from if leg_v == 0.0 else leg_to
        travelled = leg_v * (t - leg_t)
        return leg_to if travelled >= dist else leg_from + d * (travelled / dist)

    def arrival() -> float:
        d = leg_to - leg_from
        dist = float(np.hypot(d[0], d[1]))
        return leg_t + dist / leg_v if leg_v > 0 else math.inf

    def add(t: float, p: np.ndarray) -> None:
        point = (float(p[0]), float(p[1]))
        if t > times[-1]:
            times.append(t)
            points.append(point)
        else:  # same time: the newer position (a setdest at the time of the last corner)
            points[-1] = point

    for t, x, y, v, _line in node.moves:
        t_arrive = arrival()
        if t_arrive < t:
            add(t_arrive, leg_to)
        here = at(t)
        add(t, here)
        leg_t, leg_from, leg_to, leg_v = t, here, np.array([x, y]), v
    t_arrive = arrival()
    if math.isfinite(t_arrive):
        add(t_arrive, leg_to)
    return times, points


def parse_ns2(
    data: bytes, path: str, area: Area | None = None, *, tracks: _Tracks | None = None
) -> Trace:
    """An ns-2 mobility script (CMU ``setdest`` output, BonnMotion's NSFile): initial
    positions ``$node_(i) set X_ x`` / ``Y_ y`` (``Z_`` ignored) and moves ``$ns_ at t
    "$node_(i) setdest x y v"``; ``$god_`` lines are skipped, ``#`` starts a comment. A
    node's moves must be in time order; it is at its initial position from time 0."""
    nodes: dict[str, _Ns2Node] = {}
    bounds = tracks or _Tracks(path, area)

    def node_of(node_id: str, number: int) -> _Ns2Node:
        node = nodes.get(node_id)
        if node is None:
            node = nodes[node_id] = _Ns2Node(number, bounds.new_node(node_id, number))
        return node

    for number, raw in _lines(data, path):
        line = raw.strip()
        if not line or line.startswith("#") or _NS2_GOD.match(line):
            continue
        where = f"{path}:{number}"
        if m := _NS2_SET.match(line):
            node_id, axis, token = m.group(1), m.group(2), m.group(3)
            value = _number(token, f"{axis}_", where)
            node = node_of(node_id, number)
            if axis == "Z":
                continue
            before = node.x if axis == "X" else node.y
            if before is not None:
                raise TraceError(
                    f"{where}: {axis}_ of node {node_id!r} set twice (first on line "
                    f"{before[1]}): duplicate node id"
                )
            if axis == "X":
                node.x = (value, number)
            else:
                node.y = (value, number)
            if node.x is not None and node.y is not None:
                bounds.check_position(node_id, node.x[0], node.y[0], number)
        elif m := _NS2_SETDEST.match(line):
            t = _number(m.group(1), "time", where)
            node_id = m.group(2)
            x = _number(m.group(3), "x", where)
            y = _number(m.group(4), "y", where)
            v = _number(m.group(5), "speed", where)
            if t < 0 or v < 0:
                raise TraceError(f"{where}: time and speed must be >= 0, got {t:g} s, {v:g} m/s")
            bounds.check_position(node_id, x, y, number)
            node = node_of(node_id, number)
            if node.last_move is not None and t < node.last_move[0]:
                raise TraceError(
                    f"{where}: time {t:g} s of node {node_id!r} is before its time "
                    f"{node.last_move[0]:g} s on line {node.last_move[1]}: times must be sorted"
                )
            node.last_move = (t, number)
            node.first_move_line = node.first_move_line or number
            if node.kept:
                node.moves.append((t, x, y, v, number))
        else:
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise TraceError(
                f"{where}: not an ns-2 mobility line: {shown!r} (expected $node_(i) set X_ x, "
                '$node_(i) set Y_ y or $ns_ at t "$node_(i) setdest x y speed")'
            )
    if not nodes:
        raise TraceError(f"{path}: the trace has no node positions")
    tracks_out = []
    for node_id, node in nodes.items():
        if not node.kept:
            if node.x is None or node.y is None:
                _ns2_samples(node_id, node, path)  # refuses: no initial position
            continue
        times, points = _ns2_samples(node_id, node, path)
        tracks_out.append(
            NodeTrack(
                node_id=node_id,
                times_s=np.array(times, dtype=np.float64),
                xy_m=np.array(points, dtype=np.float64),
                first_line=node.first_line,
            )
        )
    return Trace(
        path=path,
        format="ns2",
        nodes=tracks_out,
        end_s=math.inf,
        n_nodes=bounds.n_nodes,
        first_ids=tuple(bounds.first_ids),
    )


# --- the ONE ----------------------------------------------------------------------------


def parse_one(
    data: bytes, path: str, area: Area | None = None, *, tracks: _Tracks | None = None
) -> Trace:
    """The ONE simulator's external movement format (``ExternalMovementReader``): a
    header ``minTime maxTime minX maxX minY maxY [minZ maxZ]``, then ``time id x y``
    lines sorted by time; ``#`` lines and blank lines skipped. As the ONE does by default,
    times count from ``minTime`` and positions from ``(minX, minY)``; samples outside the
    header's bounds are refused."""
    tracks = tracks or _Tracks(path, area)
    header: list[float] | None = None
    last: tuple[float, int] | None = None
    for number, raw in _lines(data, path):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        tokens = line.split()
        if header is None:
            if len(tokens) not in (6, 8):
                raise TraceError(
                    f"{where}: the header must be 'minTime maxTime minX maxX minY maxY' "
                    f"(optionally minZ maxZ), got {len(tokens)} values"
                )
            names = ("minTime", "maxTime", "minX", "maxX", "minY", "maxY", "minZ", "maxZ")
            header = [_number(tok, name, where) for tok, name in zip(tokens, names, strict=False)]
            for lo, hi in ((0, 1), (2, 3), (4, 5)):
                if header[lo] > header[hi]:
                    raise TraceError(
                        f"{where}: header {names[lo]} {header[lo]:g} > {names[hi]} {header[hi]:g}"
                    )
            continue
        if len(tokens) != 4:
            raise TraceError(f"{where}: expected 'time id x y', got {len(tokens)} values")
        t = _number(tokens[0], "time", where)
        node_id = tokens[1]
        x = _number(tokens[2], "x", where)
        y = _number(tokens[3], "y", where)
        if last is not None and t < last[0]:
            raise TraceError(
                f"{where}: time {t:g} s is before the time {last[0]:g} s on line {last[1]}: "
                "times must be sorted"
            )
        last = (t, number)
        t0, t1, x0, x1, y0, y1 = header[:6]
        if not (t0 <= t <= t1 and x0 <= x <= x1 and y0 <= y <= y1):
            raise TraceError(
                f"{where}: sample ({t:g} s, {x:g}, {y:g}) is outside the header's bounds "
                f"t [{t0:g}, {t1:g}], x [{x0:g}, {x1:g}], y [{y0:g}, {y1:g}]"
            )
        tracks.add(node_id, t - t0, x - x0, y - y0, number)
    if header is None:
        raise TraceError(f"{path}: empty: no header line 'minTime maxTime minX maxX minY maxY'")
    return tracks.trace("one")


# --- BonnMotion -------------------------------------------------------------------------


def _bonnmotion_3d(line: str) -> bool:
    """Does a BonnMotion line read as 3-D waypoints (``t x y z``: a multiple of 4 finite
    numbers, the times every fourth one, increasing)?"""
    tokens = line.split()
    if not tokens or len(tokens) % 4:
        return False
    try:
        values = [float(tok) for tok in tokens]
    except ValueError:
        return False
    times = values[::4]
    return all(math.isfinite(v) for v in values) and all(
        a < b for a, b in zip(times, times[1:], strict=False)
    )


def _refuse_bonnmotion(message: str, where: str, line: str) -> TraceError:
    """A BonnMotion line refused; when it reads as 3-D waypoints, the message says so."""
    if _bonnmotion_3d(line):
        message += (
            f"; the line reads as 3-D waypoints ({len(line.split())} numbers, t x y z, the "
            "times every fourth increasing): mecsim reads 2-D BonnMotion traces only "
            "(t x y per waypoint, BonnMotion's default -J 2D); drop each waypoint's z"
        )
    return TraceError(f"{where}: {message}")


def parse_bonnmotion(
    data: bytes, path: str, area: Area | None = None, *, tracks: _Tracks | None = None
) -> Trace:
    """BonnMotion's native ``.movements`` format: one line per node (node ``0`` first),
    ``t1 x1 y1 t2 x2 y2 ...``, times increasing along a line; a waypoint repeated at its
    own time is dropped, two places at one time are refused. Blank lines are skipped.
    3-D traces (``t x y z``) are not read: a line refused that reads as 3-D waypoints
    says so. A line's numbers are read one at a time (a node of a
    million waypoints is not a list of three million strings first)."""
    tracks = tracks or _Tracks(path, area)
    node = 0
    for number, raw in _lines(data, path):
        where = f"{path}:{number}"
        node_id = str(node)
        count = 0
        values: list[float] = []
        prev: tuple[float, float, float] | None = None
        for match in _TOKEN.finditer(raw):
            count += 1
            token = match.group()
            values.append(_number(token, "value", where))  # a 3-D line's are numbers too
            if len(values) < 3:
                continue
            t, x, y = values
            values.clear()
            k = count // 3
            if prev is not None and t == prev[0]:
                if (x, y) == prev[1:]:
                    continue
                raise _refuse_bonnmotion(
                    f"node {node_id} is at two places at time {t:g} s (waypoint {k})",
                    where,
                    raw,
                )
            if prev is not None and t < prev[0]:
                raise _refuse_bonnmotion(
                    f"waypoint {k} of node {node_id}: time {t:g} s is before the previous "
                    f"{prev[0]:g} s: times must be sorted",
                    where,
                    raw,
                )
            prev = (t, x, y)
            tracks.add(node_id, t, x, y, number)
        tracks.last.pop(node_id, None)  # a node is one line: its checks end with it
        if not count:
            continue
        if count % 3:
            raise _refuse_bonnmotion(
                f"{count} numbers, not a multiple of 3 (t x y per waypoint; 3-D traces, "
                "t x y z, are not read)",
                where,
                raw,
            )
        node += 1
    return tracks.trace("bonnmotion")
