"""Requests that crashed the server (500), found by the fuzzer or by probing around its findings,
replayed on every run: each must get a status its operation documents, and never a 5xx.

A NUL character is legal JSON (`"\\u0000"`) but PostgreSQL takes it neither in text nor in jsonb;
numbers must fit the SQL types they are bound to; names must be names all the way to the database's
own check.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import requests

from minions.services.api.openapi.document import document
from tests.fuzz.live import FUZZ_MODEL, QUEUED, LiveApi

SLEEP_TASK = {"team": "search", "project": "ranker", "name": "regression", "kind": "sleep",
              "input": {"records": [{"id": "a", "ms": 1}]}}
COMPLETION_TASK = {**SLEEP_TASK, "kind": "completion", "model": "m", "input": {"records": [{"id": "a", "prompt": "x"}]}}
EXECUTOR = {"name": "regression", "kinds": ["sleep"]}
TOKEN = str(uuid.UUID(int=7))  # a lease token no lease has

def _case(case_id: str, method: str, operation: str, path: str, body: Any = None, role: str = "admin") -> Any:
    """One request: the operation as documented, the concrete path, a JSON body, whose token."""
    return pytest.param(method, operation, path, body, role, id=case_id)


CASES = [
    # task_fields.py check_fields: `kind in PARAMS` hashes kind, so a list or object kind is a TypeError.
    _case("task-kind-unhashable", "POST", "/api/v1/tasks", "/api/v1/tasks", {**SLEEP_TASK, "kind": [], "params": {}}),
    # minions/names.py: NAME.match with `$` lets a trailing newline through; the minion_name domain does not.
    _case("task-name-newline", "POST", "/api/v1/tasks", "/api/v1/tasks", {**SLEEP_TASK, "name": "regression\n"}),
    # NUL into text (tasks.model) and into jsonb (tasks.params).
    _case("task-model-nul", "POST", "/api/v1/tasks", "/api/v1/tasks", {**SLEEP_TASK, "model": "a\u0000b"}),
    _case("task-params-nul", "POST", "/api/v1/tasks", "/api/v1/tasks",
          {**COMPLETION_TASK, "params": {"system": "\u0000"}}),
    # tasks/routes.py list_tasks: a cursor past bigint, and one that str.isdigit() takes but int() does not.
    _case("list-cursor-bigint", "GET", "/api/v1/tasks", "/api/v1/tasks?cursor=99999999999999999999"),
    _case("list-cursor-superscript", "GET", "/api/v1/tasks", "/api/v1/tasks?cursor=%C2%B2"),
    # tasks/routes.py task_subtasks: the same isdigit()/int() mismatch for `after`.
    _case("subtasks-after-superscript", "GET", "/api/v1/tasks/{team}/{project}/{name}/subtasks",
          "/api/v1/tasks/search/ranker/fuzz-queued/subtasks?after=%C2%B2"),
    # tasks.py task_row: path names go to the database unchecked.
    _case("task-path-nul", "GET", "/api/v1/tasks/{team}/{project}/{name}", "/api/v1/tasks/search/ranker/a%00"),
    _case("cancel-path-nul", "POST", "/api/v1/tasks/{team}/{project}/{name}/cancel",
          "/api/v1/tasks/search/ranker/a%00/cancel"),
    _case("results-path-nul", "GET", "/api/v1/tasks/{team}/{project}/{name}/results",
          "/api/v1/tasks/search/ranker/a%00/results"),
    # executors.py register: NUL into executors.name (text), .models (text[]), .hardware (jsonb); a
    # preference team with a trailing newline into executor_preferences.team (minion_name).
    _case("register-name-nul", "POST", "/api/v1/executors/register", "/api/v1/executors/register",
          {**EXECUTOR, "name": "\u0000"}, "executor"),
    _case("register-models-nul", "POST", "/api/v1/executors/register", "/api/v1/executors/register",
          {**EXECUTOR, "models": ["\u0000"]}, "executor"),
    _case("register-hardware-nul", "POST", "/api/v1/executors/register", "/api/v1/executors/register",
          {**EXECUTOR, "hardware": {"os": "\u0000"}}, "executor"),
    _case("register-preference-newline", "POST", "/api/v1/executors/register", "/api/v1/executors/register",
          {**EXECUTOR, "preferences": [{"team": f"{QUEUED[0]}\n"}]}, "executor"),
    # leases.py: complete with records past int32 (minion_complete's p_records); fail with NUL into text.
    _case("complete-records-int32", "POST", "/api/v1/leases/{token}/complete", f"/api/v1/leases/{TOKEN}/complete",
          {"records": 2**31}, "executor"),
    _case("fail-error-nul", "POST", "/api/v1/leases/{token}/fail", f"/api/v1/leases/{TOKEN}/fail",
          {"error": "a\u0000b"}, "executor"),
    # /v1: NUL into openai_files.id lookups; a multipart body with no boundary.
    _case("v1-batch-file-nul", "POST", "/v1/batches", "/v1/batches",
          {"input_file_id": "file-\u0000", "endpoint": "/v1/embeddings", "completion_window": "24h"}),
    _case("v1-file-path-nul", "GET", "/v1/files/{file_id}", "/v1/files/file-%00"),
    _case("v1-files-after-nul", "GET", "/v1/files", "/v1/files?after=%00"),
    _case("v1-batch-path-nul", "POST", "/v1/batches/{batch_id}/cancel", "/v1/batches/batch_%00/cancel"),
    # batches.py create_batch and translate.py _chat: `x in DICT` hashes x, so an object or a list
    # endpoint or role was a TypeError.
    _case("v1-batch-endpoint-object", "POST", "/v1/batches", "/v1/batches",
          {"input_file_id": "file-x", "endpoint": {}, "completion_window": "24h"}),
    _case("v1-batch-endpoint-list", "POST", "/v1/batches", "/v1/batches",
          {"input_file_id": "file-x", "endpoint": ["/v1/embeddings"], "completion_window": "24h"}),
    _case("v1-chat-role-object", "POST", "/v1/chat/completions", "/v1/chat/completions",
          {"model": FUZZ_MODEL, "messages": [{"role": {}, "content": "hi"}]}),
    _case("v1-chat-role-list", "POST", "/v1/chat/completions", "/v1/chat/completions",
          {"model": FUZZ_MODEL, "messages": [{"role": ["user"], "content": "hi"}]}),
]


@pytest.mark.parametrize(("method", "operation", "path", "body", "role"), CASES)
def test_no_server_error(live: LiveApi, http: requests.Session, method: str, operation: str, path: str,
                         body: Any, role: str) -> None:
    token = live.admin if role == "admin" else live.executor
    response = http.request(method, live.url + path, json=body, headers={"Authorization": f"Bearer {token}"})
    documented = document()["paths"][operation][method.lower()]["responses"]
    assert response.status_code < 500 and str(response.status_code) in documented, (
        response.status_code, response.text)
    if response.status_code >= 400:
        assert response.json()["error"]["code"]  # every refusal is the shared error shape


def test_multipart_without_a_boundary_is_a_400(live: LiveApi, http: requests.Session) -> None:
    response = http.post(live.url + "/v1/files", data=b"--x\r\n", headers={
        "Authorization": f"Bearer {live.admin}", "Content-Type": "multipart/form-data"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "malformed_body"


@pytest.mark.parametrize(("path", "body", "answer"), [
    ("/v1/embeddings", {"input": ["a", "b"], "encoding_format": "base64"}, "list"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "chat.completion"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3}, "text_completion"),
])
def test_the_interactive_lane_answers_fuzzed_requests(live: LiveApi, http: requests.Session, path: str,
                                                      body: dict[str, Any], answer: str) -> None:
    """The fuzz run reaches the interactive lane's answers, not only its refusals: live.py's executor
    serves FUZZ_MODEL."""
    response = http.post(live.url + path, json={**body, "model": FUZZ_MODEL},
                         headers={"Authorization": f"Bearer {live.admin}"}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["object"] == answer
