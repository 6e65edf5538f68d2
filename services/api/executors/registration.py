"""Registration: an executor says what it is (name, hardware, kinds, models, the fingerprint and
precision of each model it loaded, the work it prefers) and gets its id and the cluster's terms. The
body is judged here, field by field; the bounds per token (executors, models, registrations a minute)
are the SQL's (minion_register_executor_bounded)."""

from __future__ import annotations

import re
from typing import Any

from minions import jsoncodec, protocol
from minions.config import Settings
from minions.kinds import KINDS
from minions.logging import get_logger
from minions.names import FINGERPRINT, FINGERPRINT_RULE, NAME
from minions.nul import NUL_RULE, nul_path, without_nul
from minions.services.api.context import Context
from minions.services.api.gateway import RegistrationRow
from minions.services.api.http.auth import Principal
from minions.services.api.http.errors import ApiError, forbidden, invalid

log = get_logger(__name__)
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


async def register(ctx: Context, principal: Principal, body: dict[str, Any]) -> protocol.Registered:
    """The executor registered (or registered again under its name), or 422 naming each bad field,
    or the bound of the token it is past."""
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
    assert isinstance(name, str)
    settings = ctx.settings
    # One transaction: the leases this registration ends are recorded with the fingerprints they ran
    # with, and no claim sees the executor's new models with its old fingerprints.
    async with ctx.gateway.transaction() as db:
        row = await db.register_executor(
            token_id=principal.token_id, team=principal.team, name=name, hardware=without_nul(hardware),
            kinds=kinds, models=models, preferences=prefs, max_per_token=settings.max_executors_per_token,
            per_minute=settings.registrations_per_minute)
        _refuse_registration(row, settings)
        executor_id = row["executor_id"]
        assert executor_id is not None  # registered: _refuse_registration raised otherwise
        await db.set_executor_fingerprints(executor_id=executor_id, fingerprints=fingerprints)
    log.info("executor_registered", executor_id=str(executor_id), name=name, kinds=kinds, models=models,
             fingerprints=len(fingerprints))
    return protocol.Registered(
        executor_id=str(executor_id), heartbeat_interval_s=settings.heartbeat_interval_s,
        lease_timeout_s=ctx.cluster.lease_timeout_s, long_poll_s=settings.long_poll_s,
        max_claim=settings.max_claim, inline_output_bytes=settings.inline_output_bytes)


def _refuse_registration(row: RegistrationRow, settings: Settings) -> None:
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
