"""The logging bridge over a real nats-server: a ``set`` on the ``log``
singleton from an attested caller changes a real Python logger's level."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from conformance.props_support import props_stack
from service_engine.props import LogBridge, PropsError, StaticPolicy, all_caps, log_namespace
from service_engine.props.logging_bridge import OFF

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
            await bridge.aclose()
            target.setLevel(saved[0])
            child.setLevel(saved[1])
