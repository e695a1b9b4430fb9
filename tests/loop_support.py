"""Waiting on a condition of pure in-memory objects by loop turns, bounded;
an engine stand-in's callback attach (`CallbackAttach`)."""

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



class CallbackAttach:
    """An engine stand-in's ``render.attach_soon`` (`RenderRegistry.attach_soon`)
    over its own ``attach`` coroutine: ``done`` gets the stream or the error,
    unless the returned task is cancelled."""

    attach: Callable[..., Coroutine[Any, Any, Any]]

    @property
    def render(self) -> Any:
        return self

    def attach_soon(self, principal: Any, projector: str, window: Any,
                    done: Callable[[Any], None], *, applier: Any = None,
                    session_id: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(
            self.attach(principal, projector, window, applier=applier, session_id=session_id))

        def finished(task: asyncio.Task[Any]) -> None:
            if not task.cancelled():
                error = task.exception()
                done(task.result() if error is None else error)

        task.add_done_callback(finished)
        return task
