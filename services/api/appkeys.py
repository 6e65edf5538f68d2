"""Typed application state of the API (aiohttp `AppKey`s), attached by `cleanup_ctx` in app.py."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import asyncpg
from aiohttp import web

from minions.cluster_settings import LiveClusterSettings
from minions.config import Settings
from minions.services.api.gateway import ApiGateway
from minions.services.api.http.auth import TokenCache
from minions.services.api.leasing.claim_waiters import ClaimWaiters
from minions.services.api.leasing.input_cache import InputCache
from minions.services.api.leasing.lease_facts import LeaseFacts
from minions.services.api.store.url_signing import SigningStore

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
# The one door to the database (gateway.py) every handler uses, on POOL.
GATEWAY = web.AppKey("gateway", ApiGateway)
# The cluster-wide values (lease timeout, max attempts) as the database holds them, kept current.
CLUSTER = web.AppKey("cluster", LiveClusterSettings)
STORE = web.AppKey("store", SigningStore)
WAITERS = web.AppKey("waiters", ClaimWaiters)
TOKENS = web.AppKey("tokens", TokenCache)
LEASES = web.AppKey("leases", LeaseFacts)  # what each lease handed out here is (lease_facts.py)
INPUTS = web.AppKey("inputs", InputCache)  # small input objects, whole, for inline ranges (input_cache.py)
# Whether the local store may take a PUT of this key now: only the output key of a live lease
# (set from the database in app.py; a server without it takes no PUT at all).
OUTPUT_WRITABLE = web.AppKey[Callable[[str], Awaitable[bool]]]("output_writable")
# Whether the local store may serve a lease's input URL now: only while that lease (token, start,
# end) is live (set from the database in app.py; a server without it serves no input URL at all).
INPUT_READABLE = web.AppKey[Callable[[uuid.UUID, int, int], Awaitable[bool]]]("input_readable")
