"""The subscriber stream: one session's deltas, in revision order.

The registry puts deltas on a `SessionStream` and ends it; the subscriber
(the GraphQL subscription, a test) iterates it. Putting never blocks.

A subscriber that falls behind gets the session's latest state, not every
intermediate one. Once ``behind`` or more deltas wait untaken, a delta
*collapses* into what waits (`Backlog.put`): the latest Upsert or Remove of a
key replaces an earlier untaken one of that key, an insert followed by its
Remove vanishes, and a Reset drops everything untaken before it. Revisions
are assigned when the subscriber takes a delta (`renumbered`), so what it
reads stays contiguous (1, 2, 3, ...) whatever collapsed. Past ``capacity``
untaken deltas the backlog is dropped and the registry re-snapshots the
session: the next delta it reads is a Reset from committed state, never a gap.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..failures import EngineError
from .deltas import Delta, KeyText, Remove, Reset, Revision, Upsert, renumbered
from .session_id import SessionId

__all__ = ["BEHIND", "Backlog", "SessionEnded", "SessionStream"]

V = TypeVar("V")

BEHIND = 8
"""Untaken deltas from which on a stream collapses what it is given."""


class SessionEnded(EngineError):
    """The session ended; ``reason`` says why (``session_max_age``, a
    failed principal refresh, repeated render failures, shutdown)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"session ended: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _End:
    reason: str


class _Entry:
    """One untaken delta; ``delta`` None once it collapsed away."""

    __slots__ = ("delta", "inserts", "key", "prior", "taken")

    def __init__(self, delta: Any, key: KeyText | None, inserts: bool, prior: _Entry | None
                 ) -> None:
        self.delta = delta
        self.key = key
        self.inserts = inserts
        """An Upsert known to insert its key in the subscriber's window (it
        follows that key's Remove): its own Remove makes both vanish."""
        self.prior = prior
        self.taken = False


class Backlog(Generic[V]):
    """The untaken deltas of one stream, collapsing once ``behind`` wait.

    Pure: `put` and `take` only. `take` renumbers what it hands out so the
    reader's revisions are contiguous from 1. ``collapsed`` counts deltas
    the reader will never see because a later one carries their effect.
    """

    __slots__ = ("_entries", "_latest", "_live", "_one", "behind", "collapsed", "taken")

    def __init__(self, behind: int = BEHIND) -> None:
        self.behind = behind
        # None while nothing waits (most of a session's life): an empty deque
        # holds a 64-slot block (~0.6 KB a session), an emptied dict its table.
        self._entries: collections.deque[_Entry] | None = None
        self._latest: dict[KeyText, _Entry] | None = None
        self._one: Delta[V] | None = None
        """The only untaken delta, while it is alone (a subscriber that keeps
        up: one delta waits between a put and its take): no entry, no
        deque, no index. A second put moves it into the entries first."""
        self._live = 0
        self.collapsed = 0
        self.taken: Revision = 0
        """The revision of the last delta taken."""

    def __len__(self) -> int:
        return self._live

    def clear(self) -> int:
        """Drop every untaken delta; return how many."""
        dropped = self._live
        self._entries = None
        self._latest = None
        self._one = None
        self._live = 0
        return dropped

    def put(self, delta: Delta[V]) -> None:
        if not self._live:
            # Nothing waits (nothing untaken: no entry to collapse into).
            self._entries = None
            self._latest = None
            self._one = delta
            self._live = 1
            return
        one = self._one
        if one is not None:
            # A second delta waits: the first becomes an entry, as if it
            # had been put on the entries (it was alone: nothing collapsed).
            self._one = None
            self._live = 0
            self._put(one)
        self._put(delta)

    def _put(self, delta: Delta[V]) -> None:
        latest = self._latest
        if latest is None:
            latest = self._latest = {}
        if type(delta) is Reset:
            if self._live >= self.behind:
                # Behind: the Reset carries the whole window; nothing before it matters.
                self.collapsed += self.clear()
            else:
                latest.clear()
            self._append(_Entry(delta, None, False, None))
            return
        key: KeyText = delta.key  # type: ignore[union-attr]
        last = latest.get(key)
        if last is not None and not last.taken:
            if self._live >= self.behind and self._collapse(last, delta):
                return
            inserts = type(last.delta) is Remove and type(delta) is Upsert
            entry = _Entry(delta, key, inserts, last)
        else:
            entry = _Entry(delta, key, False, None)
        latest[key] = entry
        self._append(entry)

    def _collapse(self, last: _Entry, delta: Delta[V]) -> bool:
        """Fold ``delta`` into ``last`` (its key's latest untaken entry);
        False when the two must both reach the reader."""
        if type(last.delta) is not Upsert:
            return False  # after a Remove an Upsert re-inserts: both go
        if type(delta) is Upsert:
            last.delta = delta  # same place: the key keeps its window position
            self.collapsed += 1
            return True
        if last.inserts:
            # An insert and its Remove: the reader never held the key.
            last.delta = None
            self._live -= 1
            self.collapsed += 2
            prior = last.prior
            latest = self._latest
            assert latest is not None
            if prior is not None and not prior.taken and prior.delta is not None:
                latest[last.key] = prior  # type: ignore[index]
            else:
                del latest[last.key]  # type: ignore[arg-type]
            return True
        return False  # whether the reader holds the key is unknown: both go

    def _append(self, entry: _Entry) -> None:
        entries = self._entries
        if entries is None:
            entries = self._entries = collections.deque()
        entries.append(entry)
        self._live += 1

    def take(self) -> Delta[V] | None:
        """The next delta, numbered one past the last taken; None when empty."""
        delta = self.take_raw()
        if delta is None:
            return None
        taken = self.taken
        return delta if delta.revision == taken else renumbered(delta, taken)

    def take_raw(self) -> Delta[V] | None:
        """The next delta as it was put: its revision is ``taken`` (one past
        the last taken), whatever it carries; None when empty. For a reader
        that splices the revision into its own message (no renumbered copy)."""
        one = self._one
        if one is not None:
            self._one = None
            self._live = 0
            self.taken += 1
            return one
        entries = self._entries
        if entries is None:
            return None
        while entries:
            entry = entries.popleft()
            delta = entry.delta
            if delta is None:
                continue
            entry.taken = True
            self._live -= 1
            key = entry.key
            latest = self._latest
            if key is not None and latest is not None and latest.get(key) is entry:
                del latest[key]
            if not entries:
                self._entries = None
                if not latest:
                    self._latest = None
            self.taken += 1
            out: Delta[V] = delta
            return out
        self._entries = None
        return None


