"""URLs for executors: only the API hands them out, so signing lives here, not in the store.

An S3 store presigns with its own credentials (S3Store.presign_*). The local store's objects are
served by this API (store/routes.py) at URLs signed with the database's key and the API's address
as executors reach it (MINIONS_PUBLIC_URL, else host:port): `SignedLocalStore`. Everything else
(the splitter, the garbage collector, the CLI) opens a store with `open_store` and needs neither.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Protocol

from minions.store import signing
from minions.store.base import ObjectStore, validate_key
from minions.store.local import LocalStore


class SigningStore(ObjectStore, Protocol):
    """A store the API can hand out URLs for."""

    async def presign_get(self, uri: str, expires_s: float) -> str:
        """A URL that GETs the object (honouring Range) until it expires."""
        ...

    async def presign_input(self, uri: str, start: int, end: int, lease: uuid.UUID, expires_s: float) -> str:
        """A lease's input URL: a GET of bytes [start, end) of the object until it expires. The local
        store refuses any other bytes, and any request once the lease is not live; S3 signs the
        Range header (a request without it, or with another, fails its signature check)."""
        ...

    async def presign_put(self, key: str, expires_s: float) -> str:
        """A URL that takes one PUT of the whole object under `key` until it expires."""
        ...


class SignedLocalStore(LocalStore):
    """The local store as the API serves it: URLs at `base_url`, signed with `signing_key`."""

    def __init__(self, root: Path, signing_key: str, base_url: str) -> None:
        if not signing_key:
            # An empty key would make every signature forgeable by anyone who reads this code.
            raise ValueError("the local store's URLs need a non-empty signing key")
        super().__init__(root)
        self.signing_key = signing_key
        self.base_url = base_url.rstrip("/")

    async def presign_get(self, uri: str, expires_s: float) -> str:
        return signing.signed_url(self.base_url, self.signing_key, "GET", self.key_for(uri),
                                  signing.expiry(expires_s))

    async def presign_input(self, uri: str, start: int, end: int, lease: uuid.UUID, expires_s: float) -> str:
        return signing.signed_url(self.base_url, self.signing_key, "GET", self.key_for(uri),
                                  signing.expiry(expires_s), signing.Scope(lease, start, end))

    async def presign_put(self, key: str, expires_s: float) -> str:
        return signing.signed_url(self.base_url, self.signing_key, "PUT", validate_key(key),
                                  signing.expiry(expires_s))


def signing_store(store: ObjectStore, signing_key: str, base_url: str) -> SigningStore:
    """The opened store, able to hand out URLs: S3 as it is, a local folder signed by us."""
    if isinstance(store, LocalStore):
        return SignedLocalStore(store.root, signing_key, base_url)
    from minions.store.s3 import S3Store  # not before: only an S3 store needs boto's (slow) import

    if isinstance(store, S3Store):
        return store
    raise ValueError(f"cannot hand out URLs for the store {store.root_uri}")
