"""What a use case runs with: the application's parts (database gateway, object store, settings and the
process's shared state), read from the aiohttp application once per request, so use cases take one
argument instead of reaching into the app, and a test can build one from parts of its own."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from minions.cluster_settings import LiveClusterSettings
from minions.config import Settings
from minions.services.api.appkeys import CLUSTER, GATEWAY, INPUTS, LEASES, SETTINGS, STORE, WAITERS
from minions.services.api.gateway import ApiGateway
from minions.services.api.leasing.claim_waiters import ClaimWaiters
from minions.services.api.leasing.input_cache import InputCache
from minions.services.api.leasing.lease_facts import LeaseFacts
from minions.services.api.store.url_signing import SigningStore


@dataclass(frozen=True, slots=True)
class Context:
    gateway: ApiGateway
    store: SigningStore
    settings: Settings
    cluster: LiveClusterSettings
    leases: LeaseFacts  # what each lease handed out by this process is (lease_facts.py)
    inputs: InputCache  # small input objects, whole, for inline ranges (input_cache.py)
    waiters: ClaimWaiters

    @classmethod
    def of(cls, request: web.Request) -> Context:
        app = request.app
        return cls(app[GATEWAY], app[STORE], app[SETTINGS], app[CLUSTER], app[LEASES], app[INPUTS], app[WAITERS])
