"""Every series an alert or the ops page reads moves with its cause, against
real Postgres: live sessions, deltas delivered, render passes, resets by
cause (reconnect, overflow, threshold), the notification queue's usage, the
dead letters waiting, and ``dependency_up`` for the listener and postgres
(the LISTEN backend terminated, then new connections refused and allowed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg

from service_engine import Database, Engine, EngineConfig, ReadinessHandle
from service_engine.embedded import APP_ROLE, EmbeddedPostgres, ProvisionedDatabase
from service_engine.impacts import Impact
from service_engine.impacts.transport import PgListenNotify, stage_in
from service_engine.integration import DeadLetter, DeadLetters, DeadLetterSource
from service_engine.metrics import Metrics
from service_engine.render import Query, Reset
from service_engine.render.runtime import RenderRuntime
from service_engine.render.windows import WindowSpec

from ..support.harness import engine_running, listener_running, wait_until
from ..support.sample_cards import Card, CardsView, Principal, RankQuery, write_card

ALICE = Principal("alice", frozenset({"acme"}))
FAST = {"beat_interval": timedelta(milliseconds=50), "lease": timedelta(seconds=1)}


def window() -> WindowSpec[Any]:
    return WindowSpec(Query(RankQuery(100)))


def running(db: Database, **config: Any) -> contextlib.AbstractAsyncContextManager[Engine]:
    return engine_running(EngineConfig(service="metrics", **{**FAST, **config}), db, CardsView())


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.sample(name, **labels) or 0.0


async def test_live_sessions_deltas_and_render_passes_move_with_a_session(db: Database) -> None:
    """An attach raises ``live_sessions{projector}``, its close lowers it;
    the attach's Reset and the write's Upsert are two deltas delivered; the
    write's render pass lands in the pass histogram; no reset is counted."""
    async with running(db) as engine:
        m = engine.metrics
        assert sample(m, "service_engine_live_sessions", projector="cards") == 0
        stream = await engine.attach(ALICE, "cards", window())
        assert sample(m, "service_engine_live_sessions", projector="cards") == 1
        assert isinstance(await asyncio.wait_for(stream.next(), 5), Reset)
        passes = sample(m, "service_engine_render_pass_duration_seconds_count")
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "one"))
        await asyncio.wait_for(stream.next(), 5)
        # The attach's Reset and the Upsert.
        await wait_until(
            lambda: sample(m, "service_engine_deltas_delivered_total", projector="cards") == 2,
            what="two deltas counted")
        assert sample(m, "service_engine_render_pass_duration_seconds_count") > passes
        assert sample(m, "service_engine_render_pass_duration_seconds_sum") > 0
        await stream.aclose()
        assert sample(m, "service_engine_live_sessions", projector="cards") == 0
        # An attach Reset is no reset of a live session.
        assert m.by_label("service_engine_resets_total", "cause") == {}


async def _backends(admin: asyncpg.Connection, database: str, query_like: str) -> list[int]:
    rows = await admin.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND usename = $2 AND query LIKE $3",
        database, APP_ROLE, query_like,
    )
    return [r["pid"] for r in rows]


async def test_dependency_up_for_the_listener_and_postgres_and_reconnect_resets(
    pg_server: EmbeddedPostgres, database: ProvisionedDatabase, db: Database
) -> None:
    """The LISTEN backend terminated while new connections are refused:
    ``dependency_up{listener}`` 0, postgres still 1; every backend gone:
    postgres 0 too; connections allowed again: both 1, and the live session
    was reset once for cause reconnect."""
    admin = await asyncpg.connect(pg_server.admin_url)
    try:
        async with running(db) as engine:
            m = engine.metrics

            def up(dependency: str) -> float | None:
                return m.sample("service_engine_dependency_up", dependency=dependency)

            await wait_until(lambda: up("listener") == 1 and up("postgres") == 1, what="both up")
            stream = await engine.attach(ALICE, "cards", window())
            await asyncio.wait_for(stream.next(), 5)

            await admin.execute(f'REVOKE CONNECT ON DATABASE "{database.name}" FROM "{APP_ROLE}"')
            for pid in await _backends(admin, database.name, "LISTEN%"):
                await admin.execute("SELECT pg_terminate_backend($1)", pid)
            await wait_until(lambda: up("listener") == 0, what="listener down")
            assert up("postgres") == 1
            assert not engine.readiness.is_up

            for pid in await _backends(admin, database.name, "%"):
                await admin.execute("SELECT pg_terminate_backend($1)", pid)
            await wait_until(lambda: up("postgres") == 0, what="postgres down")
            assert engine.readiness.holds("beat:postgres")

            await admin.execute(f'GRANT CONNECT ON DATABASE "{database.name}" TO "{APP_ROLE}"')
            await wait_until(lambda: up("listener") == 1 and up("postgres") == 1, timeout=20,
                             what="both up again")
            reset = await asyncio.wait_for(stream.next(), 10)
            assert isinstance(reset, Reset)
            await wait_until(
                lambda: sample(m, "service_engine_resets_total", projector="cards",
                               cause="reconnect") == 1, what="the reconnect reset counted")
            await wait_until(lambda: engine.readiness.is_up, timeout=20, what="UP again")
    finally:
        with contextlib.suppress(Exception):
            await admin.execute(f'GRANT CONNECT ON DATABASE "{database.name}" TO "{APP_ROLE}"')
        await admin.close()


