"""The executor protocol's messages (docs/API.md, "Executor protocol"), defined once.

The API decodes requests into these and encodes its answers from them; the agent (and any other
executor, e.g. bench/drain.py) encodes its requests from them and decodes the answers; the OpenAPI
document's schemas of these messages are generated from them (`openapi_schemas`). msgspec: strict
decoding with typed errors that name the field at fault, JSON Schema generation, fast, and no
runtime dependencies of its own.

Checks that need more than a type (a kind the server knows, a preference within the token's team)
stay with the route; what a type can say (ranges, lengths, patterns) is said here.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from minions.kinds import KINDS
from minions.names import NAME_PATTERN

MAX_NUMBER = 2**31 - 1  # what the database's integer columns hold
MAX_TOKENS = 1000  # leases named in one heartbeat or one batched request
NO_NUL = r"^[^\u0000]*$"  # stored text cannot hold U+0000 (PostgreSQL)
NOT_BLANK = r"\S"
# A failure's text is kept to this many characters (the rest is cut, not refused): enough for any
# traceback's last frames, small enough to list in a task's subtasks. An executor need send no more.
MAX_ERROR_CHARS = 4000

Count = Annotated[int, Meta(ge=0, le=MAX_NUMBER)]
Seconds = Annotated[float, Meta(ge=0, le=MAX_NUMBER)]
Name = Annotated[str, Meta(pattern=NAME_PATTERN, min_length=1, max_length=64)]
# Kept as text on the wire (RFC 3339; UUIDs in their usual form): what an executor echoes back.
Timestamp = Annotated[str, Meta(extra_json_schema={"format": "date-time"})]
Uuid = Annotated[str, Meta(extra_json_schema={"format": "uuid"})]
LeaseState = Literal["ok", "lost", "cancelled"]
Message = Struct  # the base of every message below


class ProtocolError(ValueError):
    """A message that does not have the documented shape."""


# ---------------------------------------------------------------- register


class Preference(Struct, kw_only=True):
    team: Name
    project: Name | None = None
    task_name: Name | None = None


# A task_name needs its project (said in the schema; the route says it in its 422).
_PREFERENCE_RULE = {"anyOf": [
    {"not": {"required": ["task_name"]}},
    {"properties": {"task_name": {"nullable": True, "enum": [None]}}},
    {"required": ["project"], "properties": {"project": {"type": "string"}}},
]}


_LABEL = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$"


class ModelFingerprint(Struct, kw_only=True):
    """What the executor loaded for one model it serves (sql/schema/05_executors.sql): the task it
    starts is pinned to it."""

    model: Annotated[str, Meta(min_length=1, max_length=256, pattern=NO_NUL,
                               description="One of the registration's `models`.")]
    fingerprint: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9:._-]{0,159}$", description=(
        "The Hugging Face commit of the snapshot loaded, else `sha256:<hex>` over the model folder's files; "
        "Ollama: `sha256:<digest>`."))]
    precision: Annotated[str, Meta(pattern=_LABEL, description="fp32, bf16, fp16, or the backend's own.")] | None = None
    backend: Annotated[str, Meta(pattern=_LABEL, description="transformers, ollama, ...")] | None = None
    proofs: Annotated[int, Meta(ge=1, le=100, description=(
        "The version of the proofs of generation its completions carry (absent: none): then its sampled "
        "completions can be spot-checked."))] | None = None


class ExecutorRegistration(Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=128, pattern=NO_NUL, description=(
        "The machine's name; registering again with the same name and token updates that executor."))]
    hardware: Annotated[dict[str, Any], Meta(description=(
        "Free-form description of the machine. The Minions agent adds `precision`: [{model, device, "
        "precision, weights, cosine, setting}], the precision it runs each loaded model in (weights: fp32, "
        "autocast over fp32 weights, or cast to bf16/fp16) and its cosine to fp32."))] = {}
    kinds: Annotated[list[Annotated[str, Meta(extra_json_schema={"enum": list(KINDS)})]],
                     Meta(min_length=1, max_length=256)]
    models: Annotated[list[Annotated[str, Meta(min_length=1, max_length=256, pattern=NO_NUL)]],
                      Meta(max_length=1024)] | None = None
    preferences: Annotated[list[Annotated[Preference, Meta(extra_json_schema=_PREFERENCE_RULE)]],
                           Meta(max_length=32, description="Work to take first, in order.")] | None = None
    fingerprints: Annotated[list[ModelFingerprint], Meta(max_length=1024, description=(
        "Per model, what it loaded (one entry per model). Absent (older agents): each model it serves counts "
        "as its own fingerprint, `unknown:<executor id>`."))] | None = None


class Registered(Struct, kw_only=True):
    executor_id: Uuid
    heartbeat_interval_s: Annotated[float, Meta(gt=0)]
    lease_timeout_s: Annotated[float, Meta(gt=0)]
    long_poll_s: Annotated[float, Meta(ge=0)]
    # What the batched protocol allows (absent from servers before it: read as 1 and 0).
    max_claim: Annotated[int, Meta(ge=1, description="Most subtasks one claim may ask for (`max`).")] = 1
    inline_output_bytes: Annotated[int, Meta(ge=0, description=(
        "Largest output a complete may carry inline (`output`); 0: none."))] = 0


# ---------------------------------------------------------------- claim


class LeaseTerms(Struct, kw_only=True):
    token: Uuid
    expires_at: Timestamp
    backup: Annotated[bool, Meta(description="A backup copy of a straggler's subtask.")] = False


class InputRef(Struct, kw_only=True):
    url: Annotated[str | None, Meta(description=(
        "Presigned GET of `range` alone, for this lease alone: fetch it with `Range: bytes=start-(end-1)` "
        "(the local store also serves the range without the header; S3 requires it). It lasts the lease "
        "timeout plus MINIONS_INPUT_URL_MARGIN_S; a heartbeat that renews the lease sends a fresh one "
        "(`input_urls`). null when the task's input is kept in the database: `data` then always holds "
        "the range."))]
    range: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(min_length=2, max_length=2,
                                                            description="[start, end) in bytes.")]
    records: Count
    data: Annotated[str | None, Meta(description=(
        "The range's bytes themselves (UTF-8 JSONL) when small: no GET needed."))] = None

    @property
    def start(self) -> int:
        return self.range[0]

    @property
    def end(self) -> int:  # exclusive: the range is [start, end)
        return self.range[1]


class OutputRef(Struct, kw_only=True):
    url: Annotated[str, Meta(description="Presigned PUT of the whole output.")]


class CheckRef(Struct, kw_only=True):
    outputs: Annotated[list[str], Meta(description=(
        "The results of other executors that this lease checks (JSONL each, in the order they were held). "
        "An executor that can verify them (a proof of generation) answers, per record, the first whose proof "
        "holds, as it is; else its own result."))]


class LeasedSubtask(Struct, kw_only=True, omit_defaults=True):
    team: str
    project: str
    task_name: str
    subtask_id: Count
    attempt: Annotated[int, Meta(ge=1)]
    kind: Annotated[str, Meta(extra_json_schema={"enum": list(KINDS)})]
    model: str | None
    params: dict[str, Any]
    input: InputRef
    output: OutputRef
    check: Annotated[CheckRef | None, Meta(description=(
        "Present on a spot check's replica of a completion task: the results it checks."))] = None
    params_from: Annotated[Annotated[int, Meta(ge=0)] | None, Meta(description=(
        "Only in a batched claim asked with `params=once`: this lease's `params` are those of the lease at "
        "this index of the same answer (a lease of the same task), and its own `params` is empty."))] = None

    @property
    def label(self) -> str:
        return f"{self.team}/{self.project}/{self.task_name}#{self.subtask_id}.{self.attempt}"

    @property
    def output_url(self) -> str:
        return self.output.url


class Lease(Struct, kw_only=True):
    """One claimed subtask: the answer to a claim without `max`, an entry of a LeaseBatch with it."""

    lease: LeaseTerms
    subtask: LeasedSubtask

    @property
    def token(self) -> str:
        return self.lease.token


class LeaseBatch(Struct, kw_only=True):
    leases: Annotated[list[Lease], Meta(min_length=1)]

    def sharing_params(self) -> LeaseBatch:
        """The same answer with each task's params sent once: every later lease of a task refers to the
        first (`params_from`). A task's params (up to 64 KiB) rode in each of a claim's 32 leases."""
        first: dict[tuple[str, str, str], int] = {}
        for n, lease in enumerate(self.leases):
            sub = lease.subtask
            at = first.setdefault((sub.team, sub.project, sub.task_name), n)
            if at != n and sub.params:
                sub.params, sub.params_from = {}, at
        return self

    def with_params(self) -> LeaseBatch:
        """Each lease's own params again, where the answer sent them once (`params_from`); a reference to
        anything but an earlier lease of the same task is a ProtocolError."""
        for n, lease in enumerate(self.leases):
            sub = lease.subtask
            if sub.params_from is None:
                continue
            at = sub.params_from
            source = self.leases[at].subtask if at < n else None
            if source is None or (source.team, source.project, source.task_name) != (sub.team, sub.project,
                                                                                      sub.task_name):
                raise ProtocolError(f"lease {n}: params_from {at} names no earlier lease of its task")
            sub.params, sub.params_from = source.params, None
        return self


# ---------------------------------------------------------------- heartbeat


class Heartbeat(Struct, kw_only=True):
    leases: Annotated[list[str], Meta(max_length=MAX_TOKENS,
                                      description="Tokens of the leases this executor holds.")] = []


class HeartbeatReply(Struct, kw_only=True, omit_defaults=True):
    leases: dict[str, LeaseState]
    input_urls: Annotated[dict[str, str], Meta(description=(
        "A fresh input URL (replacing the claim's `input.url`) for each lease renewed (`ok`) whose "
        "input range is larger than MINIONS_INLINE_INPUT_BYTES; absent when there is none."))] = {}


# ---------------------------------------------------------------- complete, fail, release


class Completion(Struct, kw_only=True, omit_defaults=True):
    records: Annotated[Count, Meta(description="Records in the output; must equal the subtask's count.")]
    seconds: Annotated[Seconds | None, Meta(description="Time the work took.")] = None
    output: Annotated[str | None, Meta(description=(
        "The output itself (JSONL), when small (`inline_output_bytes`): no PUT needed."))] = None


class Failure(Struct, kw_only=True, omit_defaults=True):
    error: Annotated[str, Meta(min_length=1, pattern=NOT_BLANK, description=(
        f"What went wrong; its first {MAX_ERROR_CHARS:,} characters are kept."))]
    retryable: Annotated[bool, Meta(description="Whether another attempt may succeed.")] = True


class LeaseCompletion(Completion, kw_only=True, omit_defaults=True):
    token: str


class LeaseFailure(Failure, kw_only=True, omit_defaults=True):
    token: str


class CompletionBatch(Struct, kw_only=True):
    leases: Annotated[list[LeaseCompletion], Meta(min_length=1, max_length=MAX_TOKENS)]


class FailureBatch(Struct, kw_only=True):
    leases: Annotated[list[LeaseFailure], Meta(min_length=1, max_length=MAX_TOKENS)]


class ReleaseBatch(Struct, kw_only=True):
    leases: Annotated[list[str], Meta(min_length=1, max_length=MAX_TOKENS)]


class LeaseError(Struct, kw_only=True):
    code: str
    message: str
    fields: dict[str, str] | None = None


class LeaseOutcome(Struct, kw_only=True, omit_defaults=True):
    """One lease's answer in a batched request: what its own request would have answered."""

    token: str
    status: Annotated[int, Meta(description="The HTTP status its own request would have had.")]
    error: LeaseError | None = None


