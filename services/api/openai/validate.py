"""A batch's input file, checked line by line and translated into its task's records as it streams
(constant memory but for the set of custom_ids). A line is bounded before it is decoded (bounds.py):
in bytes (MINIONS_OPENAI_MAX_REQUEST_BYTES, `line_too_long`), and a long one in JSON values and in
inputs; a short one's inputs are counted once decoded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from minions import jsoncodec
from minions.services.api.openai.bounds import MAX_INPUTS, SCAN_ABOVE, SETTING, scan
from minions.services.api.openai.lines import Overlong
from minions.services.api.openai.translate import MAX_ERRORS, LineError, parse_request_line


@dataclass
class InputCheck:
    """Feeds `records()` the input's lines; afterwards holds the batch's model, params, counts and
    errors (`[{"code", "message", "param", "line"}]`, the first MAX_ERRORS of them)."""
    endpoint: str
    max_line: int
    model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    requests: int = 0
    records_total: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0
    model_line: int = 0
    _seen: set[str] = field(default_factory=set)
    _params_line: int = 0

    def error(self, line_no: int, code: str, message: str, param: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line_no})

    async def records(self, lines: AsyncIterator[bytes | Overlong]) -> AsyncIterator[bytes]:
        """The task's JSONL records for the input's good lines. The first record of each request
        carries `openai`: its custom_id, its number of records and what the response needs of its
        body, so the output is built from the task alone (the input file may be deleted meanwhile)."""
        line_no = 0
        async for line in lines:
            line_no += 1
            if isinstance(line, Overlong):
                self.requests += 1
                self.error(line_no, "line_too_long", f"the line is {line.length:,} bytes, over the limit of "
                                                     f"{self.max_line:,} ({SETTING})")
                continue
            if not line.strip():
                continue
            self.requests += 1
            try:
                if len(line) > SCAN_ABOVE:
                    scan(line, self.endpoint, within="body")
                request = parse_request_line(line, line_no, self.endpoint)
                if self.endpoint == "/v1/embeddings" and len(request.records) > MAX_INPUTS:
                    raise LineError("invalid_request", f"at most {MAX_INPUTS} inputs per request", "body.input")
            except LineError as exc:
                self.error(line_no, exc.code, exc.message, exc.param)
                continue
            if request.custom_id in self._seen:
                self.error(line_no, "duplicate_custom_id",
                           f"custom_id {request.custom_id!r} is used by an earlier line", "custom_id")
                continue
            self._seen.add(request.custom_id)
            if self.model is None:
                self.model, self.params, self.model_line, self._params_line = (request.model, request.params,
                                                                               line_no, line_no)
            elif request.model != self.model:
                self.error(line_no, "model_mismatch", f"a batch runs one model: line {self.model_line} names "
                                                      f"{self.model!r}, this line {request.model!r}", "body.model")
                continue
            elif request.params != self.params:
                self.error(line_no, "params_mismatch", "a batch runs with one set of sampling parameters "
                                                       f"(temperature, max_tokens, seed): they differ from line "
                                                       f"{self._params_line}'s", "body")
                continue
            body = jsoncodec.loads(line)["body"]
            meta = {"custom_id": request.custom_id, "records": len(request.records),
                    "body": {k: body[k] for k in ("model", "encoding_format", "max_tokens",
                                                  "max_completion_tokens") if k in body}}
            self.records_total += len(request.records)
            for i, record in enumerate(request.records):
                yield jsoncodec.dumps_line({**record, "openai": meta} if i == 0 else record)
