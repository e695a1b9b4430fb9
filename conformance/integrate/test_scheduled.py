"""Scheduled messages against a real Postgres and a spawned nats-server:
due rows publish once, a poison row is isolated and dead-lettered past its
budget, an outage (or JetStream not answering) costs no attempt."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import nats
from pydantic import BaseModel

from service_engine import Database, Timestamp
from service_engine.embedded import EmbeddedNats, provision_streams
from service_engine.messaging.dead_letters import DeadLetters, DeadLetterSource
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    HEADER_SEQ,
    Actor,
    DeclaredSequence,
    EventMetadata,
    build_event,
)
from service_engine.messaging.nats import Nats
from service_engine.metrics import Metrics
from service_engine.scheduled.publisher import (
    ScheduledBounds,
    ScheduledPublisher,
)
from service_engine.scheduled.staging import stage_scheduled_message

from ..support.harness import wait_until
from ..support.nats_support import engine_nats, set_stream, stream_count, stream_messages

SERVICE = "cards"


class DeadlinePassed(BaseModel):
    AGGREGATE: ClassVar[str] = "card"
    FACT: ClassVar[str] = "deadline_passed"
    VERSION: ClassVar[int] = 1

    card_id: str
    note: str = ""

    def sequence(self) -> DeclaredSequence | None:
        return DeclaredSequence(self.card_id, 3)


async def schedule(db: Database, cards: list[str], *, at: Timestamp, note: str = "") -> list[uuid.UUID]:
    meta = EventMetadata.originating(Actor.service(SERVICE))
    ids = []
    async with db.pool.acquire() as conn, conn.transaction():
        for card in cards:
            message = build_event(
                DeadlinePassed(card_id=card, note=note), service=SERVICE, metadata=meta,
                occurred_at=datetime.now(UTC),
            )
            await stage_scheduled_message(conn, message, at)
            ids.append(message.message_id)
    return ids


def past() -> Timestamp:
    return Timestamp.now() - timedelta(seconds=1)


def publisher(db: Database, conn: Nats, metrics: Metrics | None = None, **bounds: object) -> ScheduledPublisher:
    return ScheduledPublisher(
        db, conn, DeadLetters(db, metrics or Metrics(SERVICE, "pod")),
        bounds=ScheduledBounds(**bounds),  # type: ignore[arg-type]
    )


async def waiting(db: Database) -> list[tuple[uuid.UUID, int]]:
    rows = await db.pool.fetch(
        "SELECT message_id, attempts FROM service_engine.scheduled_message ORDER BY id"
    )
    return [(r["message_id"], r["attempts"]) for r in rows]


async def test_due_messages_publish_once_and_future_ones_wait(db: Database, nats_server: EmbeddedNats) -> None:
    """Due scheduled messages publish once, with their message id as the dedup token; future
    ones wait."""
    due = await schedule(db, ["c1", "c2", "c3"], at=past())
    later = await schedule(db, ["c4"], at=Timestamp.now() + timedelta(hours=1))
    async with engine_nats(nats_server) as conn:
        report = await publisher(db, conn).fire_due()
        assert report.published == 3
        assert (await publisher(db, conn).fire_due()).published == 0
    assert await waiting(db) == [(later[0], 0)]
    stored = await stream_messages(nats_server.url, "INTEGRATION_EVT")
    assert [m.headers[HEADER_NATS_MSG_ID] for m in stored] == [str(i) for i in due]
    assert all(m.headers[HEADER_MESSAGE_ID] == m.headers[HEADER_NATS_MSG_ID] for m in stored)
    assert all(m.headers[HEADER_SEQ] == "3" for m in stored)
    assert stored[0].subject == "integration.evt.cards.card.deadline_passed"


async def test_a_poison_row_is_dead_lettered_past_its_budget_while_the_rest_fire(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A scheduled row the broker keeps rejecting is dead-lettered (source Scheduled) at its
    attempt bound while the other rows fire, and later beats still fire."""
    metrics = Metrics(SERVICE, "pod")
    await set_stream(nats_server.url, "INTEGRATION_EVT", max_msg_size=1024)
    [poison] = await schedule(db, ["big"], at=Timestamp.now() - timedelta(seconds=5), note="x" * 4096)
    fine = await schedule(db, ["c1", "c2"], at=past())
    async with engine_nats(nats_server) as conn:
        pub = publisher(db, conn, metrics, max_attempts=2)
        first = await pub.fire_due()
        assert (first.published, first.rejected, first.dead_lettered) == (2, 1, 0)
        assert await waiting(db) == [(poison, 1)]
        second = await pub.fire_due()
        assert (second.published, second.rejected, second.dead_lettered) == (0, 1, 1)
        assert await waiting(db) == []
        # the next beat still fires
        later = await schedule(db, ["c3"], at=past())
        assert (await pub.fire_due()).published == 1
    [letter] = await DeadLetters(db).list(DeadLetterSource.SCHEDULED)
    assert letter.message_id == poison and letter.attempts == 2 and letter.reason == "rejected"
    assert letter.payload is not None and b"x" * 4096 in letter.payload
    assert metrics.sample("service_engine_dead_letters_total", source="Scheduled") == 1
    stored = await stream_messages(nats_server.url, "INTEGRATION_EVT")
    assert [m.headers[HEADER_NATS_MSG_ID] for m in stored] == [str(i) for i in [*fine, *later]]


async def test_an_outage_or_silent_jetstream_costs_no_attempt(db: Database, nats_server: EmbeddedNats) -> None:
    """An outage, or a JetStream that cannot answer, costs a scheduled row no attempt; the
    rows publish once JetStream answers."""
    ids = await schedule(db, ["c1", "c2"], at=past())
    async with engine_nats(nats_server) as conn:
        pub = publisher(db, conn, max_attempts=1)
        await asyncio.to_thread(nats_server.stop)
        await wait_until(lambda: not conn.reachable(), what="the outage")
        for _ in range(3):
            assert (await pub.fire_due()).skipped == "NATS unreachable"
        assert await waiting(db) == [(i, 0) for i in ids]
        await asyncio.to_thread(nats_server.start)
        await wait_until(conn.reachable, timeout=15, what="the reconnect")
        # connected, but no stream answers the subject: Unanswered, not Rejected
        admin = await nats.connect(nats_server.url, max_reconnect_attempts=0)
        try:
            await admin.jetstream().delete_stream("INTEGRATION_EVT")
        finally:
            await admin.close()
        for _ in range(3):
            report = await pub.fire_due()
            assert report.halted == "unanswered" and report.rejected == 0
        assert await waiting(db) == [(i, 0) for i in ids]
        await provision_streams(nats_server.url)
        assert (await pub.fire_due()).published == 2
    assert await DeadLetters(db).list() == []
    assert await stream_count(nats_server.url, "INTEGRATION_EVT") == 2


async def test_two_pods_publish_each_due_row_once(db: Database, nats_server: EmbeddedNats) -> None:
    """Two pods firing the same due rows publish each exactly once."""
    await schedule(db, [f"c{i}" for i in range(60)], at=past())
    async with engine_nats(nats_server) as a, engine_nats(nats_server) as b:
        pods = [publisher(db, a), publisher(db, b)]
        reports = await asyncio.gather(*(p.fire_due() for p in pods))
        while await waiting(db):
            reports += await asyncio.gather(*(p.fire_due() for p in pods))
    assert sum(r.published for r in reports) == 60
    assert await stream_count(nats_server.url, "INTEGRATION_EVT") == 60
