"""Connections that cannot be held open by a client that sends slowly or not at all.

uvicorn's HTTP/1.1 protocol (h11) times out only an idle keep-alive connection: one that
connects and sends nothing, or a header a byte at a time, or half a body, stays open for
ever, and a few hundred of them exhaust the server's connections.
:class:`TimedHttpToolsProtocol` (the parser ``mecsim serve`` uses) and
:class:`TimedH11Protocol` add two deadlines, measured from when the server starts waiting
(not reset by each byte that trickles in):

- the request's headers must be complete within :data:`HEADER_TIMEOUT_S`;
- its body within :data:`BODY_TIMEOUT_S` of the headers;

past either, the connection is closed. ``mecsim serve --max-connections`` bounds the
connections served at once (uvicorn's ``limit_concurrency``: 503 beyond).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0


class _ReadDeadlines:
    """The deadline of reading a request's headers or body (see the module's text)."""

    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _read_timer: asyncio.TimerHandle | None = None
    _read_phase: str | None = None  # "headers" or "body": what the timer waits for

    def _deadline(self, phase: str) -> None:
        """Arm the deadline of ``phase``, unless it is already running (a trickle of
        bytes does not push it back)."""
        if self._read_phase == phase:
            return
        self._cancel()
        seconds = self.header_timeout_s if phase == "headers" else self.body_timeout_s
        self._read_phase = phase
        self._read_timer = self.loop.call_later(seconds, self._too_slow)

    def _cancel(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer, self._read_phase = None, None

    def _too_slow(self) -> None:
        self._read_timer, self._read_phase = None, None
        if not self.transport.is_closing():
            self.transport.close()


class TimedH11Protocol(_ReadDeadlines, H11Protocol):
    """uvicorn's h11 protocol with header and body read deadlines."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline("headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.IDLE:  # (part of) a next request's headers
            self._deadline("headers")
        elif state is h11.SEND_BODY:
            self._deadline("body")
        else:  # the request is read (or the connection is over)
            self._cancel()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)


class TimedHttpToolsProtocol(_ReadDeadlines, HttpToolsProtocol):
    """uvicorn's httptools protocol (the faster parser, used when installed) with header
    and body read deadlines."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline("headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._deadline("headers")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._deadline("body")

    def on_message_complete(self) -> None:
        self._cancel()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)


def timed_protocol() -> type:
    """The protocol ``mecsim serve`` uses: httptools' (a dependency of mecsim: the faster
    parser); :class:`TimedH11Protocol` is there for a deployment that sets ``http="h11"``."""
    return TimedHttpToolsProtocol


def server_config(app: Any, *, max_connections: int = 1000, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's settings for ``mecsim serve`` (and the tests' in-process server): the
    read deadlines above, at most ``max_connections`` at once, keep-alive well above any
    polling or scrape interval (a client reusing a connection the server has just closed
    as idle would see its request fail)."""
    settings: dict[str, Any] = {
        "log_level": "warning",
        "lifespan": "on",
        "timeout_graceful_shutdown": 5,
        "timeout_keep_alive": 75,
        "http": timed_protocol(),
        "limit_concurrency": max_connections,
        **kwargs,
    }
    return uvicorn.Config(app, **settings)
