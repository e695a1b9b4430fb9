"""A session's record in the render registry, and the batches of first snapshots.

`AttachedSession` is what `RenderRegistry` keeps per live session.
`AttachBatches` queues each attach's first snapshot with the other attaches
of its projector: those queued while the projector's batch reads (or waits
for a reader) share the next one's read-only transaction, each session's
populate in it, and one ``read_many`` for the union of their keys
(`RenderRegistry` reads them; at most ``ATTACH_READERS`` batches read at
once, one per projector unless a queue outgrew ``ATTACH_BATCH`` sessions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ..db.types import Conn
from ..failures import AttachError, AttachShuttingDown
from ..impacts.model import JsonValue
from .projector import Projector, RlsApplier, Visibility
from .session import Session
from .stream import SessionStream
from .table_window import cohort_values

__all__ = [
    "ATTACH_BATCH",
    "ATTACH_READERS",
    "AttachBatches",
    "AttachedSession",
    "PopulateCx",
    "UnknownProjectorName",
    "populate_key",
    "populate_slots",
    "window_of",
]

ATTACH_BATCH = 256
"""Attaches of one projector snapshotted in one transaction at most."""
ATTACH_READERS = 2
"""Attach batches reading at once: the rest of the pool stays for writes,
principal resolves and render passes while a burst of attaches waits. A
projector's next batch starts when its last one read (a burst's attaches
gather into few batches: each costs its transaction's round trips), unless
its queue outgrew ``ATTACH_BATCH``."""


def window_of(rec: AttachedSession) -> frozenset[Hashable] | None:
    """``VISIBILITY.window`` of the session's principal (populate's
    ``cx.cohorts``): the memberships the session holds already
    (`SharedGates.take`) when the window is the default one, all of them."""
    visibility = rec.projector.VISIBILITY
    if rec.memberships is not None and type(visibility).window is Visibility.window:
        return rec.memberships
    return visibility.window(rec.session.principal)


def populate_key(rec: AttachedSession) -> Hashable | None:
    """What makes two attaching sessions' populates equal, or None when
    their query is not hashable (then each populates alone)."""
    session = rec.session
    key = (session.cohort, window_of(rec), session.membership.query)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def populate_slots(
    recs: Sequence[AttachedSession],
) -> tuple[list[AttachedSession], list[int | None]]:
    """The sessions an attach batch asks ``populate`` for, one per
    `populate_key` (sessions of one cohort with the same memberships and
    window query see the same rows), and for each of ``recs`` the index of
    its ask (None: a `Keys` window, which has no populate)."""
    asks: list[AttachedSession] = []
    slots: list[int | None] = []
    shared: dict[Hashable, int] = {}
    for rec in recs:
        if not rec.session.membership.populates:
            slots.append(None)
            continue
        key = populate_key(rec)
        slot = shared.get(key) if key is not None else None
        if slot is None:
            slot = len(asks)
            asks.append(rec)
            if key is not None:
                shared[key] = slot
        slots.append(slot)
    return asks, slots


class UnknownProjectorName(AttachError):
    """An attach or fetch named a projector that is not registered."""


@dataclass(slots=True)
class AttachedSession:
    """The registry's record of one session."""

    session: Session[Any, Any]
    projector: Projector[Any, Any, Any, Any]
    stream: SessionStream[Any]
    applier: RlsApplier[Any] | None
    gate: Callable[[Any], bool]
    memberships: frozenset[Hashable] | None
    """The principal's cohorts when the projector gates by its declared
    Visibility alone (the render pass then indexes rows by cohort)."""
    resync: bool = False
    view_key: Hashable | None = None
    """The principal's `Projector.view_key` (None: its views are its own)."""
    live_since: int = 0
    """`RenderRegistry.planned` when its last snapshot completed: a pass
    planned no later than that may have read rows older than the snapshot."""


@dataclass(frozen=True, slots=True)
class PopulateCx:
    """What a projector's populate is handed (``cx``)."""

    principal: Any
    cursor: JsonValue
    cohorts: frozenset[Hashable] | None
    conn: Conn

    def cohort_values(self, kind: str | None = None) -> list[Any]:
        return cohort_values(self.cohorts, kind)


Waiting = list[tuple[AttachedSession, asyncio.Future[None]]]
"""Attaching sessions of one projector and the futures their attaches await."""


