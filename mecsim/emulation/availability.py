"""When each client is online: the ``availability:`` section in time (docs/async.md).

:class:`Availability` answers, for a client and an emulated time, whether it is online,
when it next comes online and when it next goes offline. Online intervals are half-open,
``[start, end)``.

A trace follows FedScale's availability-trace layout (``client_behave_trace``: for each
client, ``active`` and ``inactive`` list the starts and ends of its online intervals, in
seconds, and the pattern repeats every ``finish_time``: FedScale's ``ClientSim.is_active``
takes the time modulo ``finish_time``), written as JSON because FedScale's pickle would
run code when read::

    {"0": {"active": [0, 300], "inactive": [120, 500], "finish_time": 600},
     "3": {"active": [60], "inactive": [400]}}

Keys are the scenario's client indices (0 to clients - 1); a client the trace does not
name is online throughout; without ``finish_time`` a client is offline after its last
interval; FedScale's other keys (``duration``, ``model``) are read and ignored. Every
mistake is refused before the run starts, naming the file and the line
(:class:`AvailabilityError`).

The exponential model draws each client's alternating online and offline durations from
its own stream of the scenario's seed, as far as the run asks, so the answers do not
depend on the order of the questions.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

#: A larger trace file is refused before it is read.
MAX_TRACE_BYTES = 64 * 2**20
_KNOWN_KEYS = {"active", "inactive", "finish_time", "duration", "model"}


class AvailabilityError(ValueError):
    """A trace that does not fit the scenario; ``str()`` names the file and the line."""


class _Intervals:
    """One client's online intervals, sorted, repeating every ``period`` (None: once)."""

    def __init__(self, starts: list[float], ends: list[float], period: float | None) -> None:
        self.starts, self.ends, self.period = starts, ends, period

    def _locate(self, t: float) -> tuple[float, float]:
        """(the period's start at or before ``t``, ``t``'s offset in it)."""
        if self.period is None:
            return 0.0, t
        k = math.floor(t / self.period)
        return k * self.period, t - k * self.period

    def online(self, t: float) -> bool:
        _, x = self._locate(t)
        i = bisect.bisect_right(self.starts, x) - 1
        return i >= 0 and x < self.ends[i]

    def next_on(self, t: float) -> float:
        base, x = self._locate(t)
        if self.online(t):
            return t
        i = bisect.bisect_right(self.starts, x)
        if i < len(self.starts):
            return base + self.starts[i]
        if self.period is None:
            return math.inf
        return base + self.period + self.starts[0]

    def next_off(self, t: float) -> float:
        if not self.online(t):
            return t
        base, x = self._locate(t)
        i = bisect.bisect_right(self.starts, x) - 1
        end = base + self.ends[i]
        # an interval that runs to the period's end and one that starts it are one
        if self.period is not None and self.ends[i] >= self.period and self.starts[0] <= 0.0:
            return self.next_off(end) if self.ends[0] < self.period else math.inf
        return end


class _Exponential:
    """Alternating online/offline periods of exponential durations, drawn as needed."""

    def __init__(self, rng: np.random.Generator, mean_on: float, mean_off: float) -> None:
        self.rng, self.mean_on, self.mean_off = rng, mean_on, mean_off
        self.online_at_0 = bool(rng.random() < mean_on / (mean_on + mean_off))
        self.changes: list[float] = [0.0]  # times the state changes; [0] is the start
        self._extend(0.0)

    def _extend(self, t: float) -> None:
        while self.changes[-1] <= t:
            on = self._state(len(self.changes) - 1)
            mean = self.mean_on if on else self.mean_off
            self.changes.append(self.changes[-1] + float(self.rng.exponential(mean)))

    def _state(self, i: int) -> bool:
        """Online during [changes[i], changes[i + 1])?"""
        return self.online_at_0 if i % 2 == 0 else not self.online_at_0

    def _index(self, t: float) -> int:
        self._extend(t)
        return bisect.bisect_right(self.changes, t) - 1

    def online(self, t: float) -> bool:
        return self._state(self._index(t))

    def next_on(self, t: float) -> float:
        i = self._index(t)
        return t if self._state(i) else self.changes[i + 1]

    def next_off(self, t: float) -> float:
        i = self._index(t)
        return self.changes[i + 1] if self._state(i) else t


