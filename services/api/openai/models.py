"""/v1/models: the models the pool knows (every model an executor has ever advertised, for some
kind), in OpenAI's shape, with the kinds each is known for and whether an executor online now
serves it."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from minions.services.api.http.auth import require
from minions.services.api.http.responses import json_response
from minions.services.api.openai.gateway import ModelRow, openai_gateway
from minions.services.api.openai.model_errors import model_not_found
from minions.services.api.openai.objects import unix

routes = web.RouteTableDef()
OWNER = "minions"


def model_object(row: ModelRow) -> dict[str, Any]:
    return {"id": row["model"], "object": "model", "created": unix(row["advertised_at"]), "owned_by": OWNER,
            "kinds": list(row["kinds"]), "online": row["online"]}


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    require(request, "user")
    rows = await openai_gateway(request.app).known_models(model=None)
    return json_response({"object": "list", "data": [model_object(r) for r in rows]})


# Model names hold '/' (an organisation's, on Hugging Face): the path's rest is the name, sent as
# as is or percent-encoded (the official client sends it as one segment, '/' as %2F).
@routes.get("/v1/models/{model:.+}")
async def show_model(request: web.Request) -> web.Response:
    require(request, "user")
    model = request.match_info["model"]  # aiohttp decoded it (%2F included)
    if "\x00" in model:
        raise model_not_found(model)  # no model holds one (and the database takes none)
    rows = await openai_gateway(request.app).known_models(model=model)
    if not rows:
        raise model_not_found(model)
    return json_response(model_object(rows[0]))
