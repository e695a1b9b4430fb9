"""The inbound loop against a real Postgres and a spawned nats-server per
test, one message at a time: s128 and the applied path, the poison budget,
early parking and release, the engine's authority over integrity violations,
lock timeouts, the sequence guard, a re-sent command's stored confirmation,
envelope-less frames and the reaction principal. Ownership across pods and
crashes is `test_inbound_ownership`; boot checks and supervision
`test_inbound_supervision`."""


import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from service_engine import Database
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.inbound.declaration import EVENT_STREAM, InboundReaction
from service_engine.messaging.dead_letters import DeadLetterSource
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    Actor,
    derive_dead_letter_id,
    service_identity,
)
from service_engine.messaging.reactions import Disposition, Park, Retry, Terminal
from service_engine.pipeline import Reaction

from ..support.harness import owner_connection, wait_until
from ..support.inbound_support import (
    CMD,
    DURABLE,
    PLACED,
    TWIN,
    claim_confirmations,
    confirmations_on_the_bus,
    consumer_state,
    count_is,
    dead_letter_rows,
    effects,
    fast_budget,
    fast_config,
    place_settled,
    pod,
    producer,
    recording,
    settled,
)
from ..support.sample_orders import (
    SERVICE,
    WAREHOUSE,
    Fulfil,
    OrderPacked,
    OrderShipped,
    PlaceOrder,
    Prerequisite,
    on_warehouse_fact,
    place_order,
)

# -- s128 and the applied path -------------------------------------------------------


async def test_s128_a_terminal_reaction_dead_letters_through_the_running_loop(
    db: Database, streams: EmbeddedNats
) -> None:
    """s128: a reaction answering Terminal is dead-lettered (source Reaction)
    and its frame terminated by the running inbound loop: one row, counted
    once, the handler run once, nothing applied."""
    calls: list[int] = []
    reaction = place_order("a", before=recording(calls, Terminal("order.refused", "no stock")))
    async with pod(db, streams, [reaction]) as running, producer(streams) as twin:
        sent = await twin.command(PlaceOrder(order_id="o1"))
        await wait_until(lambda: place_settled(streams), what="the frame settled")
        rows = await dead_letter_rows(db)
        assert len(rows) == 1
        letter = rows[0]
        assert letter["source"] == DeadLetterSource.REACTION.value
        assert letter["work"] == "place_order"
        assert letter["reason"] == "order.refused"
        assert letter["message_id"] == sent.envelope_id
        assert letter["id"] == derive_dead_letter_id("Reaction", "place_order", str(sent.envelope_id))
        assert (letter["attempts"], letter["occurrences"]) == (1, 1)
        assert letter["subject"] == "integration.cmd.orders.order.place"
        assert calls == [1]
        assert await effects(db) == []
        assert await claim_confirmations(db, sent.envelope_id, "place_order") is None
        assert running.engine.metrics.sample(
            "service_engine_dead_letters_total", source="Reaction"
        ) == 1
        assert running.readiness.is_up


async def test_a_command_commits_its_effect_and_confirms_with_the_inbound_metadata(
    db: Database, streams: EmbeddedNats
) -> None:
    """The effect, its claim (with the confirmation stored on it) and the
    confirmation commit together; the confirmation carries the engine's
    service identity as actor, the command's correlation, and the command's
    envelope id as causation."""
    async with pod(db, streams, [place_order("a")]), producer(streams) as twin:
        sent = await twin.command(PlaceOrder(order_id="o1", qty=3))
        await wait_until(lambda: place_settled(streams), what="the command settled")
        await wait_until(
            lambda: count_is(confirmations_on_the_bus(streams), 1), what="the confirmation"
        )
        [message] = await confirmations_on_the_bus(streams)
    body = json.loads(message.data)
    assert body["payload"] == {"order_id": "o1", "qty": 3}
    assert body["metadata"] == {
        "actor": {"kind": "service", "id": str(service_identity(SERVICE))},
        "correlation_id": str(sent.correlation_id),
        "causation_id": str(sent.envelope_id),
    }
    assert message.headers[HEADER_NATS_MSG_ID] == message.headers[HEADER_MESSAGE_ID]
    assert message.headers[HEADER_MESSAGE_ID] == body["event_id"]
    [stored] = await claim_confirmations(db, sent.envelope_id, "place_order")
    assert stored["message_id"] == body["event_id"] and stored["subject"] == PLACED
    assert [e["order_id"] for e in await effects(db)] == ["o1"]
    assert await db.pool.fetchval("SELECT qty FROM sample_order WHERE id = 'o1'") == 3


