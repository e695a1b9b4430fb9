"""``service_engine_loop_lag_seconds``: the engine's ``loop_lag`` worker
records how late the event loop ran a wake it scheduled, so a callback that
holds the loop shows on ``/metrics`` as lag of at least what it held."""

from __future__ import annotations

import asyncio
import time

from service_engine import Database, Engine, EngineConfig, ReadinessHandle
from service_engine.engine import LOOP_LAG_INTERVAL

from ..support.harness import wait_until

LAG = "service_engine_loop_lag_seconds"


async def test_a_blocked_loop_shows_as_loop_lag(db: Database) -> None:
    """The worker is supervised (its name in the supervisor's list); wakes
    are recorded while the loop is free; a callback that blocks the loop
    for 200 ms lands one observation in a bucket above 100 ms and raises the
    sum by at least the blocked time less one interval."""
    engine = await Engine.boot(EngineConfig(service="lag"), db, None, ReadinessHandle())
    assert "loop_lag" in engine._supervisor.names
    task = asyncio.create_task(engine.run())
    try:
        m = engine.metrics
        await wait_until(lambda: (m.sample(f"{LAG}_count") or 0) >= 3, what="wakes recorded")
        assert (m.sample(f"{LAG}_bucket", le="+Inf") or 0) >= 3
        slow_before = m.sample(f"{LAG}_count") or 0
        slow_before -= m.sample(f"{LAG}_bucket", le="0.1") or 0
        sum_before = m.sample(f"{LAG}_sum") or 0.0
        count_before = m.sample(f"{LAG}_count") or 0
        held = 0.2
        asyncio.get_running_loop().call_soon(time.sleep, held)  # holds the loop
        await wait_until(lambda: (m.sample(f"{LAG}_count") or 0) >= count_before + 2,
                         what="the wakes after the block")
        slow = (m.sample(f"{LAG}_count") or 0) - (m.sample(f"{LAG}_bucket", le="0.1") or 0)
        assert slow >= slow_before + 1
        assert (m.sample(f"{LAG}_sum") or 0.0) - sum_before >= held - LOOP_LAG_INTERVAL - 0.01
        assert b"service_engine_loop_lag_seconds_bucket" in m.exposition()
    finally:
        engine.shutdown()
        await asyncio.wait_for(task, 10)


async def test_the_beat_yields_a_loop_turn_between_its_steps(db: Database) -> None:
    """Two beat steps that await nothing never run in one loop turn: a
    callback the first schedules has run by the time the second starts, so
    the beat's synchronous work (sweeps, gauges) is never held together."""
    engine = await Engine.boot(EngineConfig(service="lag"), db, None, ReadinessHandle())
    loop = asyncio.get_running_loop()
    scheduled: list[asyncio.Event] = []
    seen: list[bool] = []

    async def first() -> None:
        turn = asyncio.Event()
        scheduled.append(turn)
        loop.call_soon(turn.set)

    async def second() -> None:
        if scheduled:
            seen.append(scheduled[-1].is_set())

    engine.register_beat_step("first_sync", first)
    engine.register_beat_step("second_sync", second)
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: len(seen) >= 2, what="two beats")
        assert all(seen), seen
    finally:
        engine.shutdown()
        await asyncio.wait_for(task, 10)
