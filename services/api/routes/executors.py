"""The executor protocol: register, long-poll claim, heartbeat, deregister; and the executor list."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

from aiohttp import web

from minions import jsoncodec, protocol
from minions.config import Settings
from minions.db.queries import Queries
from minions.kinds import KINDS
from minions.logging import get_logger
from minions.names import FINGERPRINT, FINGERPRINT_RULE, NAME
from minions.nul import NUL_RULE, nul_path, without_nul
from minions.services.api import spot_check
from minions.services.api.appkeys import CLUSTER, INPUTS, LEASES, POOL, SETTINGS, STORE, WAITERS
from minions.services.api.auth import Principal, require
from minions.services.api.bodies import TOKEN_LIST_BYTES, json_object, path_uuid, query_float, query_int
from minions.services.api.errors import ApiError, conflict, forbidden, invalid, not_found
from minions.services.api.input_cache import InputCache
from minions.services.api.messages import decode_body
from minions.services.api.responses import json_response
from minions.store.base import ObjectStore, StoreError

Q = Queries("api")
log = get_logger(__name__)
routes = web.RouteTableDef()
# Output URLs outlive any lease a heartbeating executor can hold in practice; they are keyed per
# attempt, so a late writer cannot harm a committed result (invariant 4). An input URL lasts the lease
# timeout plus MINIONS_INPUT_URL_MARGIN_S and is renewed by each heartbeat (`_input_url_s`).
URL_LIFETIME_S = 12 * 3600.0
# What a machine says of itself at registration; an agent's report (its hardware, the precision of each
# model it loaded) is a few hundred bytes. Every executor list carries it.
MAX_HARDWARE_BYTES = 8 * 1024
# A registration at its largest (1,024 model names of 256 characters, the hardware above) is under
# 300 KB; a larger body is refused before it is decoded.
MAX_REGISTRATION_BYTES = 1024 * 1024


def _strings(value: Any, field: str, errors: dict[str, str], limit: int = 256) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and 0 < len(v) <= 256 for v in value):
        errors[field] = "must be a list of non-empty strings"
        return []
    if len(value) > limit:
        errors[field] = f"at most {limit} entries"
    return list(dict.fromkeys(value))


LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}\Z")  # a precision or a backend name


def _fingerprints(value: Any, models: list[str], errors: dict[str, str]) -> list[dict[str, Any]]:
    """What the executor loaded for each model it serves: [{model, fingerprint, precision?, backend?,
    proofs?}]
    (docs/API.md). Absent (an agent from before fingerprints): none, and each model it serves counts
    as its own fingerprint ('unknown:<executor id>', sql/schema/05_executors.sql)."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 1024:
        errors["fingerprints"] = "must be a list of at most 1,024 {model, fingerprint, precision, backend} objects"
        return []
    served = set(models)
    seen: set[str] = set()
    found = []
    for i, entry in enumerate(value):
        where = f"fingerprints[{i}]"
        if not isinstance(entry, dict):  # other keys are ignored: a newer agent may report more
            errors[where] = "must be an object of model, fingerprint and optionally precision, backend"
            continue
        model, fingerprint = entry.get("model"), entry.get("fingerprint")
        if not isinstance(model, str) or model not in served:
            errors[f"{where}.model"] = "must be one of the models this registration names"
        elif model in seen:
            errors[f"{where}.model"] = "one fingerprint per model"
        if not isinstance(fingerprint, str) or not FINGERPRINT.match(fingerprint):
            errors[f"{where}.fingerprint"] = "must be " + FINGERPRINT_RULE
        for key in ("precision", "backend"):
            label = entry.get(key)
            if label is not None and (not isinstance(label, str) or not LABEL.match(label)):
                errors[f"{where}.{key}"] = "must be 1-32 characters of [A-Za-z0-9._-], or absent"
        proofs = entry.get("proofs")
        if proofs is not None and (type(proofs) is not int or not 1 <= proofs <= 100):
            errors[f"{where}.proofs"] = "must be the version of the proofs of generation it makes (1-100), or absent"
        if isinstance(model, str):
            seen.add(model)
        found.append({"model": model, "fingerprint": fingerprint, "precision": entry.get("precision"),
                      "backend": entry.get("backend"), "proofs": proofs})
    return found


