"""The outbox relay against a real Postgres and a spawned nats-server per
test: s175-s178, s189, s190, the drain bound, dedup, gauges, the sweep and
the retention boot check."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import nats
import pytest
from pydantic import BaseModel

from service_engine import Database, Engine, EngineConfig, ReadinessHandle
from service_engine.beat.cron import Cron, Tick
from service_engine.beat.leader import LeaderLease
from service_engine.embedded import EmbeddedNats, provision_streams
from service_engine.errors import WorkerStopped
from service_engine.messaging.dead_letters import DeadLetters, DeadLetterSource
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    HEADER_PRODUCER,
    HEADER_SEQ,
    HEADER_SEQ_KEY,
    Actor,
    DeclaredSequence,
    EventMetadata,
    SequenceWithoutService,
    build_event,
)
from service_engine.messaging.nats import Nats, StreamMissing
from service_engine.metrics import Metrics
from service_engine.outbox.relay import (
    OUTBOX_SLOT,
    MessageRetentionTooShort,
    OutboxBounds,
    OutboxRelay,
    check_message_retention,
)
from service_engine.outbox.staging import stage_outbound, stage_outbox_row
from service_engine.readiness import REASON_NATS_UNREACHABLE

from ..support.harness import assert_never, engine_running, fast_engine_config, wait_until
from ..support.nats_support import (
    StoredMessage,
    core_nats_without_jetstream,
    engine_nats,
    set_stream,
    stream_count,
    stream_messages,
    tapped,
)

SERVICE = "cards"
SUBJECT = "integration.evt.cards.card.created"


class CardCreated(BaseModel):
    AGGREGATE: ClassVar[str] = "card"
    FACT: ClassVar[str] = "created"
    VERSION: ClassVar[int] = 1

    card_id: str
    title: str = "t"
    version: int = 1
    sequenced: bool = False

    def sequence(self) -> DeclaredSequence | None:
        return DeclaredSequence(self.card_id, self.version) if self.sequenced else None


def event(card: str, **fields: object) -> CardCreated:
    return CardCreated(card_id=card, **fields)  # type: ignore[arg-type]


async def commit_events(db: Database, payloads: list[CardCreated]) -> list[uuid.UUID]:
    """Stage one outbox row per payload in one committed transaction."""
    meta = EventMetadata.originating(Actor.service(SERVICE))
    ids = []
    async with db.pool.acquire() as conn, conn.transaction():
        for p in payloads:
            message = build_event(p, service=SERVICE, metadata=meta, occurred_at=datetime.now(UTC))
            await stage_outbound(conn, message)
            ids.append(message.message_id)
    return ids


async def commit_backlog(db: Database, rows: int) -> None:
    """A large backlog in one statement (the shape does not matter to the relay)."""
    await db.pool.execute(
        """INSERT INTO service_engine.integration_outbox (message_id, subject, payload)
           SELECT gen_random_uuid(), $1, jsonb_build_object('n', n) FROM generate_series(1, $2) n""",
        SUBJECT, rows,
    )


async def statuses(db: Database) -> dict[str, int]:
    rows = await db.pool.fetch(
        "SELECT status, count(*) AS n FROM service_engine.integration_outbox GROUP BY status"
    )
    return {r["status"]: r["n"] for r in rows}


async def attempts_spent(db: Database) -> int:
    return int(await db.pool.fetchval("SELECT coalesce(sum(attempts), 0) FROM service_engine.integration_outbox"))


def fast_bounds(**overrides: object) -> OutboxBounds:
    values: dict[str, object] = {
        "unanswered_backoff": timedelta(milliseconds=10),
        "unanswered_backoff_cap": timedelta(milliseconds=50),
    }
    values.update(overrides)
    return OutboxBounds(**values)  # type: ignore[arg-type]


def relay_for(
    db: Database, conn: Nats, metrics: Metrics | None = None, *, holder: str = "pod-a",
    lease: timedelta = timedelta(seconds=5), **bounds: object,
) -> OutboxRelay:
    metrics = metrics or Metrics(SERVICE, holder)
    return OutboxRelay(
        db, conn, DeadLetters(db, metrics), LeaderLease(db, OUTBOX_SLOT, holder, lease),
        metrics=metrics, bounds=fast_bounds(**bounds),
    )


async def step_until(relay: OutboxRelay, done: Callable[[], Awaitable[bool]], *, timeout: float = 15) -> None:
    async def stepped() -> bool:
        await relay.step()
        return await done()

    await wait_until(stepped, timeout=timeout, what="the relay to converge")


async def stop(server: EmbeddedNats, conn: Nats) -> None:
    await asyncio.to_thread(server.stop)
    await wait_until(lambda: not conn.reachable(), what="the client to see the outage")


async def restart(server: EmbeddedNats, conn: Nats) -> None:
    await asyncio.to_thread(server.start)
    await wait_until(conn.reachable, timeout=15, what="the client to reconnect")


def message_ids(stored: Sequence[StoredMessage]) -> list[str]:
    return [m.headers[HEADER_NATS_MSG_ID] for m in stored]


# -- the relay's ordinary work ---------------------------------------------------------------


async def test_committed_rows_publish_once_with_their_headers(db: Database, nats_server: EmbeddedNats) -> None:
    """Committed rows publish once, in order, with their message id and producer sequence
    headers; a second step publishes nothing."""
    async with engine_nats(nats_server) as conn:
        relay = relay_for(db, conn)
        ids = await commit_events(db, [event("c1", sequenced=True, version=4), event("c2")])
        result = await relay.step()
        assert result.published == 2 and result.halted is None
        assert await statuses(db) == {"PUBLISHED": 2}
        again = await relay.step()
        assert again.published == 0
    stored = await stream_messages(nats_server.url, "INTEGRATION_EVT")
    assert message_ids(stored) == [str(i) for i in ids]
    first, second = stored
    assert first.subject == SUBJECT
    assert first.headers[HEADER_MESSAGE_ID] == str(ids[0])
    assert (first.headers[HEADER_PRODUCER], first.headers[HEADER_SEQ_KEY], first.headers[HEADER_SEQ]) == (SERVICE, "c1", "4")
    assert HEADER_PRODUCER not in second.headers
    assert b'"event_id"' in first.data and b'"card.created"' in first.data


async def test_a_declared_sequence_without_a_service_stages_nothing(db: Database) -> None:
    """A declared sequence without a service is refused (SequenceWithoutService) and stages
    nothing; with one it stages the producer and sequence."""
    meta = EventMetadata.originating(Actor.service(SERVICE))
    message = build_event(event("c1"), service=SERVICE, metadata=meta, occurred_at=datetime.now(UTC))
    body = message.body_json()
    from service_engine.messaging.envelope import IntegrationEvent

    envelope = IntegrationEvent[dict[str, object]].model_validate_json(body)
    with pytest.raises(SequenceWithoutService):
        async with db.pool.acquire() as conn, conn.transaction():
            await stage_outbox_row(conn, envelope, SUBJECT, DeclaredSequence("c1", 1), None)
    assert await statuses(db) == {}
    async with db.pool.acquire() as conn, conn.transaction():
        staged = await stage_outbox_row(conn, envelope, SUBJECT, DeclaredSequence("c1", 1), SERVICE)
    row = await db.pool.fetchrow("SELECT message_id, producer, seq_key, seq FROM service_engine.integration_outbox")
    assert row is not None
    assert (row["message_id"], row["producer"], row["seq_key"], row["seq"]) == (staged.message_id, SERVICE, "c1", 1)


async def test_a_pass_drains_up_to_its_drain_bound(db: Database, nats_server: EmbeddedNats) -> None:
    """The batch cap equals the drain bound: a backlog bursts within one beat."""
    async with engine_nats(nats_server) as conn:
        # A pass budget and a lease no loaded machine reaches: the bound
        # under test is the batch.
        relay = relay_for(db, conn, drain_bound=250, pass_budget=timedelta(seconds=60),
                          lease=timedelta(seconds=60))
        await commit_backlog(db, 600)
        first = await relay.step()
        assert first.published == 250
        assert await statuses(db) == {"PUBLISHED": 250, "PENDING": 350}
        await step_until(relay, lambda: _no_pending(db))
    assert await stream_count(nats_server.url, "INTEGRATION_EVT") == 600


async def test_only_the_lease_holder_relays(db: Database, nats_server: EmbeddedNats) -> None:
    """Of two relays only the lease holder publishes; every row is published once."""
    async with engine_nats(nats_server) as conn:
        a, b = relay_for(db, conn, holder="pod-a"), relay_for(db, conn, holder="pod-b")
        await commit_backlog(db, 50)
        results = await asyncio.gather(a.step(), b.step())
        assert sorted(r.skipped or "" for r in results) == ["", "not the leader"]
        assert sum(r.published for r in results) == 50
    assert len(await stream_messages(nats_server.url, "INTEGRATION_EVT")) == 50


async def test_a_leader_frozen_past_its_lease_cannot_mark_rows(db: Database, nats_server: EmbeddedNats) -> None:
    """A relay that wakes after its lease expired and another pod took over
    fails its fenced writes; what it published is deduplicated."""
    async with engine_nats(nats_server) as conn:
        metrics = Metrics(SERVICE, "pod-a")
        frozen = OutboxRelay(
            db, conn, DeadLetters(db, metrics), LeaderLease(db, OUTBOX_SLOT, "pod-a", timedelta(milliseconds=200)),
            metrics=metrics, bounds=fast_bounds(),
        )
        assert (await frozen.step()).skipped is None
        successor = relay_for(db, conn, holder="pod-b")
        await wait_until(lambda: _leads(successor), timeout=5, what="the takeover")
        await commit_events(db, [event("c1"), event("c2")])
        late = await frozen.publish_pass()  # the frozen leader's pass, resumed
        assert late.halted == "lease lost" and late.published == 0
        assert await statuses(db) == {"PENDING": 2}
        assert (await successor.step()).published == 2
    assert await stream_count(nats_server.url, "INTEGRATION_EVT") == 2


async def test_a_closing_relay_hands_the_lease_over_at_once(db: Database, nats_server: EmbeddedNats) -> None:
    """A relay that closes releases its lease, so another relay leads at once."""
    async with engine_nats(nats_server) as conn:
        first, second = relay_for(db, conn, holder="pod-a"), relay_for(db, conn, holder="pod-b")
        assert (await first.step()).skipped is None
        assert (await second.step()).skipped == "not the leader"
        await first.aclose()
        assert (await second.step()).skipped is None


async def test_a_republished_row_is_deduplicated(db: Database, nats_server: EmbeddedNats) -> None:
    """A row whose PUBLISHED mark was lost (a crash after the ack) publishes
    again, is answered Duplicate and lands on the stream once."""
    async with engine_nats(nats_server) as conn:
        relay = relay_for(db, conn)
        await commit_events(db, [event("c1")])
        await relay.step()
        await db.pool.execute("UPDATE service_engine.integration_outbox SET status = 'PENDING'")
        result = await relay.step()
        assert result.published == 1
        assert await statuses(db) == {"PUBLISHED": 1}
    assert len(await stream_messages(nats_server.url, "INTEGRATION_EVT")) == 1


async def test_backlog_gauges_follow_the_pending_rows(db: Database, nats_server: EmbeddedNats) -> None:
    """The backlog gauges report the pending rows and the oldest one's age, and fall to zero
    once drained."""
    metrics = Metrics(SERVICE, "pod-a")
    async with engine_nats(nats_server) as conn:
        relay = relay_for(db, conn, metrics)
        await stop(nats_server, conn)
        await commit_backlog(db, 30)
        await db.pool.execute(
            "UPDATE service_engine.integration_outbox SET created_at = now() - interval '90 seconds' WHERE id = (SELECT min(id) FROM service_engine.integration_outbox)"
        )
        await relay.step()
        assert metrics.sample("service_engine_outbox_pending") == 30
        oldest = metrics.sample("service_engine_outbox_oldest_age_seconds")
        assert oldest is not None and 89 < oldest < 120
        await restart(nats_server, conn)
        await step_until(relay, lambda: _no_pending(db))
        await relay.step()
        assert metrics.sample("service_engine_outbox_pending") == 0
        assert metrics.sample("service_engine_outbox_oldest_age_seconds") == 0


async def test_the_sweep_deletes_published_aged_failed_rows_and_old_claims(db: Database, nats_server: EmbeddedNats) -> None:
    """The sweep deletes published rows, failed rows past the retention and old claims, in
    bounded batches, and keeps the fresh ones."""
    async with engine_nats(nats_server) as conn:
        relay = relay_for(db, conn, message_retention=timedelta(hours=1), sweep_batch=2)
        await commit_backlog(db, 5)
        await relay.step()  # publishes all five
        await commit_backlog(db, 3)
        await db.pool.execute(
            """UPDATE service_engine.integration_outbox SET status = 'FAILED',
                      created_at = now() - CASE WHEN id % 2 = 0 THEN interval '2 hours' ELSE interval '1 minute' END
                WHERE status = 'PENDING'"""
        )
        old, fresh = uuid.uuid4(), uuid.uuid4()
        await db.pool.execute(
            """INSERT INTO service_engine.message_claim (message_id, reaction, claimed_at)
               VALUES ($1, 'r', now() - interval '2 hours'), ($2, 'r', now())""",
            old, fresh,
        )
        report = await relay.sweep()
    assert report.published == 5
    failed_left = await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.integration_outbox WHERE status = 'FAILED'"
    )
    assert report.failed + failed_left == 3 and report.failed >= 1
    assert await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.integration_outbox WHERE created_at < now() - interval '1 hour'"
    ) == 0
    claims = await db.pool.fetch("SELECT message_id FROM service_engine.message_claim")
    assert [r["message_id"] for r in claims] == [fresh] and report.claims == 1


# -- outages and refusals --------------------------------------------------------------------


async def test_s175_rows_committed_while_nats_is_down_deliver_exactly_once_on_restart(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s175: through the running engine's relay, rows committed while NATS is
    down wait PENDING with no attempt spent while the leader's beats keep
    gauging them, then deliver exactly once, in commit order, when the broker
    is back, with no dead letter; later beats publish nothing again."""
    async with engine_nats(nats_server) as conn, relaying_engine(db, conn) as engine:
        await stop(nats_server, conn)
        ids = await commit_events(db, [event(f"c{i}") for i in range(20)])
        # The leader's beat measures the backlog before it would publish: the
        # gauge reaching 20 shows the relay stepped over the rows meanwhile.
        await wait_until(
            lambda: engine.metrics.sample("service_engine_outbox_pending") == 20,
            what="the relay's beat to gauge the rows committed during the outage",
        )
        await _beats_pass(db, 3)
        assert await statuses(db) == {"PENDING": 20}
        assert await attempts_spent(db) == 0
        await restart(nats_server, conn)
        await wait_until(lambda: _no_pending(db), timeout=15, what="the rows published")
        await assert_never(  # ten beats more: nothing is published twice
            lambda: _stored_more_than(nats_server.url, 20), within=0.5, what="a second publish"
        )
        # The gauge is the next beat's measure: it reaches 0 once one ran.
        await wait_until(
            lambda: engine.metrics.sample("service_engine_outbox_pending") == 0,
            what="the relay's beat to gauge the drained outbox",
        )
        assert (engine.metrics.sample("service_engine_dead_letters_total", source="Outbox") or 0) == 0
    stored = await stream_messages(nats_server.url, "INTEGRATION_EVT")
    assert message_ids(stored) == [str(i) for i in ids], "published out of commit order or twice"
    assert await DeadLetters(db).list() == []


