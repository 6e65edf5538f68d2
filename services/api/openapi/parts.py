"""The pieces both OpenAPI documents are built from (each resource's openapi.py, assembled by
document.py, for /api/v1; openai/document.py for /v1): a schema reference, an Error response, a 200
answer, merged response groups. What only the /api/v1 parts share: components.py."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]
JSON = "application/json"


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def error(description: str) -> Schema:
    return {"description": description, "content": {JSON: {"schema": ref("Error")}}}


def ok(schema: Schema, description: str, status: str = "200") -> dict[str, Schema]:
    return {status: {"description": description, "content": {JSON: {"schema": schema}}}}


def responses(*groups: dict[str, Schema], **errors: str) -> dict[str, Schema]:
    """Merge response groups; keyword `e403="..."` adds an Error response with that description."""
    merged: dict[str, Schema] = {}
    for group in groups:
        merged.update(group)
    for key, description in errors.items():
        merged[key.removeprefix("e")] = error(description)
    return dict(sorted(merged.items()))
