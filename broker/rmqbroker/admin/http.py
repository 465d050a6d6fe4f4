"""The broker's admin HTTP endpoint (aiohttp).

``/healthz`` and ``/readyz`` are open (kubelet probes carry no credentials); everything else
requires ``Authorization: Bearer <token>``: the configured token, or without one a token generated
once into the store's config folder (:func:`load_or_create_token`), never an open endpoint. Handlers for more routes
(replication control, commitlog streaming) are added by the composition root through
:meth:`AdminServer.add_route`.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# aiohttp's own keep-alive timeout: what a connection that never completes a request is given
# when the broker's idle limit is off (serverChannelMaxIdleTimeSeconds=0).
AIOHTTP_KEEPALIVE_SECONDS = 3630.0


class _ClientErrorFilter(logging.Filter):
    """aiohttp logs a request it cannot parse (a bad status line, a negative Content-Length) at
    ERROR with a traceback, before any authentication: one warning line instead, so a peer that
    sends garbage cannot flood the log with tracebacks. Its answer stays aiohttp's 400."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            said = record.getMessage()
            record.msg = "%s: malformed HTTP request (%s)"
            record.args = (said, " ".join(str(exc.message).split())[:200])
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
        return True


_CLIENT_ERRORS = _ClientErrorFilter()


def load_or_create_token(path: Path) -> str:
    """The token kept in ``path``, created (random, owner-only permissions) on first use."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    log.warning("no adminToken or adminTokenFile configured: the admin endpoint requires the token "
                "generated in %s", path)
    return token


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(obj, indent=1, sort_keys=True), status=status,
                        content_type="application/json")


def json_error(status: int, reason: str) -> web.Response:
    return json_response({"error": reason}, status=status)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or an HTTP 400 with the reason."""
    try:
        obj = await request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"malformed JSON: {exc}"}),
                                 content_type="application/json") from exc
    if not isinstance(obj, dict):
        raise web.HTTPBadRequest(text=json.dumps({"error": "body must be a JSON object"}),
                                 content_type="application/json")
    return obj


class AdminServer:
    """aiohttp application with bearer-token authentication."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: str,
        registry: CollectorRegistry,
        status: Callable[[], dict[str, Any]],
        ready: Callable[[], bool],
        idle_seconds: float = 0.0,
    ) -> None:
        """``idle_seconds``: a connection without a complete request this long is closed (0: aiohttp's hour)."""
        if not token:
            raise ValueError("the admin endpoint needs a bearer token")
        self.host = host
        self.port = port
        self._token = token.encode("utf-8")
        self._registry = registry
        self._status = status
        self._ready = ready
        self._idle_seconds = idle_seconds if idle_seconds > 0 else AIOHTTP_KEEPALIVE_SECONDS
        self.unauthorized = 0
        self.app = web.Application(middlewares=[self._auth], client_max_size=1024 * 1024)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/status", self._status_handler)
        self._runner: web.AppRunner | None = None

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        self.app.router.add_route(method, path, handler)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            header = request.headers.get("Authorization", "")
            scheme, _, presented = header.partition(" ")
            # As bytes: compare_digest refuses a str with non-ASCII characters (a 500, not a 401).
            given = presented.strip().encode("utf-8", "surrogateescape")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given, self._token):
                self.unauthorized += 1
                return web.Response(status=401, text=json.dumps({"error": "missing or wrong bearer token"}),
                                    content_type="application/json",
                                    headers={"WWW-Authenticate": 'Bearer realm="rmq-broker"'})
        return await handler(request)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _status_handler(self, request: web.Request) -> web.Response:
        return json_response(self._status())

    async def start(self) -> None:
        server_log = logging.getLogger("aiohttp.server")
        if _CLIENT_ERRORS not in server_log.filters:
            server_log.addFilter(_CLIENT_ERRORS)
        # aiohttp closes a connection that completes no request within its keep-alive timeout,
        # counted from the connection or the last answer, however many bytes trickle in: bounded
        # like the remoting port's, a peer that sends a header line now and then (slowloris) does
        # not hold a connection and its file descriptor for aiohttp's default hour.
        self._runner = web.AppRunner(self.app, access_log=None, keepalive_timeout=self._idle_seconds)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.port = int(server.sockets[0].getsockname()[1])
        log.info("admin endpoint on http://%s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
