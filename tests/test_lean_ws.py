"""The lean socket protocol's receive queue and writable flag behave as the
asyncio primitives uvicorn's protocol uses them for (FIFO, waking a waiting
reader, a cancelled wait leaving nothing behind)."""

from __future__ import annotations

import asyncio

import pytest

from service_engine.host import _Inbox, _Writable

from .loop_support import turns_until


async def test_the_inbox_is_fifo_and_wakes_a_waiting_reader() -> None:
    """Items come out in order; a reader waiting on an empty inbox gets the next put."""
    inbox = _Inbox()
    inbox.put_nowait(1)
    inbox.put_nowait(2)
    assert inbox.qsize() == 2 and not inbox.empty()
    assert await inbox.get() == 1
    assert await inbox.get() == 2
    assert inbox.empty()
    reader = asyncio.create_task(inbox.get())
    await turns_until(lambda: inbox._waiter is not None, "the reader waits")
    assert not reader.done()
    inbox.put_nowait("x")
    assert await asyncio.wait_for(reader, 1) == "x"


async def test_a_cancelled_read_leaves_the_inbox_usable() -> None:
    """A reader cancelled while waiting leaves no waiter behind; the next read works."""
    inbox = _Inbox()
    reader = asyncio.create_task(inbox.get())
    await turns_until(lambda: inbox._waiter is not None, "the reader waits")
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    inbox.put_nowait("after")
    assert await asyncio.wait_for(inbox.get(), 1) == "after"


async def test_writable_blocks_while_cleared_and_releases_every_waiter_on_set() -> None:
    """wait() returns at once while set, blocks once cleared, and set() releases all waiters."""
    writable = _Writable()
    assert writable.is_set()
    await asyncio.wait_for(writable.wait(), 1)
    writable.clear()
    waiters = [asyncio.create_task(writable.wait()) for _ in range(3)]
    await turns_until(lambda: len(writable._waiters) == 3, "three waiters")
    assert not any(w.done() for w in waiters)
    writable.set()
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
