"""The service's guards, in the order a request meets them: token, body size, same site,
page headers.

:class:`TokenGuard`, :class:`BodyLimit`, :class:`SameSite` and :class:`PageHeaders` are
ASGI middleware around the whole application: the token is checked before anything of
the body is read. :func:`bearer_auth` is the dependency every route but ``/healthz`` and
``/metrics`` carries (it checks the token again, and describes it in the OpenAPI
document).
"""

from __future__ import annotations

import hmac
import ipaddress
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


BEARER = HTTPBearer(auto_error=False, description="the token of --token-file")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BodyLimit:
    """413 for request bodies above ``max_bytes`` (declared or actually sent)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = f"request body larger than {self.max_bytes} bytes"
        for key, value in scope.get("headers", []):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes or declared < 0:
                    response = JSONResponse(
                        {"detail": too_large if declared > 0 else "bad Content-Length"},
                        status_code=413 if declared > 0 else 400,
                    )
                    return await response(scope, receive, send)
        received = 0

        async def limited():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, too_large)
            return message

        return await self.app(scope, limited, send)


#: Paths answered without a token.
OPEN_PATHS = frozenset({"/healthz", "/metrics", "/favicon.ico"})


class TokenGuard:
    """401 for a request without ``Authorization: Bearer <token>`` (constant-time
    compare), before its body is read; ``/healthz``, ``/metrics`` are open."""

    def __init__(self, app, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.token is None or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = b""
        for key, value in scope.get("headers", []):
            if key == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = credentials.strip()
                break
        if not hmac.compare_digest(given, self.token):
            response = JSONResponse(
                {"detail": "missing or wrong bearer token"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class PageHeaders:
    """Every response: not to be framed by another site (``X-Frame-Options: DENY``, CSP
    ``frame-ancestors 'none'``: a page with a Cancel button cannot be clickjacked), its
    type not sniffed (``X-Content-Type-Options: nosniff``)."""

    HEADERS = (
        (b"x-frame-options", b"DENY"),
        (b"content-security-policy", b"frame-ancestors 'none'"),
        (b"x-content-type-options", b"nosniff"),
    )

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        return await self.app(scope, receive, with_headers)


def _host_of(header: str) -> str:
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class SameSite:
    """Loopback servers answer loopback Host names only; unsafe methods need no foreign
    Origin (a web page elsewhere cannot drive the service through the user's browser)."""

    def __init__(self, app, check_host: bool) -> None:
        self.app = app
        self.check_host = check_host

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
        if len(hosts) > 1:  # read one way here and another by a proxy: refused
            response = JSONResponse({"detail": "more than one Host header"}, status_code=400)
            return await response(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = hosts[0] if hosts else ""
        if self.check_host and _host_of(host) not in LOOPBACK_NAMES:
            response = JSONResponse(
                {
                    "detail": f"Host {host!r} is not a loopback name; this "
                    "service listens on loopback only"
                },
                status_code=400,
            )
            return await response(scope, receive, send)
        origin = headers.get("origin")
        if scope["method"] not in ("GET", "HEAD", "OPTIONS") and origin is not None:
            # the site, not the scheme: behind a TLS proxy the browser says https
            try:
                site = urllib.parse.urlsplit(origin).netloc
            except ValueError:  # not a URL (e.g. "http://["): not this site either
                site = None
            if site != host:
                response = JSONResponse(
                    {"detail": f"cross-site request from {origin} refused"}, status_code=403
                )
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def bearer_auth(token: str | None) -> Callable[..., Awaitable[None]]:
    """The dependency that checks ``Authorization: Bearer <token>`` (constant-time
    compare); no check at all when the server has no token."""

    async def authorised(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    ) -> None:
        if token is None:
            return
        given = creds.credentials if creds is not None else ""
        if creds is None or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    return authorised
