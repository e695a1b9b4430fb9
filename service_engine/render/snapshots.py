"""A session's snapshot from committed state: alone, or in a batch.

`Snapshots` (one per `service_engine.render.registry.RenderRegistry`,
``registry.snapshots``) reads a session's window and its rows and takes the
session live with a Reset (attach), or repairs or resnapshots it. Its steps are the connect
barrier's: `begin` before any read (from then the session holds what
commits, replayed after its Reset), the read, then `complete`. The
sessions of one projector read together (`read_batch`: one read-only
transaction, shared populates, one ``read_many`` for the union of their
keys), an RLS projector's each alone under its own principal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from ..db.types import Conn
from ..impacts.model import JsonValue
from .attached import ATTACH_BATCH, AttachedSession
from .cohort_index import CohortIndex
from .deltas import Delta, KeyText, Reset
from .interest import Dirty
from .projector import Projector, RlsApplier
from .report import PassTally
from .sharing import SharedViews
from .window_diff import SharedWindow

__all__ = ["Registry", "Snapshots"]

Proj = Projector[Any, Any, Any, Any]


class Registry(Protocol):
    """What a snapshot needs of its `RenderRegistry`: its reads, its
    projections and where a completed snapshot goes."""

    indexes: dict[str, CohortIndex]
    planned: int
    replays: list[tuple[AttachedSession, Dirty]]
    wake: asyncio.Event

    def reading(self, proj: Proj, principal: Any, applier: RlsApplier[Any] | None,
                ) -> AbstractAsyncContextManager[Conn]: ...
    async def populate(self, conn: Conn, rec: AttachedSession, cursor: JsonValue,
                       ) -> dict[KeyText, JsonValue]: ...
    async def populate_many(self, conn: Conn, proj: Proj, recs: Sequence[AttachedSession],
                            ) -> list[dict[KeyText, JsonValue] | None]: ...
    async def load(self, conn: Conn, proj: Proj, keys: Mapping[KeyText, JsonValue],
                   tally: PassTally) -> dict[KeyText, Any]: ...
    def project(self, rec: AttachedSession, rows: Mapping[KeyText, Any],
                scope: Mapping[KeyText, JsonValue], tally: PassTally | None = None,
                views: SharedViews | None = None) -> dict[KeyText, Any]: ...
    def note_rendered(self, proj: Proj, rows: Mapping[KeyText, Any],
                      rendered: Mapping[KeyText, Any]) -> None: ...
    def shared_views(self, proj: Proj) -> SharedViews: ...
    def settle_views(self, proj: Proj, views: SharedViews, tally: PassTally) -> None: ...
    def emit(self, rec: AttachedSession, delta: Delta[Any]) -> None: ...
    def count_reset(self, projector: str, cause: str) -> None: ...
    def failed(self, rec: AttachedSession, reason: str,
               exc: BaseException | None = None) -> None: ...


class Snapshots:
    """The snapshots of one registry's sessions (see the module docstring)."""

    __slots__ = ("registry",)

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def snapshot(
        self, rec: AttachedSession, tally: PassTally | None = None, *, cause: str | None = None,
        begun: bool = False,
    ) -> None:
        """Reset ``rec`` from committed state (attach, repair or resnapshot);
        ``cause`` (one of `RESET_CAUSES`) counts it as a reset of a live session.
        ``begun``: the snapshot was already begun (`begin`) by a
        batch whose shared read failed."""
        tally = tally or PassTally()
        session = rec.session
        state = session.state.value
        if not begun:
            self.begin(rec)
        registry = self.registry
        try:
            async with registry.reading(rec.projector, session.principal, rec.applier) as conn:
                populated = (await registry.populate(conn, rec, None)
                             if session.membership.populates else None)
                keys = session.snapshot_keys(populated)
                rows = await registry.load(conn, rec.projector, keys, tally)
            rendered = registry.project(rec, rows, keys, tally)
            registry.note_rendered(rec.projector, rows, rendered)
        except Exception as exc:
            self.ended(rec)
            if state == "attaching":
                raise
            registry.failed(rec, f"snapshot failed: {type(exc).__name__}: {exc}", exc)
            tally.failures += 1
            return
        self.complete(rec, state, populated, rendered, tally, cause)

    def begin(self, rec: AttachedSession) -> None:
        """The connect barrier's second step, before any read: from here the
        session holds what commits, and replays it after its Reset."""
        rec.session.begin_snapshot()
        index = self.registry.indexes.get(rec.projector.NAME)
        if index is not None:
            index.snapshotting.add(rec.session)

    def ended(self, rec: AttachedSession) -> None:
        """The snapshot's read is over (completed or failed)."""
        index = self.registry.indexes.get(rec.projector.NAME)
        if index is not None:
            index.snapshotting.discard(rec.session)

    def complete(
        self, rec: AttachedSession, state: str, populated: Mapping[KeyText, JsonValue] | None,
        rendered: Mapping[KeyText, Any], tally: PassTally, cause: str | None,
        shares: list[SharedWindow[Any]] | None = None,
    ) -> None:
        session = rec.session
        self.ended(rec)
        if session.ended:
            return  # detached while it read
        if state == "attaching":
            reset: Reset[Any] = session.go_live(populated, rendered, shares)
        elif state == "repair_pending":
            reset = session.repaired(populated, rendered, shares)
        else:
            reset = session.resnapshot(populated, rendered, shares)
        registry = self.registry
        rec.resync = False
        rec.live_since = registry.planned
        registry.emit(rec, reset)
        tally.deltas += 1
        tally.resets += 1
        if cause is not None:
            registry.count_reset(rec.projector.NAME, cause)
        held = session.take_held()
        if held is not None:
            registry.replays.append((rec, held))
            registry.wake.set()

    async def read_attach_batch(
        self, proj: Projector[Any, Any, Any, Any], recs: list[AttachedSession]
    ) -> None:
        """Snapshot ``recs`` (all attaching, snapshot begun) in one
        transaction and take them live (those not ended meanwhile)."""
        await self.read_batch(proj, recs, ["attaching"] * len(recs), PassTally(), None)

    async def snapshot_all(
        self, recs: Sequence[AttachedSession], tally: PassTally, *, cause: str
    ) -> None:
        """Reset every live session of ``recs`` from committed state, counted
        as resets for ``cause``. The sessions of one projector read together,
        as attaches do (`read_batch`: one transaction, shared populates, one
        ``read_many`` per `ATTACH_BATCH`), so a lost listener resets a
        thousand sessions in a few reads, not a thousand; an RLS projector's
        sessions each read alone under their own principal's context. When a
        shared read fails each of its sessions is read alone, so only a
        session's own failure fails it (to repair)."""
        grouped: dict[str, list[AttachedSession]] = {}
        for rec in recs:
            if not rec.session.live:
                continue
            if rec.projector.RLS:
                await self.snapshot(rec, tally, cause=cause)
            else:
                grouped.setdefault(rec.projector.NAME, []).append(rec)
        for group in grouped.values():
            proj = group[0].projector
            for at in range(0, len(group), ATTACH_BATCH):
                # Each chunk checked as it comes: the pass awaited meanwhile.
                chunk = [rec for rec in group[at:at + ATTACH_BATCH] if rec.session.live]
                if not chunk:
                    continue
                states = [rec.session.state.value for rec in chunk]
                for rec in chunk:
                    self.begin(rec)
                try:
                    await self.read_batch(proj, chunk, states, tally, cause)
                except Exception:
                    for rec in chunk:
                        if rec.session.snapshotting:
                            await self.snapshot(rec, tally, cause=cause, begun=True)

    async def read_batch(
        self, proj: Projector[Any, Any, Any, Any], recs: list[AttachedSession],
        states: list[str], tally: PassTally, cause: str | None,
    ) -> None:
        """Snapshot ``recs`` (snapshot begun; ``states`` their states before
        it) in one transaction and complete each (those not ended meanwhile)."""
        registry = self.registry
        scopes: list[dict[KeyText, JsonValue]] = []
        union: dict[KeyText, JsonValue] = {}
        async with registry.reading(proj, None, None) as conn:
            populated = await registry.populate_many(conn, proj, recs)
            for rec, window in zip(recs, populated, strict=True):
                keys = rec.session.snapshot_keys(window)
                scopes.append(keys)
                union.update(keys)
            rows = await registry.load(conn, proj, union, tally)
        views = registry.shared_views(proj)
        # Sessions completing with equal windows hold one between them.
        windows: list[SharedWindow[Any]] = []
        for rec, state, found, keys in zip(recs, states, populated, scopes, strict=True):
            if rec.session.ended:
                continue
            rendered = registry.project(rec, rows, keys, tally, views)
            registry.note_rendered(proj, rows, rendered)
            self.complete(rec, state, found, rendered, tally, cause, windows)
        registry.settle_views(proj, views, tally)
