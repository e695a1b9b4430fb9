"""Paging through history behind a live window.

A window is its live *head* (what populate lists, grown by discovery) plus
older *pages* appended behind it when the subscriber scrolls back. A page is
delivered as Upserts on the session's contiguous revision, never a Reset,
and its keys then live like any other member: an edit reaches the holder, a
delete or a loss of visibility Removes the key. A key never leaves because
it fell off a page bound.

``window_capacity`` bounds the keys a session holds across head and pages,
checked whenever a page is appended: the oldest appended pages are
*released* (dropped from the window and from ``last_sent`` with no Remove
delta — the client that asked for the page drops them too, told by
`PageResult.released`), and the live head is always retained.

A page renders outside the session's lock, so a render pass may deliver one
of its keys meanwhile. The page is therefore settled in two steps:
`Session.open_page` hands out a `PageTicket` before the page's rows are
read, every pass records the keys it looked at on the open tickets, and
`Session.settle_page` (under the lock) skips every paged key a pass has
already delivered (its ``last_sent`` is present) or looked at since the
ticket opened: the pass's view is the committed one (s183).

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..failures import EngineError
from ..impacts.model import JsonValue
from .deltas import KeyText, Upsert

__all__ = [
    "Appended",
    "NoLiveSession",
    "NotPageable",
    "PageInterrupted",
    "PageResult",
    "PageTicket",
    "Pages",
]

V = TypeVar("V")


class NoLiveSession(EngineError):
    """No live session with this id is held here for the calling principal.

    Raised alike for an unknown id, a session of another principal and a
    session that is not live, so knowing another session's id buys nothing.
    """

    def __init__(self) -> None:
        super().__init__("no live session with this id for this principal")


class NotPageable(EngineError):
    """A page was asked of a window that has no populate (a `Keys` window)."""


class PageInterrupted(EngineError):
    """The window was re-snapshotted, failed or ended while the page
    rendered: continuity may have been lost. Run the page again."""


@dataclass(frozen=True, slots=True)
class Appended:
    """What `Pages.append` did: the keys it took, the keys it released to
    stay within capacity, and how many keys did not fit at all."""

    accepted: tuple[KeyText, ...]
    released: tuple[KeyText, ...]
    truncated: int


class Pages:
    """The appended pages of one window, oldest first.

    Each key lives in at most one page and never in the head (the session
    keeps them disjoint). Membership tests and `discard` are O(1).
    """

    __slots__ = ("_count", "_next", "_pages", "_where")

    def __init__(self) -> None:
        self._pages: dict[int, dict[KeyText, JsonValue]] = {}
        self._where: dict[KeyText, int] = {}
        self._next = 0
        self._count = 0

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[KeyText]:
        for page in self._pages.values():
            yield from page

    @property
    def page_count(self) -> int:
        return len(self._pages)

    def pages(self) -> list[tuple[KeyText, ...]]:
        """Every page's keys, oldest appended first."""
        return [tuple(page) for page in self._pages.values()]

    def items(self) -> Iterator[tuple[KeyText, JsonValue]]:
        for page in self._pages.values():
            yield from page.items()

    def discard(self, key: KeyText) -> bool:
        """Drop ``key`` from its page (row gone, or the head took it)."""
        page_id = self._where.pop(key, None)
        if page_id is None:
            return False
        page = self._pages[page_id]
        del page[key]
        if not page:
            del self._pages[page_id]
        self._count -= 1
        return True

    def clear(self) -> None:
        self._pages.clear()
        self._where.clear()
        self._count = 0

    def append(
        self, keys: Mapping[KeyText, JsonValue], *, head_size: int, capacity: int
    ) -> Appended:
        """Append a page of ``keys`` (those already held are skipped).

        While head, pages and the new page together exceed ``capacity``, the
        oldest appended page is released. If the new page still does not
        fit behind the head, it is cut to the keys that do (``truncated``
        counts the rest); the head is never touched. The bound is restored
        even when nothing is fresh: a head that grew by discovery since the
        last page makes this page gesture release the oldest pages.
        """
        fresh = [key for key in keys if key not in self._where]
        released: list[KeyText] = []
        while self._pages and head_size + self._count + len(fresh) > capacity:
            oldest = next(iter(self._pages))
            page = self._pages.pop(oldest)
            for key in page:
                del self._where[key]
            self._count -= len(page)
            released.extend(page)
        room = max(capacity - head_size - self._count, 0)
        truncated = max(len(fresh) - room, 0)
        if truncated:
            fresh = fresh[:room]
        if fresh:
            page_id = self._next
            self._next += 1
            self._pages[page_id] = {key: keys[key] for key in fresh}
            for key in fresh:
                self._where[key] = page_id
            self._count += len(fresh)
        return Appended(tuple(fresh), tuple(released), truncated)


@dataclass(slots=True, eq=False)
class PageTicket:
    """One page in flight for one session: open it before reading the
    page's rows, settle it under the session's lock.

    ``touched`` collects the keys render passes looked at meanwhile;
    ``interrupted`` is set when the window was re-snapshotted, failed or
    ended meanwhile.
    """

    cursor: JsonValue
    touched: set[KeyText] = field(default_factory=set)
    interrupted: bool = False
    closed: bool = False


@dataclass(frozen=True, slots=True)
class PageResult(Generic[V]):
    """The outcome of a settled page.

    ``deltas`` go to the session's queue as they are (Upserts, contiguous,
    possibly none). ``released`` are the keys dropped silently to respect
    ``window_capacity``: tell the client that asked for the page. ``skipped``
    are paged keys left to the render pass (already held, or looked at by a
    concurrent pass); ``truncated`` counts keys that did not fit at all.
    """

    deltas: tuple[Upsert[V], ...]
    released: tuple[KeyText, ...]
    skipped: tuple[KeyText, ...]
    truncated: int