class BatchReply(Struct, kw_only=True):
    results: list[LeaseOutcome]


class Ok(Struct):
    status: Literal["ok"]


class Deregistered(Struct, kw_only=True):
    status: Literal["offline"]
    released: Annotated[int, Meta(ge=0)]


# ---------------------------------------------------------------- decoding and schemas

MESSAGES: tuple[type[Struct], ...] = (
    ExecutorRegistration, Registered, Lease, LeaseBatch, Heartbeat, HeartbeatReply, Completion, Failure,
    CompletionBatch, FailureBatch, ReleaseBatch, BatchReply, Ok, Deregistered,
)

T = TypeVar("T")
_MISSING = re.compile(r"Object missing required field `(?P<field>[^`]*)`")
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")


def convert(value: Any, kind: type[T]) -> T:
    """`value` (decoded JSON) as a `kind`; ProtocolError naming the field at fault."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise ProtocolError(str(exc)) from exc


def decode(raw: bytes, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProtocolError(str(exc)) from exc


def to_builtins(message: Any) -> Any:
    """A message as JSON-ready builtins (for the project's one JSON codec)."""
    return msgspec.to_builtins(message)


def failed_field(error: msgspec.ValidationError | ProtocolError) -> tuple[str, str]:
    """(field path, msgspec's reason) of a validation error: `preferences[0].team`, or `body`."""
    text = str(error)
    match = _AT.search(text)
    missing = _MISSING.match(text)
    if missing is not None:
        where = match["path"] if match is not None else ""
        return (f"{where}.{missing['field']}" if where else missing["field"]), "required"
    if match is None:
        return "body", text
    return match["path"] or "body", text[: match.start()]


def openapi_schemas() -> dict[str, Any]:
    """The OpenAPI 3.0 component schemas of every message, generated from the Structs above."""
    _, components = msgspec.json.schema_components(MESSAGES, ref_template="#/components/schemas/{name}")
    return {name: _oas30(schema) for name, schema in components.items()}


def _oas30(schema: Any) -> Any:
    """JSON Schema 2020-12 (what msgspec writes) as OpenAPI 3.0.3 reads it: `nullable` instead of a
    null type, no `title`, and no keywords beside a `$ref` (3.0 ignores them: wrapped in allOf)."""
    if isinstance(schema, list):
        return [_oas30(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    # 3.0 wants `required` non-empty when present.
    out = {k: _oas30(v) for k, v in schema.items() if k != "title" and not (k == "required" and not v)}
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), int | float) and not isinstance(out[bound], bool):
            out[limit], out[bound] = out[bound], True
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options:
        rest = [o for o in options if o != {"type": "null"}]
        del out["anyOf"]
        base = rest[0] if len(rest) == 1 else {"anyOf": rest}
        if "$ref" in base:
            base = {"allOf": [base]}
        out = {**base, **out, "nullable": True}
    if "$ref" in out and len(out) > 1:
        ref = out.pop("$ref")
        out = {"allOf": [{"$ref": ref}], **out}
    return out
