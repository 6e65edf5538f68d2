"""asyncpg connections and pools with the project's codecs (jsonb through orjson)."""

from __future__ import annotations

from typing import Any

import asyncpg

from minions import jsoncodec

# What a dropped or unreachable database looks like from asyncpg: the API answers these with 503
# and the services reconnect.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.ConnectionFailureError,
    TimeoutError,
)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb", schema="pg_catalog", encoder=jsoncodec.dumps_str, decoder=jsoncodec.loads, format="text"
    )
    await conn.set_type_codec(
        "json", schema="pg_catalog", encoder=jsoncodec.dumps_str, decoder=jsoncodec.loads, format="text"
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing to undo. asyncpg's default runs a reset query (advisory
    unlock all, CLOSE ALL, UNLISTEN *, RESET ALL) on every release, a round trip per request. Our
    pooled connections hold no session state: every LISTEN is on a connection of its own
    (minions/db/listen.py), session advisory locks are taken only on the splitter's and the
    migrator's own connections, nothing SETs a session variable, and cursors live inside
    transactions. An open transaction is still rolled back by asyncpg before this runs."""


async def connect(url: str, **kwargs: Any) -> asyncpg.Connection:
    conn = await asyncpg.connect(url, timeout=kwargs.pop("timeout", 10), **kwargs)
    await _init_connection(conn)
    return conn


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10, **kwargs: Any) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, init=_init_connection, reset=_keep_session,
        timeout=10, **kwargs
    )
    assert pool is not None
    return pool
