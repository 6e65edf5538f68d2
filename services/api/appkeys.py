"""Typed application state of the API (aiohttp `AppKey`s), attached by `cleanup_ctx` in app.py."""

from __future__ import annotations

import asyncpg
from aiohttp import web

from minions.config import Settings
from minions.services.api.auth import TokenCache
from minions.services.api.claim_waiters import ClaimWaiters
from minions.store.base import ObjectStore

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
STORE = web.AppKey("store", ObjectStore)
WAITERS = web.AppKey("waiters", ClaimWaiters)
TOKENS = web.AppKey("tokens", TokenCache)
