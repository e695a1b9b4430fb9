"""Postgres failover, simulated: the primary stopped and started again (same
address) under load, with two pods serving live sessions and relaying the
outbox. Every pod's listener reconnects and Resets each session from
committed state; a mutation caught by the outage answers the generic
database error and leaves no partial effect; the outbox drains once the
database is back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from service_engine import Engine, EngineConfig, ReadinessHandle
from service_engine.db import Database, connect_pool, service_migrations
from service_engine.embedded import EmbeddedNats, EmbeddedPostgres, provision_database
from service_engine.messaging.envelope import HEADER_NATS_MSG_ID
from service_engine.pipeline import Mutation, MutationError, Success
from service_engine.pipeline.outcomes import DATABASE_FAULT_MESSAGE
from service_engine.render import Query, Reset, WindowReplica
from service_engine.render.stream import SessionEnded, SessionStream
from service_engine.render.windows import WindowSpec

from ..support.harness import wait_until
from ..support.nats_support import engine_nats, stream_messages
from ..support.sample_cards import Card, CardStore, CardsView, Principal, RankQuery

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

SERVICE = "cards"
MIGRATIONS = Path(__file__).parent.parent / "migrations"
PRINCIPALS = (Principal("alice", frozenset({"acme"})), Principal("carol", frozenset({"globex"})))
ORGS = ("acme", "globex")
WRITERS = 4


@dataclass
class LiveCard(Card):
    Store: ClassVar[Any] = None

    def blob_refs(self) -> tuple[str, ...]:
        return ()


class LiveCardStore(CardStore):
    def from_row(self, row: Any) -> LiveCard:
        return LiveCard(row["id"], row["org"], row["rank"], row["title"])


LiveCard.Store = LiveCardStore()


class CardCreated(BaseModel):
    AGGREGATE: ClassVar[str] = "card"
    FACT: ClassVar[str] = "created"
    VERSION: ClassVar[int] = 1

    card_id: str

    def sequence(self) -> None:
        return None


async def create_card(cx: Mutation[Principal], card_id: str, org: str, rank: int) -> None:
    """One card row, its impact and its event in the outbox: all or nothing."""
    await cx.create(LiveCard(card_id, org, rank, f"t{rank}"))
    cx.impact("card", card_id)
    cx.emit(CardCreated(card_id=card_id))


@pytest.fixture
async def primary(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedPostgres, str]]:
    """A primary of this test's own (the battery's shared server is never stopped)."""
    server = EmbeddedPostgres(tmp_path / "pg", durable=False)
    await asyncio.to_thread(server.start)
    try:
        provisioned = await provision_database(
            server, f"f_{secrets.token_hex(4)}", extra_migrations=service_migrations(MIGRATIONS)
        )
        yield server, provisioned.app_url
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def nats_sync(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    from service_engine.embedded import provision_streams

    server = EmbeddedNats(tmp_path / "nats")
    await asyncio.to_thread(server.start)
    try:
        await provision_streams(server.url)
        yield server
    finally:
        await asyncio.to_thread(server.stop)


@dataclass
class Watched:
    """One live session's deltas folded into a replica (contiguity checked)."""

    principal: Principal
    stream: SessionStream[Any]
    replica: WindowReplica[Any] = field(default_factory=WindowReplica)
    resets: int = 0

    async def follow(self) -> None:
        with contextlib.suppress(SessionEnded):
            while True:
                delta = await self.stream.next()
                self.replica.apply(delta)  # raises RevisionGap on a gap
                if isinstance(delta, Reset):
                    self.resets += 1


@contextlib.asynccontextmanager
async def pod(url: str, nats_server: EmbeddedNats, name: str) -> AsyncIterator[Engine]:
    db = await connect_pool(url, max_size=10)
    config = EngineConfig(
        service=SERVICE, pod_id=name, beat_interval=timedelta(milliseconds=50),
        lease=timedelta(seconds=1), publish_ack_timeout=timedelta(seconds=2),
    )
    async with engine_nats(nats_server, publish_ack_timeout=timedelta(seconds=2)) as conn:
        engine = await Engine.boot(config, db, conn, ReadinessHandle())
        engine.register_projector(CardsView())
        task = asyncio.create_task(engine.run())
        try:
            await wait_until(lambda: engine.readiness.is_up, timeout=15, what=f"{name} UP")
            yield engine
        finally:
            engine.shutdown()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 15)
            await db.aclose()


async def committed_views(db: Database, principal: Principal) -> dict[str, tuple[str, int, str]]:
    rows = await db.pool.fetch(
        "SELECT id, org, rank, title FROM sample_card WHERE org = ANY($1)", sorted(principal.orgs)
    )
    return {f'"{r["id"]}"': (r["org"], r["rank"], r["title"]) for r in rows}


