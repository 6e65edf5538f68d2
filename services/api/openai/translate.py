"""Request lines of OpenAI's batch input (`{"custom_id", "method", "url", "body"}`) into Minions
records, and Minions results back into OpenAI's response bodies. Pure functions: no I/O.

One batch is one task, so it has one model and one set of sampling params: a line that differs from
the first line in either is refused with its line number (docs/OPENAI.md)."""

from __future__ import annotations

import base64
import secrets
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from minions import result_shapes
from minions.kinds import PARAMS, Param
from minions.names import model_revision_problem

ENDPOINT_KIND: Final = {"/v1/embeddings": "embedding", "/v1/chat/completions": "completion",
                        "/v1/completions": "completion"}
DEFAULT_MAX_TOKENS: Final = PARAMS["completion"]["max_tokens"].default  # the completion runners' own
_MAX_TOKENS: Final = PARAMS["completion"]["max_tokens"]
_SEED: Final = PARAMS["completion"]["seed"]
_TEMPERATURE: Final = Param("number", 0, 2)  # OpenAI's bound, narrower than the runners' own (PARAMS)
MAX_ERRORS: Final = 100  # validation errors kept per batch; the count says how many more there were
ROLE_MAP: Final = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                   "tool": "tool"}
# Body fields each endpoint takes besides model and input/messages/prompt. Others are refused rather
# than silently ignored: a pipeline must not believe a parameter took effect when it did not.
_EMBEDDING_FIELDS: Final = {"model", "input", "encoding_format", "user"}
_CHAT_FIELDS: Final = {"model", "messages", "temperature", "max_tokens", "max_completion_tokens", "seed", "n",
                       "user", "stream", "store", "metadata"}
_COMPLETION_FIELDS: Final = {"model", "prompt", "temperature", "max_tokens", "seed", "n", "user", "stream"}


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


@dataclass(frozen=True)
class Request:
    """One line of the input, translated: its records (several for an embeddings list input)."""
    custom_id: str
    model: str
    params: dict[str, Any]
    records: list[dict[str, Any]]


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def parse_request_line(line: bytes, line_no: int, endpoint: str) -> Request:
    """A batch input line (1-based `line_no`), or LineError saying what is wrong with it."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise LineError("invalid_json", f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise LineError("invalid_request", "each line must be a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("missing_required_parameter", "custom_id must be a non-empty string", "custom_id")
    if obj.get("method") != "POST":
        raise LineError("invalid_method", "method must be POST", "method")
    if obj.get("url") != endpoint:
        raise LineError("invalid_url", f"url must be the batch's endpoint {endpoint}, not {obj.get('url')!r}",
                        "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "body must be a JSON object", "body")
    return parse_body(body, endpoint, custom_id, str(line_no))


def parse_body(body: dict[str, Any], endpoint: str, custom_id: str, record_id: str) -> Request:
    """A request body of `endpoint` (batch line or interactive request) as records of its task."""
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256 or "\x00" in model:
        raise LineError("invalid_request", "body.model must be a model name", "body.model")
    if (problem := model_revision_problem(model)) is not None:  # name@revision pins the model
        raise LineError("invalid_request", f"body.model: {problem}", "body.model")
    if endpoint == "/v1/embeddings":
        return _embedding(body, custom_id, record_id, model)
    if endpoint == "/v1/chat/completions":
        return _chat(body, custom_id, record_id, model)
    return _completion(body, custom_id, record_id, model)


def _unknown(body: dict[str, Any], known: set[str]) -> None:
    extra = sorted(set(body) - known)
    if extra:
        raise LineError("unsupported_parameter", f"unsupported body parameter(s): {', '.join(extra)}",
                        f"body.{extra[0]}")


def _embedding(body: dict[str, Any], custom_id: str, record_id: str, model: str) -> Request:
    _unknown(body, _EMBEDDING_FIELDS)
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise LineError("invalid_request", "body.input must be a string or a non-empty list of strings "
                                           "(token arrays are not supported)", "body.input")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise LineError("invalid_request", "body.encoding_format must be float or base64",
                        "body.encoding_format")
    records = [{"id": f"{record_id}.{i}", "text": text} for i, text in enumerate(texts)]
    return Request(custom_id, model, {}, records)


def _sampling(body: dict[str, Any], max_field: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if body.get("n", 1) != 1:
        raise LineError("unsupported_parameter", "body.n must be 1", "body.n")
    if body.get("stream", False) is not False:
        raise LineError("unsupported_parameter", "body.stream is not supported in a batch", "body.stream")
    temperature = body.get("temperature")
    if temperature is not None:
        problem = _TEMPERATURE.problem(temperature)
        if problem is not None:
            raise LineError("invalid_request", f"body.temperature {problem}", "body.temperature")
        params["temperature"] = temperature
    for name in ("max_tokens", max_field):
        value = body.get(name) if name else None
        if value is not None:
            problem = _MAX_TOKENS.problem(value)
            if problem is not None:
                raise LineError("invalid_request", f"body.{name} {problem}", f"body.{name}")
            params["max_tokens"] = value
    seed = body.get("seed")
    if seed is not None:
        problem = _SEED.problem(seed)
        if problem is not None:
            raise LineError("invalid_request", f"body.seed {problem}", "body.seed")
        params["seed"] = seed
    return params


def _chat(body: dict[str, Any], custom_id: str, record_id: str, model: str) -> Request:
    _unknown(body, _CHAT_FIELDS)
    params = _sampling(body, "max_completion_tokens")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise LineError("invalid_request", "body.messages must be a non-empty list", "body.messages")
    messages = []
    for i, message in enumerate(raw):
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str) or role not in ROLE_MAP:  # (a dict or list is unhashable)
            raise LineError("invalid_request", f"body.messages[{i}].role must be one of {', '.join(ROLE_MAP)}",
                            f"body.messages[{i}].role")
        messages.append({"role": ROLE_MAP[role], "content": _content(message.get("content"), i)})
    return Request(custom_id, model, params, [{"id": record_id, "messages": messages}])


def _content(content: Any, i: int) -> str:
    """A message's text: a string, or a list of text parts (joined); images and audio are refused."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise LineError("invalid_request", f"body.messages[{i}].content must be a string or a list of text parts",
                    f"body.messages[{i}].content")


