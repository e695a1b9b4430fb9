"""The supervisor's shutdown: every worker ends before `run` returns, even
one that swallowed its first cancellation."""

from __future__ import annotations

import asyncio

import pytest

from service_engine.errors import WorkerStopped
from service_engine.readiness import REASON_WORKER_STOPPED, ReadinessHandle
from service_engine.supervisor import Supervisor


async def test_a_worker_that_swallows_a_cancel_is_cancelled_again() -> None:
    """A worker that drops its first cancellation (as asyncio.wait_for can on
    Python 3.11 when the cancel races its inner result) keeps running; the
    supervisor cancels it again, so a sibling's failure still ends `run`
    with `WorkerStopped` and readiness DOWN instead of hanging."""
    readiness = ReadinessHandle()
    swallowed = asyncio.Event()
    ended = asyncio.Event()

    async def stubborn() -> None:
        try:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if swallowed.is_set():
                        raise
                    swallowed.set()
                    current = asyncio.current_task()
                    assert current is not None
                    current.uncancel()
        finally:
            ended.set()

    async def failing() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    supervisor = Supervisor(readiness)
    supervisor.add("stubborn", stubborn)
    supervisor.add("failing", failing)
    with pytest.raises(WorkerStopped):
        await asyncio.wait_for(supervisor.run(), 10)
    assert swallowed.is_set() and ended.is_set()
    assert readiness.holds(REASON_WORKER_STOPPED)