class AttachBatches:
    """The attaches waiting for their first snapshot, by projector, and the
    batches reading them. ``begin`` marks a session's snapshot begun,
    ``read`` snapshots a batch in one transaction, ``alone`` snapshots one
    session by itself (after the shared read failed)."""

    def __init__(
        self,
        *,
        begin: Callable[[AttachedSession], None],
        read: Callable[[Projector[Any, Any, Any, Any], list[AttachedSession]], Awaitable[None]],
        alone: Callable[[AttachedSession], Awaitable[None]],
    ) -> None:
        self._begin = begin
        self._read = read
        self._alone = alone
        self.queued: dict[str, Waiting] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._readers = asyncio.Semaphore(ATTACH_READERS)
        self._reading: dict[str, int] = {}
        """Batches of each projector taken and not done reading."""

    def shrink(self) -> None:
        """Rebuild the emptied queue (a dict keeps its largest table)."""
        if not self.queued:
            self.queued = {}
        if not self._reading:
            self._reading = {}

    def join(self, rec: AttachedSession) -> asyncio.Future[None]:
        """Queue ``rec``'s first snapshot with the other attaches of its
        projector: those queued while a batch waits for its turn share one
        read-only transaction, each session's populate in it, and one
        ``read_many`` for the union of their keys."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        name = rec.projector.NAME
        queued = self.queued.get(name)
        if queued is None:
            queued = self.queued[name] = []
            if name not in self._reading:
                self._start(rec.projector)
            # (Else the batch reading starts the next one when it is done.)
        queued.append((rec, waiter))
        return waiter

    def _start(self, proj: Projector[Any, Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(
            self._run(proj), name=f"service_engine:attach:{proj.NAME}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take(
        self, proj: Projector[Any, Any, Any, Any]
    ) -> Waiting:
        queued = self.queued.pop(proj.NAME, [])
        if len(queued) > ATTACH_BATCH:
            self.queued[proj.NAME] = queued[ATTACH_BATCH:]
            self._start(proj)
            queued = queued[:ATTACH_BATCH]
        # A waiter already done is an attach cancelled meanwhile (detached).
        return [(rec, w) for rec, w in queued if not w.done() and not rec.session.ended]

    async def _run(self, proj: Projector[Any, Any, Any, Any]) -> None:
        name = proj.NAME
        self._reading[name] = self._reading.get(name, 0) + 1
        try:
            await self._run_batch(proj)
        except BaseException:
            self._done_reading(name)
            # Interrupted: what queued while it read is not read either.
            for _, waiter in self.queued.pop(name, []):
                if not waiter.done():
                    waiter.set_exception(AttachShuttingDown("the attach was interrupted"))
            raise
        if self._done_reading(name) and name in self.queued:
            self._start(proj)  # what queued while its batches read

    def _done_reading(self, name: str) -> bool:
        """One batch of ``name`` done; whether none of it reads any more."""
        left = self._reading[name] - 1
        if left:
            self._reading[name] = left
            return False
        del self._reading[name]
        return True

    async def _run_batch(self, proj: Projector[Any, Any, Any, Any]) -> None:
        batch: Waiting | None = None
        alone = False
        try:
            async with self._readers:
                # Taken once a reader is free: what queued meanwhile joins.
                batch = self._take(proj)
                if not batch:
                    return
                for rec, _ in batch:
                    self._begin(rec)
                try:
                    await self._read(proj, [rec for rec, _ in batch])
                except Exception:
                    # One member's populate may have failed the shared read:
                    # read each alone, so only its own attach fails.
                    alone = True
        except BaseException as exc:
            queued = batch if batch is not None else self.queued.pop(proj.NAME, [])
            failure = exc if isinstance(exc, Exception) else AttachShuttingDown(
                "the attach was interrupted")
            for _, waiter in queued:
                if not waiter.done():
                    waiter.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
            return
        try:
            for rec, waiter in batch:
                if alone and rec.session.snapshotting and not waiter.done():
                    try:
                        await self._alone(rec)
                    except Exception as exc:
                        if not waiter.done():
                            waiter.set_exception(exc)
                        continue
                if not waiter.done():
                    waiter.set_result(None)
        except BaseException:
            # Cancelled reading them one by one: no attach is left waiting.
            for _, waiter in batch:
                if not waiter.done():
                    waiter.set_exception(AttachShuttingDown("the attach was interrupted"))
            raise
