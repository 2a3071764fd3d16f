"""Request bodies read within bounds, and the bounded pool that does a request's work.

JSON bodies (``POST /runs``, ``POST /sweeps``) are parsed here, not by FastAPI, so that
every limit is checked while or right after parsing and a bad body is a 422 naming the
field, never a 500:

- ``NaN``, ``Infinity`` and numbers that overflow to infinity are refused (JSON has none);
- integers beyond a signed 64-bit integer (SQLite's, and numpy's) are refused;
- nesting deeper than :data:`MAX_DEPTH`, more than :data:`MAX_NODES` values, a mapping of
  more than :data:`MAX_KEYS` keys, a string of more than :data:`MAX_STRING_CHARS`
  characters (the scenario text excepted: the body limit bounds it), lone surrogates and
  NUL characters are refused;
- pydantic's own errors are reported without echoing the input back.

:class:`WorkPool` runs the CPU-bound part of a request (parsing, validation, the
pre-flight, sweep planning) in two threads of its own with a bounded queue, off the event
loop and at a lower CPU priority than the training (a full queue answers 503 with
``Retry-After``). The event loop only routes, so
``/healthz``, ``/metrics`` and status reads are answered while a hostile submission is
being refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from mecsim.scenario.loader import MAX_DEPTH, MAX_KEYS, MAX_NODES, MAX_SCALAR_CHARS

#: Largest integer a body may carry (SQLite's signed 64-bit integers).
MAX_INTEGER = 2**63 - 1
MAX_STRING_CHARS = MAX_SCALAR_CHARS
#: Fields whose strings may be as long as the body (a scenario's YAML text).
LONG_STRINGS = frozenset({"scenario"})

T = TypeVar("T")


class BadBody(Exception):
    """A body that cannot be accepted: ``(field, message)`` problems (a 422)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))
        self.problems = problems


class Busy(Exception):
    """The work pool's queue is full (a 503 with ``Retry-After``)."""


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is too large for a number")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) > MAX_INTEGER:
        raise ValueError(f"{text[:40]}{'...' if len(text) > 40 else ''} is beyond 2^63 - 1")
    return int(text)


def _mapping(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len(pairs) > MAX_KEYS:
        raise ValueError(f"a mapping of {len(pairs):,} keys (at most {MAX_KEYS:,})")
    return dict(pairs)


def _where(path: list[str | int]) -> str:
    return ".".join(str(p) for p in path) or "(body)"


def check_tree(value: Any) -> None:
    """Depth, size, strings: what :func:`parse_json` checks after ``json.loads``
    (iteratively: no recursion however deep the value)."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    nodes = 0
    while stack:
        item, path = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise BadBody([("(body)", f"more than {MAX_NODES:,} values")])
        if len(path) > MAX_DEPTH:
            raise BadBody([(_where(path[:3]) + "...", f"nested deeper than {MAX_DEPTH} levels")])
        if isinstance(item, str):
            _check_string(item, path)
        elif isinstance(item, dict):
            for key, sub in item.items():
                _check_string(key, path, key=True)
                stack.append((sub, [*path, key]))
        elif isinstance(item, list):
            stack.extend((sub, [*path, i]) for i, sub in enumerate(item))


def _check_string(text: str, path: list[str | int], key: bool = False) -> None:
    where = _where(path) + (" (a key)" if key else "")
    if not (path and path[0] in LONG_STRINGS and len(path) == 1) and len(text) > MAX_STRING_CHARS:
        raise BadBody(
            [(where, f"a string of {len(text):,} characters (at most {MAX_STRING_CHARS:,})")]
        )
    if "\x00" in text:
        raise BadBody([(where, "contains a NUL character")])
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadBody([(where, "contains a lone surrogate (not valid Unicode text)")]) from None


def parse_json(raw: bytes) -> Any:
    """The body as JSON within bounds, or :class:`BadBody`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody([("(body)", f"not UTF-8 text (byte {exc.start})")]) from None
    if not text.strip():
        raise BadBody([("(body)", "empty; send a JSON object")])
    try:
        value = json.loads(
            text,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int,
            object_pairs_hook=_mapping,
        )
    except RecursionError:
        raise BadBody([("(body)", f"nested deeper than {MAX_DEPTH} levels")]) from None
    except json.JSONDecodeError as exc:
        raise BadBody(
            [("(body)", f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")]
        ) from None
    except ValueError as exc:
        raise BadBody([("(body)", str(exc).splitlines()[0])]) from None
    check_tree(value)
    return value


def validation_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """pydantic's errors as ``(field, message)``, without the input they were about."""
    out = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "(body)"
        out.append((loc, str(err.get("msg", "invalid")).splitlines()[0][:300]))
    return out


def parse_model(raw: bytes, model: type[BaseModel]) -> Any:
    """A request model from a JSON body within bounds, or :class:`BadBody`."""
    value = parse_json(raw)
    if not isinstance(value, dict):
        raise BadBody([("(body)", f"expected a JSON object, got {type(value).__name__}")])
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise BadBody(validation_problems(exc)) from None
    except RecursionError:  # a deep value pydantic walks (already bounded: belt and braces)
        raise BadBody([("(body)", f"nested deeper than {MAX_DEPTH} levels")]) from None


#: How much lower the work pool's threads run than the training (``nice`` steps): a
#: hostile request's validation takes what CPU the run's hosts leave.
WORK_NICENESS = 10


def _lower_priority() -> None:
    try:  # Linux: a thread is scheduled on its own, by its native id
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORK_NICENESS)
    except (AttributeError, OSError):  # elsewhere: the process's priority
        pass


def _contained(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, with what is not an Exception (``sys.exit()`` or a BaseException of
    its own in an installed plugin's code, run by the pre-flight) turned into a 422:
    raised in the event loop, a SystemExit would stop the server."""
    try:
        return fn(*args)
    except Exception:
        raise
    except BaseException as exc:
        what = " ".join(repr(exc).split())[:200]
        raise BadBody(
            [("(scenario)", f"an installed plugin's code raised {what} while it was checked")]
        ) from None


class WorkPool:
    """``workers`` threads of their own (at a lower CPU priority than the rest of the
    server and its runs) for the CPU-bound part of requests, at most ``max_waiting``
    requests waiting for one (beyond: :class:`Busy`)."""

    def __init__(self, workers: int = 2, max_waiting: int = 16) -> None:
        self.workers = workers
        self.max_waiting = max_waiting
        self._executor = ThreadPoolExecutor(
            workers, thread_name_prefix="mecsim-request-work", initializer=_lower_priority
        )
        self.in_flight = 0  # running or waiting (changed on the event loop only)

    def load(self) -> tuple[int, int]:
        """(requests being worked on, requests waiting)."""
        busy = min(self.in_flight, self.workers)
        return busy, self.in_flight - busy

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self.in_flight >= self.workers + self.max_waiting:
            busy, waiting = self.load()
            raise Busy(
                f"the server is busy ({busy} requests being worked on, {waiting} waiting); "
                "try again shortly"
            )
        self.in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, _contained, fn, *args
            )
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
