"""What one inbound reaction sends to Postgres, statement by statement.

The driver's query logger on a one-connection pool captures every
statement of `ReactionRunner.handle` for the orders sample's
``place_order`` (claim, lock and load, two inserts, the confirmation on the
claim, one impact, one outbox row, commit). A message without a producer
sequence defers its claim to the handler's first statement; these tests
pin the round trips that saves and that a message claimed before still
replays whatever its handler does before (or instead of) touching the
database.
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from pydantic import BaseModel

from service_engine import Database, EngineConfig
from service_engine.inbound.declaration import InboundReaction
from service_engine.inbound.dispatch import InboundFrame, ReactionRunner
from service_engine.messaging.dead_letters import DeadLetters
from service_engine.messaging.envelope import (
    Actor,
    EventMetadata,
    OutboundCommand,
    OutboundEvent,
    build_command,
    build_event,
    publish_headers,
)
from service_engine.messaging.reactions import Ack, Nak, Park, Retry, Term
from service_engine.pipeline import Reaction

from ..support.harness import Statements
from ..support.sample_orders import (
    SERVICE,
    WAREHOUSE,
    Order,
    OrderShipped,
    PlaceOrder,
    on_warehouse_fact,
    place_order,
    record_effect,
)

APPLIED_ROUND_TRIPS = 5
"""place_order's round trips: BEGIN + lock bound + claim + first advisory
lock; the load pinning its row (SELECT cols ... FOR UPDATE); insert order;
the effect's advisory lock + insert effect; the confirmation, the impact
NOTIFY and the outbox row (values inlined) + COMMIT + the release reset.
(13 before the claim, the confirmation, the NOTIFY and the reset were
folded; 8 before the row lock rode with the load; 7 before the effect's
lock rode with its insert; 6 before the staged rows rode with COMMIT.)"""






def _frame(message: OutboundCommand | OutboundEvent, message_id: uuid.UUID | None = None,
           *, delivered: int = 1) -> InboundFrame:
    metadata = EventMetadata.originating(Actor.service("bench"))
    built = (
        build_command(cast(OutboundCommand, message), service="bench", metadata=metadata,
                      occurred_at=datetime.now(UTC), command_id=message_id)
        if hasattr(type(message), "VERB")
        else build_event(cast(OutboundEvent, message), service=WAREHOUSE, metadata=metadata,
                         occurred_at=datetime.now(UTC), event_id=message_id)
    )
    return InboundFrame(built.subject, built.body_json().encode(),
                        publish_headers(built.message_id, sequence=built.sequence), delivered)


def _runner(db: Database, reaction: Any) -> ReactionRunner:
    return ReactionRunner(reaction, db, EngineConfig(service=SERVICE), DeadLetters(db))


async def _effects(db: Database, message_id: uuid.UUID) -> int:
    count = await db.pool.fetchval(
        "SELECT count(*) FROM sample_order_effect WHERE message_id = $1", message_id
    )
    return int(count)


async def test_an_applied_reaction_takes_five_round_trips(
    logged: tuple[Database, Statements],
) -> None:
    """An applied place_order: the claim and the first advisory lock ride
    with BEGIN, the effect's advisory lock with its insert (the lock first),
    the confirmation, the impact's NOTIFY and the outbox insert (values
    inlined) and the pool's release reset with COMMIT; nothing is sent
    after it."""
    db, statements = logged
    runner = _runner(db, place_order("p"))
    assert await runner.handle(_frame(PlaceOrder(order_id="warm"))) == Ack("applied")
    statements.take()
    message_id = uuid.uuid4()
    assert await runner.handle(_frame(PlaceOrder(order_id="o1"), message_id)) == Ack("applied")
    sent = statements.take()
    assert len(sent) == APPLIED_ROUND_TRIPS, sent
    first = sent[0]
    assert first.startswith("BEGIN; SET LOCAL lock_timeout")
    assert "message_claim" in first and "pg_advisory_xact_lock" in first
    last = sent[-1]
    assert "integration_outbox" in last and "message_claim" in last and "pg_notify" in last
    assert last.index("integration_outbox") < last.index("; COMMIT; ") and "RESET ALL" in last
    assert sum("pg_advisory_xact_lock" in s for s in sent) == 2
    assert "sample_order" in sent[1] and sent[1].endswith("FOR UPDATE")  # lock + load
    assert sent[2].startswith('INSERT INTO "sample_order"')  # its lock rode with BEGIN
    effect = sent[3]
    assert effect.startswith("WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock($1))")
    assert 'INSERT INTO "sample_order_effect"' in effect and effect.endswith("FROM l")
    assert await _effects(db, message_id) == 1
    stored = await db.pool.fetchval(
        "SELECT jsonb_array_length(confirmations) FROM service_engine.message_claim "
        "WHERE message_id = $1", message_id,
    )
    assert stored == 1


async def test_a_redelivery_replays_without_taking_the_lock(
    logged: tuple[Database, Statements],
) -> None:
    """A message claimed before: the claim statement takes no advisory lock,
    the handler's work is discarded, the stored confirmation is staged again
    and the effect stays once."""
    db, statements = logged
    runner = _runner(db, place_order("p"))
    message_id = uuid.uuid4()
    frame = _frame(PlaceOrder(order_id="o2"), message_id)
    assert await runner.handle(frame) == Ack("applied")
    statements.take()
    assert await runner.handle(frame) == Ack("replayed")
    sent = statements.take()
    assert len(sent) == 3, sent
    assert "message_claim" in sent[0] and "pg_advisory_xact_lock" in sent[0]
    assert "confirmations" in sent[1] and "integration_outbox" in sent[2]
    assert sent[2].index("integration_outbox") < sent[2].index("; COMMIT; ")
    assert await _effects(db, message_id) == 1
    published = await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.integration_outbox"
        " WHERE payload->'payload'->>'order_id' = 'o2'"
    )
    assert published == 2  # the confirmation, then its replay


@pytest.mark.parametrize(
    ("early", "fresh"),
    [
        (Retry("not_yet"), Nak),
        (Park("later"), Nak),
        (RuntimeError("a bug before any statement"), Term),
    ],
    ids=["retry", "park", "handler-error"],
)
async def test_a_message_claimed_before_replays_whatever_its_handler_answers_first(
    logged: tuple[Database, Statements], early: Exception, fresh: type[object],
) -> None:
    """A handler that answers a disposition or fails before its first
    statement: a message claimed before still replays (as when the claim
    was taken ahead of the handler); a fresh one gets the handler's answer."""
    db, statements = logged
    message_id = uuid.uuid4()
    frame = _frame(PlaceOrder(order_id="o3"), message_id)
    assert await _runner(db, place_order("p")).handle(frame) == Ack("applied")

    async def answer_early(cx: Reaction[Any], command: BaseModel) -> None:
        raise early

    runner = _runner(db, place_order("p", before=answer_early))
    statements.take()
    assert await runner.handle(frame) == Ack("replayed")
    assert await _effects(db, message_id) == 1
    settled = await runner.handle(_frame(PlaceOrder(order_id="o4")))
    assert isinstance(settled, fresh)