def _preferences(value: Any, principal: Principal, errors: dict[str, str]) -> list[dict[str, str | None]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 32:
        errors["preferences"] = "must be a list of at most 32 {team, project, task_name} objects"
        return []
    prefs = []
    for i, pref in enumerate(value):
        if not isinstance(pref, dict):
            errors[f"preferences[{i}]"] = "must be an object"
            continue
        entry: dict[str, str | None] = {}
        for key in ("team", "project", "task_name"):
            item = pref.get(key)
            if item is not None and (not isinstance(item, str) or not NAME.match(item)):
                errors[f"preferences[{i}].{key}"] = "not a valid name"
            entry[key] = item
        if entry["team"] is None:
            errors[f"preferences[{i}].team"] = "required"
        elif entry["task_name"] is not None and entry["project"] is None:
            errors[f"preferences[{i}].project"] = "required when task_name is given"
        elif principal.team is not None and entry["team"] != principal.team:
            errors[f"preferences[{i}].team"] = f"your token only claims work of team {principal.team}"
        prefs.append(entry)
    return prefs


@routes.post("/api/v1/executors/register")
async def register(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    body = await json_object(request, limit=MAX_REGISTRATION_BYTES)
    errors: dict[str, str] = {}
    name = body.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= 128:
        errors["name"] = "required: 1-128 characters"
    hardware = body.get("hardware", {})
    if not isinstance(hardware, dict):
        errors["hardware"] = "must be an object"
    elif len(jsoncodec.dumps(hardware)) > MAX_HARDWARE_BYTES:
        errors["hardware"] = f"at most {MAX_HARDWARE_BYTES:,} bytes as JSON"
    for key in ("name", "models"):
        if key not in errors and (where := nul_path(body.get(key), key)) is not None:
            errors[where] = NUL_RULE
    kinds = _strings(body.get("kinds"), "kinds", errors)
    if not kinds and "kinds" not in errors:
        errors["kinds"] = f"required: a non-empty list drawn from {', '.join(KINDS)}"
    elif bad := [k for k in kinds if k not in KINDS]:
        errors["kinds"] = f"unknown kind(s) {', '.join(bad)}; known: {', '.join(KINDS)}"
    models = _strings(body.get("models"), "models", errors, limit=1024)
    fingerprints = _fingerprints(body.get("fingerprints"), models, errors)
    prefs = _preferences(body.get("preferences"), principal, errors)
    if errors:
        raise invalid(errors)
    settings = request.app[SETTINGS]
    # One transaction: the leases this registration ends are recorded with the fingerprints they ran
    # with, and no claim sees the executor's new models with its old fingerprints.
    async with request.app[POOL].acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            Q.register_executor, principal.token_id, principal.team, name, without_nul(hardware), kinds, models,
            prefs, settings.max_executors_per_token, settings.registrations_per_minute,
        )
        _refuse_registration(row, settings)
        executor_id = row["executor_id"]
        await conn.execute(Q.set_executor_fingerprints, executor_id, fingerprints)
    log.info("executor_registered", executor_id=str(executor_id), name=name, kinds=kinds, models=models,
             fingerprints=len(fingerprints))
    return json_response(protocol.to_builtins(protocol.Registered(
        executor_id=str(executor_id), heartbeat_interval_s=settings.heartbeat_interval_s,
        lease_timeout_s=request.app[CLUSTER].lease_timeout_s, long_poll_s=settings.long_poll_s,
        max_claim=settings.max_claim, inline_output_bytes=settings.inline_output_bytes)), 201)


def _refuse_registration(row: Any, settings: Settings) -> None:
    """The error a registration verdict other than 'ok' stands for (sql/schema/05_executors.sql)."""
    if row["verdict"] == "too_many_models":
        raise invalid({"models": "this token's executors would advertise more than 1,024 distinct models, the "
                                 "most one token may; advertise the models this machine serves"})
    if row["verdict"] == "too_many_executors":
        raise forbidden(f"this token holds {settings.max_executors_per_token:,} executor names already, the most "
                        "one token may register (MINIONS_MAX_EXECUTORS_PER_TOKEN); register again under one of "
                        "them, or use another token", "too_many_executors")
    if row["verdict"] == "too_many_registrations":
        raise ApiError(429, "too_many_registrations",
                       f"this token registered {settings.registrations_per_minute:,} new executor names in the "
                       "last minute, the most one token may (MINIONS_REGISTRATIONS_PER_MINUTE); retry after "
                       f"{row['retry_after_s']} s", headers={"Retry-After": str(row["retry_after_s"])})


async def _own_executor(request: web.Request) -> Any:
    principal = require(request, "executor")
    executor_id = path_uuid(request, "executor_id", "executor")
    row = await request.app[POOL].fetchrow(Q.executor_for_token, executor_id)
    if row is None:
        raise not_found(f"executor {executor_id}")
    if principal.role != "admin" and row["token_id"] != principal.token_id:
        raise forbidden("this executor was registered with another token", "not_your_executor")
    return row


def _caller(request: web.Request) -> tuple[uuid.UUID, int | None]:
    """The executor of the path, and the caller's API token the SQL checks it against (None: an
    admin, who may act for any executor)."""
    principal = require(request, "executor")
    executor_id = path_uuid(request, "executor_id", "executor")
    return executor_id, None if principal.role == "admin" else principal.token_id


def _refuse(verdict: str, executor_id: uuid.UUID) -> None:
    """The error a claim or heartbeat verdict other than a lease (or 'ok', 'empty') stands for."""
    if verdict == "not_found":
        raise not_found(f"executor {executor_id}")
    if verdict == "not_your_executor":
        raise forbidden("this executor was registered with another token", "not_your_executor")
    if verdict == "deregistered":
        raise ApiError(409, "deregistered", "this executor deregistered; register again to claim work")


@routes.post("/api/v1/executors/{executor_id}/claim")
async def claim(request: web.Request) -> web.Response:
    """One statement per try (minion_claim_batch: the executor check and up to `max` claims), and
    none while waiting: a wait that times out answers 204 without asking again."""
    executor_id, owner = _caller(request)
    settings = request.app[SETTINGS]
    # A longer wait than the server allows is cut to its longest, not refused; so is a larger max.
    wait = min(query_float(request, "wait", settings.long_poll_s, 0, 86400), settings.long_poll_s)
    # Without `max`, the first protocol's single lease; with it, a LeaseBatch of up to that many.
    batched = bool(request.query.get("max"))
    # params=once: each task's params once per answer (params_from), not once per lease.
    sharing = request.query.get("params") or "each"  # empty reads as absent, as for every query parameter
    if sharing not in ("each", "once"):
        raise invalid({"params": "each or once"})
    most = min(query_int(request, "max", 1, 1, protocol.MAX_NUMBER), settings.max_claim)
    pool, waiters = request.app[POOL], request.app[WAITERS]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    # Registered before the first query (woken by anything until the executor's capabilities are
    # known), so a notification landing during a query is not missed.
    with waiters.registered() as waiter:
        while True:
            # aiohttp lets a handler run on after its client hung up: a long poll of an executor
            # that died (kill -9, crash) must not win a lease nobody will ever hear of. (After a
            # quick restart under the same name that lease would never be reclaimed: the new
            # process keeps the executor's heartbeat fresh.)
            if _hung_up(request):
                return web.Response(status=204)
            rows = await pool.fetch(Q.claim_batch, executor_id, owner, most, settings.straggler_factor)
            verdict = rows[0]["verdict"]
            if verdict == "leased":
                return await _answer(request, rows, batched=batched, params_once=sharing == "once")
            if verdict == "quarantined":  # sql/schema/11_checks.sql: its results lost quorums
                reason = await pool.fetchval(Q.quarantine_reason, executor_id)
                raise forbidden(f"this executor is quarantined: {reason}; an admin may release it "
                                "(minions executor release)", "quarantined")
            _refuse(verdict, executor_id)
            waiter.capabilities = frozenset(rows[0]["capabilities"])
            remaining = deadline - loop.time()
            # A process shutting down answers at once (ClaimWaiters.close), before and after a wait.
            if waiters.closing or remaining <= 0 or not await waiter.wait(remaining) or waiters.closing:
                return web.Response(status=204)


def _hung_up(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _answer(request: web.Request, rows: list[Any], *, batched: bool, params_once: bool = False) -> web.Response:
    """The leases won, as one Lease (a claim without `max`: the first protocol's answer) or a
    LeaseBatch (each task's params sent once with `params_once`); handed back at once when the
    executor cannot be told."""
    pool = request.app[POOL]
    try:
        if _hung_up(request):
            raise ConnectionResetError
        inputs = await _inline_inputs(request.app[STORE], request.app[INPUTS], rows,
                                      request.app[SETTINGS].inline_input_bytes)
        if any(row["input_uri"] is None and data is None for row, data in zip(rows, inputs, strict=True)):
            # The claim's statement read every kept range (minion_kept_input sees what the claim saw):
            # none means the task was deleted meanwhile, as when a store read fails.
            raise StoreError("the kept input of a task claimed is gone")
        checks = await _replica_checks(request, rows)
        leases = await asyncio.gather(*(_lease(request, row, data, checks.get(row["lease_token"]))
                                        for row, data in zip(rows, inputs, strict=True)))
    except (StoreError, ConnectionResetError):
        # The claim committed but the executor cannot be told: hand it back now rather than leave
        # it to the watchdog (the executor keeps heartbeating).
        for row in rows:
            await pool.fetchval(Q.release, row["lease_token"])
        if _hung_up(request):
            return web.Response(status=204)
        raise
    facts = request.app[LEASES]
    for row, data in zip(rows, inputs, strict=True):
        facts.remember(row, data)
    message: protocol.Lease | protocol.LeaseBatch = leases[0]
    if batched:
        message = protocol.LeaseBatch(leases=leases)
        if params_once:
            message = message.sharing_params()
    return json_response(protocol.to_builtins(message))


def _input_url_s(request: web.Request) -> float:
    """How long an input URL handed out now works: as long as the lease would without another
    heartbeat, plus the margin (clock skew between this host and the store, a GET begun at the end)."""
    return request.app[CLUSTER].lease_timeout_s + request.app[SETTINGS].input_url_margin_s


async def _replica_checks(request: web.Request, rows: list[Any]) -> dict[Any, protocol.CheckRef]:
    """What each completion lease that is a spot check's replica checks: the held results, whose
    proofs of generation it verifies instead of generating (agents' transformers backend). Other
    kinds are compared as they come, and are not told."""
    tokens = [row["lease_token"] for row in rows if row["kind"] == "completion"]
    if not tokens:
        return {}
    held: dict[Any, list[str]] = {}
    store = request.app[STORE]
    for row in await request.app[POOL].fetch(Q.replica_checks, tokens):
        try:
            output = await spot_check.held_bytes(store, row)
        except StoreError as exc:  # ResultCorrupted included
            # Not readable: not sent; the replica generates its own result, compared as any.
            log.warning("held_result_unreadable", lease=str(row["lease_token"]), error=str(exc))
            continue
        held.setdefault(row["lease_token"], []).append(output.decode())
    return {token: protocol.CheckRef(outputs=outputs) for token, outputs in held.items()}


async def _lease(request: web.Request, row: Any, data: bytes | None,
                 check: protocol.CheckRef | None = None) -> protocol.Lease:
    store = request.app[STORE]
    lifetime = max(URL_LIFETIME_S, 2 * request.app[CLUSTER].lease_timeout_s)
    start, end = row["byte_start"], row["byte_end"]
    return protocol.Lease(
        lease=protocol.LeaseTerms(token=str(row["lease_token"]), expires_at=row["expires_at"].isoformat(),
                                  backup=row["backup"]),
        subtask=protocol.LeasedSubtask(
            team=row["team"], project=row["project"], task_name=row["task_name"], subtask_id=row["subtask_id"],
            attempt=row["attempt"], kind=row["kind"], model=row["model"], params=row["params"],
            # A kept input (sql/schema/08_inputs.sql) has no object to GET: its range always rides inline. An object's
            # URL reads this lease's range alone, while the lease lives.
            input=protocol.InputRef(url=None if row["input_uri"] is None else
                                    await store.presign_input(row["input_uri"], start, end, row["lease_token"],
                                                              _input_url_s(request)),
                                    range=[start, end], records=row["records"], data=_as_text(data)),
            output=protocol.OutputRef(url=await store.presign_put(row["output_key"], lifetime)),
            check=check,
        ),
    )


async def _inline_inputs(store: ObjectStore, cache: InputCache, rows: list[Any], limit: int) -> list[bytes | None]:
    """Each lease's input range when the task's input is kept in the database (the claim read it), or
    when it is at most `limit` bytes (to ride in the answer: no GET for the executor), else None;
    None too when it cannot be read (the executor's GET meets the same trouble, and reports it as it
    always has). The ranges of one input object are read in one go when they lie close together (a
    batch's usually follow one another), and a small input object of this store's own is read whole
    once, for every claim after (`input_cache.py`)."""
    found: list[bytes | None] = [row["input_data"] for row in rows]  # kept inputs: read by the claim
    small: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        if row["input_uri"] is not None and row["byte_end"] - row["byte_start"] <= limit:
            small.setdefault(row["input_uri"], []).append(i)

    async def read(uri: str, members: list[int]) -> None:
        start = min(rows[i]["byte_start"] for i in members)
        end = max(rows[i]["byte_end"] for i in members)
        spans = [(rows[i]["byte_start"], rows[i]["byte_end"]) for i in members]
        if end - start > sum(e - s for s, e in spans) + limit:  # far apart: each on its own
            await asyncio.gather(*(read(uri, [i]) for i in members))
            return
        try:
            data = await cache.read_bytes(store, uri, start, end)
        except StoreError:
            return
        for i, (s, e) in zip(members, spans, strict=True):
            found[i] = data[s - start:e - start]

    await asyncio.gather(*(read(uri, members) for uri, members in small.items()))
    return found


def _as_text(data: bytes | None) -> str | None:
    """Inline input is JSONL text; bytes that are not UTF-8 are left to the executor's GET. (A kept
    input is always UTF-8: the API wrote it from validated records.)"""
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@routes.post("/api/v1/executors/{executor_id}/heartbeat")
async def heartbeat(request: web.Request) -> web.Response:
    executor_id, owner = _caller(request)
    beat = decode_body(await json_object(request, optional=True, limit=TOKEN_LIST_BYTES), protocol.Heartbeat,
                       {"leases": f"must be a list of at most {protocol.MAX_TOKENS} lease tokens (strings)"})
    named = {t: _as_uuid(t) for t in beat.leases}  # each token parsed once
    # Unparseable tokens were never leases; the executor still holds whatever it named.
    parsed = [u for u in named.values() if u is not None]
    rows = await request.app[POOL].fetch(Q.heartbeat_as, executor_id, owner, parsed)
    _refuse(rows[0]["verdict"], executor_id)
    states = {r["lease_token"]: r["state"] for r in rows[1:]}
    # A token that is not even a UUID was never a lease: it is lost, like any stale one.
    leases = {t: states.get(u, "lost") for t, u in named.items()}
    renewed = {t: u for t, u in named.items() if u is not None and leases[t] == "ok"}
    reply = protocol.HeartbeatReply(leases=leases, input_urls=await _input_urls(request, renewed))
    return json_response(protocol.to_builtins(reply))


async def _input_urls(request: web.Request, renewed: dict[str, uuid.UUID]) -> dict[str, str]:
    """A fresh input URL for each renewed lease whose range did not ride inline in its claim's
    answer (larger than MINIONS_INLINE_INPUT_BYTES, of an input object): the claim's URL lasts only
    the lease timeout plus the margin. What each lease reads is known from its claim here
    (lease_facts.py), else looked up (claimed through another API process, or before a restart)."""
    if not renewed:
        return {}
    known = request.app[LEASES]
    facts: dict[str, Any] = {t: known.get(u) for t, u in renewed.items()}
    if missing := [u for t, u in renewed.items() if facts[t] is None]:
        rows = {r["lease_token"]: r for r in await request.app[POOL].fetch(Q.lease_inputs, missing)}
        facts.update({t: rows.get(u) for t, u in renewed.items() if facts[t] is None})
    limit = request.app[SETTINGS].inline_input_bytes
    wanted = {t: f for t, f in facts.items()
              if f is not None and f["input_uri"] is not None and f["byte_end"] - f["byte_start"] > limit}
    if not wanted:
        return {}
    store, lifetime = request.app[STORE], _input_url_s(request)

    async def sign(token: str, f: Any) -> str | None:
        try:
            return await store.presign_input(f["input_uri"], f["byte_start"], f["byte_end"], renewed[token], lifetime)
        except (StoreError, ValueError) as exc:  # the claim's URL stays the executor's; not this beat's failure
            log.warning("input_url_not_renewed", error=str(exc))
            return None

    urls = await asyncio.gather(*(sign(t, f) for t, f in wanted.items()))
    return {t: url for t, url in zip(wanted, urls, strict=True) if url is not None}


def _as_uuid(token: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(token)
    except ValueError:
        return None


@routes.post("/api/v1/executors/{executor_id}/deregister")
async def deregister(request: web.Request) -> web.Response:
    executor = await _own_executor(request)
    released = await request.app[POOL].fetchval(Q.deregister, executor["id"])
    log.info("executor_deregistered", executor_id=str(executor["id"]), released=released)
    return json_response(protocol.to_builtins(protocol.Deregistered(status="offline", released=released)))


@routes.get("/api/v1/executors")
async def list_executors(request: web.Request) -> web.Response:
    principal = require(request, "user")
    team = request.query.get("team") or principal.team
    if team is not None and not NAME.match(team):
        raise invalid({"team": "not a valid name"})
    if principal.role != "admin" and principal.team is not None and team != principal.team:
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    # What a team sees of an executor outside it (a shared one) is narrowed in the query: no hardware,
    # none of other teams' preferences or work. Admins (and all-team tokens) see everything.
    scope = None if principal.role == "admin" else principal.team
    rows = await request.app[POOL].fetch(Q.list_executors, team, scope)
    return json_response({"executors": [
        {
            "id": str(r["id"]), "name": r["name"], "team": r["team"], "status": r["status"],
            "hardware": r["hardware"], "details_hidden": r["details_hidden"], "kinds": r["kinds"],
            "models": r["models"],
            "preferences": r["preferences"], "current": r["current"],
            "fingerprints": sorted(r["fingerprints"], key=lambda f: f["model"]),
            "trust": {"agreements": r["agreements"], "disagreements": r["disagreements"], "trusted": r["trusted"],
                      "vouched": r["vouched"], "owner": r["owner"],
                      "quarantined_at": r["quarantined_at"].isoformat() if r["quarantined_at"] else None,
                      "quarantine_reason": r["quarantine_reason"]},
            "registered_at": r["registered_at"].isoformat(),
            "last_heartbeat_at": r["last_heartbeat_at"].isoformat() if r["last_heartbeat_at"] else None,
        }
        for r in rows
    ]})


@routes.post("/api/v1/executors/{executor_id}/release")
async def release_quarantine(request: web.Request) -> web.Response:
    """An admin lifts a quarantine (sql/schema/11_checks.sql): the executor claims again, its results checked until it
    earns trust again."""
    require(request, "admin")
    executor_id = path_uuid(request, "executor_id", "executor")
    released = await request.app[POOL].fetchval(Q.release_quarantine, executor_id)
    if not released:
        raise conflict("not_quarantined", f"executor {executor_id} is not quarantined (or does not exist)")
    log.info("executor_quarantine_released", executor_id=str(executor_id))
    return json_response({"executor_id": str(executor_id), "quarantined": False})
