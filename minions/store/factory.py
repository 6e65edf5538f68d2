"""Open the configured object store from its URI (`MINIONS_STORE`)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from minions.private_files import DIR_MODE, make_private_dir, tighten
from minions.store.base import ObjectStore
from minions.store.local import LocalStore

_HAS_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def open_store(store_uri: str, *, s3_endpoint_url: str = "") -> ObjectStore:
    """`s3://bucket[/prefix]` -> S3Store; `file:///abs/path` or a plain path -> LocalStore (the folder
    is created). To read and write only: URLs for executors are the API's (services/api/store/url_signing.py)."""
    if not store_uri:
        raise ValueError("no object store configured: set MINIONS_STORE to s3://bucket/prefix or file:///path")
    if store_uri.startswith("s3://"):
        # Imported only for an S3 store: aioboto3 and botocore take most of a second to import, which
        # every service, CLI command and agent on a local store would otherwise pay at start.
        from minions.store.s3 import S3Store

        return S3Store(store_uri, s3_endpoint_url or None)
    if store_uri.startswith("file://"):
        parts = urlsplit(store_uri)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment or not parts.path:
            raise ValueError(f"object store URI must be file:///absolute/path, not {store_uri!r}")
        root = Path(unquote(parts.path))
    elif _HAS_SCHEME.match(store_uri):
        raise ValueError(f"unsupported object store {store_uri!r}: use s3://bucket/prefix or file:///path")
    else:
        root = Path(store_uri).expanduser()
    # One mkdir at start-up, before any event loop work depends on the store: not worth a thread.
    # Owner-only: it holds every team's inputs and results. A root of ours that an older version
    # left open to others is closed, which also closes everything under it.
    try:
        make_private_dir(root)
        tighten(root, DIR_MODE)
    except OSError as e:
        raise ValueError(f"cannot create the object store folder {root}: {e}") from e
    return LocalStore(root)
