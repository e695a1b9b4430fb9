"""The logging bridge over a real nats-server: a ``set`` on the ``log``
singleton from an attested caller changes a real Python logger's level."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from conformance.support.props_support import props_stack
from service_engine.errors import WorkerStopped
from service_engine.props import (
    Actor,
    LogBridge,
    PropsError,
    StaticPolicy,
    all_caps,
    log_namespace,
    now,
)
from service_engine.props.logging_bridge import OFF
from service_engine.readiness import REASON_BOOTING, REASON_WORKER_STOPPED, ReadinessHandle
from service_engine.supervisor import Supervisor

POLICY = StaticPolicy({"A/alice": all_caps("demo.log")})


async def test_log_level_changes_live_over_nats(tmp_path: Path) -> None:
    """set level/filter over NATS -> the bridge's own watcher applies them to
    real loggers; the record is not written back; deletes are refused."""
    target = logging.getLogger("props_conformance_bridge")
    child = logging.getLogger("props_conformance_bridge.io")
    saved = target.level, child.level
    async with props_stack(tmp_path, [log_namespace()], POLICY) as stack:
        bridge = LogBridge(stack.store, root="props_conformance_bridge")
        await bridge.start()
        watcher = asyncio.create_task(bridge.run())
        try:
            alice = stack.caller("alice")
            reply = await alice.set("log", {"level": "debug", "applied_by": "props"})
            assert (reply["key"], reply["version"]) == ("current", 1)
            await asyncio.wait_for(bridge.applied.wait(), 5)
            assert target.getEffectiveLevel() == logging.DEBUG
            bridge.applied.clear()
            await alice.set("log", {"level": "none", "filter": "props_conformance_bridge::io=warn"})
            await asyncio.wait_for(bridge.applied.wait(), 5)
            assert target.level == OFF and child.level == logging.WARNING
            got = await alice.get("log")
            assert got["version"] == 2 and "applied_at" not in got["fields"]
            with pytest.raises(PropsError) as undeletable:
                await alice.request("delete", "log")
            assert undeletable.value.message.startswith("log_undeletable:")
            with pytest.raises(PropsError) as bad:
                await alice.set("log", {"level": "verbose"})
            assert bad.value.message.startswith("log_unknown_enum_variant:")
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            target.setLevel(saved[0])
            child.setLevel(saved[1])


async def test_a_read_failure_of_the_bridge_takes_readiness_down(tmp_path: Path) -> None:
    """The bridge's watcher runs under the engine's supervisor: when reading
    the log record after a commit fails (here: the store closed right after
    the commit), the worker stops with LogBridgeError and readiness goes
    DOWN naming it, instead of the watcher ending unseen."""
    logger = logging.getLogger("props_conformance_failing")
    saved = logger.level
    async with props_stack(tmp_path, [log_namespace()], POLICY) as stack:
        readiness = ReadinessHandle()
        readiness.clear(REASON_BOOTING)
        supervisor = Supervisor(readiness)
        bridge = LogBridge(stack.store, root="props_conformance_failing")
        supervisor.add("log_bridge", bridge.run)
        running = asyncio.create_task(supervisor.run())
        try:
            await stack.caller("alice").set("log", {"level": "warn"})
            await asyncio.wait_for(bridge.applied.wait(), 5)
            assert readiness.is_up
            await stack.store.set(log_namespace(), "current", {"level": "debug"}, merge=True, if_version=None, actor=Actor("A/alice", now()))
            # Closed before the watcher runs: its read of the committed change fails.
            await stack.store.aclose()
            with pytest.raises(WorkerStopped):
                await asyncio.wait_for(running, 5)
            assert "LogBridgeError" in readiness.current().reasons[REASON_WORKER_STOPPED]
            assert logger.level == logging.WARNING
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            logger.setLevel(saved)