@contextlib.asynccontextmanager
async def relaying_engine(db: Database, conn: Nats, **config: Any) -> AsyncIterator[Engine]:
    """A real Engine given NATS, running (its relay is a beat step and a
    commit's wake-up) and UP, with a short beat and lease."""
    settings: dict[str, Any] = {"lock_timeout": timedelta(seconds=1), **config}
    async with engine_running(fast_engine_config(SERVICE, **settings), db, nats=conn) as engine:
        yield engine


async def _beats_pass(db: Database, n: int) -> None:
    """Wait until the beat ran ``n`` more times (the schema-version heartbeat
    it writes on each beat advanced ``n`` times)."""
    for _ in range(n):
        await wait_until(_heartbeat_advanced(db, await _heartbeat(db)), timeout=5, what="a beat")


def _heartbeat_advanced(db: Database, last: datetime) -> Callable[[], Awaitable[bool]]:
    return lambda: _advanced(_heartbeat(db), last)


async def _stored_more_than(url: str, n: int) -> bool:
    return await stream_count(url, "INTEGRATION_EVT") > n


@contextlib.asynccontextmanager
async def running_engine(
    db: Database, conn: Nats, *, nats_grace: timedelta, drain_bound: int = 500,
    cron_every: timedelta = timedelta(milliseconds=200),
) -> AsyncIterator[tuple[Engine, ReadinessHandle]]:
    """A real Engine given NATS: it wires the relay and the cron scheduler as
    beat steps and NatsHealth as a worker itself."""
    config = EngineConfig(
        service=SERVICE, beat_interval=timedelta(milliseconds=50), lease=timedelta(seconds=2),
        nats_grace=nats_grace, publish_ack_timeout=timedelta(seconds=1),
        outbox_drain_bound=drain_bound,
    )
    readiness = ReadinessHandle()
    engine = await Engine.boot(config, db, conn, readiness)

    async def tick(_conn: object, _tick: Tick) -> None:
        return None

    engine.register_cron(Cron("heartbeat", cron_every, tick))
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: readiness.is_up, what="the engine UP")
        yield engine, readiness
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)


