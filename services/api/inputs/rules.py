"""Input objects: which team owns an upload, how large one may be, how many input bytes a team may
store, and which objects a task may name as its input (so one team can neither read another's
inputs nor fill the store).

The rules themselves are SQL (sql/schema/08_inputs.sql): ownership is a row per object,
written when the API stores it, so the check on `input.uri` asks the database, not a URI pattern."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from minions.config import Settings
from minions.names import is_name
from minions.services.api.gateway import ApiGateway
from minions.services.api.http.auth import Principal
from minions.services.api.http.errors import ApiError, forbidden, invalid


class TooLarge(ApiError):
    """413: a body over a size limit (the limit is in the message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(413, code, message)


def upload_team(request: web.Request, principal: Principal) -> str | None:
    """The team an upload belongs to: `?team=`, else the token's team; None for an unscoped token
    that names none (usable then only by unscoped submitters)."""
    team = request.query.get("team") or None
    if team is not None and not is_name(team):
        raise invalid({"team": "not a valid name"})
    if principal.role != "admin" and principal.team is not None:
        if team is not None and team != principal.team:
            raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
        return principal.team
    return team


def too_large(limit: int, what: str, setting: str) -> TooLarge:
    return TooLarge("too_large", f"{what} is over the limit of {limit:,} bytes ({setting})")


def quota_exceeded(team: str | None, used: int, quota: int) -> TooLarge:
    owner = f"team {team}" if team else "unscoped uploads"
    return TooLarge("quota_exceeded",
                    f"{owner} stores {used:,} of its {quota:,}-byte input quota (MINIONS_TEAM_INPUT_QUOTA_BYTES); "
                    "this input does not fit: delete finished tasks (or /v1 files) or ask an operator for more")


async def upload_cap(gateway: ApiGateway, settings: Settings, team: str | None,
                     content_length: int | None) -> tuple[int, TooLarge]:
    """The most bytes this upload may have, and the error to raise past it. Refused at once when the
    declared Content-Length is over it, before a byte is stored."""
    limit = settings.max_input_bytes
    cap, error = limit, too_large(limit, "the input", "MINIONS_MAX_INPUT_BYTES")
    quota = settings.team_input_quota_bytes
    if quota:
        used = await gateway.team_input_bytes(team=team)
        if quota - used < cap:
            cap, error = max(0, quota - used), quota_exceeded(team, used, quota)
    if content_length is not None and content_length > cap:
        raise error
    return cap, error


async def capped(chunks: AsyncIterator[bytes], cap: int, error: ApiError) -> AsyncIterator[bytes]:
    """`chunks`, raising `error` as soon as they pass `cap` bytes (the store then discards what it
    wrote: nothing over the limit is ever committed)."""
    received = 0
    async for chunk in chunks:
        received += len(chunk)
        if received > cap:
            raise error
        yield chunk


async def record_input(gateway: ApiGateway, settings: Settings, uri: str, team: str | None, size: int,
                       token_id: int) -> None:
    """Record `team`'s ownership of a stored input; 413 quota_exceeded (nothing recorded) when it
    does not fit the team's quota any more (a concurrent upload took the room)."""
    quota = settings.team_input_quota_bytes
    verdict = await gateway.record_input(uri=uri, team=team, size=size, token_id=token_id, quota=quota)
    if verdict != "ok":
        used = await gateway.team_input_bytes(team=team)
        raise quota_exceeded(team, used, quota)


async def may_use(gateway: ApiGateway, principal: Principal, team: str, uri: str) -> bool:
    """Whether a task of `team`, submitted by `principal`, may read `uri`."""
    verdict = await gateway.input_use(team=team, uri=uri, unscoped=principal.team is None,
                                      admin=principal.role == "admin")
    return verdict == "ok"


async def check_input_use(gateway: ApiGateway, principal: Principal, team: str, uri: str) -> None:
    """403 input_not_allowed unless a task of `team`, submitted by `principal`, may read `uri`."""
    if not await may_use(gateway, principal, team, uri):
        raise forbidden(f"input.uri is not an input team {team} may read: name an upload of the team "
                        "(POST /api/v1/inputs) or an s3:// prefix an operator allowed for it "
                        "(minions team allow-input)", "input_not_allowed")
