"""The inbound loop's boot checks and supervision, against a real Postgres
and a spawned nats-server per test: a stream that outlives the message
retention or is absent refuses the run, a consumer whose stream vanishes
restarts with backoff and lowers readiness, the consumer serves again after
a NATS restart, registration refuses duplicates, and a reaction's database
fault is logged with its chain."""


import asyncio
import logging
from datetime import timedelta
from typing import Any

import asyncpg
import nats
import nats.js.errors
import pytest
from pydantic import BaseModel

from service_engine import Database, Engine, ReadinessHandle
from service_engine.db.errors import DatabaseError
from service_engine.embedded import EmbeddedNats
from service_engine.inbound.declaration import EVENT_STREAM
from service_engine.messaging.nats import StreamMissing, open_nats
from service_engine.messaging.reactions import Disposition
from service_engine.outbox.relay import MessageRetentionTooShort
from service_engine.pipeline import Reaction
from service_engine.readiness import REASON_INBOUND_STOPPED

from ..support.harness import assert_never, wait_until
from ..support.inbound_support import (
    claim_confirmations,
    count_is,
    dead_letter_rows,
    declare_streams,
    effects,
    fast_budget,
    fast_config,
    place_settled,
    pod,
    producer,
)
from ..support.sample_orders import (
    WAREHOUSE,
    Order,
    OrderShipped,
    OrdersView,
    PlaceOrder,
    on_warehouse_fact,
    place_order,
)


async def _run_refused(db: Database, server: EmbeddedNats, expected: type[Exception]) -> str:
    conn = await open_nats(server.url, ping_interval=1)
    try:
        readiness = ReadinessHandle()
        engine = await Engine.boot(fast_config(), db, conn, readiness)
        engine.register_projector(OrdersView())
        engine.register_reaction(place_order("a"))
        engine.register_reaction(on_warehouse_fact(OrderShipped, "on_shipped"))
        with pytest.raises(expected) as refused:
            await asyncio.wait_for(engine.run(), 10)
        assert readiness.holds("inbound_boot")
        return str(refused.value)
    finally:
        await conn.aclose()