async def test_a_restarted_primary_resets_sessions_fails_in_flight_cleanly_and_drains_the_outbox(
    primary: tuple[EmbeddedPostgres, str], nats_sync: EmbeddedNats
) -> None:
    """The primary stopped and started under load: each pod's listener
    reconnects and every session gets a Reset equal to committed state (its
    revisions contiguous throughout); every mutation answers Success (its card
    and its outbox row committed) or the generic database error; no card
    lacks its outbox row nor the reverse; every outbox row is published once
    the database is back, each exactly once on the stream."""
    server, url = primary
    outcomes: dict[str, Success | MutationError] = {}
    counter = iter(range(1_000_000))
    stop_load = asyncio.Event()
    async with pod(url, nats_sync, "pod-a") as a, pod(url, nats_sync, "pod-b") as b:
        watched = [
            Watched(p, await engine.attach(p, "cards", WindowSpec(Query(RankQuery(100_000)))))
            for engine in (a, b) for p in PRINCIPALS
        ]
        followers = [asyncio.create_task(w.follow()) for w in watched]

        async def writer(engine: Engine) -> None:
            executor = engine.mutation_executor()
            while not stop_load.is_set():
                n = next(counter)
                card = f"c{n}"
                outcomes[card] = await executor.ack(
                    PRINCIPALS[n % 2], create_card, card, ORGS[n % 2], n
                )
                if isinstance(outcomes[card], MutationError):
                    await asyncio.sleep(0.01)  # a client's pause before its next try

        writers = [asyncio.create_task(writer(e)) for e in (a, b) for _ in range(WRITERS // 2)]
        try:
            def successes() -> int:
                for task in writers:
                    if task.done():
                        task.result()  # a writer's defect fails the test at once
                return sum(isinstance(o, Success) for o in outcomes.values())

            await wait_until(lambda: successes() >= 100, timeout=30, what="load before the fault")
            await wait_until(lambda: all(w.resets == 1 for w in watched), what="first Resets")
            await asyncio.to_thread(server.stop)  # fast shutdown: in-flight backends terminated
            failed_before = sum(isinstance(o, MutationError) for o in outcomes.values())
            await wait_until(
                lambda: sum(isinstance(o, MutationError) for o in outcomes.values())
                >= failed_before + 4,
                timeout=15, what="mutations failing during the outage",
            )
            await asyncio.to_thread(server.start, keep_port=True)
            back = successes()
            await wait_until(lambda: successes() >= back + 100, timeout=60,
                             what="load succeeding after the restart")
        finally:
            stop_load.set()
            await asyncio.gather(*writers)

        await wait_until(lambda: all(w.resets >= 2 for w in watched), timeout=30,
                         what="every session Reset after the failover")
        check = await connect_pool(url, max_size=2)
        try:
            for w in watched:
                async def converged(w: Watched = w) -> bool:
                    return w.replica.views == await committed_views(check, w.principal)

                await wait_until(converged, timeout=30, what=f"{w.principal.id}'s window")
            for task in followers:
                assert not task.done(), task  # no revision gap ended a follower

            errors = {c: o for c, o in outcomes.items() if isinstance(o, MutationError)}
            assert errors, "no mutation was caught by the outage"
            assert {(o.code, o.message, o.retryable) for o in errors.values()} <= {
                (MutationError.DATABASE, DATABASE_FAULT_MESSAGE, False),
                (MutationError.DATABASE, DATABASE_FAULT_MESSAGE, True),
            }, {o for o in errors.values()}
            cards = {r["id"] for r in await check.pool.fetch("SELECT id FROM sample_card")}
            ok = {c for c, o in outcomes.items() if isinstance(o, Success)}
            assert ok <= cards
            # An answer lost with the connection may hide a commit; never half of one.
            assert cards - ok <= set(errors)

            async def drained() -> bool:
                pending = await check.pool.fetchval(
                    "SELECT count(*) FROM service_engine.integration_outbox"
                    " WHERE status <> 'PUBLISHED'"
                )
                return int(pending) == 0

            await wait_until(drained, timeout=30, what="the outbox drained")
        finally:
            await check.aclose()
        for task in followers:
            task.cancel()
    stored = await stream_messages(nats_sync.url, "INTEGRATION_EVT")
    ids = [m.headers[HEADER_NATS_MSG_ID] for m in stored]
    assert len(ids) == len(set(ids)), "an event published twice"
    published = [json.loads(m.data)["payload"]["card_id"] for m in stored]
    assert len(published) == len(set(published)), "one card's event stored twice"
    assert set(published) == cards, "a card without its event or an event without its card"
