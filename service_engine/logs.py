"""Log lines as JSON: ``SERVICE_ENGINE_LOG_FORMAT=json``.

Each line is one JSON object with the time, level, logger, message, the
``service`` and ``pod``, and, where one is in scope, the ``session_id`` of
the live session or the ``message_id`` of the integration message being
handled. Code that serves a session or handles a message binds it with
`in_session` / `in_message` (context variables: every task started inside
inherits them, other tasks never see them).

``text`` (the default) leaves logging as the process configured it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO

from .failures import ConfigError

__all__ = [
    "LOG_FORMATS",
    "LOG_FORMAT_VARIABLE",
    "JsonFormatter",
    "bind_session",
    "configure_logging",
    "in_message",
    "in_session",
]

LOG_FORMAT_VARIABLE = "SERVICE_ENGINE_LOG_FORMAT"
LOG_FORMATS: tuple[str, ...] = ("text", "json")

_SESSION_ID: ContextVar[str | None] = ContextVar("service_engine_session_id", default=None)
_MESSAGE_ID: ContextVar[str | None] = ContextVar("service_engine_message_id", default=None)


@contextmanager
def in_session(session_id: str) -> Iterator[None]:
    """Lines logged inside carry ``session_id``."""
    token = _SESSION_ID.set(session_id)
    try:
        yield
    finally:
        _SESSION_ID.reset(token)


def bind_session(session_id: str) -> None:
    """Lines logged from here on in the current task (and the tasks it
    starts) carry ``session_id``: for a task that serves one session."""
    _SESSION_ID.set(session_id)


@contextmanager
def in_message(message_id: str) -> Iterator[None]:
    """Lines logged inside carry ``message_id``."""
    token = _MESSAGE_ID.set(message_id)
    try:
        yield
    finally:
        _MESSAGE_ID.reset(token)


class _Scope(logging.Filter):
    # Runs where the line is logged, so the context variables are the
    # caller's even if the record is formatted elsewhere later.
    def filter(self, record: logging.LogRecord) -> bool:
        record.se_session_id = _SESSION_ID.get()
        record.se_message_id = _MESSAGE_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``message``,
    ``service``, ``pod``, then ``session_id`` / ``message_id`` when in scope
    and ``exc`` when the line carries an exception."""

    def __init__(self, service: str | None, pod: str) -> None:
        super().__init__()
        self.service = service
        self.pod = pod

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "service": self.service,
            "pod": self.pod,
        }
        session = getattr(record, "se_session_id", None) or _SESSION_ID.get()
        if session:
            entry["session_id"] = session
        message = getattr(record, "se_message_id", None) or _MESSAGE_ID.get()
        if message:
            entry["message_id"] = message
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def log_format(environ: Mapping[str, str] | None = None) -> str:
    """The configured format; raises `ConfigError` for an unknown one."""
    env = os.environ if environ is None else environ
    value = env.get(LOG_FORMAT_VARIABLE, "text").strip().lower() or "text"
    if value not in LOG_FORMATS:
        raise ConfigError(
            f"{LOG_FORMAT_VARIABLE}={value!r}: expected one of {', '.join(LOG_FORMATS)}"
        )
    return value


def configure_logging(
    service: str | None,
    pod: str,
    *,
    environ: Mapping[str, str] | None = None,
    stream: IO[str] | None = None,
    level: int = logging.INFO,
) -> logging.Handler | None:
    """Install the JSON handler on the root logger when the format is json
    (replacing one installed before); the handler, or None for text."""
    if log_format(environ) != "json":
        return None
    root = logging.getLogger()
    for existing in list(root.handlers):
        if isinstance(existing.formatter, JsonFormatter):
            root.removeHandler(existing)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(service, pod))
    handler.addFilter(_Scope())
    root.addHandler(handler)
    if root.level > level or root.level == logging.NOTSET:
        root.setLevel(level)
    return handler