async def test_a_handler_that_swallows_the_claim_still_replays(
    logged: tuple[Database, Statements],
) -> None:
    """A careless handler catching every exception around its first load
    cannot turn a message claimed before into a second effect."""
    db, _ = logged
    message_id = uuid.uuid4()
    frame = _frame(PlaceOrder(order_id="o5"), message_id)
    assert await _runner(db, place_order("p")).handle(frame) == Ack("applied")

    async def swallowing(cx: Reaction[Any], command: BaseModel) -> None:
        with contextlib.suppress(Exception):  # the carelessness under test
            await cx.load_optional(Order, "o5")
        with contextlib.suppress(Exception):
            await record_effect(cx, "place_order", "o5", "p")

    careless = InboundReaction.command(
        "place_order", aggregate="order", verb="place", payload=PlaceOrder, handler=swallowing,
    )
    assert await _runner(db, careless).handle(frame) == Ack("replayed")
    assert await _effects(db, message_id) == 1


async def test_a_sequenced_message_is_claimed_and_guarded_before_its_handler(
    logged: tuple[Database, Statements],
) -> None:
    """A message with a producer sequence: the claim rides with BEGIN, the
    guard follows, both before the handler's first statement; a stale one
    is a no-op."""
    db, statements = logged
    runner = _runner(db, on_warehouse_fact(OrderShipped, "on_shipped"))
    statements.take()
    assert await runner.handle(_frame(OrderShipped(order_id="o6", version=2))) == Ack("applied")
    sent = statements.take()
    assert sent[0].startswith("BEGIN; SET LOCAL lock_timeout") and "message_claim" in sent[0]
    assert "pg_advisory_xact_lock" not in sent[0]
    assert "sequence_guard" in sent[1]
    assert "pg_advisory_xact_lock" in sent[2]
    assert await runner.handle(_frame(OrderShipped(order_id="o6", version=1))) == Ack("stale")


async def test_a_reaction_that_creates_first_answers_its_claim_before_the_insert(
    logged: tuple[Database, Statements],
) -> None:
    """A handler whose first statement is a create: the claim and the
    create's advisory lock ride with BEGIN (its answer decides what runs),
    then the store's prepared insert, then COMMIT: the order written once;
    a redelivery replays and inserts nothing."""
    db, statements = logged

    async def create_first(cx: Reaction[Any], command: PlaceOrder) -> None:
        await cx.create(Order(command.order_id, command.item, command.qty))

    runner = _runner(db, InboundReaction.command(
        "create_first", aggregate="order", verb="place", payload=PlaceOrder, handler=create_first,
    ))
    frame = _frame(PlaceOrder(order_id="o7"))
    statements.take()
    assert await runner.handle(frame) == Ack("applied")
    first, insert, last = statements.take()
    assert "message_claim" in first and "pg_advisory_xact_lock" in first
    assert "sample_order" not in first
    assert insert.startswith('INSERT INTO "sample_order"') and "$1" in insert
    assert "COMMIT" in last and "sample_order" not in last
    assert await runner.handle(frame) == Ack("replayed")
    assert await db.pool.fetchval("SELECT count(*) FROM sample_order WHERE id = 'o7'") == 1
