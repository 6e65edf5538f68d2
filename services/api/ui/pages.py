"""The web UI's files (services/api/web/, package data) and how they are served: which may be named,
their content types, the security headers every page carries, ETags for revalidation. The UI's own
routes and the API's docs page both serve through here."""

from __future__ import annotations

import asyncio
import hashlib
from importlib.resources import files
from importlib.resources.abc import Traversable

from aiohttp import web

# Package data, read through importlib.resources: the same in a checkout and an installed wheel.
WEB_DIR: Traversable = files("minions.services.api") / "web"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".txt": "text/plain; charset=utf-8",
}
# The app fetches only its own origin; nothing from the internet, no inline scripts.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
       "form-action 'self'")
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""


def resolve(relative: str) -> Traversable | None:
    """The asset `relative` names inside WEB_DIR, or None (hidden, unknown type, missing). Every part
    must be a plain name (no `..`, no hidden files, no backslashes), so nothing outside WEB_DIR."""
    parts = relative.split("/")
    if not relative or any(not part or part.startswith(".") or "\\" in part for part in parts):
        return None
    path = WEB_DIR.joinpath(*parts)
    if _suffix(path.name) not in CONTENT_TYPES or not path.is_file():
        return None
    return path


async def serve(request: web.Request, path: Traversable, cache_control: str,
                 extra: dict[str, str] | None = None) -> web.Response:
    body = await asyncio.to_thread(path.read_bytes)
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {"Cache-Control": cache_control, "ETag": etag, **SECURITY_HEADERS, **(extra or {})}
    if etag in {tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")}:
        return web.Response(status=304, headers=headers)
    headers["Content-Type"] = CONTENT_TYPES[_suffix(path.name)]
    return web.Response(body=body, headers=headers)
