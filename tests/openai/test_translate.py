"""The translation between OpenAI's request and response bodies and Minions' records and results
(pure functions: their edge cases, without services)."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from minions.services.api.openai.translate import LineError, float32_base64, parse_request_line, response_body


def test_base64_is_little_endian_float32() -> None:
    vector = [0.1, -2.5, 3.0e-8, 1.0]
    raw = base64.b64decode(float32_base64(vector))
    assert len(raw) == 16
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), np.asarray(vector, dtype=np.float32))


@pytest.mark.parametrize(("line", "code"), [
    (b"[1]", "invalid_request"),
    (b'{"custom_id": "", "method": "POST", "url": "/v1/embeddings", "body": {}}', "missing_required_parameter"),
    (b'{"custom_id": "a", "method": "GET", "url": "/v1/embeddings", "body": {}}', "invalid_method"),
    (b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}', "invalid_request"),
    (b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": [1, 2]}}',
     "invalid_request"),
    (b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", '
     b'"body": {"model": "m", "input": "x", "encoding_format": "int8"}}', "invalid_request"),
])
def test_bad_lines_have_codes(line: bytes, code: str) -> None:
    with pytest.raises(LineError) as error:
        parse_request_line(line, 1, "/v1/embeddings")
    assert error.value.code == code


@pytest.mark.parametrize("role", [{}, [], ["user"], 1, None])
def test_a_chat_lines_role_of_any_json_type_is_a_line_error(role: object) -> None:
    """An object or list role was hashed into the role map: a TypeError, a 500."""
    line = orjson.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "messages": [{"role": role, "content": "hi"}]}})
    with pytest.raises(LineError) as error:
        parse_request_line(line, 1, "/v1/chat/completions")
    assert (error.value.code, error.value.param) == ("invalid_request", "body.messages[0].role")


def test_chat_lines_translate_roles_parts_and_sampling() -> None:
    line = (b'{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", '
            b'"messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": '
            b'[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "max_completion_tokens": 5, '
            b'"temperature": 0.5, "seed": 3}}')
    request = parse_request_line(line, 7, "/v1/chat/completions")
    assert request.params == {"max_tokens": 5, "temperature": 0.5, "seed": 3}
    assert request.records == [{"id": "7", "messages": [{"role": "system", "content": "be brief"},
                                                        {"role": "user", "content": "ab"}]}]
    for refused in (b'"n": 2', b'"stream": true', b'"tools": []'):
        bad = line.replace(b'"seed": 3', refused)
        with pytest.raises(LineError):
            parse_request_line(bad, 7, "/v1/chat/completions")


def test_finish_reason_and_usage() -> None:
    body = {"model": "m", "messages": [], "max_tokens": 4}
    full = response_body("/v1/chat/completions", body, [{"id": "0", "text": "abcd",
                                                         "usage": {"prompt_tokens": 3, "completion_tokens": 4}}], 1)
    assert full.body is not None and full.body["choices"][0]["finish_reason"] == "length"
    assert full.body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    short = response_body("/v1/chat/completions", body, [{"id": "0", "text": "ab",
                                                          "usage": {"prompt_tokens": 3, "completion_tokens": 2}}], 1)
    assert short.body is not None and short.body["choices"][0]["finish_reason"] == "stop"
    failed = response_body("/v1/embeddings", {"model": "m"}, [{"id": "0.0", "error": "boom"}])
    assert failed.body is None and failed.error == ("server_error", "boom")


@pytest.mark.parametrize("model", ["m@", "@abc", "m@Some Thing", "m@" + "a" * 161])
def test_a_model_pinned_to_a_bad_revision_is_refused_on_its_line(model: str) -> None:
    """name@revision pins a task's model (sql/schema/05_executors.sql); a revision that is empty, too long or of another
    form is refused on its line (it was a 500, or a task no executor could ever serve)."""
    line = b'{"custom_id":"c","method":"POST","url":"/v1/embeddings","body":{"model":"%s","input":"a"}}' % (
        model.encode())
    with pytest.raises(LineError) as refused:
        parse_request_line(line, 1, "/v1/embeddings")
    assert refused.value.param == "body.model" and "name@revision" in refused.value.message
    assert parse_request_line(line.replace(model.encode(), b"m@" + b"a" * 40), 1, "/v1/embeddings").model == (
        "m@" + "a" * 40)
