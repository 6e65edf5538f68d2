"""Health: the API is up, and whether it reaches the database."""

from __future__ import annotations

from aiohttp import web

from minions import jsoncodec
from minions.services.api.appkeys import GATEWAY

routes = web.RouteTableDef()


@routes.get("/api/v1/health")
async def health(request: web.Request) -> web.Response:
    # Connection errors propagate to the error middleware, which answers 503 with Retry-After.
    await request.app[GATEWAY].ping(timeout=5)
    return web.Response(body=jsoncodec.dumps({"status": "ok", "database": "ok"}),
                        content_type="application/json")
