"""The task a request's path names, as its caller may see it: a task of another team does not exist
for a scoped token (404, the same answer as a name nobody took)."""

from __future__ import annotations

from aiohttp import web

from minions.names import is_name
from minions.services.api.appkeys import GATEWAY
from minions.services.api.gateway import TaskRow
from minions.services.api.http.auth import Principal
from minions.services.api.http.errors import not_found


async def task_of_path(request: web.Request, principal: Principal) -> TaskRow:
    """The task of `/…/{team}/{project}/{name}`, or 404."""
    team, project, name = (request.match_info[k] for k in ("team", "project", "name"))
    if not (is_name(team) and is_name(project) and is_name(name)) or not principal.can_see_team(team):
        raise not_found(f"task {team}/{project}/{name}")  # other teams' tasks do not exist for you
    row = await request.app[GATEWAY].task_by_name(team=team, project=project, name=name)
    if row is None:
        raise not_found(f"task {team}/{project}/{name}")
    return row
