"""An input upload (`POST /api/v1/inputs`) for clients without an S3 of their own: the body streamed to
the store within the team's quota and the size limit, content-addressed when the client names its
SHA-256 (the same bytes, the same object, checked against the hash as they stream), and recorded as
the team's (sql/schema/08_inputs.sql)."""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from collections.abc import AsyncIterator

from minions.services.api.context import Context
from minions.services.api.http.auth import Principal
from minions.services.api.http.errors import invalid
from minions.services.api.inputs import rules

SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class DigestMismatch(Exception):
    """An upload's body is not the bytes its `sha256` names."""


async def upload(ctx: Context, principal: Principal, team: str | None, body: AsyncIterator[bytes], *,
                 sha256: str | None, content_length: int | None) -> tuple[str, int, bool]:
    """The stored input's URI and size, and whether this call stored it (False: the same bytes were
    there already, and the caller's team may read them)."""
    gateway, store, settings = ctx.gateway, ctx.store, ctx.settings
    if sha256 is None:
        key = f"inputs/uploads/{uuid.uuid4().hex}.jsonl"
    else:
        # Content-addressed: the same bytes are the same object, so a client that submits the same
        # file twice submits the same input URI (the same task, not a conflict).
        if not SHA256_HEX.fullmatch(sha256):
            raise invalid({"sha256": "must be the body's SHA-256: 64 lowercase hex digits"})
        key = f"inputs/sha256/{sha256}.jsonl"
        stored = await store.size(store.uri_for(key))
        # Skipped only for a team that may already read them (or an admin, who may read anything):
        # knowing a hash must never be enough to gain another team's input, so anyone else sends the
        # bytes, checked against the hash.
        if stored and (principal.role == "admin" or (
                team is not None and await rules.may_use(gateway, principal, team, store.uri_for(key)))):
            return store.uri_for(key), stored, False
    cap, over = await rules.upload_cap(gateway, settings, team, content_length)
    digest = hashlib.sha256()

    async def checked() -> AsyncIterator[bytes]:
        async for chunk in body:
            if sha256 is not None:
                await asyncio.to_thread(digest.update, chunk)
            yield chunk
        if sha256 is not None and digest.hexdigest() != sha256:
            # Raised inside the stream: the store discards the object instead of committing it.
            raise DigestMismatch(digest.hexdigest())

    try:
        uri, size = await store.put_stream(key, rules.capped(checked(), cap, over))
    except DigestMismatch as exc:
        raise invalid({"sha256": f"does not match the body (its SHA-256 is {exc})"}) from None
    if size == 0:
        await store.delete(uri)
        raise invalid({"body": "empty input: send at least one JSONL record"})
    try:
        await rules.record_input(gateway, settings, uri, team, size, principal.token_id)
    except rules.TooLarge:
        if sha256 is None:  # a content-addressed object may be another team's too: gc judges it
            await store.delete(uri)
        raise
    return uri, size, True