async def test_the_durable_is_created_with_the_frozen_contract(
    db: Database, streams: EmbeddedNats
) -> None:
    """Explicit ack, deliver-all, instant replay, the exact filter subject,
    unlimited max_deliver, ack_wait and max_ack_pending from the config."""
    config = fast_config(max_ack_pending=7)
    async with pod(db, streams, [place_order("a")], config=config):
        info = await consumer_state(streams.url, CMD, DURABLE)
    c = info.config
    assert c.durable_name == DURABLE
    policies = (c.ack_policy, c.deliver_policy, c.replay_policy)
    assert tuple(getattr(p, "value", p) for p in policies) == ("explicit", "all", "instant")
    assert c.filter_subject == "integration.cmd.orders.order.place"
    assert c.max_deliver == -1
    assert c.ack_wait == pytest.approx(config.ack_wait.total_seconds())
    assert c.max_ack_pending == 7



# -- dispositions and budgets -------------------------------------------------------


async def test_a_poison_message_is_dead_lettered_when_its_retry_budget_is_spent(
    db: Database, streams: EmbeddedNats
) -> None:
    """A handler that keeps answering Retry is nak'ed with backoff until the
    reaction's max_deliveries, then dead-lettered: never lost, never looping."""
    calls: list[int] = []
    reaction = place_order(
        "a", before=recording(calls, Retry("warehouse_down")),
        budget=fast_budget(max_deliveries=3),
    )
    async with pod(db, streams, [reaction]), producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="o1"))
        await wait_until(lambda: count_is(dead_letter_rows(db), 1), what="the dead letter")
        await wait_until(lambda: place_settled(streams), what="the frame terminated")
    [letter] = await dead_letter_rows(db)
    assert calls == [1, 2, 3]
    assert letter["reason"] == "retry_budget_spent" and letter["attempts"] == 3
    assert await effects(db) == []


async def test_an_early_message_is_parked_and_released_when_its_prerequisite_lands(
    db: Database, streams: EmbeddedNats
) -> None:
    """Park naks with the park delay: the message comes back and applies
    once what it waited for is there; nothing is dead-lettered."""
    calls: list[int] = []

    async def needs_prerequisite(cx: Reaction[Any], command: BaseModel) -> Disposition | None:
        calls.append(cx.delivered)
        assert isinstance(command, PlaceOrder)
        if await cx.load_optional(Prerequisite, command.order_id) is None:
            return Park("awaiting_prerequisite")
        return None

    reaction = place_order("a", before=needs_prerequisite, budget=fast_budget(max_deliveries=2))
    async with pod(db, streams, [reaction]), producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="o1"))
        await wait_until(lambda: len(calls) >= 2, what="the message parked and released once")
        assert await effects(db) == []
        await db.pool.execute("INSERT INTO sample_order_prerequisite VALUES ('o1')")
        await wait_until(lambda: count_is(effects(db), 1), what="the release")
        await wait_until(lambda: place_settled(streams), what="the frame acked")
    assert calls[-1] >= 3, "parking does not spend the retry budget"
    assert await dead_letter_rows(db) == []


async def test_a_message_parked_past_its_park_budget_is_dead_lettered(
    db: Database, streams: EmbeddedNats
) -> None:
    """A message parked past its park budget is dead-lettered (park_budget_spent)."""
    reaction = place_order(
        "a", before=recording([], Park("never")),
        budget=fast_budget(park_delay=timedelta(milliseconds=100), park_for=timedelta(seconds=1)),
    )
    async with pod(db, streams, [reaction]), producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="o1"))
        await wait_until(lambda: count_is(dead_letter_rows(db), 1), what="the dead letter")
    [letter] = await dead_letter_rows(db)
    assert letter["reason"] == "park_budget_spent"


