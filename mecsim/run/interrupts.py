"""Ctrl-C and SIGTERM stop a run between writes, never in the middle of one.

:func:`install` makes SIGINT raise :class:`KeyboardInterrupt` and SIGTERM raise
:class:`Terminated` (a KeyboardInterrupt: the run stops the same way, exit 143 instead
of 130). Inside :func:`atomic_section` (a checkpoint or a round's records being written)
a signal is held back and raised when the section ends, so a file is never left half
written by an interrupt (torch.save, for one, turns an exception raised inside its
writer into an unrelated error).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the finished rounds are kept, exit 143."""


_depth = 0
_pending: BaseException | None = None


def _handler(signum: int, frame) -> None:  # noqa: ARG001 - signal handler signature
    global _pending
    exc: BaseException = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    if _depth:
        _pending = exc
        return
    raise exc


@contextmanager
def atomic_section() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back until the block is done (main thread only)."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending is not None:
            exc, _pending = _pending, None
            raise exc


def install() -> Callable[[], None]:
    """Install the handlers (main thread); returns a function that restores the old ones."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore
