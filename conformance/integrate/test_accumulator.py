"""The accumulated lane (lane A) against a real Postgres and a spawned
nats-server: durable receipts, idempotent resubmit and ChunkConflict, the
fold stopping at a gap, the table-verified fold cache, the boot bind
(s139) and the NATS ingress across two pods (s140)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from service_engine import Database, Engine, ReadinessHandle
from service_engine.db.errors import Stage, translating
from service_engine.embedded import EmbeddedNats
from service_engine.lanes.accumulated.accumulator import Durable
from service_engine.lanes.accumulated.chunks import ChunkSeq
from service_engine.lanes.accumulated.errors import (
    AccumulatorWithoutService,
    ChunkConflict,
    ChunkSeqOutOfRange,
    KeySealed,
    LaneStreamMissing,
    SealRetentionTooShort,
)
from service_engine.lanes.accumulated.flush import PendingChunk, write_chunks
from service_engine.lanes.accumulated.ingress import DEPENDENCY
from service_engine.messaging.nats import open_nats

from ..support.accumulator_support import (
    Producer,
    chunk_rows,
    hash_of,
    lane_config,
    lane_pod,
    producer,
    provision,
    seal_row,
    text_accumulator,
)
from ..support.harness import assert_never, wait_until


async def test_push_chunk_answers_durable_only_once_committed(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A Durable receipt means the chunk is in Postgres; an identical
    resubmit is idempotent (duplicate) and leaves one row; the pod's
    ephemeral lane consumer is deleted when the pod stops."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        receipt = await pod.engine.push_chunk(acc, "r1", 0, b"hello")
        assert (receipt.key, int(receipt.seq), receipt.duplicate) == ("r1", 0, False)
        assert await chunk_rows(db, "r1") == [(0, b"hello")]
        again = await pod.engine.push_chunk(acc, "r1", 0, b"hello")
        assert again.duplicate
        assert await chunk_rows(db, "r1") == [(0, b"hello")]
    async with producer(nats_server) as source:  # the pod's ephemeral consumer went with it
        info = await source.js.stream_info("STREAMING_lanes")
        assert info.state.consumer_count == 0


async def test_a_different_resubmit_is_a_chunk_conflict(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Different bytes at a durable seq raise ChunkConflict; the durable
    chunk stands."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        await pod.engine.push_chunk(acc, "r1", 0, b"hello")
        with pytest.raises(ChunkConflict):
            await pod.engine.push_chunk(acc, "r1", 0, b"HELLO")
        assert await chunk_rows(db, "r1") == [(0, b"hello")]
        conflicts = pod.engine.metrics.sample(
            "service_engine_lane_chunks_total", outcome="conflict"
        )
        assert conflicts == 1


async def test_concurrent_identical_and_conflicting_resubmits(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Many writers of one seq at once: exactly one content wins, every
    identical writer gets Durable, every other a ChunkConflict."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        results = await asyncio.gather(
            *(pod.engine.push_chunk(acc, "k", 0, b"a") for _ in range(10)),
            return_exceptions=True,
        )
        assert all(not isinstance(r, BaseException) for r in results)
        assert sum(1 for r in results if not getattr(r, "duplicate", True)) == 1
        assert await chunk_rows(db, "k") == [(0, b"a")]


async def test_fold_stops_at_a_gap_and_resumes_when_it_fills(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The state is the fold of the contiguous prefix: chunk 2 waits behind
    the missing chunk 1, and is folded once 1 arrives."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        await pod.engine.push_chunk(acc, "g", 0, b"a")
        await pod.engine.push_chunk(acc, "g", 2, b"c")
        folded = await pod.engine.fold(acc, "g")
        assert (folded.state, folded.next_seq, folded.hash) == ("a", 1, hash_of("a"))
        await pod.engine.push_chunk(acc, "g", 1, b"b")
        folded = await pod.engine.fold(acc, "g")
        assert (folded.state, folded.next_seq, folded.hash) == ("abc", 3, hash_of("a", "b", "c"))


async def test_fold_cache_is_bounded_and_verified_against_the_table(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The cache holds at most fold_cache_capacity keys (LRU), resumes a
    cached prefix only while the table still holds it, and refolds when a
    chunk it folded is gone."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(
        db, nats_server, [acc], config=lane_config(fold_cache_capacity=2)
    ) as pod:
        for key in ("a", "b", "c"):
            await pod.engine.push_chunk(acc, key, 0, key.encode())
            await pod.engine.fold(acc, key)
        cache = pod.engine.lanes.accumulators.cache
        assert len(cache) == 2
        assert cache.get("text", "a") is None  # the least recently used went
        await pod.engine.push_chunk(acc, "c", 1, b"!")
        assert (await pod.engine.fold(acc, "c")).state == "c!"
        # Someone deletes the folded prefix behind the cache's back (an
        # erasure): the cache is not trusted, the fold reads the table.
        await db.pool.execute("DELETE FROM service_engine.accumulator_chunk WHERE key = 'c'")
        await db.pool.execute(
            "INSERT INTO service_engine.accumulator_chunk (accumulator, key, seq, chunk) "
            "VALUES ('text', 'c', 0, 'x'), ('text', 'c', 1, 'y')"
        )
        assert (await pod.engine.fold(acc, "c")).state == "xy"


async def test_chunk_seq_is_checked_at_construction(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """An over-range or negative seq is refused before anything is written."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        for bad in (2**63, -1):
            with pytest.raises(ChunkSeqOutOfRange):
                await pod.engine.push_chunk(acc, "k", bad, b"x")
        await pod.engine.push_chunk(acc, "k", 2**63 - 1, b"top")
        assert await chunk_rows(db, "k") == [(2**63 - 1, b"top")]


