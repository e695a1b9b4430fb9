"""The logging bridge: the ``log`` singleton's hooks, EnvFilter parsing, and
a real Python logger's level changed live by a commit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from service_engine.props import (
    Actor,
    LogBridge,
    LogBridgeError,
    MemoryStore,
    PeerIdentity,
    PropsError,
    PropsHandler,
    PropsStoreError,
    StaticPolicy,
    all_caps,
    log_namespace,
    now,
    open_log_bridge,
    parse_command,
    parse_filter,
)
from service_engine.props.errors import HookRejected
from service_engine.props.logging_bridge import OFF, Directive

ALICE = PeerIdentity("A", "alice")


@pytest.fixture
async def handler() -> PropsHandler:
    h = PropsHandler("demo", MemoryStore(), StaticPolicy({"A/alice": all_caps("demo.log")}))
    await h.register(log_namespace())
    return h


@pytest.fixture
def loggers() -> Iterator[None]:
    names = ["", "svc_test_bridge", "svc_test_bridge.db", "svc_test_other"]
    saved = {n: logging.getLogger(n or None).level for n in names}
    yield
    for name, level in saved.items():
        logging.getLogger(name or None).setLevel(level)


async def call(h: PropsHandler, verb: str, headers: dict[str, str], body: bytes = b"") -> dict[str, object]:
    return await h.command(parse_command("demo", f"demo.props.{verb}", headers, body), ALICE)


def test_parse_filter() -> None:
    """A log filter parses to per-logger directives (:: as dots, a bare name at debug, off);
    malformed filters are refused as log_filter_invalid."""
    assert parse_filter("") == []
    assert parse_filter("warn,svc_test::db=debug, other=off") == [
        Directive(None, logging.WARNING), Directive("svc_test.db", logging.DEBUG), Directive("other", OFF),
    ]
    assert parse_filter("a.b") == [Directive("a.b", logging.DEBUG)]
    for bad in ("a=loud", "=info", "a b=info", "a,,b", "9x=info", "a=info=debug"):
        with pytest.raises(HookRejected, match=r"^log_filter_invalid:"):
            parse_filter(bad)


async def test_log_singleton_shape(handler: PropsHandler) -> None:
    """The log namespace is a singleton with the documented fields and defaults, written under the
    key current."""
    described = await call(handler, "describe", {"namespace": "log"})
    assert described["cardinality"] == "singleton"
    fields = {f["name"]: f["default"] for f in described["fields"]}  # type: ignore[attr-defined]
    assert fields == {"level": "info", "filter": "", "format": "human", "applied_at": "", "source": "", "applied_by": "default"}
    reply = await call(handler, "set", {"namespace": "log"}, b'{"level": "debug", "applied_by": "props"}')
    assert reply["key"] == "current"


@pytest.mark.parametrize("body", [b'{"level": "loud"}', b'{"format": "xml"}', b'{"applied_by": "me"}'])
async def test_hooks_reject_unknown_enum_variants(handler: PropsHandler, body: bytes) -> None:
    """An unknown level, format or applied_by is refused as log_unknown_enum_variant."""
    with pytest.raises(PropsError) as caught:
        await call(handler, "set", {"namespace": "log"}, body)
    assert caught.value.error_code == "validation_error"
    assert caught.value.message.startswith("log_unknown_enum_variant:")


async def test_hooks_reject_bad_filters_and_every_delete(handler: PropsHandler) -> None:
    """A malformed filter is refused, and the log singleton can never be deleted."""
    with pytest.raises(PropsError) as bad:
        await call(handler, "set", {"namespace": "log"}, b'{"filter": "a=loud"}')
    assert bad.value.message.startswith("log_filter_invalid:")
    await call(handler, "set", {"namespace": "log"}, b'{"level": "info"}')
    with pytest.raises(PropsError) as undeletable:
        await call(handler, "delete", {"namespace": "log"})
    assert (undeletable.value.error_code, undeletable.value.message.split(":")[0]) == ("validation_error", "log_undeletable")


async def test_bridge_changes_real_logger_levels_live(handler: PropsHandler, loggers: None) -> None:
    """The bridge applies each committed log setting to the real loggers' levels live (filters, off,
    reset to NOTSET), writes nothing back and rebuilds no handler."""
    logger = logging.getLogger("svc_test_bridge")
    handlers_before = list(logging.getLogger().handlers)
    bridge = LogBridge(handler.store, root="svc_test_bridge")
    await bridge.start()
    watcher = asyncio.create_task(bridge.run())
    try:
        await call(handler, "set", {"namespace": "log"}, b'{"level": "debug"}')
        await asyncio.wait_for(bridge.applied.wait(), 2)
        assert logger.level == logging.DEBUG and logger.isEnabledFor(logging.DEBUG)
        bridge.applied.clear()
        await call(handler, "set", {"namespace": "log"}, b'{"level": "none", "filter": "svc_test_bridge::db=warn,svc_test_other=error"}')
        await asyncio.wait_for(bridge.applied.wait(), 2)
        assert logger.level == OFF and not logger.isEnabledFor(logging.CRITICAL)
        assert logging.getLogger("svc_test_bridge.db").level == logging.WARNING
        assert logging.getLogger("svc_test_other").level == logging.ERROR
        bridge.applied.clear()
        await call(handler, "set", {"namespace": "log"}, b'{"level": "warn", "filter": ""}')
        await asyncio.wait_for(bridge.applied.wait(), 2)
        assert logger.level == logging.WARNING
        assert logging.getLogger("svc_test_other").level == logging.NOTSET
        record = await call(handler, "get", {"namespace": "log"})
        assert record["fields"] == {"level": "warn", "filter": ""}  # nothing written back
        assert record["version"] == 3
        assert list(logging.getLogger().handlers) == handlers_before  # no sink rebuilt
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


class FailingReads(MemoryStore):
    """A store whose reads fail once ``failing`` is set."""

    failing = False

    async def get(self, namespace: str, key: str) -> Any:
        if self.failing:
            raise PropsStoreError("disk I/O error")
        return await super().get(namespace, key)


async def test_a_read_failure_ends_the_watcher_with_log_bridge_error(loggers: None, caplog: pytest.LogCaptureFixture) -> None:
    """The watcher is `run` itself (a supervised worker): opening the bridge
    starts no background task, and a read failure is raised out of `run`
    and logged, never swallowed by a task nobody awaits."""
    store = FailingReads()
    h = PropsHandler("demo", store, StaticPolicy({"A/alice": all_caps("demo.log")}))
    tasks_before = asyncio.all_tasks()
    bridge = await open_log_bridge(h, root="svc_test_bridge")
    assert asyncio.all_tasks() == tasks_before
    watcher = asyncio.create_task(bridge.run())
    await call(h, "set", {"namespace": "log"}, b'{"level": "debug"}')
    await asyncio.wait_for(bridge.applied.wait(), 2)
    store.failing = True
    await store.set(log_namespace(), "current", {"level": "warn"}, merge=True, if_version=None, actor=Actor("A/alice", now()))
    with pytest.raises(LogBridgeError, match="reading the log record failed"):
        await asyncio.wait_for(watcher, 2)
    assert logging.getLogger("svc_test_bridge").level == logging.DEBUG
    assert any(r.levelno == logging.ERROR and "logging bridge stopped" in r.getMessage() for r in caplog.records)


async def test_start_maps_a_read_failure_to_log_bridge_error() -> None:
    """A store read failing at start raises LogBridgeError."""
    store = FailingReads()
    await store.register(log_namespace())
    store.failing = True
    with pytest.raises(LogBridgeError):
        await LogBridge(store).start()


async def test_open_log_bridge_maps_registration_failure(handler: PropsHandler) -> None:
    """open_log_bridge raises LogBridgeError when log is registered already, and registers it on a
    fresh handler."""
    from service_engine.props import LogBridgeError, open_log_bridge

    with pytest.raises(LogBridgeError):
        await open_log_bridge(handler)  # "log" is registered already
    fresh = PropsHandler("demo", MemoryStore(), StaticPolicy({}))
    bridge = await open_log_bridge(fresh)
    try:
        assert "log" in fresh.namespaces
    finally:
        await bridge.aclose()
