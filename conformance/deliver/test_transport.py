"""Impact transport over LISTEN/NOTIFY: s132, s133, s134 and the stream's
continuity guarantees, against a real Postgres."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from service_engine import Database, EngineConfig, ReadinessHandle, Timestamp
from service_engine.embedded import ProvisionedDatabase
from service_engine.errors import CauseTooLarge
from service_engine.impacts import MAX_PAYLOAD_BYTES, Cause, Impact
from service_engine.impacts.model import Reconnected
from service_engine.impacts.transport import (
    PgListenNotify,
    fire_due,
    queue_usage,
    schedule_in,
    stage_in,
)
from service_engine.metrics import Metrics
from service_engine.readiness import REASON_LISTENER_BRAKE
from service_engine.render import Query, Reset, Upsert
from service_engine.render.stream import SessionStream
from service_engine.render.windows import WindowSpec

from ..support.harness import (
    assert_never,
    assert_nothing,
    engine_running,
    fast_engine_config,
    listener_running,
    owner_connection,
    wait_until,
)
from ..support.sample_cards import Card, CardsView, Principal, RankQuery, write_card


@contextlib.asynccontextmanager
async def listening(db: Database, **config: object) -> AsyncIterator[PgListenNotify]:
    listener = PgListenNotify(db, EngineConfig(**config), ReadinessHandle())
    async with listener_running(listener):
        yield listener


async def commit(db: Database, impacts: list[Impact]) -> None:
    async with db.pool.acquire() as conn, conn.transaction():
        await stage_in(conn, impacts)


async def next_delivery(listener: PgListenNotify) -> list[Impact] | Reconnected:
    return await asyncio.wait_for(listener.channel.get(), 10)


def cards(*keys: int) -> list[Impact]:
    return [Impact.entity("card", k) for k in keys]


ALICE = Principal("alice", frozenset({"acme"}))


async def seed(db: Database, *cards: Card) -> None:
    async with db.pool.acquire() as conn:
        for card in cards:
            await write_card(conn, card)


async def test_committed_impacts_arrive_whole_once_in_commit_order(db: Database) -> None:
    """Committed impact groups arrive whole, once each, in commit order."""
    async with listening(db) as listener:
        async with db.pool.acquire() as conn:
            for batch in ([1, 2], [3], [4, 5, 6]):
                async with conn.transaction():
                    await stage_in(conn, cards(*batch))
        assert await next_delivery(listener) == cards(1, 2)
        assert await next_delivery(listener) == cards(3)
        assert await next_delivery(listener) == cards(4, 5, 6)
        await assert_nothing(listener.channel, 0.2)


async def test_a_rolled_back_transaction_delivers_nothing(db: Database) -> None:
    """A transaction that rolls back delivers nothing."""
    async with listening(db) as listener:
        async with db.pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await stage_in(conn, cards(1))
            await tx.rollback()
        await assert_nothing(listener.channel, 0.3)


async def test_large_groups_reassemble_across_frames_amid_concurrent_commits(db: Database) -> None:
    """Groups too large for one NOTIFY reassemble whole across frames while other
    transactions commit concurrently."""
    def group(tag: str) -> list[Impact]:
        return [Impact.entity("row", f"{tag}-{i}-" + "x" * 120) for i in range(400)]

    groups = {tag: group(tag) for tag in "abcd"}
    small = [cards(i) for i in range(20)]
    async with listening(db) as listener:
        await asyncio.gather(
            *(commit(db, g) for g in groups.values()), *(commit(db, s) for s in small)
        )
        received = [await next_delivery(listener) for _ in range(len(groups) + len(small))]
    assert all(isinstance(r, list) for r in received)
    large = [r for r in received if isinstance(r, list) and len(r) == 400]
    assert sorted(large, key=lambda g: g[0].key_json) == list(groups.values())
    singles = sorted(int(str(r[0].key)) for r in received if isinstance(r, list) and len(r) == 1)
    assert singles == list(range(20))


async def test_an_oversize_cause_fails_the_transaction_and_commits_nothing(db: Database) -> None:
    """An impact whose cause exceeds the payload bound fails its transaction (CauseTooLarge)
    and commits nothing, scheduled impacts included."""
    at = Timestamp.now() + timedelta(hours=1)
    huge = Impact.entity("card", 1, Cause("card.moved", "x" * MAX_PAYLOAD_BYTES))
    async with listening(db) as listener:
        async with db.pool.acquire() as conn:
            with pytest.raises(CauseTooLarge):
                async with conn.transaction():
                    await schedule_in(conn, at, cards(7))
                    await stage_in(conn, [*cards(1), huge])
        assert await db.pool.fetchval("SELECT count(*) FROM service_engine.scheduled_impact") == 0
        await assert_nothing(listener.channel, 0.2)


async def test_s132_channel_overflow_yields_exactly_one_reconnected_and_keeps_draining(
    db: Database,
) -> None:
    """s132: with a tiny channel and a stalled consumer, an overflow drops the
    queued impacts, yields exactly one Reconnected, and the drain goes on."""
    async with listening(db, listener_channel_capacity=3) as listener:
        for i in range(10):  # the consumer is stalled: nobody reads
            await commit(db, cards(i))
        await wait_until(lambda: listener.channel.overflows >= 1, what="an overflow")
        await wait_until(lambda: len(listener.channel) >= 1, what="queued deliveries")
        drained: list[object] = []
        while (item := listener.channel.get_nowait()) is not None:
            drained.append(item)
        assert sum(isinstance(d, Reconnected) for d in drained) == 1
        assert isinstance(drained[0], Reconnected)
        # The listener kept draining: a new commit arrives after the loss.
        await commit(db, cards(99))
        got = await next_delivery(listener)
        while got != cards(99):
            assert isinstance(got, list), "a second Reconnected for one overflow"
            got = await next_delivery(listener)


async def test_s133_brake_through_the_beat(db: Database) -> None:
    """s133: the running engine's beat measures the notification queue; past
    listener_queue_threshold it closes the listener, readiness goes DOWN
    with the brake's reason, and the reconnected listener re-snapshots the
    live session (a Reset). Once usage falls the beat brakes no more, the pod
    stays UP and a commit reaches the session as an Upsert again."""
    await seed(db, Card("c1", "acme", 1, "one"))
    # Any usage at all brakes: a fresh queue reads exactly 0.
    config = fast_engine_config(
        "transport", lock_timeout=timedelta(seconds=1), listener_queue_threshold=1e-9
    )
    async with engine_running(config, db, CardsView()) as engine:
        stream = await engine.attach(ALICE, "cards", WindowSpec(Query(RankQuery())))
        (first,) = [await asyncio.wait_for(stream.next(), 10)]
        assert isinstance(first, Reset)
        # A backend that LISTENs and idles in a transaction holds the queue
        # tail: notifications spanning more than one queue page count as usage.
        stuck = await db.connect_dedicated()
        try:
            await stuck.execute("LISTEN service_engine_impacts")
            await stuck.execute("BEGIN")
            await stuck.execute("SELECT 1")
            await commit(db, [Impact.entity("row", f"{i}-" + "x" * 200) for i in range(600)])
            reasons: list[str] = []

            def braked() -> bool:
                reason = engine.readiness.current().reasons.get(REASON_LISTENER_BRAKE)
                if reason is not None:
                    reasons.append(reason)
                return reason is not None

            await wait_until(braked, what="the beat's brake taking readiness DOWN")
            assert "listener_queue_threshold" in reasons[0]
            reset = await _next_reset(stream)
            assert reset.views == {'"c1"': ("acme", 1, "one")}
            await stuck.execute("ROLLBACK")
            await stuck.execute("UNLISTEN *")
        finally:
            await stuck.close()
        await wait_until(lambda: _usage_zero(db), what="the queue drained")
        await wait_until(lambda: engine.readiness.is_up, what="UP once usage fell")
        await assert_never(  # ten beats: the brake stays released
            lambda: engine.readiness.holds(REASON_LISTENER_BRAKE), within=0.5, what="the brake"
        )
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "after the brake"))
        while True:  # Resets queued by the brake's reconnects come first
            delta = await asyncio.wait_for(stream.next(), 10)
            if isinstance(delta, Upsert):
                break
            assert isinstance(delta, Reset)
        assert delta.key == '"c1"' and delta.view == ("acme", 1, "after the brake")


async def _next_reset(stream: SessionStream[Any]) -> Reset[Any]:
    while True:
        delta = await asyncio.wait_for(stream.next(), 10)
        if isinstance(delta, Reset):
            return delta


async def _usage_zero(db: Database) -> bool:
    return await queue_usage(db) == 0.0


async def test_s134_only_committed_impacts_are_counted_after_commit(
    db: Database, database: ProvisionedDatabase
) -> None:
    """s134: the impacts-committed metric counts impacts of committed
    transactions only, recorded after COMMIT returned: a firing whose
    impacts were staged but whose COMMIT itself fails (a deferred constraint
    trigger) moves the counter not at all and delivers nothing."""
    metrics = Metrics("svc", "pod-a")
    series = "service_engine_impacts_committed_total"
    due = Timestamp.now() - timedelta(seconds=1)
    async with db.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await schedule_in(conn, due, cards(1, 2, 3))
        await tx.rollback()
    assert await fire_due(db, metrics) == 0
    assert (metrics.sample(series) or 0) == 0

    # The firing's DELETE of its claimed rows fails the COMMIT, and only the COMMIT.
    async with owner_connection(database) as owner:
        await owner.execute(
            """CREATE FUNCTION public.fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'commit refused'; END $$;
               CREATE CONSTRAINT TRIGGER refuse_firing AFTER DELETE
                   ON service_engine.scheduled_impact DEFERRABLE INITIALLY DEFERRED
                   FOR EACH ROW EXECUTE FUNCTION public.fail_at_commit()"""
        )
        async with db.pool.acquire() as conn, conn.transaction():
            await schedule_in(conn, due, cards(1, 2, 3))
        async with listening(db) as listener:
            with pytest.raises(Exception, match="commit refused"):
                await fire_due(db, metrics)
            assert (metrics.sample(series) or 0) == 0
            await owner.execute("DROP TRIGGER refuse_firing ON service_engine.scheduled_impact")
            assert await fire_due(db, metrics) == 3  # the rows survived the failed COMMIT
            assert await next_delivery(listener) == cards(1, 2, 3)
            await assert_nothing(listener.channel)  # the failed firing delivered nothing
    assert metrics.sample(series) == 3
    assert "service_engine_impacts_committed_total" in metrics.exposition().decode()


async def test_a_terminated_listener_backend_yields_reconnected_and_resumes(db: Database) -> None:
    """A terminated LISTEN backend yields one Reconnected and the listener resumes
    delivering."""
    async with listening(db) as listener:
        pid = await db.pool.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
        )
        assert pid is not None
        owner = await asyncpg.connect(db._url)
        try:
            # The app role may terminate its own backends.
            assert await owner.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await owner.close()
        assert isinstance(await next_delivery(listener), Reconnected)
        await commit(db, cards(5))
        assert await next_delivery(listener) == cards(5)


async def test_scheduled_impacts_fire_once_at_database_time_with_two_pods_racing(
    db: Database,
) -> None:
    """Scheduled impacts fire at database time, not before, and exactly once with two pods
    racing."""
    db_now = Timestamp(await db.pool.fetchval("SELECT now()"))
    async with db.pool.acquire() as conn, conn.transaction():
        await schedule_in(conn, db_now + timedelta(milliseconds=400), cards(1, 2))
    async with listening(db) as listener:
        assert await fire_due(db) == 0, "fired before the database clock reached it"
        fired: list[int] = []

        async def fire() -> bool:
            fired.append(await fire_due(db))
            return sum(fired) >= 2

        # Two pods poll until the database clock reaches the due time, then
        # both fire again: nothing fires twice.
        await asyncio.gather(*(wait_until(fire, timeout=5, interval=0.01, what="the firing")
                               for _ in range(2)))
        assert list(await asyncio.gather(fire_due(db), fire_due(db))) == [0, 0]
        assert sum(fired) == 2
        assert await next_delivery(listener) == cards(1, 2)
        await assert_nothing(listener.channel, 0.2)
