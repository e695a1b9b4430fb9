"""Waiting on a condition of pure in-memory objects by loop turns, bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

TURNS = 100
"""Loop turns a condition may take: far more than any in-memory step needs."""


async def turns_until(condition: Callable[[], bool], what: str, turns: int = TURNS) -> None:
    """Yield to the loop until ``condition()`` holds; fail after ``turns`` turns."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not reached in {turns} loop turns: {what}")
