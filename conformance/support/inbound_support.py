"""What the inbound battery shares: a producer that publishes envelopes with
a raw client, engines run as pods, and reads of the effects, claims, dead
letters and durables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sized
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import StreamConfig
from pydantic import BaseModel

from service_engine import Database, Engine, EngineConfig, ReadinessHandle
from service_engine.embedded import INTEGRATION_STREAMS, EmbeddedNats
from service_engine.errors import WorkerStopped
from service_engine.inbound.declaration import EVENT_STREAM, InboundReaction
from service_engine.inbound.dispatch import InboundHook
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    Actor,
    EventMetadata,
    OutboundCommand,
    OutboundEvent,
    build_command,
    build_event,
    publish_headers,
)
from service_engine.messaging.nats import open_nats
from service_engine.messaging.reactions import Disposition, ReactionBudget
from service_engine.pipeline import Reaction
from service_engine.pipeline.reaction import ReactionPrincipal

from .harness import fast_engine_config, wait_until
from .nats_support import stream_messages
from .sample_orders import SERVICE, OrdersView

STREAM_MAX_AGE = timedelta(days=1)
"""What the battery declares its integration streams' max_age as (the
engine refuses to bind a stream that keeps messages forever)."""

TWIN = "twin"
"""The producer service the battery's commands come from."""


def fast_config(**overrides: Any) -> EngineConfig:
    """Small bounds, so redeliveries and restarts happen within a test."""
    return fast_engine_config(
        overrides.pop("service", SERVICE),
        **{"lock_timeout": timedelta(milliseconds=300), "nats_grace": timedelta(seconds=5),
           **overrides},
    )


def fast_budget(**overrides: Any) -> ReactionBudget:
    values: dict[str, Any] = {
        "max_deliveries": 3,
        "retry_backoff": timedelta(milliseconds=50),
        "retry_backoff_cap": timedelta(milliseconds=200),
        "park_delay": timedelta(milliseconds=300),
        "park_for": timedelta(minutes=5),
    }
    values.update(overrides)
    return ReactionBudget(**values)


async def declare_streams(url: str, max_age: timedelta | None = STREAM_MAX_AGE) -> None:
    """Redeclare both integration streams with ``max_age`` (None: unlimited)."""
    client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = client.jetstream()
        for name, subjects in INTEGRATION_STREAMS.items():
            config = StreamConfig(
                name=name, subjects=subjects,
                max_age=max_age.total_seconds() if max_age is not None else None,
            )
            try:
                await js.update_stream(config)
            except nats.js.errors.NotFoundError:
                await js.add_stream(config)
    finally:
        await client.close()


# -- the producer ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sent:
    envelope_id: uuid.UUID
    correlation_id: uuid.UUID
    headers: dict[str, str]
    body: bytes


class Producer:
    """Publishes envelopes the way another service's engine would."""

    def __init__(self, client: Client, actor: Actor | None = None) -> None:
        self.client = client
        self.js = client.jetstream()
        self.actor = actor or Actor.service(TWIN)

    async def command(
        self,
        payload: OutboundCommand,
        *,
        command_id: uuid.UUID | None = None,
        nats_msg_id: str | None = None,
        actor: Actor | None = None,
        correlation_id: uuid.UUID | None = None,
    ) -> Sent:
        """Publish ``payload`` as a command; ``nats_msg_id`` overrides the
        dedup token (a re-send past the dedup window)."""
        metadata = EventMetadata.originating(actor or self.actor, correlation_id)
        message = build_command(
            payload, service=TWIN, metadata=metadata, occurred_at=datetime.now(UTC),
            command_id=command_id,
        )
        return await self._publish(
            message.subject, message.body_json().encode(),
            publish_headers(nats_msg_id or message.message_id,
                            logical_id=message.message_id, sequence=message.sequence),
            message.message_id, metadata.correlation_id,
        )

    async def event(
        self, payload: OutboundEvent, *, producer: str, event_id: uuid.UUID | None = None
    ) -> Sent:
        metadata = EventMetadata.originating(Actor.service(producer))
        message = build_event(
            payload, service=producer, metadata=metadata, occurred_at=datetime.now(UTC),
            event_id=event_id,
        )
        return await self._publish(
            message.subject, message.body_json().encode(),
            publish_headers(message.message_id, sequence=message.sequence),
            message.message_id, metadata.correlation_id,
        )

    async def raw(self, subject: str, body: bytes, headers: Mapping[str, str]) -> None:
        await self.js.publish(subject, body, headers=dict(headers))

    async def _publish(
        self, subject: str, body: bytes, headers: dict[str, str], envelope_id: uuid.UUID,
        correlation_id: uuid.UUID,
    ) -> Sent:
        await self.js.publish(subject, body, headers=headers)
        return Sent(envelope_id, correlation_id, headers, body)


@contextlib.asynccontextmanager
async def producer(server: EmbeddedNats, actor: Actor | None = None) -> AsyncIterator[Producer]:
    client = await nats.connect(server.url, connect_timeout=5)
    try:
        yield Producer(client, actor)
    finally:
        await client.close()


