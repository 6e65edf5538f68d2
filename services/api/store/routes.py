"""The local store's signed URLs: GET (with Range) and PUT of objects, for executors.

No bearer token here: the signature in the query is the credential, exactly as with S3 presigned
URLs, so executors hold no store secret and treat both stores alike. With an S3 store these routes
answer 404: nothing signs URLs for them.

A PUT is taken only for the output key of a lease that is live when the upload starts and still
live when it ends (OUTPUT_WRITABLE): an output URL stops working once its lease is completed,
failed, released, lost or cancelled, whatever its signed expiry says.

A lease's input URL is scoped (signing.Scope: its lease token and byte range are signed): it serves
that range and nothing else (no Range header: the whole range, 206; a Range inside it: those bytes;
any other: 416 `range_not_signed`), and only while its lease is live (INPUT_READABLE; after: 403
`lease_ended`). A GET URL without a scope (a compacted result's part) reads the whole object.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from minions import jsoncodec
from minions.config import Settings
from minions.services.api.appkeys import INPUT_READABLE, OUTPUT_WRITABLE, STORE
from minions.services.api.http.errors import error_response
from minions.services.api.store.url_signing import SignedLocalStore
from minions.store import signing
from minions.store.base import InvalidKey, ObjectNotFound, validate_key

ROUTE = "/api/v1/store/{key:.+}"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_UPLOAD_CHUNK = 256 * 1024


# The largest object a signed PUT may store (MINIONS_MAX_OUTPUT_BYTES).
MAX_PUT_BYTES = web.AppKey("max_put_bytes", int)


def add_routes(app: web.Application, max_put_bytes: int = Settings.max_output_bytes) -> None:
    app[MAX_PUT_BYTES] = max_put_bytes
    # add_get also answers HEAD (a GET-signed URL may ask for the size alone).
    app.router.add_get(ROUTE, get_object)
    app.router.add_put(ROUTE, put_object)


def _authorize(request: web.Request, method: str) -> tuple[SignedLocalStore, str, signing.Scope | None] | web.Response:
    """The store, key and scope (a lease's input range, or None: the whole object) of a validly
    signed request, or the error response to send."""
    store = request.app[STORE]
    if not isinstance(store, SignedLocalStore):
        return error_response(404, "not_found", "this server does not serve store objects")
    key = request.match_info["key"]
    try:
        validate_key(key)
        scope = signing.check(store.signing_key, method, key, request.query)
    except InvalidKey:
        # A key no URL of ours could name: no signature for it exists either.
        return error_response(403, "bad_signature", "signature does not match")
    except signing.SignatureError as e:
        return error_response(403, e.code, str(e))
    return store, key, scope


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """A single `bytes=a-b`, `bytes=a-` or `bytes=-n` range as half-open [start, end) clamped to
    `size`; None for no header or one we ignore (malformed, several ranges: RFC 9110 lets a server
    answer those with the whole object). ValueError when the range is unsatisfiable (416)."""
    match = _RANGE.fullmatch(header.strip().replace(" ", ""))
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if size == 0:
        raise ValueError("the object is empty")  # no byte of it can be selected
    if not first:  # suffix: the last n bytes
        count = int(last)
        if count == 0:
            raise ValueError("empty suffix range")
        return max(0, size - count), size
    start = int(first)
    end = size if not last else min(int(last) + 1, size)
    if last and int(last) < start:
        return None  # invalid, so ignored (RFC 9110 §14.1.1)
    if start >= size:
        raise ValueError("range starts past the end")
    return start, end


async def get_object(request: web.Request) -> web.StreamResponse:
    authorized = _authorize(request, "GET")
    if isinstance(authorized, web.Response):
        return authorized
    store, key, scope = authorized
    if scope is not None:
        readable = request.app.get(INPUT_READABLE)
        if readable is None or not await readable(scope.token, scope.start, scope.end):
            return _lease_ended("its input can no longer be read")
    try:
        obj = await store.open(store.uri_for(key))
    except ObjectNotFound:
        return error_response(404, "not_found", f"no object {key}")
    async with obj:
        # Size and bytes from one open file: a concurrent PUT of this key cannot make the body
        # disagree with Content-Length.
        header = request.headers.get("Range")
        try:
            byte_range = parse_range(header, obj.size) if header else None
        except ValueError:
            if scope is not None:
                return _outside(scope, header, obj.size)
            return error_response(416, "range_not_satisfiable",
                                  f"range {header!r} is outside the object ({obj.size} bytes)",
                                  headers={"Content-Range": f"bytes */{obj.size}"})
        if scope is not None:
            # A scoped URL serves its signed range, or a part of it, and never another byte: no Range
            # (or one ignored: malformed, several ranges) is the whole signed range.
            if byte_range is None:
                byte_range = (min(scope.start, obj.size), min(scope.end, obj.size))
                if byte_range[0] == byte_range[1]:
                    return _outside(scope, header, obj.size)  # the object is shorter than the range
            elif not scope.start <= byte_range[0] < byte_range[1] <= scope.end:
                return _outside(scope, header, obj.size)
        response = web.StreamResponse(status=200 if byte_range is None else 206)
        start, end = (0, obj.size) if byte_range is None else byte_range
        if byte_range is not None:
            response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{obj.size}"
        response.headers["Accept-Ranges"] = "bytes"
        response.content_type = "application/octet-stream"
        response.content_length = end - start
        await response.prepare(request)
        if request.method != "HEAD":
            async for chunk in obj.chunks(start, end):
                await response.write(chunk)
        await response.write_eof()
        return response


async def put_object(request: web.Request) -> web.StreamResponse:
    authorized = _authorize(request, "PUT")
    if isinstance(authorized, web.Response):
        return authorized
    store, key, _ = authorized
    writable = request.app.get(OUTPUT_WRITABLE)
    if writable is None or not await writable(key):
        return _lease_ended()
    limit = request.app[MAX_PUT_BYTES]
    if request.content_length is not None and request.content_length > limit:
        return _too_large(limit)
    try:
        uri, size = await store.put_stream(key, _body(request, limit, lambda: writable(key)))
    except _IncompleteBody as e:
        return error_response(400, "incomplete_body", str(e))
    except _BodyTooLarge:
        return _too_large(limit)
    except _LeaseEnded:
        return _lease_ended()
    return web.Response(body=jsoncodec.dumps({"uri": uri, "size": size}), content_type="application/json")


def _lease_ended(consequence: str = "its output can no longer change") -> web.Response:
    return error_response(403, "lease_ended", "this URL's lease is no longer live (completed, failed, "
                                              f"released, lost or cancelled): {consequence}")


def _outside(scope: signing.Scope, header: str | None, size: int) -> web.Response:
    asked = f"Range {header!r} asks for others" if header else f"the object holds only {size} bytes"
    return error_response(416, "range_not_signed",
                          f"this URL reads bytes [{scope.start}, {scope.end}) of the object (its lease's input "
                          f"range) and no others; {asked}", headers={"Content-Range": f"bytes */{size}"})


class _LeaseEnded(Exception):
    pass


class _IncompleteBody(Exception):
    pass


class _BodyTooLarge(Exception):
    pass


def _too_large(limit: int) -> web.Response:
    return error_response(413, "too_large", f"the object is over the limit of {limit:,} bytes "
                                            "(MINIONS_MAX_OUTPUT_BYTES)")


async def _body(request: web.Request, limit: int,
                still_writable: Callable[[], Awaitable[bool]]) -> AsyncIterator[bytes]:
    """The request body, refusing (so put_stream discards its temp file) one that ends short of its
    Content-Length (a dropped upload must never be committed as a truncated object), that runs past
    `limit` bytes (nothing over the limit is ever stored, whatever Content-Length said), or whose
    lease ended while it was uploading."""
    received = 0
    async for chunk in request.content.iter_chunked(_UPLOAD_CHUNK):
        received += len(chunk)
        if received > limit:
            raise _BodyTooLarge
        yield chunk
    expected = request.content_length
    if expected is not None and received != expected:
        raise _IncompleteBody(f"body ended after {received} of {expected} bytes")
    if not await still_writable():
        raise _LeaseEnded
