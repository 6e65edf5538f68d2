"""The API's access log: one JSON event (`http_request`) per request, through the one logging
pipeline, so its paths are redacted like every other line (a lease token in `/leases/{token}/…` or a
signed URL's `sig` never reaches the log). The Authorization header is never read here."""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from minions.logging import get_logger

log = get_logger("access")


class AccessLogger(AbstractAccessLogger):
    @property
    def enabled(self) -> bool:
        # Read once per connection by aiohttp: below info (MINIONS_LOG_LEVEL=warning) it then neither
        # times a request nor calls `log`, whose arguments (the peer's address among them) cost a
        # few percent of the API's CPU on small requests even when the event is dropped.
        return bool(log.is_enabled_for(logging.INFO))

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        log.info("http_request", method=request.method, path=request.path_qs, status=response.status,
                 bytes=response.body_length, duration_ms=round(time * 1000, 1), remote=request.remote)