async def test_run_refuses_a_stream_that_outlives_the_message_retention(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A claim must outlive every redelivery of its message: a stream kept
    forever, or longer than message_retention, is refused at run."""
    await declare_streams(nats_server.url, max_age=None)
    message = await _run_refused(db, nats_server, MessageRetentionTooShort)
    assert "INTEGRATION_CMD" in message and "INTEGRATION_EVT" in message
    await declare_streams(nats_server.url, max_age=timedelta(days=30))
    assert "below stream" in await _run_refused(db, nats_server, MessageRetentionTooShort)


async def test_run_fails_loud_on_an_absent_stream_and_never_creates_it(
    db: Database, streams: EmbeddedNats
) -> None:
    """run() fails loud (StreamMissing) on an absent stream and never creates it."""
    client = await nats.connect(streams.url)
    try:
        await client.jetstream().delete_stream(EVENT_STREAM)
        message = await _run_refused(db, streams, StreamMissing)
        assert EVENT_STREAM in message
        with pytest.raises(nats.js.errors.NotFoundError):
            await client.jetstream().stream_info(EVENT_STREAM)
    finally:
        await client.close()


async def test_a_consumer_whose_stream_vanishes_restarts_with_backoff_and_lowers_readiness(
    db: Database, streams: EmbeddedNats
) -> None:
    """The supervisor restarts a lost consumer with a bounded backoff (no hot
    spin) and, past the consecutive-failure threshold, holds the pod DOWN
    (inbound_stopped, dependency_up{inbound}=0); once the stream is back the
    consumer binds again, serves, and the pod is UP."""
    reaction = on_warehouse_fact(OrderShipped, "on_shipped", "a")
    config = fast_config(inbound_failure_threshold=3)
    async with pod(db, streams, [reaction], config=config) as running, \
            producer(streams) as wh:
        supervisor = running.engine.integration.inbound["on_shipped"]
        metrics = running.engine.metrics
        assert metrics.sample("service_engine_dependency_up", dependency="inbound") == 1
        client = await nats.connect(streams.url)
        try:
            await client.jetstream().delete_stream(EVENT_STREAM)
            await wait_until(
                lambda: running.readiness.holds(REASON_INBOUND_STOPPED), what="DOWN"
            )
            assert supervisor.failures >= 3
            assert metrics.sample("service_engine_dependency_up", dependency="inbound") == 0
            restarts = supervisor.restarts
            await assert_never(  # the backoff is capped at 200 ms: a handful, not a spin
                lambda: supervisor.restarts - restarts > 5, within=0.5, what="a restart spin"
            )
            await declare_streams(streams.url)
            await wait_until(lambda: running.readiness.is_up, what="UP again")
        finally:
            await client.close()
        assert metrics.sample("service_engine_dependency_up", dependency="inbound") == 1
        await wh.event(OrderShipped(order_id="o1", version=1), producer=WAREHOUSE)
        await wait_until(lambda: count_is(effects(db), 1), what="the consumer serving again")


async def test_the_consumer_serves_again_after_a_nats_restart(
    db: Database, streams: EmbeddedNats
) -> None:
    """A broker restart loses the open pull request; the loop asks again
    and the same durable serves what was published after the restart."""
    async with pod(db, streams, [place_order("a")]) as running:
        supervisor = running.engine.integration.inbound["place_order"]
        await asyncio.to_thread(streams.stop)
        await asyncio.to_thread(streams.start)
        async with producer(streams) as twin:
            await twin.command(PlaceOrder(order_id="o1"))
            await wait_until(lambda: count_is(effects(db), 1), timeout=15, what="served again")
        await wait_until(lambda: place_settled(streams), what="the frame acked")
        assert not running.readiness.holds(REASON_INBOUND_STOPPED)
        assert supervisor.failures < 3


async def test_registration_refuses_duplicates_and_a_second_principal_resolver(
    db: Database, streams: EmbeddedNats
) -> None:
    """Registering a reaction twice, or a second reaction principal resolver, is refused
    with DuplicateRegistration."""
    from service_engine.errors import DuplicateRegistration

    conn = await open_nats(streams.url)
    try:
        engine = await Engine.boot(fast_config(), db, conn, ReadinessHandle())
        engine.register_reaction(place_order("a"))
        with pytest.raises(DuplicateRegistration, match="place_order"):
            engine.register_reaction(place_order("b"))
        engine.register_reaction_principal(lambda actor: None)
        with pytest.raises(DuplicateRegistration):
            engine.register_reaction_principal(lambda actor: None)
    finally:
        await conn.aclose()



async def test_reaction_database_fault_is_logged_with_its_chain(
    db: Database, streams: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """A reaction's database fault is logged by the running inbound loop with
    its whole exception chain (the engine's typed `DatabaseError` and the
    driver's error as its cause): a terminal one (a CHECK violation) at
    error, once, as its frame is dead-lettered; a retryable one (a lock
    timeout) at warn on each nak'ed delivery, never at error, until the
    lock is free and the message applies."""

    async def load_first(cx: Reaction[Any], command: BaseModel) -> Disposition | None:
        # Outside the sample's own try: a fault here reaches the engine raw.
        assert isinstance(command, PlaceOrder)
        await cx.load_optional(Order, command.order_id)
        return None

    dispatch = "service_engine.inbound.dispatch"
    await db.pool.execute("INSERT INTO sample_order VALUES ('locked', 'w', 1)")
    reaction = place_order("a", before=load_first, budget=fast_budget(max_deliveries=2))
    with caplog.at_level(logging.INFO, logger=dispatch):
        async with pod(db, streams, [reaction]), producer(streams) as twin:
            bad = await twin.command(PlaceOrder(order_id="bad", qty=0))
            await wait_until(lambda: count_is(dead_letter_rows(db), 1), what="the dead letter")

            def faults(level: int, message: str) -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.name == dispatch and r.levelno == level
                        and message in r.getMessage()]

            [terminal] = faults(logging.ERROR, "is terminal")
            assert str(bad.envelope_id) in terminal.getMessage()
            _assert_chain(terminal, asyncpg.CheckViolationError, retryable=False)

            async with db.pool.acquire() as holder:
                tx = holder.transaction()
                await tx.start()
                await holder.execute("SELECT * FROM sample_order WHERE id = 'locked' FOR UPDATE")
                sent = await twin.command(PlaceOrder(order_id="locked"))
                try:
                    await wait_until(lambda: len(faults(logging.WARNING, str(sent.envelope_id))) >= 3,
                                     what="three deliveries nak'ed on the lock")
                finally:
                    await tx.rollback()
            await wait_until(lambda: place_settled(streams), what="the frame applied")
            for retried in faults(logging.WARNING, str(sent.envelope_id)):
                assert "not applied" in retried.getMessage()
                _assert_chain(retried, asyncpg.LockNotAvailableError, retryable=True)
            assert faults(logging.ERROR, str(sent.envelope_id)) == []
    assert len(await dead_letter_rows(db)) == 1
    assert await claim_confirmations(db, sent.envelope_id, "place_order") is not None


def _assert_chain(record: logging.LogRecord, driver_error: type[Exception], *, retryable: bool) -> None:
    """``record`` carries the engine's `DatabaseError` with the driver's
    error as its cause, and the formatted log line shows both."""
    assert record.exc_info is not None, record.getMessage()
    error = record.exc_info[1]
    assert isinstance(error, DatabaseError) and error.retryable is retryable, error
    assert isinstance(error.__cause__, driver_error), error.__cause__
    formatted = logging.Formatter().format(record)
    assert type(error).__name__ in formatted and driver_error.__name__ in formatted
    assert "The above exception was the direct cause" in formatted
