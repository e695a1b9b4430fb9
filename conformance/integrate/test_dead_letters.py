"""The dead-letter store: record in the caller's transaction with an impact
on the ops noun, list by source, discard, retry with a fresh dedup token but
the original logical id, and s169's count-once rule."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator

import pytest

from service_engine import Database, EngineConfig, ReadinessHandle
from service_engine.embedded import EmbeddedNats
from service_engine.impacts import Impact
from service_engine.impacts.transport import PgListenNotify
from service_engine.messaging.dead_letters import (
    DEAD_LETTER_NOUN,
    DeadLetter,
    DeadLetterNotFound,
    DeadLetters,
    DeadLetterSource,
    NotRetryable,
)
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    derive_dead_letter_id,
)
from service_engine.messaging.nats import Acked
from service_engine.metrics import Metrics

from ..support.harness import assert_nothing, listener_running
from ..support.nats_support import engine_nats, stream_messages

COUNTER = "service_engine_dead_letters_total"


@contextlib.asynccontextmanager
async def listening(db: Database) -> AsyncIterator[PgListenNotify]:
    async with listener_running(PgListenNotify(db, EngineConfig(), ReadinessHandle())) as listener:
        yield listener


def reaction_letter(message_id: uuid.UUID, reaction: str = "create_card") -> DeadLetter:
    body = json.dumps({"command_id": str(message_id), "payload": {"title": "x"}}).encode()
    return DeadLetter.for_message(
        derive_dead_letter_id("Reaction", reaction, str(message_id)),
        DeadLetterSource.REACTION, reaction, reason="terminal", detail="handler refused",
        subject="integration.cmd.cards.card.create", payload=body,
        headers={HEADER_NATS_MSG_ID: str(message_id), HEADER_MESSAGE_ID: str(message_id), "X-Trace": "t1"},
        message_id=message_id, attempts=1,
    )


def counted(metrics: Metrics, source: DeadLetterSource) -> float:
    return metrics.sample(COUNTER, source=source.value) or 0.0


async def test_record_in_the_callers_transaction_stages_an_impact_on_the_ops_noun(db: Database) -> None:
    """A dead letter recorded in the caller's transaction stages an impact on the dead-
    letter noun, is counted only after commit, and stores the message whole."""
    metrics = Metrics("dl", "pod")
    store = DeadLetters(db, metrics)
    letter = reaction_letter(uuid.uuid4())
    async with listening(db) as listener:
        async with db.pool.acquire() as conn, conn.transaction():
            recorded = await store.record(conn, letter)
            assert counted(metrics, DeadLetterSource.REACTION) == 0, "counted before commit"
        store.committed(recorded)
        delivery = await asyncio.wait_for(listener.channel.get(), 10)
        assert delivery == [Impact.entity(DEAD_LETTER_NOUN, str(letter.id))]
    assert recorded.fresh
    assert counted(metrics, DeadLetterSource.REACTION) == 1
    [stored] = await store.list(DeadLetterSource.REACTION)
    assert stored.id == letter.id and stored.work == "create_card" and stored.reason == "terminal"
    assert stored.payload == letter.payload and stored.headers == letter.headers
    assert stored.message_id == letter.message_id and stored.occurrences == 1


async def test_a_rolled_back_record_leaves_no_row_no_impact_no_count(db: Database) -> None:
    """A dead letter recorded in a transaction that rolls back leaves no row, delivers no
    impact and is not counted."""
    metrics = Metrics("dl", "pod")
    store = DeadLetters(db, metrics)
    async with listening(db) as listener:
        async with db.pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await store.record(conn, reaction_letter(uuid.uuid4()))
            await tx.rollback()
        await assert_nothing(listener.channel, 0.3)
    assert await store.list() == []
    assert counted(metrics, DeadLetterSource.REACTION) == 0


async def test_s169_a_stuck_worker_re_recorded_every_beat_is_one_row_counted_once(db: Database) -> None:
    """s169: a mirror stuck past its restart threshold is re-recorded on every
    beat: one row, one count; a genuinely distinct dead letter still counts."""
    metrics = Metrics("dl", "pod")
    store = DeadLetters(db, metrics)
    for beat in range(5):
        await store.record_work(
            DeadLetter.for_work(
                DeadLetterSource.MIRROR, "known_persons", reason="restart threshold",
                detail=f"failed again at beat {beat}",
            )
        )
    [row] = await store.list(DeadLetterSource.MIRROR)
    assert row.occurrences == 5 and row.detail == "failed again at beat 4"
    assert counted(metrics, DeadLetterSource.MIRROR) == 1

    # distinct: another mirror, and the same work under another key
    await store.record_work(DeadLetter.for_work(DeadLetterSource.MIRROR, "known_teams", reason="stuck"))
    await store.record_work(
        DeadLetter.for_work(DeadLetterSource.MIRROR, "known_persons", reason="stuck", key="episode-2")
    )
    assert len(await store.list(DeadLetterSource.MIRROR)) == 3
    assert counted(metrics, DeadLetterSource.MIRROR) == 3

    # a redelivered poison message re-records its one row, counted once
    message = reaction_letter(uuid.uuid4())
    for _ in range(3):
        await store.record_work(message)
    assert counted(metrics, DeadLetterSource.REACTION) == 1
    assert (await store.get(message.id)) is not None


async def test_concurrent_records_of_one_dead_letter_count_once(db: Database) -> None:
    """Concurrent records of one dead letter store one row with every occurrence and count
    it once."""
    metrics = Metrics("dl", "pod")
    store = DeadLetters(db, metrics)
    letter = DeadLetter.for_work(DeadLetterSource.CRON, "nightly", reason="tick failed", key="slot-1")
    results = await asyncio.gather(*(store.record_work(letter) for _ in range(8)))
    assert sum(r.fresh for r in results) == 1
    assert counted(metrics, DeadLetterSource.CRON) == 1
    stored = await store.get(letter.id)
    assert stored is not None and stored.occurrences == 8


async def test_list_filters_by_source_and_discard_removes_with_an_impact(db: Database) -> None:
    """list filters by source; discard removes a dead letter with one impact, and a second
    discard of it does nothing."""
    store = DeadLetters(db, Metrics("dl", "pod"))
    message = reaction_letter(uuid.uuid4())
    work = DeadLetter.for_work(DeadLetterSource.CRON, "nightly", reason="tick failed")
    await store.record_work(message)
    await store.record_work(work)
    assert [d.id for d in await store.list(DeadLetterSource.CRON)] == [work.id]
    assert {d.id for d in await store.list()} == {message.id, work.id}
    async with listening(db) as listener:
        assert await store.discard(work.id)
        delivery = await asyncio.wait_for(listener.channel.get(), 10)
        assert delivery == [Impact.entity(DEAD_LETTER_NOUN, str(work.id))]
        assert not await store.discard(work.id)
        await assert_nothing(listener.channel, 0.2)
    assert [d.id for d in await store.list()] == [message.id]


async def test_retry_republishes_with_a_fresh_dedup_token_and_the_original_logical_id(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A retried dead letter is republished with a fresh Nats-Msg-Id (not dropped as a
    duplicate) and its original logical message id, then leaves the store."""
    store = DeadLetters(db, Metrics("dl", "pod"))
    message_id = uuid.uuid4()
    letter = reaction_letter(message_id)
    await store.record_work(letter)
    async with engine_nats(nats_server) as conn:
        # the original delivery is still within JetStream's duplicate window
        first = await conn.publish(letter.subject or "", letter.payload or b"", dict(letter.headers))
        assert isinstance(first, Acked)
        outcome = await store.retry(letter.id, conn)
        assert isinstance(outcome, Acked), "the retry was dropped as a duplicate"
        with pytest.raises(DeadLetterNotFound):
            await store.retry(letter.id, conn)
    stored = await stream_messages(nats_server.url, "INTEGRATION_CMD")
    assert len(stored) == 2
    original, retried = stored
    assert retried.data == original.data
    assert retried.subject == "integration.cmd.cards.card.create"
    assert retried.headers[HEADER_MESSAGE_ID] == str(message_id)
    assert retried.headers[HEADER_NATS_MSG_ID] != str(message_id)
    assert uuid.UUID(retried.headers[HEADER_NATS_MSG_ID])
    assert retried.headers["X-Trace"] == "t1"
    assert await store.get(letter.id) is None


async def test_a_failed_retry_keeps_the_dead_letter(db: Database, nats_server: EmbeddedNats) -> None:
    """A retry the broker does not ack keeps the dead letter."""
    store = DeadLetters(db, Metrics("dl", "pod"))
    letter = DeadLetter.for_message(
        uuid.uuid4(), DeadLetterSource.OUTBOX, "outbox", reason="rejected",
        subject="nowhere.captures.this", payload=b"{}", message_id=uuid.uuid4(),
    )
    await store.record_work(letter)
    async with engine_nats(nats_server) as conn:
        outcome = await store.retry(letter.id, conn)
    assert not isinstance(outcome, Acked)
    assert await store.get(letter.id) is not None


async def test_work_that_was_no_message_is_not_retryable(db: Database, nats_server: EmbeddedNats) -> None:
    """A dead letter for work that was no message is refused a retry (NotRetryable) and
    kept."""
    store = DeadLetters(db, Metrics("dl", "pod"))
    letter = DeadLetter.for_work(DeadLetterSource.MIRROR, "known_persons", reason="stuck")
    await store.record_work(letter)
    async with engine_nats(nats_server) as conn:
        with pytest.raises(NotRetryable):
            await store.retry(letter.id, conn)
    assert await store.get(letter.id) is not None