async def test_a_handler_exception_is_rolled_back_dead_lettered_and_the_consumer_serves_on(
    db: Database, streams: EmbeddedNats
) -> None:
    """A handler exception rolls back the handler's writes, dead-letters the message after
    one attempt, and the consumer serves the next message with readiness UP."""
    async def buggy(cx: Reaction[Any], command: BaseModel) -> None:
        assert isinstance(command, PlaceOrder)
        await cx.create(Prerequisite(command.order_id))  # rolled back with the failure
        if command.order_id == "bad":
            raise RuntimeError("slice bug")

    async with pod(db, streams, [place_order("a", before=buggy)]) as running, \
            producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="bad"))
        await twin.command(PlaceOrder(order_id="good"))
        await wait_until(lambda: count_is(effects(db), 1), what="the good message")
        await wait_until(lambda: place_settled(streams), what="both frames settled")
        assert running.readiness.is_up
    [letter] = await dead_letter_rows(db)
    assert letter["reason"] == "handler_error" and "RuntimeError: slice bug" in letter["detail"]
    assert letter["attempts"] == 1
    assert [e["order_id"] for e in await effects(db)] == ["good"]
    assert await db.pool.fetchval("SELECT count(*) FROM sample_order_prerequisite") == 1


async def test_an_integrity_violation_is_terminal_on_the_engines_authority(
    db: Database, streams: EmbeddedNats
) -> None:
    """A CHECK violation (SQLSTATE class 23) the handler coarsely maps to
    Retry is still dead-lettered on its first delivery."""
    calls: list[int] = []
    async with pod(db, streams, [place_order("a", before=recording(calls))]), \
            producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="o1", qty=0))
        await wait_until(lambda: count_is(dead_letter_rows(db), 1), what="the dead letter")
        await wait_until(lambda: place_settled(streams), what="the frame terminated")
    [letter] = await dead_letter_rows(db)
    assert letter["reason"] == "integrity_violation" and "23514" in letter["detail"]
    assert calls == [1] and letter["attempts"] == 1


async def test_a_lock_timeout_naks_without_spending_the_retry_budget(
    db: Database, streams: EmbeddedNats
) -> None:
    """A reaction blocked past lock_timeout is retryable: it is nak'ed and
    redelivered (beyond max_deliveries) until the lock is free, then applied."""
    calls: list[int] = []
    await db.pool.execute("INSERT INTO sample_order VALUES ('o1', 'w', 1)")
    reaction = place_order("a", before=recording(calls), budget=fast_budget(max_deliveries=2))
    async with db.pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT * FROM sample_order WHERE id = 'o1' FOR UPDATE")
        async with pod(db, streams, [reaction]), producer(streams) as twin:
            sent = await twin.command(PlaceOrder(order_id="o1"))
            try:
                await wait_until(lambda: len(calls) >= 3, what="redeliveries past the budget")
            finally:
                await tx.rollback()
            await wait_until(lambda: place_settled(streams), what="the frame applied")
    assert await dead_letter_rows(db) == []
    assert await claim_confirmations(db, sent.envelope_id, "place_order") is not None


# -- the sequence guard and the claim ---------------------------------------------------


