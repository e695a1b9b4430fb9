"""The reference service's reply slice, in process against real Postgres and
a spawned nats-server: the seal behind a streamed reply.

A finish sealing what the lane holds finishes the reply; a finish whose
last_seq sits below a durable chunk and one whose hash does not match are
answered ``reply.seal_failed`` at once; a truncated stream is retried over
redeliveries (``cx.delivered``) so a late chunk can heal it, and answered
``reply.seal_failed`` once the budget is spent; a reply cancelled in flight
keeps what is durable (``seal_current``) and refuses every later chunk;
who is typing rides the presence lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.js.api import DeliverPolicy

from example_service.slices.reply.commands import cancel_reply, start_reply
from example_service.slices.reply.domain import REPLY_TEXT, Reply
from example_service.slices.reply.reactions import FINISH_ATTEMPTS, reactions
from example_twin import Twin
from example_twin.reply import finish_reply, reply_cycle
from service_engine import EventMetadata, MutationError
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.errors import KeySealed
from service_engine.graphql import Passport
from service_engine.lanes import seal_hash

from ..blackbox.harness import provision_kv, provision_lanes
from ..support.example_support import Running, person, running
from ..support.harness import wait_until
from ..support.inbound_support import consumer_state
from ..support.nats_support import engine_nats

ALICE = person("alice")
SLICES = ("reply",)



@contextlib.asynccontextmanager
async def service(store: ProvisionedDatabase, server: EmbeddedNats) -> AsyncIterator[Running]:
    await provision_lanes(server.url)
    await provision_kv(server.url)
    async with engine_nats(server) as conn, running(store, SLICES, nats=conn) as live:
        yield live


@contextlib.asynccontextmanager
async def reply_events(server: EmbeddedNats) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
    """The service's reply events from now on, decoded."""
    client = await nats.connect(server.url, connect_timeout=5, max_reconnect_attempts=0)
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def route(msg: Any) -> None:
        queue.put_nowait(json.loads(msg.data))

    try:
        await client.jetstream().subscribe(
            "integration.evt.example.reply.*", stream="INTEGRATION_EVT", cb=route,
            ordered_consumer=True, deliver_policy=DeliverPolicy.NEW,
        )
        yield queue
    finally:
        await client.close()


async def _push(live: Running, reply_id: str, chunks: dict[int, bytes]) -> None:
    for seq, chunk in chunks.items():
        await live.engine.push_chunk(REPLY_TEXT, reply_id, seq, chunk)


async def _reply(live: Running, reply_id: str) -> Reply | None:
    row = await live.db.pool.fetchrow("SELECT * FROM reply WHERE id = $1", reply_id)
    return None if row is None else Reply.Store.from_row(dict(row))


async def _finish(server: EmbeddedNats, reply_id: str, last_seq: int, hash: str) -> None:
    async with Twin.connect(server.url) as twin:
        await finish_reply(
            twin, reply_id, "acme", last_seq, hash, EventMetadata.originating(twin.actor)
        )