async def test_s139_absent_stream_holds_readiness_down(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s139: an accumulator with no STREAMING_{service} stream fails run
    loud (LaneStreamMissing) and readiness stays DOWN with the reason."""
    acc = text_accumulator()
    conn = await open_nats(nats_server.url, ping_interval=1)
    try:
        readiness = ReadinessHandle()
        engine = await Engine.boot(lane_config(), db, conn, readiness)
        engine.register_accumulator(acc)
        with pytest.raises(LaneStreamMissing):
            await engine.run()
        assert not readiness.is_up
        assert readiness.holds("lane_stream")
    finally:
        await conn.aclose()


@pytest.mark.parametrize("max_age", [timedelta(days=30), None])
async def test_s139_seal_retention_below_the_stream_max_age_fails_boot(
    db: Database, nats_server: EmbeddedNats, max_age: timedelta | None
) -> None:
    """s139: a stream that keeps chunks longer than seal_retention (or
    forever) fails boot loud: the marker must outlive the stream."""
    await provision(nats_server, max_age=max_age)
    acc = text_accumulator()
    conn = await open_nats(nats_server.url, ping_interval=1)
    try:
        readiness = ReadinessHandle()
        engine = await Engine.boot(
            lane_config(seal_retention=timedelta(days=7)), db, conn, readiness
        )
        engine.register_accumulator(acc)
        with pytest.raises(SealRetentionTooShort):
            await engine.run()
        assert readiness.holds("lane_stream")
    finally:
        await conn.aclose()


async def test_an_accumulator_without_a_service_fails_at_registration(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """No service configured: no stream to bind, AccumulatorWithoutService."""
    conn = await open_nats(nats_server.url, ping_interval=1)
    try:
        engine = await Engine.boot(lane_config(service=None), db, conn, ReadinessHandle())
        with pytest.raises(AccumulatorWithoutService):
            engine.register_accumulator(text_accumulator())
    finally:
        await conn.aclose()


async def test_s140_a_separate_producer_reaches_two_pods_and_a_chunk_after_the_seal_is_refused(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s140: frames published by a separate producer on stream.{service}.{key}
    are folded (by either pod's ingress) into the one Postgres accumulator;
    after the seal the key's subject is purged and a late frame is dropped
    by every pod, never written."""
    await provision(nats_server)
    acc = text_accumulator()
    async with (
        lane_pod(db, nats_server, [acc]) as a,
        lane_pod(db, nats_server, [acc]) as b,
        producer(nats_server) as source,
    ):
        for pod in (a, b):
            assert pod.engine.metrics.sample(
                "service_engine_dependency_up", dependency=DEPENDENCY
            ) == 1
        for seq, chunk in enumerate(["he", "ll", "o"]):
            await source.send("reply-1", seq, chunk)
        await wait_until(
            lambda: _ingested(a, b, 6), what="both pods folded every frame"
        )
        for pod in (a, b):
            assert (await pod.engine.fold(acc, "reply-1")).state == "hello"
        assert await a.seal(acc, "reply-1", 2, hash_of("he", "ll", "o")) == "hello"
        await wait_until(
            lambda: _subject_empty(source, "reply-1"), what="the sealed subject purged"
        )
        marker = await seal_row(db, "reply-1")
        assert (marker["high_water"], marker["stream_purged"]) == (3, True)
        dropped = (a.engine.lanes.ingress.ingress.dropped, b.engine.lanes.ingress.ingress.dropped)  # type: ignore[union-attr]
        await source.send("reply-1", 3, "!")
        await wait_until(
            lambda: (
                a.engine.lanes.ingress.ingress.dropped > dropped[0]  # type: ignore[union-attr]
                and b.engine.lanes.ingress.ingress.dropped > dropped[1]  # type: ignore[union-attr]
            ),
            what="both pods dropped the late frame",
        )
        assert await chunk_rows(db, "reply-1") == []
        with pytest.raises(KeySealed):
            await b.engine.push_chunk(acc, "reply-1", 3, b"!")


async def _ingested(a: object, b: object, frames: int) -> bool:
    total = 0
    for pod in (a, b):
        ingress = pod.engine.lanes.ingress  # type: ignore[attr-defined]
        total += ingress.ingress.frames
    return total >= frames


async def _subject_empty(source: Producer, key: str) -> bool:
    return await source.subject_count(key) == 0


async def test_the_ingress_survives_a_frame_that_is_no_lane_frame(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A frame without a seq header is terminated with a log line; the
    frames behind it still fold."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod, producer(nats_server) as source:
        await source.js.publish("stream.lanes.bad", b"no seq")
        await source.send("ok", 0, "fine")
        await wait_until(
            lambda: _has_rows(db, "ok"), what="the good frame folded"
        )
        assert pod.engine.lanes.ingress is not None
        await assert_never(lambda: not pod.readiness.is_up, within=0.2, what="readiness DOWN")


async def _has_rows(db: Database, key: str) -> bool:
    return bool(await chunk_rows(db, key))


async def test_the_ingress_is_supervised_and_readiness_follows_it(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The lane's consumer is restarted with a bounded backoff: with its
    stream gone it fails past the threshold and readiness goes DOWN
    (lane_ingress_stopped, dependency_up{streaming} 0); once the stream is
    declared again it consumes, readiness comes back UP and frames fold."""
    from service_engine.lanes.accumulated.ingress import REASON_LANE_INGRESS

    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod, producer(nats_server) as source:
        await source.js.delete_stream("STREAMING_lanes")
        await wait_until(
            lambda: pod.readiness.holds(REASON_LANE_INGRESS), timeout=15,
            what="readiness DOWN on the lost lane consumer",
        )
        assert pod.engine.metrics.sample(
            "service_engine_dependency_up", dependency=DEPENDENCY
        ) == 0
        supervisor = pod.engine.lanes.ingress
        assert supervisor is not None and supervisor.restarts >= 3
        await provision(nats_server)
        await wait_until(lambda: pod.readiness.is_up, timeout=15, what="readiness UP again")
        await source.send("after", 0, "back")
        await wait_until(lambda: _has_rows(db, "after"), what="a frame folded after recovery")


async def test_two_passes_writing_the_same_rows_in_opposite_orders_never_deadlock(
    db: Database,
) -> None:
    """Every pod folds every frame, so two pods' flush passes write the same
    (accumulator, key, seq) rows, in whatever order they arrived. Held at
    the same row by a third writer, two passes of one batch in opposite
    orders both complete once it rolls back (rows are written in one fixed
    order), with every chunk Durable exactly once and nothing lost."""
    rows = [("text", "dl", seq, f"c{seq}".encode()) for seq in range(40)]
    middle = rows[20]

    def batch(order: list[tuple[str, str, int, bytes]]) -> list[PendingChunk]:
        return [PendingChunk(a, k, ChunkSeq(s), c) for a, k, s, c in order]

    async def both_waiting() -> bool:
        value = await db.pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return int(value) >= 2

    async with db.pool.acquire() as blocker:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(
            "INSERT INTO service_engine.accumulator_chunk (accumulator, key, seq, chunk) "
            "VALUES ($1, $2, $3, $4)", *middle,
        )

        async def write(order: list[tuple[str, str, int, bytes]]) -> dict[int, Any]:
            async with db.pool.acquire() as conn:
                with translating(Stage.FLUSH):
                    outcomes, deferred = await write_chunks(
                        conn, batch(order), timedelta(seconds=20)
                    )
            assert deferred == []
            return outcomes

        first = asyncio.create_task(write(rows))
        second = asyncio.create_task(write(list(reversed(rows))))
        await wait_until(both_waiting, what="both passes waiting behind the blocker")
        await tx.rollback()
        results = await asyncio.wait_for(asyncio.gather(first, second), 20)
    durable = [o for outcomes in results for o in outcomes.values()]
    assert all(isinstance(o, Durable) for o in durable)
    assert sum(1 for o in durable if not o.duplicate) == len(rows)
    assert await chunk_rows(db, "dl") == [(s, c) for _, _, s, c in rows]


async def test_a_flush_pass_that_times_out_on_a_lock_is_retried_not_failed(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A pass that fails with a retryable error (here a row lock held past
    lock_timeout by another writer of the same chunk) is retried once: the
    push_chunk caller gets its Durable receipt, never the transient
    LockTimeout."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        flusher = pod.engine.lanes.accumulators.flusher
        async with db.pool.acquire() as blocker:
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute(
                "INSERT INTO service_engine.accumulator_chunk (accumulator, key, seq, chunk) "
                "VALUES ('text', 'lt', 0, 'a')"
            )
            pushing = asyncio.create_task(pod.engine.push_chunk(acc, "lt", 0, b"a"))
            await wait_until(lambda: flusher.retries >= 1, what="the first pass timing out")
            await tx.rollback()
            receipt = await asyncio.wait_for(pushing, 10)
        assert (receipt.key, int(receipt.seq), receipt.duplicate) == ("lt", 0, False)
        assert flusher.retries == 1
        assert await chunk_rows(db, "lt") == [(0, b"a")]