async def test_the_notification_queue_usage_follows_a_stuck_listener(
    database: ProvisionedDatabase, db: Database
) -> None:
    """A backend that LISTENs inside an open transaction holds the queue's
    tail: usage climbs with the notifications behind it and falls once it
    lets go; the gauge follows."""
    async with running(db) as engine:
        m = engine.metrics
        await wait_until(lambda: m.sample("service_engine_listener_queue_usage") is not None,
                         what="usage gauged")
        assert sample(m, "service_engine_listener_queue_usage") == 0
        stuck = await asyncpg.connect(database.app_url)
        try:
            await stuck.execute("LISTEN h_metrics_stuck")
            await stuck.execute("BEGIN")
            await stuck.execute("SELECT 1")
            await db.pool.execute(
                "SELECT pg_notify('h_metrics_stuck', repeat('x', 4000) || i)"
                " FROM generate_series(1, 8000) AS i")
            await wait_until(lambda: sample(m, "service_engine_listener_queue_usage") > 0,
                             what="usage above 0")
            await stuck.execute("COMMIT")
        finally:
            await stuck.close()
        await wait_until(lambda: sample(m, "service_engine_listener_queue_usage") == 0,
                         what="usage back to 0")


async def test_dead_letters_waiting_follow_record_and_discard(db: Database) -> None:
    """``dead_letters_waiting{source}`` is gauged for every source, rises
    when a dead letter is recorded and falls when it is discarded."""
    async with running(db) as engine:
        m = engine.metrics

        def waiting(source: str) -> float | None:
            return m.sample("service_engine_dead_letters_waiting", source=source)

        await wait_until(lambda: waiting("Reaction") == 0 and waiting("Cron") == 0,
                         what="every source gauged at 0")
        letter = DeadLetter.for_work(DeadLetterSource.CRON, "nightly", reason="stuck")
        await DeadLetters(db).record_work(letter)
        await wait_until(lambda: waiting("Cron") == 1, what="one Cron dead letter waiting")
        assert waiting("Reaction") == 0
        await DeadLetters(db).discard(letter.id)
        await wait_until(lambda: waiting("Cron") == 0, what="none waiting")


@contextlib.asynccontextmanager
async def frames(db: Database, metrics: Metrics, **config: Any) -> AsyncIterator[
    tuple[PgListenNotify, RenderRuntime]
]:
    """A listener and a runtime the test drives pass by pass."""
    cfg = EngineConfig(**config)
    listener = PgListenNotify(db, cfg, ReadinessHandle(), metrics=metrics)
    runtime = RenderRuntime(db, cfg, listener.channel, metrics=metrics)
    runtime.registry.register_projector(CardsView())
    async with listener_running(listener):
        yield listener, runtime


async def test_resets_are_counted_by_cause_overflow_and_threshold(db: Database) -> None:
    """A commit dirtying more keys than the reset threshold counts one
    threshold reset; a listener channel overflow one overflow reset (not a
    reconnect); each pass lands in the histogram."""
    metrics = Metrics("metrics", "p1")
    try:
        async with frames(db, metrics, listener_channel_capacity=2, reset_threshold=2) as (
            listener, runtime
        ):
            stream = await runtime.registry.attach(ALICE, "cards", window())
            await asyncio.wait_for(stream.next(), 5)
            # Threshold: one commit dirtying more keys than the threshold.
            async with db.pool.acquire() as conn, conn.transaction():
                for i in range(3):
                    await conn.execute(
                        "INSERT INTO sample_card (id, org, rank) VALUES ($1, 'acme', $2)", f"c{i}", i)
                await stage_in(conn, [Impact.entity("card", f"c{i}") for i in range(3)])
            delivery = await asyncio.wait_for(listener.channel.get(), 10)
            await runtime.render_pass([delivery])
            assert isinstance(await asyncio.wait_for(stream.next(), 5), Reset)
            assert sample(metrics, "service_engine_resets_total", projector="cards",
                          cause="threshold") == 1
            # Overflow: nobody renders while commits pile up past the channel.
            async with db.pool.acquire() as conn:
                for i in range(6):
                    await write_card(conn, Card("c1", "acme", 1, f"v{i}"))
            await wait_until(lambda: listener.channel.overflows >= 1, what="overflow")
            deliveries = []
            while (item := listener.channel.get_nowait()) is not None:
                deliveries.append(item)
            await runtime.render_pass(deliveries)
            assert sample(metrics, "service_engine_resets_total", projector="cards",
                          cause="overflow") == 1
            assert sample(metrics, "service_engine_resets_total", projector="cards",
                          cause="reconnect") == 0
            assert sample(metrics, "service_engine_render_pass_duration_seconds_count") == 2
    finally:
        metrics.shutdown()