def _completion(body: dict[str, Any], custom_id: str, record_id: str, model: str) -> Request:
    _unknown(body, _COMPLETION_FIELDS)
    params = _sampling(body, None)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise LineError("invalid_request", "body.prompt must be a string", "body.prompt")
    return Request(custom_id, model, params, [{"id": record_id, "prompt": prompt}])


# -- results into response bodies ----------------------------------------------------------------


@dataclass
class Outcome:
    """What became of one request: a response body, or an error (code, message)."""
    body: dict[str, Any] | None = None
    error: tuple[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def float32_base64(vector: list[float]) -> str:
    """OpenAI's `encoding_format: "base64"`: the vector as little-endian float32, base64-encoded."""
    values = array("f", vector)  # C float: IEEE float32
    if sys.byteorder == "big":
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode()


def parse_result(line: bytes) -> Any:
    """A stored result line, parsed; None when it is not JSON (`response_body` says so)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return None


def response_body(endpoint: str, request_body: dict[str, Any], results: list[Any],
                  created: int | None = None) -> Outcome:
    """The response body OpenAI would give for `request_body`, from its records' results (in order).
    A result that breaks its kind's shape (committed before complete checked shapes) is the
    request's error `malformed_result`, naming the record and the field."""
    dimension = None
    for n, record in enumerate(results):
        try:
            dimension = result_shapes.check_record(ENDPOINT_KIND[endpoint], record, dimension) or dimension
        except result_shapes.Malformed as exc:
            return Outcome(error=("malformed_result", f"the stored result of input {n} is malformed: {exc}"))
    failed = next((r for r in results if "error" in r), None)
    if failed is not None:
        return Outcome(error=("server_error", str(failed["error"])))
    model = request_body["model"]
    created = int(time.time()) if created is None else created
    if endpoint == "/v1/embeddings":
        base64_wanted = request_body.get("encoding_format") == "base64"
        prompt_tokens = sum(int(r.get("usage", {}).get("prompt_tokens", 0)) for r in results)
        data = [{"object": "embedding", "index": i,
                 "embedding": float32_base64(r["embedding"]) if base64_wanted else r["embedding"]}
                for i, r in enumerate(results)]
        return Outcome(body={"object": "list", "data": data, "model": model,
                             "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
    result = results[0]
    usage = result.get("usage", {})
    prompt_tokens = int(usage.get("prompt_tokens", 0))
    completion_tokens = int(usage.get("completion_tokens", 0))
    # The runners stop at max_tokens (their default when none is given) or at end of sequence.
    limit = request_body.get("max_completion_tokens") or request_body.get("max_tokens") or DEFAULT_MAX_TOKENS
    finish_reason = "length" if completion_tokens >= limit else "stop"
    usage_body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens}
    if endpoint == "/v1/chat/completions":
        return Outcome(body={
            "id": new_id("chatcmpl-"), "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result["text"], "refusal": None},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage_body, "system_fingerprint": None})
    return Outcome(body={
        "id": new_id("cmpl-"), "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": result["text"], "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage_body, "system_fingerprint": None})
