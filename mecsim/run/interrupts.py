"""Ctrl-C and SIGTERM stop a run between writes, never in the middle of one.

:func:`install` makes SIGINT raise :class:`KeyboardInterrupt` and SIGTERM raise
:class:`Terminated` (a KeyboardInterrupt: the run stops the same way, exit 143 instead
of 130). Inside :func:`atomic_section` (a checkpoint or a round's records being written)
a signal is held back and raised when the section ends, so a file is never left half
written by an interrupt (torch.save, for one, turns an exception raised inside its
writer into an unrelated error).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the finished rounds are kept, exit 143."""


_depth = 0
_pending: BaseException | None = None


#: set on the KeyboardInterrupt the handler raises and on the handler itself, so that
#: code that catches a KeyboardInterrupt can tell a signal from an algorithm's own
#: ``raise KeyboardInterrupt`` (mecsim.agents.algorithms.base.from_signal)
SIGNAL_MARK = "mecsim_from_signal"


def _handler(signum: int, frame) -> None:  # noqa: ARG001 - signal handler signature
    global _pending
    exc: BaseException = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    setattr(exc, SIGNAL_MARK, True)
    if _depth:
        _pending = exc
        return
    raise exc


setattr(_handler, SIGNAL_MARK, True)


def from_signal(exc: KeyboardInterrupt) -> bool:
    """Did ``exc`` come from Ctrl-C or SIGTERM, as far as can be told? Yes when
    :func:`_handler` raised it; no when that handler is installed and did not (code of
    the run raised it: a failed run, not an interrupted one); yes otherwise."""
    if getattr(exc, SIGNAL_MARK, False):
        return True
    return not getattr(signal.getsignal(signal.SIGINT), SIGNAL_MARK, False)


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


PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(parent_pid: int, *, watch_s: float | None = None) -> None:
    """Have this (child) process die when ``parent_pid``, the process that started it,
    dies, however it dies (kill -9 included): Linux's ``PR_SET_PDEATHSIG`` (the kernel
    sends SIGKILL), checked against a parent that died before the request was made (the
    process exits at once). With ``watch_s``, also a daemon thread that exits the process
    once its parent is no longer ``parent_pid``, every ``watch_s`` seconds: the same
    where prctl is missing (not Linux), and a second line of defence where it is (the
    kernel's signal follows the parent *thread* that forked)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(1)
    if watch_s is not None:

        def watch() -> None:
            while True:
                time.sleep(watch_s)
                if os.getppid() != parent_pid:
                    os._exit(1)

        threading.Thread(target=watch, name="mecsim-parent-watch", daemon=True).start()
