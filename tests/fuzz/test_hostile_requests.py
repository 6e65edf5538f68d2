"""Fuzzing what the OpenAPI run leaves alone: every operation, called with hostile
headers (an Authorization that is garbage, not UTF-8, or valid; extra headers of arbitrary bytes)
and, where it takes a JSON body, with a value nested 64 to 100,000 levels deep put into that body.
Whatever comes, no 5xx, and every error the app answers is in the project's JSON error shape.

Requests are the schemathesis cases of the OpenAPI document (valid and invalid), sent with
`requests` to the live server of this package; the body is re-encoded by hand when nested deeper
than Python's json module can write. MINIONS_FUZZ_HOSTILE_EXAMPLES sets the examples per operation.
"""

from __future__ import annotations

import json
import os
from typing import Any

import requests
import schemathesis
from hypothesis import strategies as st

from minions.services.api.openapi.document import JSONL_MEDIA_TYPES, document
from tests.fuzz.live import LiveApi, aim_at_served_model

EXAMPLES = int(os.environ.get("MINIONS_FUZZ_HOSTILE_EXAMPLES", "30"))
SEED = os.environ.get("MINIONS_FUZZ_SEED", "0")
schema = schemathesis.openapi.from_dict(document(), config=schemathesis.Config.from_dict({
    **({} if SEED == "random" else {"seed": int(SEED)}),
    "generation": {"max-examples": EXAMPLES, "database": "none", "with-security-parameters": False},
    "phases": {"stateful": {"enabled": False}, "coverage": {"enabled": False}},
}))
NEST = "__minions_nested__"


@schemathesis.serializer(*JSONL_MEDIA_TYPES)  # as in test_schemathesis.py, for this module run alone
def _jsonl(ctx: schemathesis.SerializationContext, value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return json.dumps(value).encode() + b"\n"

# Header values requests and http.client will send: no CR/LF, no leading whitespace.
_header_bytes = st.binary(min_size=1, max_size=60).filter(
    lambda b: b"\r" not in b and b"\n" not in b and not b[:1].isspace())
_header_names = st.from_regex(r"\AX-[A-Za-z0-9-]{1,20}\Z")


def _authorization(live: LiveApi) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.just(f"Bearer {live.admin}".encode()),
        st.just(f"Bearer {live.executor}".encode()),
        _header_bytes.map(lambda b: b"Bearer " + b),
        _header_bytes,
        st.text(max_size=40).map(lambda t: ("Bearer " + t).encode("utf-8", "surrogatepass"))
        .filter(lambda b: b"\r" not in b and b"\n" not in b),
    )


def _with_nesting(kwargs: dict[str, Any], body: dict[str, Any], key: str, depth: int) -> None:
    encoded = json.dumps({**body, key: NEST}).encode()
    kwargs.pop("json", None)
    kwargs["data"] = encoded.replace(f'"{NEST}"'.encode(), b"[" * depth + b"]" * depth)
    kwargs.setdefault("headers", {})["Content-Type"] = "application/json"


@schema.parametrize()
@schema.given(data=st.data())
def test_hostile_headers_and_deep_bodies_get_no_5xx(case: schemathesis.Case[Any], data: st.DataObject,
                                                    live: LiveApi, http: requests.Session) -> None:
    headers: dict[str, Any] = {"Authorization": data.draw(_authorization(live), label="authorization")}
    headers.update(data.draw(st.dictionaries(_header_names, _header_bytes, max_size=3), label="extra headers"))
    aim_at_served_model(case)
    kwargs = case.as_transport_kwargs(base_url=live.url, headers=headers)
    # (A JSON body: a multipart form's fields are a dict too.)
    if isinstance(case.body, dict) and case.media_type == "application/json" and data.draw(st.booleans(),
                                                                                          label="nest"):
        depth = data.draw(st.sampled_from([64, 65, 256, 1000, 1025, 100_000]), label="depth")
        key = data.draw(st.sampled_from(sorted(case.body) or ["x"]), label="nested key")
        _with_nesting(kwargs, case.body, key, depth)
    response = http.request(**kwargs, timeout=30)
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400 and response.headers.get("Content-Type", "").startswith("application/json"):
        error = response.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str)
