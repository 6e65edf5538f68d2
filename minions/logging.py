"""The one logging setup: structlog, rendering JSON lines through orjson (or readable lines on a tty)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import orjson
import structlog


def _orjson_dumps(value: Any, **_: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def configure(service: str, level: str | None = None) -> None:
    """Configure structlog for a process. JSON unless MINIONS_LOG_FORMAT=console."""
    level_name = (level or os.environ.get("MINIONS_LOG_LEVEL", "info")).upper()
    console = os.environ.get("MINIONS_LOG_FORMAT", "json") == "console"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if console
        else structlog.processors.JSONRenderer(serializer=_orjson_dumps)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level_name, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
