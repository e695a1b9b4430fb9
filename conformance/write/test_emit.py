"""cx.emit / cx.command / cx.schedule_at in the pipeline contexts: staged
with the transaction (a rollback sends nothing), the actor the context
acts as, one correlation per transaction, the inbound message as
causation in a reaction, and a declared sequence refused without a
service."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service_engine import Database, EngineConfig, Timestamp, connect_pool
from service_engine.clock import SystemClock
from service_engine.embedded import ProvisionedDatabase
from service_engine.errors import SequenceWithoutService
from service_engine.messaging.envelope import (
    Actor,
    EventMetadata,
    Incoming,
    build_command,
    identify,
    publish_headers,
    service_identity,
)
from service_engine.messaging.reactions import ReactionDelivery
from service_engine.pipeline import Mutation, MutationExecutor, Reaction, Success
from service_engine.pipeline.reaction import Applied, run_reaction

from ..support.sample_orders import SERVICE, Fulfil, OrderPlaced, PlaceOrder

PERSON = uuid.uuid4()


@dataclass(frozen=True)
class Person:
    id: str
    actor: str
    kind: str = "person"


@dataclass(frozen=True)
class Anonymous:
    id: str


def executor(db: Database, **config: Any) -> MutationExecutor:
    return MutationExecutor(db, EngineConfig(**{"service": SERVICE, **config}))


async def outbox(db: Database) -> list[dict[str, Any]]:
    rows = await db.pool.fetch(
        """SELECT message_id, subject, payload::text AS payload, headers::text AS headers,
                  producer, seq_key, seq
             FROM service_engine.integration_outbox ORDER BY id"""
    )
    return [
        {**dict(r), "payload": json.loads(r["payload"]), "headers": json.loads(r["headers"])}
        for r in rows
    ]


async def scheduled(db: Database) -> list[dict[str, Any]]:
    rows = await db.pool.fetch(
        """SELECT message_id, subject, payload::text AS payload, due_at, producer, seq_key, seq
             FROM service_engine.scheduled_message ORDER BY id"""
    )
    return [{**dict(r), "payload": json.loads(r["payload"])} for r in rows]


async def test_a_mutation_emits_and_commands_as_its_principals_passport_actor(
    db: Database,
) -> None:
    """A mutation's emitted event, command and scheduled message carry its principal's
    passport actor and share one correlation id."""
    due = Timestamp.now() + timedelta(hours=1)

    async def place(cx: Mutation[Person]) -> None:
        cx.emit(OrderPlaced(order_id="o1", qty=2))
        cx.command(Fulfil(order_id="o1", version=4))
        cx.schedule_at(due, OrderPlaced(order_id="o1", qty=9))

    principal = Person("alice", str(PERSON))
    assert await executor(db).ack(principal, place) == Success()
    event, command = await outbox(db)
    [timer] = await scheduled(db)
    actor = {"kind": "person", "id": str(PERSON)}
    assert event["subject"] == "integration.evt.orders.order.placed"
    assert command["subject"] == "integration.cmd.warehouse.order.fulfil"
    for row in (event, command):
        assert row["payload"]["metadata"]["actor"] == actor
        assert row["payload"]["metadata"]["causation_id"] is None
    assert timer["payload"]["metadata"]["actor"] == actor
    correlations = {
        r["payload"]["metadata"]["correlation_id"] for r in (event, command, timer)
    }
    assert len(correlations) == 1, "one correlation per transaction"
    assert str(event["message_id"]) == event["payload"]["event_id"]
    assert str(command["message_id"]) == command["payload"]["command_id"]
    assert (command["producer"], command["seq_key"], command["seq"]) == (SERVICE, "o1", 4)
    assert (event["producer"], event["seq_key"], event["seq"]) == (None, None, None)
    assert timer["due_at"] == due.value
    assert timer["payload"]["occurred_at"].startswith(due.value.strftime("%Y-%m-%dT%H:%M:%S"))


async def test_a_principal_without_a_passport_actor_sends_as_the_service(db: Database) -> None:
    """A principal without a passport actor sends as the service's own actor."""
    async def place(cx: Mutation[Anonymous]) -> None:
        cx.emit(OrderPlaced(order_id="o1", qty=1))

    assert await executor(db).ack(Anonymous("bob"), place) == Success()
    [row] = await outbox(db)
    assert row["payload"]["metadata"]["actor"] == {
        "kind": "service", "id": str(service_identity(SERVICE)),
    }


