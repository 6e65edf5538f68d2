"""The API application: built by a factory, resources attached with cleanup_ctx so start-up and
shut-down are symmetrical and each test can build a fresh app."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
from aiohttp import web

import minions.services.api.openai.wiring as openai_wiring  # OpenAI's API under /v1
from minions import cluster_settings
from minions.backoff import Backoff
from minions.config import Settings, check_lease_timeout
from minions.db.connect import CONNECTION_ERRORS, create_pool
from minions.logging import get_logger
from minions.services.api.admin import teams_routes, tokens_routes, usage_routes
from minions.services.api.appkeys import (
    CLUSTER,
    GATEWAY,
    INPUT_READABLE,
    INPUTS,
    LEASES,
    OUTPUT_WRITABLE,
    POOL,
    SETTINGS,
    STORE,
    TOKENS,
    WAITERS,
)
from minions.services.api.executors import routes as executor_routes
from minions.services.api.gateway import ApiGateway
from minions.services.api.http.auth import PRINCIPAL, TokenCache, authenticate
from minions.services.api.http.errors import ApiError, error_response
from minions.services.api.http.slow_clients import ClientLimits, body_deadline
from minions.services.api.inputs import routes as input_routes
from minions.services.api.leasing import routes as lease_routes
from minions.services.api.leasing.claim_waiters import ClaimWaiters
from minions.services.api.leasing.input_cache import InputCache
from minions.services.api.leasing.lease_facts import LeaseFacts
from minions.services.api.meta import health_routes, meta_routes
from minions.services.api.openai.gateway import OPENAI_GATEWAY, OpenAIGateway
from minions.services.api.openapi import routes as openapi_routes
from minions.services.api.results import routes as result_routes
from minions.services.api.store import routes as store_routes
from minions.services.api.store.url_signing import signing_store
from minions.services.api.tasks import routes as task_routes
from minions.services.api.ui import routes as ui_routes
from minions.spot_check_settings import spot_check_session
from minions.store.base import InvalidKey, ObjectNotFound, StoreError
from minions.store.factory import open_store

log = get_logger(__name__)
MAX_BODY_BYTES = 64 * 1024 * 1024  # inline records; larger inputs go through POST /api/v1/inputs
PUBLIC_PATHS = ("/api/v1/health", "/api/v1/store/", "/ui/", "/api/openapi.json", "/api/docs")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SchemaMissing(RuntimeError):
    """The database answers but was never migrated: waiting would not help."""


def create_app(settings: Settings) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[
        errors_middleware, body_deadline(ClientLimits.from_settings(settings)), auth_middleware])
    app[SETTINGS] = settings
    app[TOKENS] = TokenCache()
    app[LEASES] = LeaseFacts()
    app[INPUTS] = InputCache()
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_store)
    app.cleanup_ctx.append(_claim_waiters)
    app.on_shutdown.append(_release_waiting_claims)
    app.router.add_routes(health_routes.routes)
    app.router.add_routes(meta_routes.routes)
    openai_wiring.install(app)
    app.router.add_routes(task_routes.routes)
    app.router.add_routes(result_routes.routes)
    app.router.add_routes(input_routes.routes)
    app.router.add_routes(executor_routes.routes)
    app.router.add_routes(lease_routes.routes)
    app.router.add_routes(tokens_routes.routes)
    app.router.add_routes(usage_routes.routes)
    app.router.add_routes(teams_routes.routes)
    app.router.add_routes(ui_routes.routes)
    app.router.add_routes(openapi_routes.routes)
    store_routes.add_routes(app, settings.max_output_bytes)
    return app


async def _database(app: web.Application) -> AsyncIterator[None]:
    # min_size=0: the API starts (and answers 503) even while the database is down.
    pool = await create_pool(app[SETTINGS].database_url, min_size=0, max_size=20,
                             server_settings=spot_check_session(app[SETTINGS]))
    app[POOL] = pool
    gateway = app[GATEWAY] = ApiGateway(pool)
    app[OPENAI_GATEWAY] = OpenAIGateway(pool)

    async def output_writable(key: str) -> bool:
        return await gateway.output_writable(key=key)

    app[OUTPUT_WRITABLE] = output_writable

    async def input_readable(token: uuid.UUID, start: int, end: int) -> bool:
        return await gateway.input_readable(lease_token=token, start=start, end=end)

    app[INPUT_READABLE] = input_readable
    yield
    await pool.close()


async def _store(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    signing_key = await _signing_key(app[GATEWAY])
    app[CLUSTER] = await _cluster_settings(app[POOL], settings)
    store = signing_store(open_store(settings.store, s3_endpoint_url=settings.s3_endpoint_url),
                          signing_key, settings.url_for_executors)
    app[STORE] = store
    yield
    await store.close()


async def _cluster_settings(pool: asyncpg.Pool, settings: Settings) -> cluster_settings.LiveClusterSettings:
    """The lease timeout and max attempts from the database (kept current by NOTIFY minion_settings,
    heard by the claim waiters' connection). One that cannot work with our heartbeat interval is
    said loudly: executors would lose their leases between heartbeats."""
    current = await cluster_settings.read(pool)
    try:
        check_lease_timeout(current.lease_timeout_s, settings.heartbeat_interval_s)
    except ValueError as exc:
        log.error("lease_timeout_too_short", error=str(exc), hint="minions settings set lease_timeout_s SECONDS")
    return cluster_settings.LiveClusterSettings(pool, current)


async def _signing_key(gateway: ApiGateway) -> str:
    """The local store's URL-signing key lives in the database so every replica shares it. A service
    started before its database waits for it here, saying so, rather than crashing."""
    # The statement is read before the loop: a missing queries file is an OSError, which the loop
    # would take for an unreachable database and wait on forever (a broken install must fail).
    gateway.check_queries()
    backoff = Backoff(max_s=5.0)
    while True:
        try:
            return await gateway.store_signing_key()
        except CONNECTION_ERRORS as exc:
            log.warning("waiting_for_database", error=str(exc))
        except (asyncpg.exceptions.UndefinedFunctionError, asyncpg.exceptions.UndefinedTableError) as exc:
            raise SchemaMissing(f"the database has no Minions schema ({exc}); run `minions db migrate` "
                               "against it first") from None
        await backoff.sleep()


async def _claim_waiters(app: web.Application) -> AsyncIterator[None]:
    # The token cache listens on the same connection, for revocations; the /v1 lane for its tasks' ends.
    waiters = ClaimWaiters(app[SETTINGS].database_url, probe_interval_s=app[SETTINGS].listen_probe_s,
                           listeners=[app[TOKENS], openai_wiring.listener(app), app[CLUSTER]])
    await waiters.start()
    app[WAITERS] = waiters
    yield
    await waiters.stop()


async def _release_waiting_claims(app: web.Application) -> None:
    # on_shutdown runs once the listening socket is closed and before aiohttp waits for the
    # requests in flight: long-polls answer 204 now rather than hold the process's exit.
    if WAITERS in app:
        app[WAITERS].close()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    # The web UI's page and assets are public (its scripts send the token); "/" exactly, since every
    # path starts with it.
    if not (request.path == "/" or request.path.startswith(PUBLIC_PATHS)):
        request[PRINCIPAL] = await authenticate(request, request.app[TOKENS], request.app[GATEWAY])
    return await handler(request)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
        return error_response(exc.status, code, exc.reason, headers=headers)
    except (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError) as exc:
        # Transient by nature: the client's retry goes through.
        log.warning("database_conflict", path=request.path, error=str(exc))
        return error_response(503, "retry", "the database asked to retry; retry shortly",
                              headers={"Retry-After": "1"})
    except InvalidKey as exc:
        return error_response(422, "invalid", str(exc))
    except ObjectNotFound as exc:
        return error_response(404, "not_found", str(exc))
    except StoreError as exc:
        log.warning("store_unavailable", path=request.path, error=str(exc))
        return error_response(503, "store_unavailable", f"the object store failed: {exc}; retry shortly",
                              headers={"Retry-After": "2"})
    except CONNECTION_ERRORS as exc:
        if _client_gone(request):
            # The client hung up (mid-stream, say): nothing is wrong with the database, and no answer
            # can reach it. 499 is for the access log (nginx's "client closed request").
            log.debug("client_disconnected", path=request.path, error=str(exc))
            return web.Response(status=499)
        log.warning("database_unavailable", path=request.path, error=str(exc))
        return error_response(503, "database_unavailable", "the database is unreachable; retry shortly",
                              headers={"Retry-After": "2"})
    except asyncpg.exceptions.DataError as exc:
        # A value the database cannot hold that validation let through: the client's input, not a
        # crash. Logged, since validation should have caught it.
        log.warning("database_refused_value", path=request.path, error=str(exc))
        return error_response(422, "invalid", refused_value(exc))
    except asyncpg.PostgresError as exc:
        if isinstance(exc, asyncpg.exceptions.CannotConnectNowError | asyncpg.exceptions.AdminShutdownError):
            return error_response(503, "database_unavailable", "the database is restarting; retry shortly",
                                  headers={"Retry-After": "2"})
        log.exception("database_error", path=request.path)
        return error_response(500, "internal", "internal error (logged)")
    except Exception:
        log.exception("unhandled_error", path=request.path)
        return error_response(500, "internal", "internal error (logged)")



# What a client is told of a value PostgreSQL refused (by SQLSTATE): the kind of value, never the
# database's own text, which names encodings, types and internals that are not the client's business.
_REFUSED_VALUES = {
    "22021": "text holds a character that cannot be stored (a NUL, U+0000, or invalid UTF-8)",
    "22P05": "text holds a character that cannot be stored (a NUL, U+0000, or invalid UTF-8)",
    "22003": "a number is out of range",
    "22001": "a text value is too long",
    "22P02": "a value is not of the form its field takes",
    "22007": "a date or time is not valid",
    "22008": "a date or time is out of range",
}


def refused_value(exc: asyncpg.exceptions.DataError) -> str:
    """The 422's message for a value the database refused (asyncpg's DataError)."""
    what = _REFUSED_VALUES.get(str(getattr(exc, "sqlstate", "")))
    return f"a value cannot be stored: {what}" if what else "a value in the request cannot be stored as sent"

def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
