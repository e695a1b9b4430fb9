"""The render loop never holds the event loop: a session whose resync its
pass cannot serve (not live: a repair pending, a snapshot in flight) leaves
the loop idle, not spinning over empty passes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from service_engine.config import EngineConfig
from service_engine.impacts.transport import ImpactChannel
from service_engine.render.runtime import RenderRuntime


@pytest.mark.timeout(20)
def test_a_resync_pending_on_a_session_that_is_not_live_does_not_spin_the_loop() -> None:
    """A stalled subscriber's overflow marks its session for a resync; if
    that session is not live (its resync snapshot failed: repair pending),
    the render loop waits for work instead of running empty passes that
    never await, so every other task (the beat that repairs it, HTTP, the
    sockets) keeps running."""

    async def scenario() -> None:
        runtime = RenderRuntime(SimpleNamespace(), EngineConfig(), ImpactChannel(10))  # type: ignore[arg-type]
        session: Any = SimpleNamespace(live=False, holding=True, ended=False)
        runtime.registry._sessions["s"] = SimpleNamespace(resync=True, session=session)  # type: ignore[index,assignment]
        ticked = asyncio.Event()

        async def other() -> None:
            for _ in range(5):
                await asyncio.sleep(0.01)
            ticked.set()

        loop_task = asyncio.ensure_future(runtime.run())
        other_task = asyncio.ensure_future(other())
        try:
            async with asyncio.timeout(5):
                await ticked.wait()
        finally:
            loop_task.cancel()
            other_task.cancel()
            await asyncio.gather(loop_task, other_task, return_exceptions=True)

    asyncio.run(scenario())
