"""Durable by default: the provisioned nats-server (``jetstream { sync_interval:
always }``) keeps every publish it acknowledged through a SIGKILL, so the
outbox's PUBLISHED mark (set on that ack) never names a message the stream
lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from service_engine import Database
from service_engine.beat.leader import LeaderLease
from service_engine.embedded import EmbeddedNats, provision_streams
from service_engine.messaging.dead_letters import DeadLetters
from service_engine.messaging.envelope import HEADER_NATS_MSG_ID
from service_engine.metrics import Metrics
from service_engine.outbox.relay import OUTBOX_SLOT, OutboxBounds, OutboxRelay

from ..support.harness import wait_until
from ..support.nats_support import engine_nats, stream_messages

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

SUBJECT = "integration.evt.cards.card.created"
BURST = 2000


@pytest.fixture
async def durable_nats(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    """A nats-server provisioned the way EmbeddedInfra provisions it (sync always)."""
    server = EmbeddedNats(tmp_path / "nats")
    assert server.sync_always
    await asyncio.to_thread(server.start)
    try:
        await provision_streams(server.url)
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def test_acknowledged_outbox_publishes_survive_a_sigkill(
    db: Database, durable_nats: EmbeddedNats
) -> None:
    """Every outbox row the relay marked PUBLISHED (on JetStream's ack) is in
    the stream after the server is SIGKILLed right after the burst and
    restarted on the same store: none lost, none twice."""
    assert "sync_interval: always" in (durable_nats.data_dir / "nats.conf").read_text()
    await db.pool.execute(
        """INSERT INTO service_engine.integration_outbox (message_id, subject, payload)
           SELECT gen_random_uuid(), $1, jsonb_build_object('n', n) FROM generate_series(1, $2) n""",
        SUBJECT, BURST,
    )
    metrics = Metrics("cards", "pod-a")
    async with engine_nats(durable_nats, publish_ack_timeout=timedelta(seconds=5)) as conn:
        relay = OutboxRelay(
            db, conn, DeadLetters(db, metrics),
            LeaderLease(db, OUTBOX_SLOT, "pod-a", timedelta(seconds=5)),
            metrics=metrics, bounds=OutboxBounds(drain_bound=BURST),
        )

        async def drained() -> bool:
            await relay.step()
            pending = await db.pool.fetchval(
                "SELECT count(*) FROM service_engine.integration_outbox WHERE status <> 'PUBLISHED'"
            )
            return int(pending) == 0

        await wait_until(drained, timeout=60, what="the burst acknowledged")
        await asyncio.to_thread(durable_nats.kill)  # at once: no orderly flush
        await relay.aclose()
    acknowledged = {
        str(r["message_id"])
        for r in await db.pool.fetch(
            "SELECT message_id FROM service_engine.integration_outbox WHERE status = 'PUBLISHED'"
        )
    }
    assert len(acknowledged) == BURST
    await asyncio.to_thread(durable_nats.start)
    stored = await stream_messages(durable_nats.url, "INTEGRATION_EVT")
    ids = [m.headers[HEADER_NATS_MSG_ID] for m in stored]
    assert len(ids) == len(set(ids)), "a message stored twice"
    assert acknowledged - set(ids) == set(), "acknowledged messages lost by the crash"
