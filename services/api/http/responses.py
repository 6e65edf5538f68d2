"""JSON responses through the project's one codec."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aiohttp import web

from minions import jsoncodec


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=jsoncodec.dumps(data), status=status, content_type="application/json")


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
