"""How the /v1 adapter joins the API application: its routes, and the listener that wakes the
interactive lane's handlers (it rides on the API's one LISTEN connection)."""

from __future__ import annotations

from aiohttp import web

from minions.services.api.openai import batches, files, interactive, models


def install(app: web.Application) -> None:
    app[interactive.TASK_ENDS] = interactive.TaskEnds()
    app.router.add_routes(files.routes)
    app.router.add_routes(batches.routes)
    app.router.add_routes(interactive.routes)
    app.router.add_routes(models.routes)


def listener(app: web.Application) -> interactive.TaskEnds:
    return app[interactive.TASK_ENDS]
