"""Signed, expiring URLs for the local store: the same contract as S3 presigned URLs, served by the API.

A URL is `{base_url}/api/v1/store/{key}?method=GET&expires=<unix seconds>&sig=<hex>` with
`sig = HMAC-SHA256(signing_key, f"{method}\\n{key}\\n{expires}")`. The signature covers the method,
so a GET URL cannot be replayed as a PUT, and the expiry, so it cannot be extended by editing the
query. The URL is the whole credential: executors hold no store secret (DESIGN.md invariant 5).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Mapping

STORE_PATH = "/api/v1/store/"
METHODS = ("GET", "PUT")


class SignatureError(Exception):
    """A signed URL that must be refused; `code` is the API's machine-readable error code."""

    code = "bad_signature"


class UrlExpired(SignatureError):
    code = "url_expired"


def signature(signing_key: str, method: str, key: str, expires: int) -> str:
    """Hex HMAC-SHA256 of one (method, key, expiry)."""
    message = f"{method.upper()}\n{key}\n{expires}".encode()
    return hmac.new(signing_key.encode(), message, hashlib.sha256).hexdigest()


def verify(signing_key: str, method: str, key: str, expires: int, sig: str) -> bool:
    """Whether `sig` signs (method, key, expires); constant-time so timing leaks nothing of the
    expected signature."""
    expected = signature(signing_key, method, key, expires)
    return hmac.compare_digest(expected.encode(), sig.encode())


def expiry(expires_s: float, now: float | None = None) -> int:
    """Unix second at which a URL valid for `expires_s` seconds expires; rounded up so the URL
    never expires before the caller asked (a lease's URLs must outlive the lease)."""
    return math.ceil((time.time() if now is None else now) + expires_s)


def signed_url(base_url: str, signing_key: str, method: str, key: str, expires: int) -> str:
    """The signed URL of `key` for `method`. Keys are validated to need no percent-encoding."""
    method = method.upper()
    sig = signature(signing_key, method, key, expires)
    return f"{base_url.rstrip('/')}{STORE_PATH}{key}?method={method}&expires={expires}&sig={sig}"


def check(signing_key: str, method: str, key: str, query: Mapping[str, str],
          now: float | None = None) -> None:
    """Raise SignatureError (or UrlExpired) unless `query` carries a valid, unexpired signature of
    `method` on `key`. The signature is checked before the expiry so that `url_expired` is only
    ever said of a URL this server really issued."""
    signed_method = query.get("method", "")
    expires_text = query.get("expires", "")
    sig = query.get("sig", "")
    if not signed_method or not expires_text or not sig:
        raise SignatureError("signed URL needs method, expires and sig query parameters")
    if signed_method.upper() != method.upper():
        raise SignatureError(f"URL is signed for {signed_method.upper()}, not {method.upper()}")
    # Digits only: int() would also accept signs, spaces and underscores, i.e. several spellings
    # of one signed value.
    if not expires_text.isascii() or not expires_text.isdigit():
        raise SignatureError("expires must be unix seconds")
    expires = int(expires_text)
    if not verify(signing_key, method, key, expires, sig):
        raise SignatureError("signature does not match")
    if (time.time() if now is None else now) >= expires:
        raise UrlExpired("signed URL has expired")
