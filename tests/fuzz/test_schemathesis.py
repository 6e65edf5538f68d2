"""Fuzzing the live API against its OpenAPI document (services/api/openapi/document.py) with schemathesis.

Every operation gets valid and invalid requests (the examples, coverage and fuzzing phases), sent to a
real server over a real socket, and each response is checked: no 5xx, a status code, content type,
body and headers the document declares, and authentication enforced. The executor protocol is called
with an executor token, the rest with an admin token; now and then a path parameter is swapped for a
real identifier (a seeded task, executor or lease), so requests get past "404 not found".

MINIONS_FUZZ_EXAMPLES sets the fuzzing phase's examples per operation: the default keeps the run
short enough for every `make test`; try a few hundred for a long run. MINIONS_FUZZ_SEED fixes the
seed (default 0, so CI is reproducible; "random" for a new one each run).
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis.core.parameters import ParameterLocation

from minions.services.api.openapi.document import JSONL_MEDIA_TYPES, document
from tests.fuzz.live import LiveApi, Seeds, aim_at_served_model

EXAMPLES = int(os.environ.get("MINIONS_FUZZ_EXAMPLES", "100"))
SEED = os.environ.get("MINIONS_FUZZ_SEED", "0")

CONFIG = schemathesis.Config.from_dict({
    **({} if SEED == "random" else {"seed": int(SEED)}),
    # The server ignores query parameters it does not know, as HTTP servers do: not a negative case.
    "generation": {"max-examples": EXAMPLES, "database": "none", "allow-extra-parameters": False,
                   "with-security-parameters": False},
    "phases": {"stateful": {"enabled": False}},
    "operations": [{
        # Schema-valid yet refused with 422 by design: an input.uri this server cannot read, duplicate
        # record ids (submitTask); a record count other than the subtask's (completeLease); a
        # fingerprint of a model the registration does not name, or two of one model (registerExecutor);
        # a usage window of 0 or past ten years (getUsage).
        "include-operation-id": ["submitTask", "completeLease", "registerExecutor", "getUsage"],
        "checks": {"positive_data_acceptance": {"expected-statuses": [
            "2xx", "401", "403", "404", "409", "422", "429", "5xx"]}},
    }, {
        # Schema-valid yet refused by design: an `input_file_id` that names no file (404), a window
        # past 168 h or metadata that names no valid team or project (422).
        "include-operation-id": "createOpenAIBatch",
        "checks": {"positive_data_acceptance": {"expected-statuses": [
            "2xx", "401", "403", "404", "409", "422", "429", "5xx"]}},

    }, {
        # Schema-valid yet 422 by design: a team no token, task or executor names (`unknown_team`).
        "include-operation-id": "setTeamShare",
        "checks": {"positive_data_acceptance": {"expected-statuses": [
            "2xx", "401", "403", "404", "409", "422", "429", "5xx"]}},
    }, {
        # The body is opaque bytes to this endpoint (records are checked when the task is split), so
        # there is no "invalid" upload but an empty one. Schema-valid yet 422 by design: a `sha256`
        # that is not the body's.
        "include-operation-id": "uploadInput",
        "generation": {"mode": "positive"},
        "checks": {"positive_data_acceptance": {"expected-statuses": [
            "2xx", "401", "403", "404", "409", "422", "429", "5xx"]}},
    }],
})
schema = schemathesis.openapi.from_dict(document(), config=CONFIG)
NEGATIVE_DATA_REJECTION = schemathesis.checks.negative_data_rejection


@schemathesis.serializer(*JSONL_MEDIA_TYPES)
def _jsonl(ctx: schemathesis.SerializationContext, value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return json.dumps(value).encode() + b"\n"


def _token(case: schemathesis.Case[Any], live: LiveApi) -> str:
    # The executor protocol as an executor would call it; everything else as an admin.
    executor_protocol = case.path.startswith(("/api/v1/executors/", "/api/v1/leases/"))
    return live.executor if executor_protocol else live.admin


def _aim_at_seeds(case: schemathesis.Case[Any], data: st.DataObject, seeds: Seeds) -> None:
    """Half the time, replace valid path parameters with a real task, executor or lease."""
    params = case.path_parameters
    if not params or case.meta is None or case.meta.is_negative_at(ParameterLocation.PATH):
        return
    if not data.draw(st.booleans(), label="aim at a seeded identifier"):
        return
    if "executor_id" in params:
        params["executor_id"] = data.draw(st.sampled_from(seeds.executor_ids), label="executor_id")
    elif "token" in params:
        params["token"] = data.draw(st.sampled_from(seeds.lease_tokens), label="lease token")
    elif "team" in params:
        team, project, name = data.draw(st.sampled_from(seeds.tasks), label="task")
        params.update(team=team, project=project, name=name)
    elif "file_id" in params:
        params["file_id"] = data.draw(st.sampled_from(seeds.file_ids), label="file_id")
    elif "batch_id" in params:
        params["batch_id"] = data.draw(st.sampled_from(seeds.batch_ids), label="batch_id")


@schema.parametrize()
@schema.given(data=st.data())
def test_api_conforms_to_its_openapi_document(case: schemathesis.Case[Any], data: st.DataObject, live: LiveApi,
                                              http: requests.Session) -> None:
    _aim_at_seeds(case, data, live.seeds)
    headers = {"Authorization": f"Bearer {_token(case, live)}"}
    aim_at_served_model(case)
    response = case.call(base_url=live.url, session=http, headers=headers)
    case.validate_response(response, headers=headers,
                           excluded_checks=[NEGATIVE_DATA_REJECTION] if _lenient(case, response) else None,
                           transport_kwargs={"base_url": live.url, "session": http, "headers": headers})


def _lenient(case: schemathesis.Case[Any], response: schemathesis.Response) -> bool:
    """Requests the server accepts on purpose though the document cannot call them valid."""
    # A query parameter sent twice: the server reads the first value (aiohttp's `request.query.get`).
    keys = [key for key, _ in parse_qsl(urlsplit(response.request.url or "").query, keep_blank_values=True)]
    if len(keys) != len(set(keys)):
        return True
    # A blank body ("\n") where a body is optional (heartbeat): read as no body.
    body = response.request.body
    blank = body is None or not (body.strip() if isinstance(body, bytes | str) else True)
    return bool(case.meta and case.meta.is_negative_at(ParameterLocation.BODY) and blank)