async def test_a_rolled_back_mutation_sends_nothing(db: Database) -> None:
    """A mutation that fails after emitting and scheduling leaves no outbox row and no
    scheduled message."""
    async def place(cx: Mutation[Person]) -> None:
        cx.emit(OrderPlaced(order_id="o1", qty=1))
        cx.schedule_at(Timestamp.now(), OrderPlaced(order_id="o1", qty=1))
        raise RuntimeError("after the emit")

    with pytest.raises(RuntimeError):
        await executor(db).ack(Person("alice", str(PERSON)), place)
    assert await outbox(db) == [] and await scheduled(db) == []


async def test_a_declared_sequence_without_a_service_is_refused_at_emit(db: Database) -> None:
    """Refused where the handler sends it, before anything is staged."""
    sent: list[str] = []

    async def place(cx: Mutation[Person]) -> None:
        try:
            cx.command(Fulfil(order_id="o1"))
        except SequenceWithoutService:
            sent.append("refused")
            raise

    with pytest.raises(SequenceWithoutService):
        await MutationExecutor(db, EngineConfig()).ack(Person("alice", str(PERSON)), place)
    assert sent == ["refused"]
    assert await outbox(db) == []


async def test_a_reaction_sends_as_the_service_within_the_inbound_conversation(
    db: Database,
) -> None:
    """Run without NATS through the reaction entry point: the reaction's
    messages carry the service identity, the inbound correlation and the
    inbound envelope id as causation; its emitted messages are stored on the
    claim in the same transaction."""
    sender = EventMetadata.originating(Actor.person(PERSON))
    inbound = build_command(
        PlaceOrder(order_id="o1"), service="twin", metadata=sender,
        occurred_at=datetime.now(UTC),
    )
    incoming = identify(inbound.body_json().encode(), publish_headers(inbound.message_id))
    assert isinstance(incoming, Incoming)
    due = Timestamp.now() + timedelta(minutes=5)

    async def react(cx: Reaction[Any], command: PlaceOrder) -> None:
        assert cx.delivered == 1 and cx.actor == Actor.person(PERSON)
        cx.emit(OrderPlaced(order_id=command.order_id, qty=command.qty))
        cx.schedule_at(due, Fulfil(order_id=command.order_id))

    delivery = ReactionDelivery("place", incoming, inbound.subject, 1)
    outcome = await run_reaction(
        db, EngineConfig(service=SERVICE), delivery, PlaceOrder(order_id="o1"), react,
        clock=SystemClock(),
    )
    assert outcome == Applied(1)
    [event] = await outbox(db)
    [timer] = await scheduled(db)
    expected = {
        "actor": {"kind": "service", "id": str(service_identity(SERVICE))},
        "correlation_id": str(sender.correlation_id),
        "causation_id": str(inbound.message_id),
    }
    assert event["payload"]["metadata"] == expected
    assert timer["payload"]["metadata"] == expected
    stored = await db.pool.fetchval(
        "SELECT confirmations::text FROM service_engine.message_claim WHERE message_id = $1",
        inbound.message_id,
    )
    assert [m["message_id"] for m in json.loads(stored)] == [str(event["message_id"])]


async def test_a_reaction_resolves_its_principal_before_taking_its_connection(
    database: ProvisionedDatabase,
) -> None:
    """A principal resolver that reads the database (a principal fact) runs
    before the reaction's transaction takes its pool connection: more
    reactions at once than the pool holds all complete, none waiting for a
    second connection while holding one."""
    pool = await connect_pool(database.app_url, min_size=1, max_size=2)
    try:
        async def resolver(actor: Actor) -> object:
            await pool.fetch("SELECT 1")  # a fact load on the same pool
            return actor

        async def react(cx: Reaction[Any], command: PlaceOrder) -> None:
            assert cx.principal == Actor.person(PERSON)
            cx.emit(OrderPlaced(order_id=command.order_id, qty=command.qty))

        async def one(i: int) -> object:
            sender = EventMetadata.originating(Actor.person(PERSON))
            inbound = build_command(
                PlaceOrder(order_id=f"p{i}"), service="twin", metadata=sender,
                occurred_at=datetime.now(UTC),
            )
            incoming = identify(inbound.body_json().encode(), publish_headers(inbound.message_id))
            assert isinstance(incoming, Incoming)
            return await run_reaction(
                pool, EngineConfig(service=SERVICE),
                ReactionDelivery("place", incoming, inbound.subject, 1),
                PlaceOrder(order_id=f"p{i}"), react, clock=SystemClock(),
                resolve_principal=resolver,
            )

        running = asyncio.ensure_future(asyncio.gather(*(one(i) for i in range(6))))
        done, _ = await asyncio.wait({running}, timeout=30)
        if not done:
            running.cancel()
            pool.pool.terminate()  # the held connections would keep aclose waiting
            pytest.fail("reactions holding the pool's connections waited for more of them")
        assert running.result() == [Applied(1)] * 6
    finally:
        if not pool.pool.is_closing():
            await pool.aclose()
