"""GET /api/openapi.json: the API's OpenAPI document (public, like the health check)."""

from __future__ import annotations

from aiohttp import web

from minions import jsoncodec
from minions.services.api.openapi import document

routes = web.RouteTableDef()
PATH = "/api/openapi.json"


@routes.get(PATH)
async def openapi_json(request: web.Request) -> web.Response:
    # Built on each request (it is small and cheap) with a relative server, so the document is right
    # behind any proxy or port mapping: clients resolve it against the URL they fetched it from.
    return web.Response(body=jsoncodec.dumps(document()), content_type="application/json",
                        headers={"Cache-Control": "no-cache"})


def add_routes(app: web.Application) -> None:
    app.router.add_routes(routes)
