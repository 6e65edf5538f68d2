"""The web UI: a static single-page app (services/api/web/) served at `/` and `/ui/{path}`.

No build step: the files are served as they are. Both paths are public; the page asks for a token
and sends it with every API call, like any other client. The index is never cached (it names the
assets); assets are revalidated with an ETag, so a new release shows at the next load."""

from __future__ import annotations

from aiohttp import web

from minions.services.api.ui.pages import CSP, WEB_DIR, resolve, serve

routes = web.RouteTableDef()


@routes.get("/")
async def index(request: web.Request) -> web.Response:
    return await serve(request, WEB_DIR / "index.html", "no-cache, no-store, must-revalidate",
                       {"Content-Security-Policy": CSP})


@routes.get("/ui/{path:.+}")
async def asset(request: web.Request) -> web.Response:
    path = resolve(request.match_info["path"])
    if path is None:
        raise web.HTTPNotFound(reason="no such UI asset")
    return await serve(request, path, "no-cache")