class SessionStream(Generic[V]):
    """A subscriber's side of one session: its deltas in revision order.

    Iterate it; iteration stops when the session ends (``end_reason`` says
    why). `aclose` detaches the session. Putting never blocks: from
    ``behind`` untaken deltas on they collapse to the latest state (see the
    module), past ``capacity`` the backlog is dropped and the session
    re-snapshotted, so a slow subscriber gets its latest state or a Reset,
    never a gap.

    Two ways to take: await `next` (iterate), or callback mode: `set_waker`
    registers a callback the stream calls when a delta or the end is queued
    and nobody awaits, and the subscriber takes with `get_nowait`. A
    callback-mode subscriber may also take a delta as it is put (`set_waker`'s
    ``direct``): a caught-up one writes it at once, with no queue, wake or
    take between.
    """

    __slots__ = (
        "_backlog", "_direct", "_end", "_getters", "_on_close", "_resyncing", "_waker",
        "_woken", "capacity", "end_reason", "id", "last_seen", "waiting",
    )

    def __init__(
        self, session_id: SessionId, capacity: int, on_close: Callable[[], None],
        *, behind: int = BEHIND,
    ) -> None:
        self.id = session_id
        self.capacity = capacity
        self._backlog: Backlog[V] = Backlog(min(behind, capacity))
        self._end: _End | None = None
        self._resyncing = False
        self._getters: list[asyncio.Future[None]] | None = None
        """Those awaiting `next` (None while none does: a callback-mode
        subscriber never has one)."""
        self._on_close = on_close
        self._waker: Callable[[], None] | None = None
        self._direct: Callable[[Delta[V], Revision], bool] | None = None
        """Offered a delta put while nothing waits (callback mode, `set_waker`)."""
        self._woken = False
        self.end_reason: str | None = None
        self.waiting = 0
        self.last_seen = time.monotonic()

    def collapse_after(self, behind: int | None) -> None:
        """Collapse once ``behind`` or more deltas wait; None: never
        (every delta reaches the subscriber, or the capacity's Reset)."""
        self._backlog.behind = self.capacity + 1 if behind is None else min(behind, self.capacity)

    @property
    def collapsed(self) -> int:
        """Deltas the subscriber will never read: a later one carries them."""
        return self._backlog.collapsed

    def put(self, delta: Delta[V]) -> bool:
        """Queue ``delta``; False when the backlog overflowed and was dropped
        (the caller re-snapshots the session; until its Reset arrives every
        other delta is dropped too)."""
        if self._end is not None:
            return True
        backlog = self._backlog
        direct = self._direct
        if direct is not None and not backlog._live and not self._resyncing:
            # Caught up (nothing untaken, no Reset awaited): the subscriber
            # takes it now, numbered as its take would number it, or
            # declines (not writable now) and it is queued as usual.
            revision = backlog.taken + 1
            if direct(delta, revision):
                backlog.taken = revision
                return True
        if self._resyncing:
            if type(delta) is not Reset:
                return False
            self._resyncing = False
        elif len(backlog) >= self.capacity and type(delta) is not Reset:
            # (A Reset carries the whole window: it replaces the backlog.)
            backlog.clear()
            self._resyncing = True
            return False
        backlog.put(delta)
        if self._getters:
            self._wake()
        elif not self._woken:
            waker = self._waker
            if waker is not None:
                self._woken = True
                waker()
        return True

    def _wake(self) -> None:
        getters = self._getters
        if getters:
            self._getters = None
            for getter in getters:
                if not getter.done():
                    getter.set_result(None)
            return
        waker = self._waker
        if waker is not None and not self._woken:
            self._woken = True
            waker()

    def set_waker(
        self, waker: Callable[[], None] | None,
        direct: Callable[[Delta[V], Revision], bool] | None = None,
    ) -> None:
        """Callback mode: call ``waker`` when a delta or the end is queued
        and nobody awaits `next` (at most once until the subscriber next
        calls `get_nowait`); called at once when something waits already.
        None stops the calls.

        ``direct`` (with a waker): a delta put while nothing is untaken is
        first offered to ``direct(delta, revision)``, ``revision`` the one
        its take would give it; True means the subscriber took it (written,
        counted as taken: `taken` is ``revision``), False that it is queued
        and woken for as any other. It runs inside `put`: it must not block
        nor put. Cleared with the waker.

        While a waker is set the subscriber counts as reading (``waiting``,
        as an awaiting one does); clearing it (a writer that cannot take
        more) makes it one that stopped reading now (``last_seen``), so a
        stalled subscriber ages and collapses the same in both modes. The
        waker runs inside `put` / `end`: it must only schedule the take.
        """
        if (self._waker is None) != (waker is None):
            if waker is None:
                self.waiting -= 1
                self.last_seen = time.monotonic()
            else:
                self.waiting += 1
        self._waker = waker
        self._direct = direct if waker is not None else None
        self._woken = False
        if waker is not None and self.pending():
            self._woken = True
            waker()

    def end(self, reason: str) -> None:
        """Queue the end: the subscriber reads what came before, then stops."""
        if self._end is None:
            self._end = _End(reason)
        self._wake()

    def pending(self) -> int:
        """Deltas queued and not yet taken (the end counts as one)."""
        return len(self._backlog) + (self._end is not None)

    def get_nowait(self) -> Delta[V] | None:
        """The next queued delta, or None (None also after the end:
        ``end_reason`` then says why)."""
        self._woken = False
        delta = self._backlog.take()
        if delta is None and self._end is not None:
            self.end_reason = self._end.reason
        return delta

    def get_raw_nowait(self) -> Delta[V] | None:
        """`get_nowait`, the delta as it was put: its revision for this
        reader is `taken` (sessions holding equal windows are given the
        same delta objects, numbered for the first of them). For a reader
        that writes the revision into its own message: no renumbered copy."""
        self._woken = False
        delta = self._backlog.take_raw()
        if delta is None and self._end is not None:
            self.end_reason = self._end.reason
        return delta

    @property
    def taken(self) -> Revision:
        """The revision of the last delta taken (0 before the first)."""
        return self._backlog.taken

    async def next(self) -> Delta[V]:
        """The next delta; raises `SessionEnded` once the session ended."""
        self.waiting += 1
        try:
            while True:
                delta = self._backlog.take()
                if delta is not None:
                    return delta
                if self._end is not None:
                    self.end_reason = self._end.reason
                    raise SessionEnded(self._end.reason)
                getter = asyncio.get_running_loop().create_future()
                if self._getters is None:
                    self._getters = [getter]
                else:
                    self._getters.append(getter)
                try:
                    await getter
                finally:
                    getters = self._getters
                    if getters is not None and getter in getters:
                        getters.remove(getter)
                        if not getters:
                            self._getters = None
        finally:
            self.waiting -= 1
            self.last_seen = time.monotonic()

    def __aiter__(self) -> AsyncIterator[Delta[V]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Delta[V]]:
        while True:
            try:
                yield await self.next()
            except SessionEnded:
                return

    def detach(self) -> None:
        """`aclose` without a coroutine (a subscriber with no task: callback mode)."""
        self._waker = None
        self._direct = None
        self._on_close()

    async def aclose(self) -> None:
        self._on_close()
