"""The one logging setup: structlog, rendering JSON lines through orjson (or readable lines on a tty).

Everything a process logs goes through the same processors, so every line has the same shape and
passes through the same redaction (minions.redaction): our own structlog events, the stdlib loggers
of libraries (aiohttp, asyncpg, transformers: their records become events named after the logger,
`aiohttp_server`, with the text in `message`), Python warnings (`py_warnings`) and an uncaught
exception (`unhandled_exception`, with its traceback in the same JSON line).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from types import TracebackType
from typing import Any

import orjson
import structlog

from minions.redaction import redact_event

_NOT_SNAKE = re.compile(r"[^a-z0-9]+")


def _orjson_dumps(value: Any, **_: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def _stdlib_event(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A library's log record as one of our events: a snake_case event name (its logger's) and its
    text as `message`, so event names keep one style whoever logs."""
    record: logging.LogRecord | None = event_dict.get("_record")
    if record is not None and not event_dict.get("_from_structlog"):
        event_dict["message"] = event_dict.get("event")
        event_dict["event"] = _NOT_SNAKE.sub("_", record.name.lower()).strip("_") or "root"
    return event_dict


def configure(service: str, level: str | None = None, *, for_terminal: bool = False) -> None:
    """Configure structlog (and the stdlib logging under it) for a process. JSON unless
    MINIONS_LOG_FORMAT=console; a command a person runs (`for_terminal`) renders readable lines
    when its stderr is a terminal and MINIONS_LOG_FORMAT is unset."""
    level_name = (level or os.environ.get("MINIONS_LOG_LEVEL", "info")).upper()
    level_no = getattr(logging, level_name, logging.INFO)
    default_format = "console" if for_terminal and sys.stderr.isatty() else "json"
    console = os.environ.get("MINIONS_LOG_FORMAT", default_format) == "console"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if console
        else structlog.processors.JSONRenderer(serializer=_orjson_dumps)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, redact_event, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    _route_stdlib_logging(level_no, shared, renderer)
    sys.excepthook = _log_uncaught


def _route_stdlib_logging(level_no: int, shared: list[Any], renderer: Any) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _stdlib_event],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, redact_event, renderer],
    ))
    root = logging.getLogger()
    root.handlers = [handler]  # replaces, so configuring twice never prints a line twice
    root.setLevel(level_no)
    logging.captureWarnings(True)


def _log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    structlog.get_logger().critical("unhandled_exception", exc_info=(exc_type, exc, tb))


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
