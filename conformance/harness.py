"""Test harness: real servers, isolated per test, and bounded waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` until it holds; fail the test past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def assert_nothing(queue: asyncio.Queue[T], within: float = 0.2) -> None:
    """Assert no item arrives on ``queue`` within the bound."""
    try:
        item = await asyncio.wait_for(queue.get(), within)
    except TimeoutError:
        return
    raise AssertionError(f"expected nothing, got {item!r}")
