"""Presence lanes for the conformance battery: two sample lanes, an engine
running them against real Postgres and a spawned nats-server, and a
subscriber-side replica of a session's window."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from service_engine import Database, Engine, Projector, ReadinessHandle
from service_engine.embedded import EmbeddedNats, provision_presence_bucket
from service_engine.errors import WorkerStopped
from service_engine.lanes import PresenceEntry, PresenceHandle, PresenceProjector
from service_engine.messaging.nats import Nats
from service_engine.render import (
    Query,
    Remove,
    Reset,
    Unrestricted,
    Upsert,
    Visibility,
    WindowSpec,
)
from service_engine.render.deltas import Delta
from service_engine.render.stream import SessionStream

from .harness import fast_engine_config, wait_until
from .sample_cards import Principal

SERVICE = "presence"
ALICE = Principal("alice")
BOB = Principal("bob")


class Typing(PresenceProjector[dict[str, Any], Principal, str]):
    """Who is typing in a room: keys ``<room>.<person>``."""

    NAME = "typing"
    VISIBILITY: ClassVar[Visibility[Any, Any]] = Unrestricted()

    def select(self, entry: PresenceEntry, query: str) -> bool:
        return entry.key.startswith(f"{query}.")

    def project(self, row: PresenceEntry, principal: Principal) -> dict[str, Any]:
        assert isinstance(row.value, Mapping)
        return dict(row.value)


class Viewing(Typing):
    """Who is viewing a room: a second lane, with its own ttl, in the same bucket."""

    NAME = "viewing"


class OrgVisibility(Visibility[PresenceEntry, Principal]):
    """A presence row belongs to its value's ``org``; a principal to their orgs."""

    def cohorts(self, row: PresenceEntry) -> Iterable[Hashable]:
        assert isinstance(row.value, Mapping)
        return (row.value.get("org"),)

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        return principal.orgs


def room(name: str) -> WindowSpec[str]:
    return WindowSpec(Query(name))


@dataclass
class Replica:
    """A subscriber's view of one session: the window, every delta seen, and
    the revision contiguity check."""

    stream: SessionStream[Any]
    window: dict[str, Any] = field(default_factory=dict)
    seen: list[Delta[Any]] = field(default_factory=list)
    revision: int | None = None

    def apply(self, delta: Delta[Any]) -> None:
        if self.revision is not None:
            assert delta.revision == self.revision + 1, (
                f"revision gap: {self.revision} -> {delta.revision}"
            )
        self.revision = delta.revision
        self.seen.append(delta)
        if isinstance(delta, Reset):
            self.window = dict(delta.views)
        elif isinstance(delta, Upsert):
            self.window[delta.key] = delta.view
        elif isinstance(delta, Remove):
            self.window.pop(delta.key, None)

    async def next(self, timeout: float = 10.0) -> Delta[Any]:
        delta = await asyncio.wait_for(self.stream.next(), timeout)
        self.apply(delta)
        return delta

    async def until(self, predicate: Any, timeout: float = 10.0, what: str = "a delta") -> Delta[Any]:
        """Read deltas until one satisfies ``predicate``; return it."""
        async with asyncio.timeout(timeout):
            while True:
                delta = await self.next(timeout)
                if predicate(delta):
                    return delta
        raise AssertionError(what)  # pragma: no cover


def key(text: str) -> str:
    """The key text a delta carries for presence key ``text``."""
    return f'"{text}"'


@dataclass
class Lanes:
    engine: Engine
    readiness: ReadinessHandle
    typing: PresenceHandle
    viewing: PresenceHandle

    async def attach(self, projector: str, window: WindowSpec[str],
                     principal: Principal = ALICE) -> Replica:
        replica = Replica(await self.engine.attach(principal, projector, window))
        first = await replica.next()
        assert isinstance(first, Reset)
        return replica


@contextlib.asynccontextmanager
async def presence_engine(
    db: Database, conn: Nats, *, typing_ttl: timedelta = timedelta(seconds=1),
    viewing_ttl: timedelta = timedelta(seconds=3), typing: Typing | None = None,
    also: Sequence[Projector[Any, Any, Any, Any]] = (), **config: Any,
) -> AsyncIterator[Lanes]:
    """An engine with the two sample lanes (and the projectors ``also``)
    registered, running, seeded."""
    readiness = ReadinessHandle()
    settings = {"lock_timeout": timedelta(seconds=1), **config}
    engine = await Engine.boot(fast_engine_config(SERVICE, **settings), db, conn, readiness)
    typing_handle = engine.register_presence(typing or Typing(), typing_ttl)
    viewing = engine.register_presence(Viewing(), viewing_ttl)
    for projector in also:
        engine.register_projector(projector)
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: readiness.is_up or task.done(), what="the engine UP")
        if task.done():
            task.result()
        lanes = engine.lanes.presence_lanes
        assert lanes is not None
        await asyncio.wait_for(lanes.seeded.wait(), 10)
        yield Lanes(engine, readiness, typing_handle, viewing)
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)


async def provision(server: EmbeddedNats, **bounds: timedelta) -> None:
    await provision_presence_bucket(server.url, SERVICE, **bounds)
