"""The inbound loop against a real Postgres and a spawned nats-server per
test: s128, shared-consumer ownership across two pods, ack-after-durable
with a crash on either side of the commit, the poison budget, early parking
and release, the sequence guard, a re-sent command's stored confirmation,
envelope-less frames, the reaction principal, the engine's authority over
integrity violations, supervision and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats
import nats.js.errors
import pytest
from pydantic import BaseModel

from service_engine import Database, Engine, ReadinessHandle
from service_engine.db.errors import DatabaseError
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.integration.outbox import MessageRetentionTooShort
from service_engine.messaging.dead_letters import DeadLetterSource
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    Actor,
    derive_dead_letter_id,
    service_identity,
)
from service_engine.messaging.nats import StreamMissing, open_nats
from service_engine.messaging.reactions import Disposition, Park, Retry, Terminal
from service_engine.pipeline import Reaction
from service_engine.pipeline.inbound import EVENT_STREAM, InboundReaction
from service_engine.readiness import REASON_INBOUND_STOPPED

from .harness import assert_never, assert_nothing, owner_connection, wait_until
from .inbound_support import (
    TWIN,
    claim_confirmations,
    consumer_state,
    dead_letter_rows,
    declare_streams,
    effects,
    fast_budget,
    fast_config,
    pod,
    producer,
    settled,
)
from .nats_support import stream_messages
from .sample_orders import (
    SERVICE,
    WAREHOUSE,
    Fulfil,
    Order,
    OrderPacked,
    OrderShipped,
    PlaceOrder,
    Prerequisite,
    on_warehouse_fact,
    place_order,
)

CMD = "INTEGRATION_CMD"
DURABLE = f"{SERVICE}-place_order"
PLACED = "integration.evt.orders.order.placed"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
async def streams(nats_server: EmbeddedNats) -> EmbeddedNats:
    """The per-test nats-server with both integration streams declared with
    a bounded max_age, as the engine requires to bind them."""
    await declare_streams(nats_server.url)
    return nats_server


async def place_settled(server: EmbeddedNats, durable: str = DURABLE) -> bool:
    return await settled(server.url, CMD, durable)


async def effect_count(db: Database, reaction: str | None = None) -> int:
    return len(await effects(db, reaction))


async def confirmations_on_the_bus(server: EmbeddedNats) -> list[Any]:
    return [m for m in await stream_messages(server.url, EVENT_STREAM) if m.subject == PLACED]


def recording(calls: list[int], answer: Disposition | None = None) -> Any:
    async def before(cx: Reaction[Any], _: BaseModel) -> Disposition | None:
        calls.append(cx.delivered)
        return answer

    return before


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
            lambda: _count(confirmations_on_the_bus(streams), 1), what="the confirmation"
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


# -- ownership across pods and crashes -------------------------------------------------


async def test_two_pods_share_one_durable_and_each_message_is_handled_once(
    db: Database, streams: EmbeddedNats
) -> None:
    """Two engines over one store bind the same durable: every message is
    handled by exactly one pod, and both pods take work."""
    started: set[str] = set()
    both = asyncio.Event()

    def held_until_both_pods_work(pod_name: str) -> Any:
        async def before(cx: Reaction[Any], _: BaseModel) -> None:
            # Each pod holds its first frames until the other pod has taken
            # one: a pod that never gets work fails the bounded wait.
            started.add(pod_name)
            if len(started) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), 10)

        return before

    n = 40
    a = place_order("a", before=held_until_both_pods_work("a"), concurrency=2)
    b = place_order("b", before=held_until_both_pods_work("b"), concurrency=2)
    async with pod(db, streams, [a]), pod(db, streams, [b]), producer(streams) as twin:
        for i in range(n):
            await twin.command(PlaceOrder(order_id=f"o{i}"))
        await wait_until(lambda: _count(effects(db), n), timeout=30, what="every effect")
        await wait_until(lambda: place_settled(streams), what="every frame settled")
        rows = await effects(db)
        consumers = await _consumer_names(streams.url, CMD)
    assert sorted(r["order_id"] for r in rows) == sorted(f"o{i}" for i in range(n))
    assert {r["pod"] for r in rows} == {"a", "b"}
    assert consumers == [DURABLE]


async def _spawn_pod(
    database: ProvisionedDatabase, server: EmbeddedNats, name: str, kill_at: str,
    log: Path,
) -> asyncio.subprocess.Process:
    err = await asyncio.to_thread(log.open, "ab")
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "conformance.inbound_pod", database.app_url, server.url,
            name, kill_at, "2", cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=err,
        )
    finally:
        err.close()
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    assert line == b"ready\n", f"the pod did not start: {line!r} (see {log})"
    return process


@contextlib.asynccontextmanager
async def crashing_pod(
    database: ProvisionedDatabase, server: EmbeddedNats, kill_at: str, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await _spawn_pod(database, server, "crashed", kill_at, log)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_a_crash_after_the_commit_before_the_ack_lands_the_effect_once(
    db: Database, database: ProvisionedDatabase, streams: EmbeddedNats, tmp_path: Path
) -> None:
    """Ack-after-durable: the handling process is SIGKILLed between the
    commit and the ack. The frame is redelivered to another pod, whose claim
    makes it a no-op that re-emits the stored confirmation: the effect
    landed exactly once."""
    async with crashing_pod(database, streams, "committed", tmp_path / "pod.log") as crashed:
        async with producer(streams) as twin:
            sent = await twin.command(PlaceOrder(order_id="o1"))
        assert await asyncio.wait_for(crashed.wait(), 30) == -signal.SIGKILL
    assert [e["pod"] for e in await effects(db)] == ["crashed"]
    [stored] = await claim_confirmations(db, sent.envelope_id, "place_order")
    assert not await place_settled(streams), "the frame was acked before the crash"

    async with pod(db, streams, [place_order("survivor")]):
        await wait_until(lambda: place_settled(streams), timeout=20, what="the redelivery")
        rows = await db.pool.fetch(
            """SELECT message_id, headers::text AS headers FROM service_engine.integration_outbox
                WHERE subject = $1 ORDER BY id""",
            PLACED,
        )
    assert [e["pod"] for e in await effects(db)] == ["crashed"]
    # The original confirmation and its replay: one logical message, two
    # dedup tokens.
    assert len(rows) == 2
    assert str(rows[0]["message_id"]) == stored["message_id"]
    assert json.loads(rows[1]["headers"]) == {HEADER_MESSAGE_ID: stored["message_id"]}
    assert rows[1]["message_id"] != rows[0]["message_id"]


async def test_a_crash_before_the_commit_runs_the_effect_once_on_redelivery(
    db: Database, database: ProvisionedDatabase, streams: EmbeddedNats, tmp_path: Path
) -> None:
    """Killed with the effect written but not committed, the pod leaves
    nothing behind: no effect, no claim; the redelivery applies it once."""
    async with crashing_pod(database, streams, "before_commit", tmp_path / "pod.log") as crashed:
        async with producer(streams) as twin:
            sent = await twin.command(PlaceOrder(order_id="o1"))
        assert await asyncio.wait_for(crashed.wait(), 30) == -signal.SIGKILL
    assert await effects(db) == []
    assert await claim_confirmations(db, sent.envelope_id, "place_order") is None

    async with pod(db, streams, [place_order("survivor")]):
        await wait_until(lambda: place_settled(streams), timeout=20, what="the redelivery")
    assert [e["pod"] for e in await effects(db)] == ["survivor"]
    assert await claim_confirmations(db, sent.envelope_id, "place_order") is not None


async def test_shutdown_naks_the_frames_in_hand_so_another_pod_takes_them_at_once(
    db: Database, streams: EmbeddedNats
) -> None:
    """A pod shutting down mid-frame rolls the frame back and naks it: a
    live pod handles it long before ack_wait (30 s here) would redeliver it."""
    config = fast_config(ack_wait=timedelta(seconds=30))
    started = asyncio.Event()

    async def hang(cx: Reaction[Any], _: BaseModel) -> None:
        started.set()
        await asyncio.Event().wait()

    async with producer(streams) as twin:
        async with pod(db, streams, [place_order("a", before=hang)], config=config):
            await twin.command(PlaceOrder(order_id="o1"))
            await asyncio.wait_for(started.wait(), 10)
        assert await effects(db) == []
        async with pod(db, streams, [place_order("b")], config=config):
            await wait_until(lambda: _count(effects(db), 1), timeout=10, what="the handover")
    assert [e["pod"] for e in await effects(db)] == ["b"]


async def test_a_handler_slower_than_ack_wait_keeps_its_frame(
    db: Database, streams: EmbeddedNats
) -> None:
    """A frame in hand is reported in progress, so JetStream does not hand
    it to the other pod while a slow handler (1.5 x ack_wait) works on it."""
    calls: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    release = asyncio.Event()
    ack_wait = fast_config().ack_wait.total_seconds()

    def slow(pod_name: str) -> Any:
        async def before(cx: Reaction[Any], _: BaseModel) -> None:
            calls.put_nowait((pod_name, cx.delivered))
            await asyncio.wait_for(release.wait(), 30)

        return before

    a, b = place_order("a", before=slow("a")), place_order("b", before=slow("b"))
    async with pod(db, streams, [a]), pod(db, streams, [b]), producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="o1"))
        _, delivered = await asyncio.wait_for(calls.get(), 10)
        assert delivered == 1
        # The frame stays in hand past ack_wait: nobody is handed it again.
        await assert_nothing(calls, within=1.5 * ack_wait)
        release.set()
        await wait_until(lambda: _count(effects(db), 1), what="the slow effect")
        await wait_until(lambda: place_settled(streams), what="the frame acked")
        info = await consumer_state(streams.url, CMD, DURABLE)
    assert calls.empty()
    assert info.delivered.consumer_seq == 1, "the frame was redelivered while in hand"


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
        await wait_until(lambda: _count(dead_letter_rows(db), 1), what="the dead letter")
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
        await wait_until(lambda: _count(effects(db), 1), what="the release")
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
        await wait_until(lambda: _count(dead_letter_rows(db), 1), what="the dead letter")
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
        await wait_until(lambda: _count(effects(db), 1), what="the good message")
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
        await wait_until(lambda: _count(dead_letter_rows(db), 1), what="the dead letter")
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
        await wait_until(lambda: _count(effects(db, "on_shipped"), 1), what="v2 applied")
        await wh.event(OrderShipped(order_id="o1", version=1), producer=WAREHOUSE)  # stale
        await wh.event(OrderShipped(order_id="o1", version=2), producer=WAREHOUSE)  # equal
        await wh.event(OrderPacked(order_id="o1", version=1), producer=WAREHOUSE)  # other reaction
        await wait_until(all_settled, what="every frame settled")
        await wh.event(OrderShipped(order_id="o1", version=3), producer=WAREHOUSE)
        await wait_until(lambda: _count(effects(db, "on_shipped"), 2), what="v3 applied")
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
        await wait_until(lambda: _count(confirmations_on_the_bus(streams), 1), what="confirmed")
        await twin.command(
            PlaceOrder(order_id="o1"), command_id=command_id, nats_msg_id=str(uuid.uuid4())
        )
        await wait_until(lambda: _count(confirmations_on_the_bus(streams), 2), what="replayed")
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
                await wait_until(lambda: _count(dead_letter_rows(db), 1), what="the dead letter")
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
        await wait_until(lambda: _count(dead_letter_rows(db), 1), what="the dead letter")
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
        await wait_until(lambda: _count(dead_letter_rows(db), 1), what="the dead letter")
        await wait_until(
            lambda: settled(streams.url, EVENT_STREAM, "fulfil"), what="the frame terminated"
        )
    [letter] = await dead_letter_rows(db)
    assert letter["reason"] == "sequence_without_service" and letter["attempts"] == 1
    assert await db.pool.fetchval("SELECT count(*) FROM service_engine.integration_outbox") == 0


# -- boot checks and supervision ------------------------------------------------------


async def _run_refused(db: Database, server: EmbeddedNats, expected: type[Exception]) -> str:
    conn = await open_nats(server.url, ping_interval=1)
    try:
        readiness = ReadinessHandle()
        engine = await Engine.boot(fast_config(), db, conn, readiness)
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
        await wait_until(lambda: _count(effects(db), 1), what="the consumer serving again")


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
            await wait_until(lambda: _count(effects(db), 1), timeout=15, what="served again")
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


# -- helpers ---------------------------------------------------------------------------


async def _count(rows: Any, n: int) -> bool:
    return len(await rows) == n


async def _consumer_names(url: str, stream: str) -> list[str]:
    client = await nats.connect(url)
    try:
        return sorted(c.name for c in await client.jetstream().consumers_info(stream))
    finally:
        await client.close()


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

    dispatch = "service_engine.integration.dispatch"
    await db.pool.execute("INSERT INTO sample_order VALUES ('locked', 'w', 1)")
    reaction = place_order("a", before=load_first, budget=fast_budget(max_deliveries=2))
    with caplog.at_level(logging.INFO, logger=dispatch):
        async with pod(db, streams, [reaction]), producer(streams) as twin:
            bad = await twin.command(PlaceOrder(order_id="bad", qty=0))
            await wait_until(lambda: _count(dead_letter_rows(db), 1), what="the dead letter")

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
