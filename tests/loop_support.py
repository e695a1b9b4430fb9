"""Waiting on a condition of pure in-memory objects by loop turns, bounded;
an engine stand-in's callback attach."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

TURNS = 100
"""Loop turns a condition may take: far more than any in-memory step needs."""


async def turns_until(condition: Callable[[], bool], what: str, turns: int = TURNS) -> None:
    """Yield to the loop until ``condition()`` holds; fail after ``turns`` turns."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not reached in {turns} loop turns: {what}")


def attach_soon(
    attached: Coroutine[Any, Any, Any], done: Callable[[Any], None]
) -> asyncio.Task[Any]:
    """`RenderRegistry.attach_soon` over a stand-in's ``attach(...)``
    coroutine: ``done`` gets its stream or its error, unless cancelled."""
    task = asyncio.get_running_loop().create_task(attached)

    def finished(task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            error = task.exception()
            done(task.result() if error is None else error)

    task.add_done_callback(finished)
    return task