async def _heartbeat(db: Database) -> datetime:
    value: datetime = await db.pool.fetchval("SELECT heartbeat_at FROM service_engine.schema_version")
    return value


async def _latest_cron_slot(db: Database) -> datetime | None:
    value: datetime | None = await db.pool.fetchval(
        "SELECT max(slot) FROM service_engine.cron_slot WHERE cron = 'heartbeat'"
    )
    return value


@pytest.mark.slow
async def test_s176_a_full_backlog_with_nats_down_keeps_the_beat_ticking(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s176: with NATS down and a full outbox, the beat keeps ticking — the
    schema-version heartbeat and the cron's slots advance — while readiness
    carries the nats reason."""
    async with engine_nats(nats_server) as conn, running_engine(
        db, conn, nats_grace=timedelta(milliseconds=500)
    ) as (engine, readiness):
        await stop(nats_server, conn)
        await commit_backlog(db, 3000)
        await wait_until(lambda: readiness.holds(REASON_NATS_UNREACHABLE), timeout=5, what="the nats reason")
        heartbeats, slots = [await _heartbeat(db)], [await _latest_cron_slot(db)]
        for _ in range(3):
            await wait_until(lambda: _advanced(_heartbeat(db), heartbeats[-1]), timeout=3, what="a heartbeat")
            heartbeats.append(await _heartbeat(db))
            await wait_until(lambda: _advanced(_latest_cron_slot(db), slots[-1]), timeout=3, what="a cron slot")
            slots.append(await _latest_cron_slot(db))
            assert readiness.holds(REASON_NATS_UNREACHABLE)
        assert await statuses(db) == {"PENDING": 3000}
        assert await attempts_spent(db) == 0
        assert not any(r.startswith("beat:") for r in readiness.current().reasons)
        assert engine.metrics.sample("service_engine_dependency_up", dependency="nats") == 0
        await restart(nats_server, conn)
        await wait_until(lambda: readiness.is_up, timeout=10, what="UP after the outage")
        # 3,000 publishes: a bound a machine shared by parallel workers meets.
        await wait_until(lambda: _no_pending(db), timeout=120, what="the backlog to drain")
    assert await stream_count(nats_server.url, "INTEGRATION_EVT") == 3000


async def test_s177_the_nats_verdict_lands_within_grace_despite_a_backlog(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s177: a draining backlog does not delay REASON_NATS_UNREACHABLE past
    nats_grace plus a small detection margin."""
    grace = timedelta(seconds=1)
    async with engine_nats(nats_server) as conn, running_engine(db, conn, nats_grace=grace) as (_, readiness):
        await commit_backlog(db, 20_000)
        await wait_until(lambda: _some_published(db), what="the relay to be draining")
        stopped_at = time.monotonic()
        await asyncio.to_thread(nats_server.stop)
        await wait_until(lambda: readiness.holds(REASON_NATS_UNREACHABLE), timeout=10, what="the nats reason")
        took = time.monotonic() - stopped_at
        assert took <= grace.total_seconds() + 0.6, f"DOWN only after {took:.2f}s"
        assert took >= grace.total_seconds() - 0.05, f"DOWN already after {took:.2f}s, inside the grace"


async def test_an_outage_shorter_than_the_grace_keeps_the_pod_up(db: Database, nats_server: EmbeddedNats) -> None:
    """A NATS outage shorter than nats_grace never takes the pod DOWN."""
    async with engine_nats(nats_server) as conn, running_engine(
        db, conn, nats_grace=timedelta(seconds=4)
    ) as (engine, readiness):
        watcher = asyncio.create_task(assert_never(  # through the whole outage
            lambda: readiness.holds(REASON_NATS_UNREACHABLE), within=60, interval=0.01,
            what="the nats reason",
        ))
        try:
            await stop(nats_server, conn)
            await restart(nats_server, conn)
            await assert_never(  # a last look after the reconnect
                lambda: readiness.holds(REASON_NATS_UNREACHABLE), within=0.2, what="the nats reason"
            )
            assert not watcher.done()  # done early only by seeing the reason
        finally:
            if watcher.done():
                watcher.result()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        assert readiness.is_up
        assert engine.metrics.sample("service_engine_dependency_up", dependency="nats") == 1


async def test_s178_a_row_the_broker_keeps_rejecting_is_dead_lettered_and_failed_in_one_transaction(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s178: through the running engine's relay, a row the reachable broker
    refuses (too large for the stream) is tried once per attempt up to the
    bound (the broker sees at least that many publishes of it), then marked
    FAILED and dead-lettered (source Outbox) in the same transaction and never
    tried again; the other rows publish meanwhile."""
    await set_stream(nats_server.url, "INTEGRATION_EVT", max_msg_size=1024)
    async with tapped(nats_server.url, "integration.evt.cards.>") as tap, engine_nats(
        nats_server
    ) as conn, relaying_engine(db, conn, outbox_max_attempts=3) as engine:
        [poison] = await commit_events(db, [event("big", title="x" * 4096)])
        fine = await commit_events(db, [event("c1"), event("c2")])
        await wait_until(lambda: _status_of(db, poison, "FAILED"), what="the poison row FAILED")
        await wait_until(lambda: _no_pending(db), what="the other rows published")
        # A publish whose answer came late (Unanswered, not an attempt) may
        # reach the broker too: the broker sees at least the three attempts.
        seen = tap.count(str(poison))
        assert seen >= 3
        await _beats_pass(db, 3)
        await assert_never(  # FAILED is final: no further attempt
            lambda: tap.count(str(poison)) > seen, within=0.5, what="an attempt after FAILED"
        )
        assert engine.metrics.sample("service_engine_dead_letters_total", source="Outbox") == 1
    failed = await db.pool.fetchrow(
        """SELECT status, attempts, last_error, xmin::text AS tx
             FROM service_engine.integration_outbox WHERE message_id = $1""", poison
    )
    assert failed is not None and (failed["status"], failed["attempts"]) == ("FAILED", 3)
    assert "size" in failed["last_error"] or "maximum" in failed["last_error"]
    letters = await DeadLetters(db).list(DeadLetterSource.OUTBOX)
    assert len(letters) == 1
    letter = letters[0]
    assert letter.message_id == poison and letter.subject == SUBJECT and letter.attempts == 3
    assert letter.payload is not None and b"x" * 4096 in letter.payload
    dead_tx = await db.pool.fetchval("SELECT xmin::text FROM service_engine.dead_letter WHERE id = $1", letter.id)
    assert dead_tx == failed["tx"], "FAILED and its dead letter were written in different transactions"
    stored = await stream_messages(nats_server.url, "INTEGRATION_EVT")
    assert message_ids(stored) == [str(i) for i in fine]


async def test_s189_a_subject_jetstream_cannot_answer_is_an_outage(db: Database, nats_server: EmbeddedNats) -> None:
    """s189: through the running engine's relay, connected but with no stream
    to answer the subject (no responders): the relay keeps trying (the
    broker sees its publishes) yet spends no attempt and dead-letters
    nothing, the rows wait PENDING, then deliver once, in commit order, when
    JetStream answers again."""
    async with tapped(nats_server.url, "integration.evt.cards.>") as tap, engine_nats(
        nats_server
    ) as conn, relaying_engine(db, conn) as engine:
        await _delete_stream(nats_server.url, "INTEGRATION_EVT")
        ids = await commit_events(db, [event(f"c{i}") for i in range(5)])
        await wait_until(lambda: tap.count(str(ids[0])) >= 3, timeout=15, what="three tries unanswered")
        assert await statuses(db) == {"PENDING": 5}
        assert await attempts_spent(db) == 0
        await provision_streams(nats_server.url)
        await wait_until(lambda: _no_pending(db), timeout=20, what="the rows published")
        assert (engine.metrics.sample("service_engine_dead_letters_total", source="Outbox") or 0) == 0
    assert await DeadLetters(db).list() == []
    assert message_ids(await stream_messages(nats_server.url, "INTEGRATION_EVT")) == [str(i) for i in ids]


async def test_s190_a_server_restarted_without_jetstream_is_an_outage(
    db: Database, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """s190: the broker comes back on the same port without JetStream: the
    running engine's client reconnects, its relay keeps trying (the broker
    sees its publishes) yet spends no attempt, the pod goes DOWN with the nats
    reason past the grace, and once JetStream is back the rows deliver once,
    in commit order, and the pod is UP."""
    async with engine_nats(nats_server) as conn, relaying_engine(
        db, conn, nats_grace=timedelta(milliseconds=300)
    ) as engine:
        await stop(nats_server, conn)
        async with core_nats_without_jetstream(nats_server.port, tmp_path / "core"):
            await wait_until(conn.reachable, timeout=15, what="a connection to the core server")
            async with tapped(nats_server.url, "integration.evt.cards.>") as tap:
                ids = await commit_events(db, [event(f"c{i}") for i in range(5)])
                await wait_until(lambda: tap.count(str(ids[0])) >= 3, timeout=15, what="three tries unanswered")
            assert await statuses(db) == {"PENDING": 5}
            assert await attempts_spent(db) == 0
            await wait_until(
                lambda: engine.readiness.holds(REASON_NATS_UNREACHABLE), timeout=5,
                what="DOWN without JetStream",
            )
            assert conn.reachable()
        await wait_until(lambda: not conn.reachable(), what="the core server gone")
        await restart(nats_server, conn)
        await wait_until(lambda: _no_pending(db), timeout=20, what="the rows published")
        await wait_until(lambda: engine.readiness.is_up, timeout=5, what="UP with JetStream back")
    assert await DeadLetters(db).list() == []
    assert message_ids(await stream_messages(nats_server.url, "INTEGRATION_EVT")) == [str(i) for i in ids]


async def _delete_stream(url: str, name: str) -> None:
    admin = await nats.connect(url, max_reconnect_attempts=0)
    try:
        await admin.jetstream().delete_stream(name)
    finally:
        await admin.close()


async def _status_of(db: Database, message_id: uuid.UUID, status: str) -> bool:
    found = await db.pool.fetchval(
        "SELECT status FROM service_engine.integration_outbox WHERE message_id = $1", message_id
    )
    return bool(found == status)


# -- the retention boot check -----------------------------------------------------------------


async def test_boot_refuses_a_message_retention_below_a_streams_max_age(nats_server: EmbeddedNats) -> None:
    """Boot refuses a message retention below a stream's max_age, and a stream that does not
    exist."""
    await set_stream(nats_server.url, "INTEGRATION_CMD", max_age=3600)
    await set_stream(nats_server.url, "INTEGRATION_EVT", max_age=600)
    async with engine_nats(nats_server) as conn:
        await check_message_retention(conn, timedelta(hours=1), ["INTEGRATION_CMD", "INTEGRATION_EVT"])
        with pytest.raises(MessageRetentionTooShort, match="INTEGRATION_CMD"):
            await check_message_retention(conn, timedelta(minutes=30), ["INTEGRATION_CMD", "INTEGRATION_EVT"])
        with pytest.raises(StreamMissing, match="NO_SUCH_STREAM"):
            await check_message_retention(conn, timedelta(days=7), ["NO_SUCH_STREAM"])


async def test_boot_refuses_any_retention_for_a_stream_without_max_age(nats_server: EmbeddedNats) -> None:
    """Boot refuses any retention for a stream that keeps messages forever."""
    await set_stream(nats_server.url, "INTEGRATION_EVT")  # no max_age: keeps messages forever
    async with engine_nats(nats_server) as conn:
        with pytest.raises(MessageRetentionTooShort, match="unlimited"):
            await check_message_retention(conn, timedelta(days=3650), ["INTEGRATION_EVT"])


# -- helpers -------------------------------------------------------------------------------------


async def _no_pending(db: Database) -> bool:
    return "PENDING" not in await statuses(db)


async def _leads(relay: OutboxRelay) -> bool:
    return (await relay.step()).skipped != "not the leader"


async def _some_published(db: Database) -> bool:
    return (await statuses(db)).get("PUBLISHED", 0) > 0


async def _advanced(value: Awaitable[datetime | None], last: datetime | None) -> bool:
    now = await value
    return now is not None and (last is None or now > last)


async def test_a_commit_with_outbox_rows_wakes_the_relay_between_beats(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A commit that staged outbox rows signals the relay's leader, which
    publishes them at once instead of on its next beat."""
    config = EngineConfig(
        service=SERVICE, beat_interval=timedelta(seconds=30), lease=timedelta(seconds=60),
        publish_ack_timeout=timedelta(seconds=1),
    )
    async with engine_nats(nats_server) as conn:
        readiness = ReadinessHandle()
        engine = await Engine.boot(config, db, conn, readiness)
        task = asyncio.create_task(engine.run())
        try:
            await wait_until(lambda: readiness.is_up, what="the engine UP")
            # The first beat has run (readiness is UP); the next is 30 s away.
            await wait_until(lambda: _lease_held(db), what="the outbox lease")
            await commit_events(db, [event("c1"), event("c2")])
            # Both well inside the 30 s beat: only the commit's wake-up can explain them.
            await wait_until(
                lambda: _published(nats_server.url, 2), timeout=5, what="the rows published"
            )
            await wait_until(
                lambda: _all_published(db, 2), timeout=5, what="the rows marked PUBLISHED"
            )
        finally:
            engine.shutdown()
            with contextlib.suppress(WorkerStopped):
                await asyncio.wait_for(task, 10)


async def _all_published(db: Database, n: int) -> bool:
    return await statuses(db) == {"PUBLISHED": n}


async def _lease_held(db: Database) -> bool:
    return bool(await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.leader_slot WHERE slot = 'outbox'"
    ))


async def _published(url: str, n: int) -> bool:
    return await stream_count(url, "INTEGRATION_EVT") >= n