async def test_a_streamed_reply_is_finished_by_its_seal(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """The twin's frames and finish seal the reply: the row holds the
    sealed text and hash, the subscriber sees it finished."""
    async with service(store, nats_server) as live, Twin.connect(nats_server.url) as twin:
        assert await live.executor.execute(ALICE, start_reply, "r1") == "r1"
        chunks = ["héllo ".encode(), "wör".encode()[:2], "wör".encode()[2:], b"ld"]
        run = await reply_cycle(twin, "r1", chunks, org="acme", bound=15)
        assert run.finished, run
        reply = await _reply(live, "r1")
        assert reply is not None
        assert (reply.status, reply.text, reply.hash, reply.chunks) == (
            "finished", "héllo wörld", seal_hash(chunks), 4
        )


@pytest.mark.parametrize(
    ("chunks", "last_seq", "hash", "code"),
    [
        ({0: b"a", 1: b"b", 2: b"c"}, 1, seal_hash([b"a", b"b"]), "seal_chunk_beyond_last_seq"),
        ({0: b"a", 1: b"b"}, 1, seal_hash([b"x"]), "seal_hash_mismatch"),
    ],
    ids=["below-a-durable-chunk", "hash-mismatch"],
)
async def test_a_finish_the_seal_cannot_honour_is_answered_at_once(
    store: ProvisionedDatabase, nats_server: EmbeddedNats,
    chunks: dict[int, bytes], last_seq: int, hash: str, code: str,
) -> None:
    """last_seq below a durable chunk, or a wrong hash: reply.seal_failed on
    the first delivery; the reply keeps streaming, its chunks untouched."""
    async with service(store, nats_server) as live, reply_events(nats_server) as events:
        await live.executor.execute(ALICE, start_reply, "r2")
        await _push(live, "r2", chunks)
        await _finish(nats_server, "r2", last_seq, hash)
        event = await asyncio.wait_for(events.get(), 10)
        assert (event["type"], event["payload"]["code"]) == ("reply.seal_failed", code)
        reply = await _reply(live, "r2")
        assert reply is not None and reply.status == "streaming"
        folded = await live.engine.fold(REPLY_TEXT, "r2")
        assert folded.next_seq == len(chunks)


async def test_a_late_joiner_reads_the_durable_progress(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """replyProgress answers the fold of the contiguous durable chunks of a
    streaming reply (stopping at a gap), to the reply's org only."""
    async with service(store, nats_server) as live:
        await live.executor.execute(ALICE, start_reply, "r7")
        await _push(live, "r7", {0: b"so ", 1: b"far", 3: b"!"})
        query = 'query { replyProgress(id: "r7") { text chunks hash sealed } }'
        data = await live.gql(query, passport=Passport(sub="alice", org="acme"))
        assert data["replyProgress"] == {
            "text": "so far", "chunks": 2, "hash": seal_hash([b"so ", b"far"]), "sealed": False,
        }
        other = await live.gql(query, passport=Passport(sub="mallory", org="globex"))
        assert other["replyProgress"] is None


async def test_a_truncated_finish_heals_when_the_missing_chunk_arrives(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A finish arriving ahead of its last chunk is retried, not refused:
    once the chunk is durable a redelivery seals the reply."""
    async with service(store, nats_server) as live, reply_events(nats_server) as events:
        await live.executor.execute(ALICE, start_reply, "r3")
        await _push(live, "r3", {0: b"a", 2: b"c"})
        await _finish(nats_server, "r3", 2, seal_hash([b"a", b"b", b"c"]))
        await wait_until(
            lambda: _delivered(nats_server), what="a first (truncated) delivery"
        )
        await _push(live, "r3", {1: b"b"})
        event = await asyncio.wait_for(events.get(), 10)
        assert event["type"] == "reply.finished"
        reply = await _reply(live, "r3")
        assert reply is not None and (reply.status, reply.text) == ("finished", "abc")


async def _delivered(server: EmbeddedNats) -> bool:
    reaction = reactions()[0]
    info = await consumer_state(server.url, reaction.stream, reaction.durable("example"))
    return bool(info.delivered.consumer_seq >= 1)


async def test_a_truncation_that_stays_is_answered_after_the_budget(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """A stream still truncated after FINISH_ATTEMPTS deliveries is answered
    reply.seal_failed (seal_truncated), never nak'ed into a dead letter."""
    async with service(store, nats_server) as live, reply_events(nats_server) as events:
        await live.executor.execute(ALICE, start_reply, "r4")
        await _push(live, "r4", {0: b"a", 2: b"c"})
        await _finish(nats_server, "r4", 2, seal_hash([b"a", b"b", b"c"]))
        event = await asyncio.wait_for(events.get(), 20)
        assert (event["type"], event["payload"]["code"]) == ("reply.seal_failed", "seal_truncated")
        dead = await live.db.pool.fetchval("SELECT count(*) FROM service_engine.dead_letter")
        assert dead == 0
        assert FINISH_ATTEMPTS > 1


async def test_a_reply_cancelled_in_flight_keeps_what_is_durable(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """cancelReply seals the current durable prefix: the reply is cancelled
    with that text, a later chunk is refused, a second cancel is refused."""
    async with service(store, nats_server) as live:
        await live.executor.execute(ALICE, start_reply, "r5")
        await _push(live, "r5", {0: b"par", 1: b"tial"})
        assert not isinstance(await live.executor.ack(ALICE, cancel_reply, "r5"), MutationError)
        reply = await _reply(live, "r5")
        assert reply is not None and (reply.status, reply.text) == ("cancelled", "partial")
        with pytest.raises(KeySealed):
            await live.engine.push_chunk(REPLY_TEXT, "r5", 2, b"!")
        again = await live.executor.ack(ALICE, cancel_reply, "r5")
        assert isinstance(again, MutationError) and again.code == "reply.ended"
        outsider = await live.executor.ack(person("mallory", "globex"), cancel_reply, "r5")
        assert isinstance(outsider, MutationError)


async def test_who_is_typing_rides_the_presence_lane(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """replyTyping puts the caller on the reply's typing lane after the
    commit; a subscriber of the reply's typists sees them."""
    async with service(store, nats_server) as live:
        await live.executor.execute(ALICE, start_reply, "r6")
        passport = Passport(sub="alice", org="acme")
        async with live.socket(passport) as ws:
            await ws.subscribe("typing", """subscription { replyTyping(id: "r6") {
                __typename
                ... on ReplyTypingReset { keys }
                ... on ReplyTypingUpsert { key view { replyId person } }
            } }""")
            reset = (await ws.next("typing"))["replyTyping"]
            assert (reset["__typename"], reset["keys"]) == ("ReplyTypingReset", [])
            data = await live.gql(
                'mutation { replyTyping(id: "r6") { success error { code } } }',
                passport=passport,
            )
            assert data["replyTyping"]["success"], data
            upsert = (await ws.next("typing"))["replyTyping"]
            assert upsert["__typename"] == "ReplyTypingUpsert"
            assert upsert["view"] == {"replyId": "r6", "person": "alice"}
