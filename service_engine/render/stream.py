"""The subscriber stream: one session's deltas, in revision order.

The registry puts deltas on a `SessionStream` and ends it; the subscriber
(the GraphQL subscription, a test) iterates it. Putting never blocks: a
subscriber that falls past ``capacity`` undelivered deltas loses the backlog
and the registry re-snapshots the session, so it gets a Reset, never a gap.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..errors import EngineError
from .deltas import Delta
from .session import SessionId

__all__ = ["SessionEnded", "SessionStream"]

V = TypeVar("V")


class SessionEnded(EngineError):
    """The session ended; ``reason`` says why (``session_max_age``, a
    failed principal refresh, repeated render failures, shutdown)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"session ended: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _End:
    reason: str


class SessionStream(Generic[V]):
    """A subscriber's side of one session: its deltas in revision order.

    Iterate it; iteration stops when the session ends (``end_reason`` says
    why). `aclose` detaches the session. Putting never blocks: past
    ``capacity`` undelivered deltas the backlog is dropped and the session
    re-snapshotted, so a slow subscriber gets a Reset, never a gap.
    """

    def __init__(self, session_id: SessionId, capacity: int, on_close: Callable[[], None]) -> None:
        self.id = session_id
        self.capacity = capacity
        self._queue: asyncio.Queue[Delta[V] | _End] = asyncio.Queue()
        self._on_close = on_close
        self.end_reason: str | None = None
        self.waiting = 0
        self.last_seen = time.monotonic()

    def put(self, delta: Delta[V]) -> bool:
        """Queue ``delta``; False when the backlog overflowed and was dropped
        (the caller re-snapshots the session)."""
        if self._queue.qsize() >= self.capacity:
            while not self._queue.empty():
                self._queue.get_nowait()
            return False
        self._queue.put_nowait(delta)
        return True

    def end(self, reason: str) -> None:
        """Queue the end: the subscriber reads what came before, then stops."""
        self._queue.put_nowait(_End(reason))

    def pending(self) -> int:
        return self._queue.qsize()

    def get_nowait(self) -> Delta[V] | None:
        """The next queued delta, or None (None also after the end)."""
        if self._queue.empty():
            return None
        item = self._queue.get_nowait()
        if isinstance(item, _End):
            self.end_reason = item.reason
            self._queue.put_nowait(item)
            return None
        return item

    async def next(self) -> Delta[V]:
        """The next delta; raises `SessionEnded` once the session ended."""
        self.waiting += 1
        try:
            item = await self._queue.get()
        finally:
            self.waiting -= 1
            self.last_seen = time.monotonic()
        if isinstance(item, _End):
            self.end_reason = item.reason
            self._queue.put_nowait(item)  # every later read sees the end too
            raise SessionEnded(item.reason)
        return item

    def __aiter__(self) -> AsyncIterator[Delta[V]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Delta[V]]:
        while True:
            try:
                yield await self.next()
            except SessionEnded:
                return

    async def aclose(self) -> None:
        self._on_close()
