"""The engine's NATS wrapper against a real nats-server: every publish ends
in one PublishOutcome, streams and buckets are bind-only."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import nats
import pytest
from nats.js.api import KeyValueConfig

from service_engine.embedded import EmbeddedNats
from service_engine.messaging.envelope import HEADER_NATS_MSG_ID
from service_engine.messaging.nats import (
    Acked,
    BucketMissing,
    Duplicate,
    KvConflict,
    Rejected,
    StreamMissing,
    Unanswered,
)

from ..support.harness import wait_until
from ..support.nats_support import engine_nats, set_stream

SUBJECT = "integration.evt.cards.card.created"


async def test_publish_outcomes_ack_and_duplicate(nats_server: EmbeddedNats) -> None:
    """A publish is Acked; the same Nats-Msg-Id again is a Duplicate of that stream
    sequence."""
    async with engine_nats(nats_server) as conn:
        token = {HEADER_NATS_MSG_ID: str(uuid.uuid4())}
        first = await conn.publish(SUBJECT, b"{}", token)
        again = await conn.publish(SUBJECT, b"{}", token)
    assert isinstance(first, Acked) and first.stream == "INTEGRATION_EVT"
    assert again == Duplicate(first.stream, first.seq)


async def test_genuine_broker_refusals_are_rejected(nats_server: EmbeddedNats) -> None:
    """Genuine broker refusals (message too large, wrong expected sequence) are Rejected
    with their error codes."""
    await set_stream(nats_server.url, "INTEGRATION_EVT", max_msg_size=256)
    async with engine_nats(nats_server) as conn:
        too_big = await conn.publish(SUBJECT, b"x" * 1024)
        await conn.publish(SUBJECT, b"{}")
        wrong_seq = await conn.publish(SUBJECT, b"{}", {"Nats-Expected-Last-Sequence": "99"})
    assert isinstance(too_big, Rejected) and too_big.err_code == 10054
    assert isinstance(wrong_seq, Rejected) and wrong_seq.err_code == 10071


async def test_a_broker_that_cannot_answer_is_unanswered(nats_server: EmbeddedNats) -> None:
    """A subject no stream captures and a broker that is down are Unanswered, never
    Rejected; after the reconnect a publish is Acked."""
    async with engine_nats(nats_server, publish_ack_timeout=timedelta(milliseconds=300)) as conn:
        no_stream = await conn.publish("nowhere.captures.this", b"{}")
        assert isinstance(no_stream, Unanswered)
        await asyncio.to_thread(nats_server.stop)
        await wait_until(lambda: not conn.reachable(), what="the outage")
        down = await conn.publish(SUBJECT, b"{}")
        assert isinstance(down, Unanswered)
        assert await conn.probe_jetstream(0.3) is not None
        await asyncio.to_thread(nats_server.start)
        await wait_until(conn.reachable, timeout=15, what="the reconnect")
        assert await conn.probe_jetstream(1) is None
        assert isinstance(await conn.publish(SUBJECT, b"{}"), Acked)


async def test_streams_are_bind_only(nats_server: EmbeddedNats) -> None:
    """Streams are bound, never created: an undeclared stream raises StreamMissing."""
    async with engine_nats(nats_server) as conn:
        await conn.bind_stream("INTEGRATION_CMD")
        with pytest.raises(StreamMissing, match="NOT_DECLARED"):
            await conn.bind_stream("NOT_DECLARED")


async def test_buckets_are_bind_only_and_compare_and_set(nats_server: EmbeddedNats) -> None:
    """Buckets are bound, never created (BucketMissing); keys create and update by compare-
    and-set (KvConflict on a stale revision)."""
    admin = await nats.connect(nats_server.url, max_reconnect_attempts=0)
    try:
        await admin.jetstream().create_key_value(KeyValueConfig(bucket="published_cards"))
    finally:
        await admin.close()
    async with engine_nats(nats_server) as conn:
        with pytest.raises(BucketMissing, match="absent_bucket"):
            await conn.bind_bucket("absent_bucket")
        bucket = await conn.bind_bucket("published_cards")
        key = bucket.key("card-1")
        assert await key.get() is None
        first = await key.create(b"v1")
        with pytest.raises(KvConflict):
            await key.create(b"v1-again")
        second = await key.update(b"v2", last=first)
        with pytest.raises(KvConflict):
            await key.update(b"stale", last=first)
        entry = await key.get()
        assert entry is not None and (entry.value, entry.revision) == (b"v2", second)
        await key.delete()
        assert await key.get() is None
        assert await bucket.put("card-2", b"p") > second
