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


async def connect(url: str, **kwargs: Any) -> asyncpg.Connection:
    conn = await asyncpg.connect(url, timeout=kwargs.pop("timeout", 10), **kwargs)
    await _init_connection(conn)
    return conn


async def _reset_open_transaction(conn: asyncpg.Connection) -> None:
    if conn.is_in_transaction():
        await conn.reset()


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10, stateless: bool = False,
                      **kwargs: Any) -> asyncpg.Pool:
    """`stateless`: the pool's users never leave session state on a connection (no LISTEN, SET or
    session advisory lock), so a connection going back to the pool needs no reset round trip (asyncpg's
    default sends one on every release: half of an idle API's statements), only a rollback of a
    transaction left open."""
    if stateless:
        kwargs["reset"] = _reset_open_transaction
    pool = await asyncpg.create_pool(
        url, min_size=min_size, max_size=max_size, init=_init_connection, timeout=10, **kwargs
    )
    assert pool is not None
    return pool
