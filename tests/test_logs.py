"""SERVICE_ENGINE_LOG_FORMAT=json: one JSON object a line, with the service,
the pod and the session or message in scope."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from service_engine.config import check_environment
from service_engine.errors import ConfigError
from service_engine.logs import JsonFormatter, configure_logging, in_message, in_session


@pytest.fixture
def lines() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    out = io.StringIO()
    handler = configure_logging("orders", "pod-1", environ={"SERVICE_ENGINE_LOG_FORMAT": "json"},
                                stream=out)
    assert handler is not None
    try:
        yield out, handler
    finally:
        logging.getLogger().removeHandler(handler)


def _read(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_each_line_is_json_with_service_and_pod(lines: tuple[io.StringIO, logging.Handler]) -> None:
    """In JSON format each log line is one JSON object with the message, level, service, pod, logger
    and a UTC timestamp, and no session or message id outside a scope."""
    out, _ = lines
    logging.getLogger("service_engine.test").warning("relay %s behind", "orders")
    [entry] = _read(out)
    assert entry["message"] == "relay orders behind" and entry["level"] == "WARNING"
    assert (entry["service"], entry["pod"], entry["logger"]) == ("orders", "pod-1", "service_engine.test")
    assert "session_id" not in entry and "message_id" not in entry
    assert entry["ts"].endswith("+00:00")


async def test_the_session_or_message_in_scope_is_on_the_line(
    lines: tuple[io.StringIO, logging.Handler],
) -> None:
    """A line logged inside in_session or in_message carries that id (tasks started inside inherit
    it, tasks started outside do not), and an exception's traceback rides in exc."""
    out, _ = lines
    log = logging.getLogger("service_engine.test")

    async def elsewhere() -> None:
        log.info("unrelated task")

    other = asyncio.create_task(elsewhere())  # started outside any scope
    with in_session("s-42"):
        log.info("rendered")
        # A task started inside inherits the scope.
        await asyncio.create_task(asyncio.to_thread(lambda: None))
        await asyncio.create_task(_log_in_task(log))
    await other
    with in_message("m-7"):
        try:
            raise ValueError("poison")
        except ValueError:
            log.exception("reaction failed")
    log.info("after")
    entries = {e["message"]: e for e in _read(out)}
    assert entries["rendered"]["session_id"] == "s-42"
    assert entries["in a task"]["session_id"] == "s-42"
    assert "session_id" not in entries["unrelated task"]
    assert entries["reaction failed"]["message_id"] == "m-7"
    assert "ValueError: poison" in entries["reaction failed"]["exc"]
    assert "message_id" not in entries["after"] and "session_id" not in entries["after"]


async def _log_in_task(log: logging.Logger) -> None:
    log.info("in a task")


def test_configuring_twice_keeps_one_json_handler(lines: tuple[io.StringIO, logging.Handler]) -> None:
    """Configuring JSON logging twice leaves one JSON handler on the root logger."""
    again = configure_logging("orders", "pod-1", environ={"SERVICE_ENGINE_LOG_FORMAT": "JSON"},
                              stream=io.StringIO())
    assert again is not None
    try:
        root = logging.getLogger()
        assert [h for h in root.handlers if isinstance(h.formatter, JsonFormatter)] == [again]
    finally:
        logging.getLogger().removeHandler(again)


def test_text_is_the_default_and_an_unknown_format_is_refused() -> None:
    """Text is the default format (no handler installed); an unknown format is a ConfigError, and
    check_environment names it."""
    assert configure_logging("orders", "pod-1", environ={}) is None
    assert configure_logging("orders", "pod-1", environ={"SERVICE_ENGINE_LOG_FORMAT": "text"}) is None
    with pytest.raises(ConfigError, match="SERVICE_ENGINE_LOG_FORMAT='xml'"):
        configure_logging("orders", "pod-1", environ={"SERVICE_ENGINE_LOG_FORMAT": "xml"})
    check = check_environment({"SERVICE_ENGINE_LOG_FORMAT": "xml"})
    assert not check.ok and check.problems[0].startswith("SERVICE_ENGINE_LOG_FORMAT='xml'")