async def test_the_sequence_guard_drops_stale_messages_per_reaction(
    db: Database, streams: EmbeddedNats
) -> None:
    """A message at or below its (producer, reaction, seq_key) watermark is
    a no-op ack; two reactions on one producer's key keep independent
    watermarks."""
    shipped = on_warehouse_fact(OrderShipped, "on_shipped", "a")
    packed = on_warehouse_fact(OrderPacked, "on_packed", "a")

    async def all_settled() -> bool:
        return all([
            await settled(streams.url, EVENT_STREAM, f"{SERVICE}-on_shipped"),
            await settled(streams.url, EVENT_STREAM, f"{SERVICE}-on_packed"),
        ])

    async with pod(db, streams, [shipped, packed]), producer(streams) as wh:
        await wh.event(OrderShipped(order_id="o1", version=2), producer=WAREHOUSE)
        await wait_until(lambda: count_is(effects(db, "on_shipped"), 1), what="v2 applied")
        await wh.event(OrderShipped(order_id="o1", version=1), producer=WAREHOUSE)  # stale
        await wh.event(OrderShipped(order_id="o1", version=2), producer=WAREHOUSE)  # equal
        await wh.event(OrderPacked(order_id="o1", version=1), producer=WAREHOUSE)  # other reaction
        await wait_until(all_settled, what="every frame settled")
        await wh.event(OrderShipped(order_id="o1", version=3), producer=WAREHOUSE)
        await wait_until(lambda: count_is(effects(db, "on_shipped"), 2), what="v3 applied")
        await wait_until(all_settled, what="every frame settled")
    assert [e["seq"] for e in await effects(db, "on_shipped")] == [2, 3]
    assert [e["seq"] for e in await effects(db, "on_packed")] == [1]
    marks = await db.pool.fetch(
        "SELECT producer, reaction, seq_key, seq FROM service_engine.sequence_guard ORDER BY reaction"
    )
    assert [tuple(m) for m in marks] == [
        (WAREHOUSE, "on_packed", "o1", 1), (WAREHOUSE, "on_shipped", "o1", 3),
    ]
    assert await dead_letter_rows(db) == []


async def test_a_resent_command_reemits_its_stored_confirmation(
    db: Database, streams: EmbeddedNats
) -> None:
    """A command re-sent under a fresh Nats-Msg-Id (past the dedup window)
    but the same envelope id does not run the effect again: the stored
    confirmation is published again, same logical id, fresh dedup token."""
    command_id = uuid.uuid4()
    async with pod(db, streams, [place_order("a")]), producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="o1"), command_id=command_id)
        await wait_until(lambda: count_is(confirmations_on_the_bus(streams), 1), what="confirmed")
        await twin.command(
            PlaceOrder(order_id="o1"), command_id=command_id, nats_msg_id=str(uuid.uuid4())
        )
        await wait_until(lambda: count_is(confirmations_on_the_bus(streams), 2), what="replayed")
        first, again = await confirmations_on_the_bus(streams)
    assert len(await effects(db)) == 1
    assert again.data == first.data
    assert again.headers[HEADER_MESSAGE_ID] == first.headers[HEADER_MESSAGE_ID]
    assert again.headers[HEADER_NATS_MSG_ID] != first.headers[HEADER_NATS_MSG_ID]


async def test_a_foreign_producer_without_uuid_ids_is_claimed_on_the_envelope_id(
    db: Database, streams: EmbeddedNats
) -> None:
    """A non-uuid Nats-Msg-Id and no Br-Message-Id are tolerated: the frame
    is identified and claimed under its envelope id."""
    async with pod(db, streams, [place_order("a")]), producer(streams) as twin:
        sent = await twin.command(PlaceOrder(order_id="o1"))
        await twin.raw(
            "integration.cmd.orders.order.place", sent.body, {HEADER_NATS_MSG_ID: "fabric-42"}
        )
        await wait_until(lambda: place_settled(streams), what="both frames settled")
    assert len(await effects(db)) == 1
    assert await dead_letter_rows(db) == []


