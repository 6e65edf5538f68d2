"""U+0000 in request values: PostgreSQL text and jsonb cannot hold it. Values that name or define
things are refused with a 422 (`nul_path`, `NUL_RULE`); informational ones (hardware, error messages)
are kept, escaped (`without_nul`)."""

from __future__ import annotations

from typing import Any

NUL_RULE = "must not contain the NUL character (\\u0000)"


def without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\\u0000")
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    return value


def nul_path(value: Any, path: str) -> str | None:
    """The path of the first string (or key) holding U+0000, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            if "\x00" in key:
                return child
            if (found := nul_path(item, child)) is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := nul_path(item, f"{path}[{i}]")) is not None:
                return found
    return None