class Availability:
    """Who is online when, for a run (see the module's docstring)."""

    def __init__(self, clients: dict[int, Any]) -> None:
        self._clients = clients  # client -> _Intervals | _Exponential (absent: always)

    @classmethod
    def of(cls, config: Any, clients: int, seed: int) -> Availability | None:
        """The run's availability from its ``availability:`` section (None: always)."""
        if config.model == "always":
            return None
        if config.model == "exponential":
            return cls(
                {
                    c: _Exponential(
                        np.random.default_rng(np.random.SeedSequence([seed, 0xA7A1, c])),
                        config.mean_online_s,
                        config.mean_offline_s,
                    )
                    for c in range(clients)
                }
            )
        return cls(read_trace(Path(config.trace), clients))

    def online(self, client: int, t: float) -> bool:
        c = self._clients.get(client)
        return True if c is None else c.online(t)

    def next_on(self, client: int, t: float) -> float:
        """The first time at or after ``t`` the client is online (inf: never again)."""
        c = self._clients.get(client)
        return t if c is None else c.next_on(t)

    def next_off(self, client: int, t: float) -> float:
        """The first time at or after ``t`` the client is offline (inf: never)."""
        c = self._clients.get(client)
        return math.inf if c is None else c.next_off(t)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _number(path: Path, node: yaml.Node, what: str) -> float:
    where = f"{path}:{_line(node)}"
    if not isinstance(node, yaml.ScalarNode):
        raise AvailabilityError(f"{where}: {what} is not a number")
    try:
        value = float(node.value)
    except ValueError:
        raise AvailabilityError(f"{where}: {what} {node.value!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise AvailabilityError(f"{where}: {what} {node.value} is not a time >= 0 (s)")
    return value


def _numbers(path: Path, node: yaml.Node, what: str) -> list[float]:
    if not isinstance(node, yaml.SequenceNode):
        raise AvailabilityError(f"{path}:{_line(node)}: {what} is not a list of times (s)")
    return [_number(path, item, f"{what}[{i}]") for i, item in enumerate(node.value)]


def read_trace(path: Path, clients: int) -> dict[int, _Intervals]:
    """A FedScale-layout availability trace (see the module's docstring), checked against
    a scenario of ``clients`` clients; :class:`AvailabilityError` names the file and
    the line of the first mistake."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise AvailabilityError(f"{path}: cannot be read ({exc.strerror})") from None
    if not path.is_file():
        raise AvailabilityError(f"{path}: not a regular file")
    if size > MAX_TRACE_BYTES:
        raise AvailabilityError(
            f"{path}: {size} bytes, over the {MAX_TRACE_BYTES} a trace may have"
        )
    if path.suffix == ".pkl" or path.read_bytes()[:1] == b"\x80":
        raise AvailabilityError(
            f"{path}:1: a pickle (FedScale's own file); mecsim reads the same layout as "
            "JSON, which cannot run code when read: convert it where the file is trusted "
            "(json.dump of the unpickled dict)"
        )
    try:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except UnicodeDecodeError:
        raise AvailabilityError(f"{path}:1: not UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else 1
        raise AvailabilityError(f"{path}:{line}: not JSON ({exc.problem})") from None
    if not isinstance(root, yaml.MappingNode):
        line = 1 if root is None else _line(root)
        raise AvailabilityError(f"{path}:{line}: not a JSON object of clients")
    out: dict[int, _Intervals] = {}
    for key, value in root.value:
        where = f"{path}:{_line(key)}"
        try:
            client = int(str(key.value))
        except ValueError:
            raise AvailabilityError(f"{where}: client {key.value!r} is not an index") from None
        if not 0 <= client < clients:
            raise AvailabilityError(
                f"{where}: client {client}, but the scenario has {clients} clients "
                f"(0 to {clients - 1})"
            )
        if client in out:
            raise AvailabilityError(f"{where}: client {client} a second time")
        if not isinstance(value, yaml.MappingNode):
            raise AvailabilityError(f"{where}: client {client}'s entry is not an object")
        fields = {str(k.value): (k, v) for k, v in value.value}
        for name, (k, _) in fields.items():
            if name not in _KNOWN_KEYS:
                raise AvailabilityError(
                    f"{path}:{_line(k)}: client {client}: unknown key {name!r} (known: "
                    f"{', '.join(sorted(_KNOWN_KEYS))})"
                )
        for name in ("active", "inactive"):
            if name not in fields:
                raise AvailabilityError(f"{where}: client {client} has no {name!r} list")
        a_node, i_node = fields["active"][1], fields["inactive"][1]
        starts = _numbers(path, a_node, f"client {client}: active")
        ends = _numbers(path, i_node, f"client {client}: inactive")
        if len(starts) != len(ends):
            raise AvailabilityError(
                f"{path}:{_line(i_node)}: client {client}: {len(starts)} active times and "
                f"{len(ends)} inactive ones (each online interval has both)"
            )
        if not starts:
            raise AvailabilityError(
                f"{path}:{_line(a_node)}: client {client} is never online (no interval); "
                "leave a client out to have it online throughout"
            )
        for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
            if not s < e:
                raise AvailabilityError(
                    f"{path}:{_line(i_node.value[i])}: client {client}: interval {i} ends "
                    f"at {e} s, not after its start at {s} s"
                )
            if i and s < ends[i - 1]:
                raise AvailabilityError(
                    f"{path}:{_line(a_node.value[i])}: client {client}: interval {i} starts "
                    f"at {s} s, before interval {i - 1} ends at {ends[i - 1]} s (the "
                    "intervals must be in order and apart)"
                )
        period = None
        if "finish_time" in fields:
            f_node = fields["finish_time"][1]
            period = _number(path, f_node, f"client {client}: finish_time")
            if period <= 0 or ends[-1] > period:
                raise AvailabilityError(
                    f"{path}:{_line(f_node)}: client {client}: finish_time {period} s is not "
                    f"after its last interval's end ({ends[-1]} s); the intervals repeat "
                    "every finish_time"
                )
        out[client] = _Intervals(starts, ends, period)
    return out
