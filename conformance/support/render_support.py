"""What the render battery shares: principals, an engine or a runtime
driven frame by frame over a real LISTEN channel, concurrent card writers,
and bounded reads of a session's deltas."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from typing import Any

from service_engine import Database, Engine, EngineConfig, ReadinessHandle
from service_engine.impacts import Impact
from service_engine.impacts.model import Delivery
from service_engine.impacts.transport import PgListenNotify, stage_in
from service_engine.render import Query
from service_engine.render.runtime import RenderRuntime
from service_engine.render.stream import SessionStream
from service_engine.render.windows import WindowSpec

from .harness import engine_running, listener_running, wait_until
from .sample_cards import (
    Card,
    Principal,
    RankQuery,
    delete_card,
    write_card,
)

ALICE = Principal("alice", frozenset({"acme"}))
BOB = Principal("bob", frozenset({"acme"}))
CAROL = Principal("carol", frozenset({"globex"}))
FAST = {"beat_interval": timedelta(milliseconds=50), "lease": timedelta(seconds=1)}


def running_engine(
    db: Database, *projectors: Any, **config: Any
) -> contextlib.AbstractAsyncContextManager[Engine]:
    """An engine of ``projectors`` running on a fast beat (``config`` overrides)."""
    return engine_running(EngineConfig(service="render", **{**FAST, **config}), db, *projectors)


class CardWriters:
    """Writers committing random card upserts and deletes (over 30 keys of
    ``orgs``) until the block ends; ``written`` counts their commits."""

    def __init__(self, db: Database, rng: Any, orgs: Sequence[str], count: int = 3) -> None:
        self._db, self._rng, self._orgs, self._count = db, rng, list(orgs), count
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.written = 0

    async def _write(self, w: int) -> None:
        rng = self._rng
        async with self._db.pool.acquire() as conn:
            while not self._stop.is_set():
                key = f"k{rng.randrange(30)}"
                if rng.random() < 0.2:
                    await delete_card(conn, key)
                else:
                    await write_card(conn, Card(key, rng.choice(self._orgs), rng.randrange(100), f"w{w}"))
                self.written += 1

    def wrote_since(self, mark: int) -> Callable[[], bool]:
        """A predicate: a commit landed after ``mark`` commits."""
        return lambda: self.written > mark

    async def facts_changed(self, *principals: str) -> None:
        """Stage the principal-facts impacts of ``principals`` (whose facts the
        caller just changed), then wait until 20 more commits landed."""
        async with self._db.pool.acquire() as conn, conn.transaction():
            await stage_in(conn, [Impact.principal_facts(p, ["card"]) for p in principals])
        mark = self.written
        await wait_until(lambda: self.written > mark + 20,
                         what="writes after the principal changes")

    async def __aenter__(self) -> CardWriters:
        self._tasks = [asyncio.create_task(self._write(w)) for w in range(self._count)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


class Frames:
    """A runtime driven frame by frame from a real LISTEN channel."""

    def __init__(self, db: Database, **config: Any) -> None:
        self.config = EngineConfig(**config)
        self.listener = PgListenNotify(db, self.config, ReadinessHandle())
        self.runtime = RenderRuntime(db, self.config, self.listener.channel)

    async def commits(self, n: int) -> list[Delivery]:
        """The next ``n`` deliveries the listener received."""
        return [await asyncio.wait_for(self.listener.channel.get(), 10) for _ in range(n)]


@contextlib.asynccontextmanager
async def frames(db: Database, *projectors: Any, **config: Any) -> AsyncIterator[Frames]:
    """A `Frames` of ``projectors`` with its listener running."""
    f = Frames(db, **config)
    for projector in projectors:
        f.runtime.registry.register_projector(projector)
    async with listener_running(f.listener):
        yield f


async def take(stream: SessionStream[Any], n: int) -> list[Any]:
    """The next ``n`` deltas of ``stream``, each within 10 s."""
    return [await asyncio.wait_for(stream.next(), 10) for _ in range(n)]


async def assert_quiet(stream: SessionStream[Any], within: float = 0.3) -> None:
    """No delta reaches ``stream`` within the bound."""
    try:
        delta = await asyncio.wait_for(stream.next(), within)
    except TimeoutError:
        return
    raise AssertionError(f"expected no delta, got {delta!r}")


def drained(stream: SessionStream[Any]) -> list[Any]:
    """The deltas ``stream`` holds now, without waiting."""
    out = []
    while (d := stream.get_nowait()) is not None:
        out.append(d)
    return out


def window(limit: int = 100) -> WindowSpec[Any]:
    """A Query window of the ``limit`` top-ranked cards."""
    return WindowSpec(Query(RankQuery(limit)))


async def seed(db: Database, *cards: Card) -> None:
    """Commit ``cards``."""
    async with db.pool.acquire() as conn:
        for card in cards:
            await write_card(conn, card)
