"""The OpenAPI document (services/api/openapi/document.py): a valid OpenAPI 3.0.3 document, in step with the
router (every route documented, every documented operation routed), its request schemas agreeing
with the server's own validation on known bodies, and served without a token.

tests/fuzz holds the live server to the document with schemathesis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

import tests.support.api
from minions.config import Settings
from minions.services.api.app import create_app
from minions.services.api.openapi import routes as openapi_routes
from minions.services.api.openapi.document import document
from tests.fuzz.live import app_with_openapi
from tests.support.api import running_api

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
SLEEP_TASK = {"team": "search", "project": "ranker", "name": "t1", "kind": "sleep",
              "input": {"records": [{"id": "a", "ms": 1}, {"id": "b", "ms": 1}]}}
API_MD_TASK = {"team": "search", "project": "ranker", "name": "emb-2026-11-29", "kind": "embedding",
               "model": "sentence-transformers/all-MiniLM-L6-v2", "input": {"records": [{"id": "a1", "text": "..."}]},
               "subtask_size": 500, "params": {"normalize": True, "max_length": 256}, "priority": 0}
API_MD_REGISTRATION = {
    "name": "anna-mbp", "hardware": {"os": "macOS 15.1", "chip": "Apple M3 Max", "memory_gb": 64, "device": "mps"},
    "kinds": ["embedding", "completion", "sleep"], "models": ["sentence-transformers/all-MiniLM-L6-v2", "llama3.2:1b"],
    "preferences": [{"team": "search", "project": "ranker", "task_name": None}]}


def _documented(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in doc["paths"].items() for method in item if method in METHODS}


def _routed(app: web.Application) -> set[tuple[str, str]]:
    """The client API's operations: /api/v1 less the store's signed-URL routes (not part of it, see the
    document's description), and OpenAI's /v1; HEAD is aiohttp's automatic twin of each GET."""
    operations = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        client_api = path.startswith(("/api/v1/", "/v1/")) and not path.startswith("/api/v1/store/")
        if route.method != "HEAD" and client_api:
            operations.add((route.method, path))
    return operations


def _validator(schema_name: str) -> OAS30Validator:
    registry: Registry[Any] = Registry().with_resource(
        "urn:minions-openapi", Resource.from_contents(document(), default_specification=DRAFT4))
    return OAS30Validator({"$ref": f"urn:minions-openapi#/components/schemas/{schema_name}"}, registry=registry)


def test_the_document_is_valid_openapi_3_0_3() -> None:
    for server in (None, "http://127.0.0.1:8080/"):
        doc = document(server)
        validate(doc)
        assert doc["openapi"] == "3.0.3"
    assert document("http://127.0.0.1:8080/")["servers"] == [{"url": "http://127.0.0.1:8080"}]


def test_every_route_is_documented_and_every_documented_operation_is_routed() -> None:
    app = create_app(Settings(database_url="postgresql://127.0.0.1:1/unused", store="file:///unused"))
    routed, documented = _routed(app), _documented(document())
    assert routed - documented == set(), "routes missing from minions.services/api/openapi/document.py"
    assert documented - routed == set(), "documented operations the app does not route"


def test_security_and_shared_errors() -> None:
    for path, item in document()["paths"].items():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            responses = operation["responses"]
            assert "503" in responses and "500" not in responses, (method, path)
            if path == "/api/v1/health":
                assert operation["security"] == [] and "401" not in responses
            else:
                assert "security" not in operation and "401" in responses, (method, path)
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    assert response.get("$ref") or response["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/Error"}, (method, path, status)


@pytest.mark.parametrize("body", [
    SLEEP_TASK,
    API_MD_TASK,
    {**SLEEP_TASK, "input": {"uri": "s3://bucket/key.jsonl"}, "subtask_size": None, "params": None},
    {**SLEEP_TASK, "kind": "completion", "model": "llama3.2:1b", "params": {"temperature": 0.2, "seed": -1},
     "input": {"records": [{"id": 1, "prompt": "hi"}, {"id": "2", "messages": [{"role": "user", "content": "hi"}]}]}},
])
def test_task_schema_accepts_what_the_server_accepts(body: dict[str, Any]) -> None:
    _validator("TaskRequest").validate(body)


@pytest.mark.parametrize("body", [
    {**SLEEP_TASK, "colour": "red"},                                      # unknown field
    {**SLEEP_TASK, "team": "bad team!"},
    {**SLEEP_TASK, "kind": "teleport"},
    {**API_MD_TASK, "model": None},
    {k: v for k, v in API_MD_TASK.items() if k != "model"},             # model required but for sleep
    {**API_MD_TASK, "params": {"temperature": 1}},                       # a completion param
    {**SLEEP_TASK, "params": {"normalize": True}},
    {**SLEEP_TASK, "subtask_size": 0},
    {**SLEEP_TASK, "priority": 1001},
    {**SLEEP_TASK, "input": {"records": []}},
    {**SLEEP_TASK, "input": {"records": [{"id": "a", "ms": 1}], "uri": "s3://b/k"}},
    {**SLEEP_TASK, "input": {"records": [{"id": True, "ms": 1}]}},
    {**SLEEP_TASK, "input": {"records": [{"id": "a", "ms": -1}]}},
    {**SLEEP_TASK, "kind": "completion", "model": "m",
     "input": {"records": [{"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}]}},
])
def test_task_schema_rejects_what_the_server_rejects(body: dict[str, Any]) -> None:
    assert not _validator("TaskRequest").is_valid(body)


def test_executor_schemas_match_the_server() -> None:
    registration = _validator("ExecutorRegistration")
    registration.validate(API_MD_REGISTRATION)
    registration.validate({"name": "x", "kinds": ["sleep"], "unknown": "ignored by the server"})
    for bad in ({"name": "", "kinds": ["sleep"]}, {"name": "x", "kinds": []}, {"name": "x", "kinds": ["gpu"]},
                {"name": "x", "kinds": ["sleep"], "preferences": [{"project": "p"}]},
                {"name": "x", "kinds": ["sleep"], "preferences": [{"team": "t", "task_name": "n"}]},
                {"name": "x", "kinds": ["sleep"], "preferences": [{"team": "t", "project": None, "task_name": "n"}]}):
        assert not registration.is_valid(bad), bad
    _validator("Completion").validate({"records": 500, "seconds": 12.3})
    assert not _validator("Completion").is_valid({"records": -1})
    _validator("Failure").validate({"error": "out of memory", "retryable": True})
    assert not _validator("Failure").is_valid({"error": "  "})


async def test_served_without_a_token(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The harness's app, with the OpenAPI route (a no-op once app.py registers it itself).
    monkeypatch.setattr(tests.support.api, "create_app", app_with_openapi)
    async with running_api(database_url, tmp_path / "store") as api:
        reply = await api.call("GET", openapi_routes.PATH, token=None)
        assert reply.status == 200, reply.body
        assert reply.headers["Content-Type"].startswith("application/json")
        assert reply.body == document()
