"""Slow clients cannot pin the API's sockets.

aiohttp waits for request headers and bodies as long as a client cares to dribble them. Three
limits, each a setting (docs/API.md):

- header timeout: a new connection must deliver its first request's headers within
  MINIONS_HEADER_TIMEOUT_S, or it is closed. (Later requests on a kept-alive connection are bounded
  by the keep-alive timeout, KEEPALIVE_S: aiohttp closes a connection idle or mid-headers by then.)
- body timeout: a request body must keep arriving: it may take MINIONS_BODY_TIMEOUT_S plus one
  second for every MINIONS_BODY_MIN_RATE bytes received (the rule of Apache's mod_reqtimeout), so
  a big upload on a decent link never hits it and a trickle does; the reader then gets 408.
- connections per IP: at most MINIONS_MAX_CONNECTIONS_PER_IP open at once, counted across the API's
  workers (connection_counts.py); one more is answered 429 `too_many_connections` and closed at
  once, before aiohttp starts serving it, and logged as one warning per episode.

The connection-level limits live in a `web.Server` subclass (its connection_made/connection_lost
hooks, its request factory and the protocol it makes are the low-level server's public interface);
`GuardedAppRunner` builds it in place of the plain one. The body limit is a middleware.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from minions import jsoncodec
from minions.config import Settings
from minions.logging import get_logger
from minions.services.api.http.connection_counts import ConnectionCounts, Held
from minions.services.api.http.errors import ApiError

log = get_logger(__name__)
KEEPALIVE_S = 75.0  # aiohttp's run_app default, kept


@dataclass(frozen=True)
class ClientLimits:
    header_timeout_s: float
    body_timeout_s: float
    body_min_rate: float  # bytes per second
    max_connections_per_ip: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ClientLimits:
        return cls(settings.header_timeout_s, settings.body_timeout_s, settings.body_min_rate,
                   settings.max_connections_per_ip)


def _refusal(limit: int) -> bytes:
    body = jsoncodec.dumps({"error": {"code": "too_many_connections",
                                      "message": f"more than {limit} open connections from your address"}})
    head = (f"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class _GuardedHandler(RequestHandler):
    """aiohttp's connection protocol, admitted by its server before it starts: a connection over its
    address's cap never gets a handler task (one started on a closed transport fails, and asyncio
    logs the failure as an error with a traceback)."""

    __slots__ = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._manager
        assert isinstance(server, GuardedServer)
        if server.admit(self, cast(asyncio.Transport, transport)):
            super().connection_made(transport)


class GuardedServer(web.Server):
    """aiohttp's low-level server with a header timeout and a per-IP connection cap (counted in
    `counts`, shared by the API's workers)."""

    def __init__(self, *args: Any, limits: ClientLimits, counts: ConnectionCounts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._counts = counts
        self._refusal = _refusal(limits.max_connections_per_ip)
        self._held: dict[RequestHandler, tuple[str, Held]] = {}
        self._refusing: set[str] = set()
        self._header_timers: dict[RequestHandler, asyncio.TimerHandle] = {}
        self._build_request = self.request_factory
        self.request_factory = self._request_started

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs)

    def admit(self, handler: RequestHandler, transport: asyncio.Transport) -> bool:
        """Count a new connection against its address's cap; one over it is answered 429 and closed."""
        peer = transport.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) else "local"
        held = self._counts.acquire(ip, self._limits.max_connections_per_ip)
        if held is None:
            if ip not in self._refusing:  # once per episode, not once per connection of a flood
                self._refusing.add(ip)
                log.warning("connections_refused", ip=ip, limit=self._limits.max_connections_per_ip)
            transport.write(self._refusal)
            transport.close()
            return False
        self._refusing.discard(ip)
        self._held[handler] = (ip, held)
        return True

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self._header_timers[handler] = self._loop.call_later(
            self._limits.header_timeout_s, self._headers_overdue, handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        timer = self._header_timers.pop(handler, None)
        if timer is not None:
            timer.cancel()
        if (entry := self._held.pop(handler, None)) is not None:
            self._counts.release(entry[1])

    def _request_started(self, message: Any, payload: Any, protocol: RequestHandler, writer: Any,
                         task: Any) -> web.BaseRequest:
        timer = self._header_timers.pop(protocol, None)
        if timer is not None:
            timer.cancel()
        request: web.BaseRequest = self._build_request(message, payload, protocol, writer, task)
        return request

    def _headers_overdue(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        self._header_timers.pop(handler, None)
        log.debug("header_timeout", ip=self._held[handler][0] if handler in self._held else None)
        transport.close()


class GuardedAppRunner(web.AppRunner):
    """An AppRunner whose server is a GuardedServer; `counts`: the connection counts this process
    shares with the API's other workers (made before they forked), or None for its own."""

    def __init__(self, app: web.Application, *, limits: ClientLimits, counts: ConnectionCounts | None = None,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits
        self._counts = counts or ConnectionCounts()

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # starts the app up, as the plain runner does
        return GuardedServer(plain.request_handler, request_factory=plain.request_factory,
                             handler_cancellation=plain.handler_cancellation,
                             limits=self._limits, counts=self._counts, **self._kwargs)


def body_deadline(limits: ClientLimits) -> Any:
    """A middleware: a request body that stops arriving at MINIONS_BODY_MIN_RATE (after the grace of
    MINIONS_BODY_TIMEOUT_S) fails its reader with 408 `request_timeout`."""

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        content = request.content
        if not request.body_exists or content.is_eof():
            response: web.StreamResponse = await handler(request)
            return response
        loop = asyncio.get_running_loop()
        started = loop.time()
        timer: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal timer
            if content.is_eof():
                return
            allowed = started + limits.body_timeout_s + content.total_bytes / limits.body_min_rate
            if loop.time() < allowed:
                timer = loop.call_at(allowed, check)
                return
            log.debug("body_timeout", path=request.path, received=content.total_bytes)
            content.set_exception(ApiError(
                408, "request_timeout",
                f"the request body stopped arriving (slower than {limits.body_min_rate:g} bytes/s after "
                f"{limits.body_timeout_s:g} s)", headers={"Connection": "close"}))

        timer = loop.call_at(started + limits.body_timeout_s, check)
        try:
            response = await handler(request)
            return response
        finally:
            timer.cancel()

    return middleware
