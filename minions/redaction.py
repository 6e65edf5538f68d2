"""The one redaction of secrets in text we log or show: API tokens, bearer headers, lease tokens in
paths, URL signatures (the local store's `sig`, S3's `X-Amz-*`), passwords in URLs.

Used by the logging pipeline (every event value) and by the API's representations of text that a
client sent (failure messages in `/subtasks`, the task's `error`, results' error lines), so a secret
that reaches either is replaced by `[redacted]` on the way out. Redaction keeps the shape of the
text (the URL, the key name) so the message still says what happened.

Failure text an executor writes (a fail's `error`, an `error` field in its output's records) gets
`redact_failure`: the above, and every UUID-shaped string too. A lease token is a random UUID, the
credential of its lease, and nothing tells one lease's token from another's, or from any other
UUID, by its shape; the ids a tenant needs to read a failure (tasks, subtasks, records) are not
UUIDs, so failure text loses nothing it needs by losing them all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

REDACTED = "[redacted]"

# Keys whose values are secrets whole, wherever they appear (log fields, JSON objects).
SECRET_KEYS = frozenset({
    "token", "lease_token", "admin_token", "executor_token", "authorization", "password", "secret",
    "signing_key", "sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
    "aws_secret_access_key", "aws_session_token",
})

_UUID = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
# A UUID standing alone (hyphens or none, any case, braces or `urn:uuid:` around it or not): not a
# piece of a longer run of hex digits (a SHA-256 is not 2 UUIDs).
_ANY_UUID = re.compile(r"(?<![0-9a-fA-F])" + _UUID + r"(?![0-9a-fA-F])")
# Each pattern with the (lower-case) words one of which a text must hold for the pattern to apply:
# a cheap `in` test spares the regular expressions on most values (event names, ids, times).
_PATTERNS: tuple[tuple[tuple[str, ...], re.Pattern[str], str], ...] = (
    # Credentials carried by a URL's query: local-store and S3 (SigV4 and V2) presigned URLs.
    (("sig", "token", "credential", "awsaccesskeyid"),
     re.compile(r"(?i)([?&;](?:sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|"
                r"awsaccesskeyid|token|access_token)=)[^&;#\s\"'<>]*"), r"\1" + REDACTED),
    # `Authorization: Bearer …` and the project's API tokens wherever they stand.
    (("bearer",), re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]+"), r"\1" + REDACTED),
    (("mn_",), re.compile(r"\bmn_[A-Za-z0-9_-]{8,}"), "mn_" + REDACTED),
    # A lease token is the credential of a lease: in its API path, and named in text.
    (("/leases/",), re.compile(r"(?i)(/leases/)" + _UUID), r"\1" + REDACTED),
    (("token",), re.compile(r"(?i)\b((?:lease[ _-]?)?token[\"']?\s*[:= ]\s*[\"']?)" + _UUID), r"\1" + REDACTED),
    # A password in a connection URL (postgresql://user:secret@host/db).
    (("@",), re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^:/@\s]+:)[^@/\s]+(@)"), r"\1" + REDACTED + r"\2"),
)


def redact(text: str, known: Iterable[str] = ()) -> str:
    """`text` with every secret it carries replaced by `[redacted]`; `known` names secrets the
    caller holds (a lease's own token), removed wherever they appear, in whatever spelling."""
    for secret in known:
        if secret:
            text = re.sub(re.escape(secret), REDACTED, text, flags=re.IGNORECASE)
    lower = text.lower()
    for words, pattern, replacement in _PATTERNS:
        if any(word in lower for word in words):
            text = pattern.sub(replacement, text)
    return text


def redact_failure(text: str, known: Iterable[str] = ()) -> str:
    """Failure text an executor wrote, as it may be stored, logged or shown: `redact`, and every
    UUID-shaped string (any lease's token, in any spelling) replaced by `[redacted]`."""
    return _ANY_UUID.sub(REDACTED, redact(text, known))


def redact_failure_value(value: Any) -> Any:
    """An executor's JSON `error` value (a string, or an object or list of them) with every string
    in it passed through `redact_failure`, and values under a secret key redacted whole."""
    if isinstance(value, str):
        return redact_failure(value)
    if isinstance(value, Mapping):
        return {k: REDACTED if str(k).lower() in SECRET_KEYS and v is not None else redact_failure_value(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_failure_value(v) for v in value]
    return value


def redact_value(value: Any, key: str | None = None) -> Any:
    """A JSON-like value with secrets redacted: values under a secret key whole, strings by text."""
    if key is not None and key.lower() in SECRET_KEYS and value is not None:
        return REDACTED
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_value(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


def redact_event(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor: redacts every field of every event (and a rendered traceback)."""
    return {key: redact_value(value, key) for key, value in event_dict.items()}
