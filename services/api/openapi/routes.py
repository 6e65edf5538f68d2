"""GET /api/openapi.json: the API's OpenAPI document; GET /api/docs: a page rendering it for people.
Both public, like the health check."""

from __future__ import annotations

import asyncio

from aiohttp import web

from minions import jsoncodec
from minions.services.api.openapi.document import document
from minions.services.api.ui.pages import CSP, SECURITY_HEADERS, WEB_DIR

routes = web.RouteTableDef()
PATH = "/api/openapi.json"
DOCS_PATH = "/api/docs"
# The page (and its script and style under /ui/) ships as package data with the web UI's files.
DOCS_PAGE = "apidocs.html"


@routes.get(PATH)
async def openapi_json(request: web.Request) -> web.Response:
    # Built on each request (it is small and cheap) with a relative server, so the document is right
    # behind any proxy or port mapping: clients resolve it against the URL they fetched it from.
    return web.Response(body=jsoncodec.dumps(document()), content_type="application/json",
                        headers={"Cache-Control": "no-cache"})


@routes.get(DOCS_PATH)
async def docs_page(request: web.Request) -> web.Response:
    page = await asyncio.to_thread((WEB_DIR / DOCS_PAGE).read_bytes)
    return web.Response(body=page, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP, **SECURITY_HEADERS})


def add_routes(app: web.Application) -> None:
    app.router.add_routes(routes)
