"""The first-come, first-served queue in front of the pool
(`service_engine.db.pool.ConnectionQueue`). Pure: no pool, no connection."""

from __future__ import annotations

import asyncio

import pytest

from service_engine.db.pool import ConnectionQueue, PoolQueueFull, write_slots


async def test_waiters_are_served_in_arrival_order_and_a_newcomer_does_not_barge() -> None:
    """With every slot held, waiters get a released slot oldest first; a
    request arriving after the release, before the woken waiter ran, waits
    behind it instead of taking the slot."""
    queue = ConnectionQueue(1)
    await queue.enter(None)
    served: list[str] = []

    async def wait(name: str) -> None:
        await queue.enter(None)
        served.append(name)

    first = asyncio.create_task(wait("first"))
    second = asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    queue.leave()  # handed to "first": never free in between
    late = asyncio.create_task(wait("late"))
    await asyncio.sleep(0)
    await first
    assert served == ["first"] and queue.waiting == 2
    queue.leave()
    await second
    queue.leave()
    await late
    assert served == ["first", "second", "late"]
    queue.leave()
    await queue.enter(None)  # a free slot again: taken at once


async def test_a_bounded_wait_times_out_and_leaves_no_slot_behind() -> None:
    """A waiter past its bound raises `TimeoutError`; the slot released
    later goes to the next waiter, not to the one that gave up."""
    queue = ConnectionQueue(1)
    await queue.enter(None)
    with pytest.raises(TimeoutError):
        await queue.enter(0.01)
    after = asyncio.create_task(queue.enter(None))
    await asyncio.sleep(0)
    queue.leave()
    await asyncio.wait_for(after, 1)
    assert queue.waiting == 0


async def test_a_full_queue_refuses_at_once() -> None:
    """``max_queue`` waiters wait; one more is refused with `PoolQueueFull`
    (a `TimeoutError`: retryable) without waiting."""
    queue = ConnectionQueue(1, max_queue=2)
    await queue.enter(None)
    waiters = [asyncio.create_task(queue.enter(None)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(PoolQueueFull) as refused:
        await queue.enter(None)
    assert isinstance(refused.value, TimeoutError) and "max_queue=2" in str(refused.value)
    for _ in range(3):
        queue.leave()
        await asyncio.sleep(0)
    await asyncio.gather(*waiters)


async def test_a_waiter_cancelled_once_handed_a_slot_passes_it_on() -> None:
    """A waiter cancelled after the slot was handed to it (before it ran)
    hands the slot to the next waiter: no slot is lost."""
    queue = ConnectionQueue(1)
    await queue.enter(None)
    first = asyncio.create_task(queue.enter(None))
    second = asyncio.create_task(queue.enter(None))
    await asyncio.sleep(0)
    queue.leave()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)
    queue.leave()
    await asyncio.wait_for(queue.enter(None), 1)


def test_the_write_pipeline_keeps_one_connection_in_five_for_reads() -> None:
    """`write_slots`: the pool less one connection in `READ_RESERVE`, and at
    least one (a pool of one or two serves writers with all of it)."""
    assert [write_slots(n) for n in (1, 2, 4, 5, 10, 20)] == [1, 2, 4, 4, 8, 16]
    assert all(1 <= write_slots(n) <= n for n in range(1, 100))
