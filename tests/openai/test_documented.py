"""/v1 is OpenAI's contract: every /v1 route the app serves is listed in docs/OPENAI.md (what of it
is supported), and nothing listed there is unrouted. (The OpenAPI document describes them too, as this
server takes and answers them: tests/api/test_openapi.py keeps it in step with the router.)"""

from __future__ import annotations

import re

from minions.config import Settings
from minions.services.api.app import create_app
from tests.support.paths import REPO


def test_every_v1_route_is_in_openai_md_and_every_listed_one_is_routed() -> None:
    app = create_app(Settings(database_url="postgresql://127.0.0.1:1/unused", store="file:///unused"))
    routed = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None and r.resource.canonical.startswith("/v1/") and r.method != "HEAD"}
    text = (REPO / "docs" / "OPENAI.md").read_text()
    listed = set(re.findall(r"^\| `(GET|POST|DELETE) (/v1/[^`]*)` \|", text, re.M))
    assert routed == listed