async def test_an_envelope_less_frame_is_one_dead_letter_across_redeliveries(
    db: Database, database: ProvisionedDatabase, streams: EmbeddedNats
) -> None:
    """A frame with no envelope is refused at identify. While its dead
    letter cannot be written (the table refuses the app role) the frame is
    nak'ed, not terminated; once it can, one row is written, whose id
    derives from the frame's Nats-Msg-Id, and the frame is terminated."""
    async with owner_connection(database) as owner:
        try:
            await owner.execute("REVOKE INSERT ON service_engine.dead_letter FROM service_engine_app")
            reaction = place_order("a", budget=fast_budget())
            async with pod(db, streams, [reaction]), producer(streams) as twin:
                await twin.raw(
                    "integration.cmd.orders.order.place", b"plain text, no envelope",
                    {HEADER_NATS_MSG_ID: "foreign-123"},
                )

                async def redelivered() -> bool:
                    info = await consumer_state(streams.url, CMD, DURABLE)
                    return bool(info.delivered.consumer_seq >= 3)

                await wait_until(redelivered, what="redeliveries while the write fails")
                assert await place_settled(streams) is False
                await owner.execute(
                    "GRANT INSERT ON service_engine.dead_letter TO service_engine_app"
                )
                await wait_until(lambda: count_is(dead_letter_rows(db), 1), what="the dead letter")
                await wait_until(lambda: place_settled(streams), what="the frame terminated")
        finally:
            await owner.execute("GRANT INSERT ON service_engine.dead_letter TO service_engine_app")
    [letter] = await dead_letter_rows(db)
    assert letter["reason"] == "no_envelope"
    assert letter["id"] == derive_dead_letter_id("Reaction", "place_order", "frame", "foreign-123")
    assert letter["occurrences"] == 1 and letter["attempts"] >= 3
    assert letter["message_id"] is None
    assert letter["headers"] == {HEADER_NATS_MSG_ID: "foreign-123"}


# -- the reaction principal --------------------------------------------------------------


async def test_the_sender_resolves_to_a_principal_or_the_message_is_terminal(
    db: Database, streams: EmbeddedNats
) -> None:
    """cx.principal is the registered resolver's answer for the sender's
    actor; with no answer it raises PrincipalUnresolved, which dead-letters
    the message like any terminal reaction error."""
    seen: list[Any] = []
    twin_id = service_identity(TWIN)

    async def resolve(actor: Actor) -> str | None:
        return "the twin" if actor.id == twin_id else None

    async def needs_sender(cx: Reaction[Any], _: BaseModel) -> None:
        seen.append((cx.try_principal, cx.actor.kind))
        seen.append(cx.principal)

    stranger = Actor.person(uuid.uuid4())
    async with pod(db, streams, [place_order("a", before=needs_sender)], principal=resolve), \
            producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="known"))
        await twin.command(PlaceOrder(order_id="unknown"), actor=stranger)
        await wait_until(lambda: count_is(dead_letter_rows(db), 1), what="the dead letter")
        await wait_until(lambda: place_settled(streams), what="both settled")
    assert [e["order_id"] for e in await effects(db)] == ["known"]
    [letter] = await dead_letter_rows(db)
    assert letter["reason"] == "principal_unresolved" and str(stranger.id) in letter["detail"]
    assert ("the twin", "service") in seen and (None, "person") in seen


async def test_a_sequence_without_a_service_is_a_terminal_violation(
    db: Database, streams: EmbeddedNats
) -> None:
    """A reaction of an engine with no service that sends a sequenced
    command is refused at cx.command and dead-lettered, never redelivered."""

    async def fulfil(cx: Reaction[Any], event: OrderShipped) -> None:
        cx.command(Fulfil(order_id=event.order_id, version=event.version))

    reaction = InboundReaction.event(
        "fulfil", producer=WAREHOUSE, aggregate="order", fact="shipped",
        payload=OrderShipped, handler=fulfil,
    )
    async with pod(db, streams, [reaction], config=fast_config(service=None)), \
            producer(streams) as wh:
        await wh.event(OrderShipped(order_id="o1", version=1), producer=WAREHOUSE)
        await wait_until(lambda: count_is(dead_letter_rows(db), 1), what="the dead letter")
        await wait_until(
            lambda: settled(streams.url, EVENT_STREAM, "fulfil"), what="the frame terminated"
        )
    [letter] = await dead_letter_rows(db)
    assert letter["reason"] == "sequence_without_service" and letter["attempts"] == 1
    assert await db.pool.fetchval("SELECT count(*) FROM service_engine.integration_outbox") == 0