# -- pods ------------------------------------------------------------------------------


@dataclass
class Pod:
    engine: Engine
    readiness: ReadinessHandle
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def pod(
    db: Database,
    server: EmbeddedNats,
    reactions: Iterable[InboundReaction[Any]],
    *,
    config: EngineConfig | None = None,
    principal: ReactionPrincipal | None = None,
    hook: InboundHook | None = None,
    wait_up: bool = True,
) -> AsyncIterator[Pod]:
    """One pod: its own NATS connection and engine over ``db``, running."""
    conn = await open_nats(
        server.url, publish_ack_timeout=timedelta(milliseconds=500), ping_interval=1
    )
    try:
        readiness = ReadinessHandle()
        engine = await Engine.boot(config or fast_config(), db, conn, readiness)
        engine.register_projector(OrdersView())
        for reaction in reactions:
            engine.register_reaction(reaction)
        if principal is not None:
            engine.register_reaction_principal(principal)
        engine.set_inbound_hook(hook)
        task = asyncio.create_task(engine.run())
        try:
            if wait_up:
                await wait_until(lambda: readiness.is_up or task.done(), what="the pod UP")
                if task.done():
                    task.result()
            yield Pod(engine, readiness, task)
        finally:
            engine.shutdown()
            with contextlib.suppress(WorkerStopped):
                await asyncio.wait_for(task, 15)
    finally:
        await conn.aclose()


# -- reads -----------------------------------------------------------------------------


async def effects(db: Database, reaction: str | None = None) -> list[dict[str, Any]]:
    rows = await db.pool.fetch(
        """SELECT reaction, order_id, message_id, seq, pod FROM sample_order_effect
            WHERE $1::text IS NULL OR reaction = $1 ORDER BY recorded_at, id""",
        reaction,
    )
    return [dict(r) for r in rows]


async def dead_letter_rows(db: Database) -> list[dict[str, Any]]:
    rows = await db.pool.fetch(
        """SELECT id, source, work, reason, detail, subject, message_id, attempts, occurrences,
                  headers::text AS headers
             FROM service_engine.dead_letter ORDER BY recorded_at, id"""
    )
    out = []
    for r in rows:
        row = dict(r)
        row["headers"] = json.loads(row["headers"])
        out.append(row)
    return out


async def claim_confirmations(db: Database, message_id: uuid.UUID, reaction: str) -> Any:
    text = await db.pool.fetchval(
        """SELECT confirmations::text FROM service_engine.message_claim
            WHERE message_id = $1 AND reaction = $2""",
        message_id, reaction,
    )
    return None if text is None else json.loads(text)


async def consumer_state(url: str, stream: str, durable: str) -> Any:
    client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        return await client.jetstream().consumer_info(stream, durable)
    finally:
        await client.close()


async def settled(url: str, stream: str, durable: str) -> bool:
    """Every frame of the durable was settled (nothing pending, nothing in hand)."""
    info = await consumer_state(url, stream, durable)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


def headers_of(stored: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (stored or {}).items()}


__all__ = [
    "HEADER_MESSAGE_ID",
    "HEADER_NATS_MSG_ID",
    "STREAM_MAX_AGE",
    "TWIN",
    "Pod",
    "Producer",
    "Sent",
    "claim_confirmations",
    "consumer_state",
    "dead_letter_rows",
    "declare_streams",
    "effects",
    "fast_budget",
    "fast_config",
    "headers_of",
    "pod",
    "producer",
    "settled",
]


CMD = "INTEGRATION_CMD"
DURABLE = f"{SERVICE}-place_order"
"""The sample's ``place_order`` durable on `CMD`."""
PLACED = "integration.evt.orders.order.placed"


async def place_settled(server: EmbeddedNats, durable: str = DURABLE) -> bool:
    """Every ``place_order`` frame on `CMD` acknowledged (none pending or in hand)."""
    return await settled(server.url, CMD, durable)


async def confirmations_on_the_bus(server: EmbeddedNats) -> list[Any]:
    """The ``order.placed`` confirmations stored in the event stream."""
    return [m for m in await stream_messages(server.url, EVENT_STREAM) if m.subject == PLACED]


def recording(calls: list[int], answer: Disposition | None = None) -> Any:
    """A ``before`` hook recording each delivery's count and answering ``answer``."""

    async def before(cx: Reaction[Any], _: BaseModel) -> Disposition | None:
        calls.append(cx.delivered)
        return answer

    return before


async def count_is(rows: Awaitable[Sized], n: int) -> bool:
    """Whether the awaited ``rows`` number ``n`` (a `wait_until` condition)."""
    return len(await rows) == n


async def consumer_names(url: str, stream: str) -> list[str]:
    """The names of ``stream``'s consumers, sorted."""
    client = await nats.connect(url)
    try:
        return sorted(c.name for c in await client.jetstream().consumers_info(stream))
    finally:
        await client.close()
