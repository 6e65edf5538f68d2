"""Signed, expiring URLs for the local store: the same contract as S3 presigned URLs, served by the API.

A URL is `{base_url}/api/v1/store/{key}?method=GET&expires=<unix seconds>&sig=<hex>` with
`sig = HMAC-SHA256(signing_key, f"{method}\\n{key}\\n{expires}")`. The signature covers the method,
so a GET URL cannot be replayed as a PUT, and the expiry, so it cannot be extended by editing the
query. The URL is the whole credential: executors hold no store secret (DESIGN.md invariant 5).

A lease's input URL is scoped (`Scope`): `…?method=GET&expires=…&token=<lease token>&start=<byte>&end=<byte>
&sig=…` with `sig = HMAC-SHA256(signing_key, f"GET\\n{key}\\n{expires}\\n{token}\\n{start}\\n{end}")`:
it reads bytes [start, end) of the object and nothing else, and only while that lease is live (the
route asks the database). A scoped signature never verifies as a whole-object one (the signed text
has more lines), and editing the range or the token breaks it.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

STORE_PATH = "/api/v1/store/"
METHODS = ("GET", "PUT")


class SignatureError(Exception):
    """A signed URL that must be refused; `code` is the API's machine-readable error code."""

    code = "bad_signature"


class UrlExpired(SignatureError):
    code = "url_expired"


@dataclass(frozen=True)
class Scope:
    """What a lease's input URL may read: bytes [start, end) of its key, while lease `token` is live."""

    token: uuid.UUID
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"an input URL's range must be non-empty: [{self.start}, {self.end})")

    @property
    def signed_text(self) -> str:
        return f"{self.token}\n{self.start}\n{self.end}"

    @property
    def query(self) -> str:
        return f"&token={self.token}&start={self.start}&end={self.end}"


def signature(signing_key: str, method: str, key: str, expires: int, scope: Scope | None = None) -> str:
    """Hex HMAC-SHA256 of one (method, key, expiry[, scope])."""
    message = f"{method.upper()}\n{key}\n{expires}"
    if scope is not None:
        message += f"\n{scope.signed_text}"
    return hmac.new(signing_key.encode(), message.encode(), hashlib.sha256).hexdigest()


def verify(signing_key: str, method: str, key: str, expires: int, sig: str, scope: Scope | None = None) -> bool:
    """Whether `sig` signs (method, key, expires[, scope]); constant-time so timing leaks nothing of
    the expected signature."""
    expected = signature(signing_key, method, key, expires, scope)
    return hmac.compare_digest(expected.encode(), sig.encode())


def expiry(expires_s: float, now: float | None = None) -> int:
    """Unix second at which a URL valid for `expires_s` seconds expires; rounded up so the URL
    never expires before the caller asked (a lease's URLs must outlive the lease)."""
    return math.ceil((time.time() if now is None else now) + expires_s)


def signed_url(base_url: str, signing_key: str, method: str, key: str, expires: int,
               scope: Scope | None = None) -> str:
    """The signed URL of `key` for `method` (a GET scoped to a lease's range with `scope`). Keys are
    validated to need no percent-encoding."""
    method = method.upper()
    if scope is not None and method != "GET":
        raise ValueError("only a GET URL is scoped to a byte range")
    sig = signature(signing_key, method, key, expires, scope)
    scoped = "" if scope is None else scope.query
    return f"{base_url.rstrip('/')}{STORE_PATH}{key}?method={method}&expires={expires}{scoped}&sig={sig}"


def check(signing_key: str, method: str, key: str, query: Mapping[str, str],
          now: float | None = None) -> Scope | None:
    """Raise SignatureError (or UrlExpired) unless `query` carries a valid, unexpired signature of
    `method` on `key`; the URL's scope (a lease's input range) when it has one, else None (the
    whole object). The signature is checked before the expiry so that `url_expired` is only ever
    said of a URL this server really issued."""
    signed_method = query.get("method", "")
    expires_text = query.get("expires", "")
    sig = query.get("sig", "")
    if not signed_method or not expires_text or not sig:
        raise SignatureError("signed URL needs method, expires and sig query parameters")
    if signed_method.upper() != method.upper():
        raise SignatureError(f"URL is signed for {signed_method.upper()}, not {method.upper()}")
    expires = _number(expires_text, "expires must be unix seconds")
    scope = _scope(query) if method.upper() == "GET" else None
    if not verify(signing_key, method, key, expires, sig, scope):
        raise SignatureError("signature does not match")
    if (time.time() if now is None else now) >= expires:
        raise UrlExpired("signed URL has expired")
    return scope


def _number(text: str, problem: str) -> int:
    # Digits only: int() would also accept signs, spaces and underscores, i.e. several spellings
    # of one signed value.
    if not text.isascii() or not text.isdigit():
        raise SignatureError(problem)
    return int(text)


def _scope(query: Mapping[str, str]) -> Scope | None:
    """The scope a GET URL names (token, start, end: all three or none); SignatureError for a partial
    or malformed one. Only its one spelling is taken (lower-case token, no leading zeros): the
    signature then covers exactly the text the URL carries."""
    given = {name: query.get(name) for name in ("token", "start", "end")}
    if all(value is None for value in given.values()):
        return None
    token, start, end = (given[name] or "" for name in ("token", "start", "end"))
    if not token or not start or not end:
        raise SignatureError("a range-scoped URL needs token, start and end query parameters")
    try:
        parsed = uuid.UUID(token)
    except ValueError:
        raise SignatureError("token must be a lease token") from None
    first = _number(start, "start must be a byte offset")
    last = _number(end, "end must be a byte offset")
    if str(parsed) != token or str(first) != start or str(last) != end or first >= last:
        raise SignatureError("signature does not match")
    return Scope(parsed, first, last)
