"""The verified seal against a real Postgres and a spawned nats-server:
every refusal (nothing written), the marker at last_seq + 1, the cancel
gestures, seal_current folding a chunk that committed while it waited for
the lock, a seal racing a late chunk, and the flush deferring a key a slow
seal holds."""

from __future__ import annotations

import asyncio

import pytest

from service_engine import Database
from service_engine.embedded import EmbeddedNats
from service_engine.lanes.accumulated.accumulator import lane_lock_key
from service_engine.lanes.accumulated.errors import (
    AlreadySealed,
    KeySealed,
    SealChunkBeyondLastSeq,
    SealHashMismatch,
    SealTruncated,
)
from service_engine.pipeline import Mutation
from service_engine.pipeline.outcomes import MutationError

from ..support.accumulator_support import (
    LanePod,
    chunk_rows,
    hash_of,
    lane_pod,
    provision,
    seal_row,
    text_accumulator,
)
from ..support.harness import wait_until


async def _push(pod: LanePod, key: str, *chunks: str, start: int = 0) -> None:
    acc = pod.engine.lanes.accumulators.resolve(None)
    for offset, chunk in enumerate(chunks):
        await pod.engine.push_chunk(acc, key, start + offset, chunk.encode())


async def test_a_seal_writes_its_marker_and_returns_the_folded_state(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """seal(key, last_seq, hash) returns the fold of 0..last_seq, writes the
    marker at high water last_seq + 1, deletes the chunks, and refuses every
    chunk of the key afterwards."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        await _push(pod, "r", "a", "b", "c")
        state = await pod.seal(acc, "r", 2, hash_of("a", "b", "c").upper())
        assert state == "abc"
        marker = await seal_row(db, "r")
        assert (marker["high_water"], marker["hash"], marker["gesture"]) == (
            3, hash_of("a", "b", "c"), "seal"
        )
        assert await chunk_rows(db, "r") == []
        with pytest.raises(KeySealed):
            await pod.engine.push_chunk(acc, "r", 3, b"d")
        with pytest.raises(KeySealed):
            await pod.engine.push_chunk(acc, "r", 0, b"a")
        assert (await pod.engine.fold(acc, "r")).sealed_at == 3
        assert pod.engine.metrics.sample(
            "service_engine_lane_seals_total", gesture="seal", outcome="sealed"
        ) == 1


@pytest.mark.parametrize(
    ("chunks", "last_seq", "hash", "refusal"),
    [
        (["a", None, "c"], 2, hash_of("a", "b", "c"), SealTruncated),
        (["a", "b"], 2, hash_of("a", "b", "c"), SealTruncated),
        (["a", "b", "c"], 2, hash_of("a", "b", "x"), SealHashMismatch),
        (["a", "b", "c"], 2, "not-a-hash", SealHashMismatch),
        (["a", "b", "c", "d"], 2, hash_of("a", "b", "c"), SealChunkBeyondLastSeq),
        (["a", None, None, "d"], 1, hash_of("a"), SealChunkBeyondLastSeq),
    ],
    ids=["gap", "short", "mismatch", "malformed-hash", "beyond", "beyond-a-gap"],
)
async def test_every_seal_refusal_writes_nothing(
    db: Database,
    nats_server: EmbeddedNats,
    chunks: list[str | None],
    last_seq: int,
    hash: str,
    refusal: type[Exception],
) -> None:
    """A truncated prefix, a hash mismatch and a chunk durable beyond
    last_seq are refused with their typed error; no marker is written and
    every durable chunk stays."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        for seq, chunk in enumerate(chunks):
            if chunk is not None:
                await pod.engine.push_chunk(acc, "r", seq, chunk.encode())
        before = await chunk_rows(db, "r")
        with pytest.raises(refusal):
            await pod.seal(acc, "r", last_seq, hash)
        assert await seal_row(db, "r") is None
        assert await chunk_rows(db, "r") == before
        assert pod.engine.metrics.sample(
            "service_engine_lane_seals_total", gesture="seal",
            outcome=refusal.code,  # type: ignore[attr-defined]
        ) == 1


async def test_a_second_seal_is_already_sealed(db: Database, nats_server: EmbeddedNats) -> None:
    """A key with a marker refuses every seal gesture (AlreadySealed); the
    sealed record is never rewritten."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        await _push(pod, "r", "a")
        await pod.seal(acc, "r", 0, hash_of("a"))
        first = await seal_row(db, "r")
        with pytest.raises(AlreadySealed):
            await pod.seal(acc, "r", 0, hash_of("a"))
        with pytest.raises(AlreadySealed):
            await pod.seal_current(acc, "r")
        with pytest.raises(AlreadySealed):
            await pod.seal_partial(acc, "r", 5)
        assert dict(await seal_row(db, "r")) == dict(first)


async def test_a_seal_refusal_is_answered_by_a_mutation(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Through the mutation executor a refused seal is a MutationError with
    the refusal's code, not a crash."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        await _push(pod, "r", "a", "b")

        async def finish(cx: Mutation[str]) -> str:
            return await cx.seal(acc, "r", 5, hash_of("a", "b"))

        outcome = await pod.engine.mutation_executor().execute("tester", finish)
        assert isinstance(outcome, MutationError)
        assert outcome.code == "seal_truncated"


async def test_seal_partial_seals_what_is_durable(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """seal_partial(key, last_seq) seals at last_seq + 1 over the contiguous
    prefix durable now, with no hash; a chunk beyond last_seq refuses it."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        await _push(pod, "p", "a", "b")
        with pytest.raises(SealChunkBeyondLastSeq):
            await pod.seal_partial(acc, "p", 0)
        assert await pod.seal_partial(acc, "p", 9) == "ab"
        marker = await seal_row(db, "p")
        assert (marker["high_water"], marker["gesture"]) == (10, "partial")


async def test_a_cancel_past_a_gap_says_which_acked_chunks_it_dropped(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The cancel gestures end a stream whatever is missing, folding the
    contiguous prefix: a chunk acked durable beyond a gap cannot be folded,
    and the result names it in ``dropped`` (never silently gone); a cancel
    over a whole prefix drops nothing."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        await _push(pod, "p", "a")
        await _push(pod, "p", "c", start=2)
        partial = await pod.cancel_partial(acc, "p", 2)
        assert (partial.state, partial.folded, partial.high_water, partial.dropped) == (
            "a", 1, 3, (2,)
        )
        assert await chunk_rows(db, "p") == []
        await _push(pod, "q", "a")
        await _push(pod, "q", "c", "d", start=2)
        current = await pod.cancel_current(acc, "q")
        assert (current.state, current.high_water, current.dropped) == ("a", 4, (2, 3))
        await _push(pod, "w", "a", "b")
        whole = await pod.cancel_current(acc, "w")
        assert (whole.state, whole.folded, whole.dropped) == ("ab", 2, ())


async def test_seal_current_folds_a_chunk_that_committed_while_it_waited(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """seal_current folds under the lock it seals with: a chunk whose write
    holds the key's lane lock when the seal starts is in the returned state
    and sealed, not read before the lock and lost."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        await _push(pod, "c", "a")
        writer = await db.pool.acquire()
        try:
            tx = writer.transaction()
            await tx.start()
            await writer.execute(
                "SELECT pg_advisory_xact_lock_shared($1)", lane_lock_key("text", "c")
            )
            await writer.execute(
                "INSERT INTO service_engine.accumulator_chunk (accumulator, key, seq, chunk) "
                "VALUES ('text', 'c', 1, 'b')"
            )
            sealing = asyncio.create_task(pod.seal_current(acc, "c"))
            await wait_until(
                lambda: _waiting_for_lock(db), what="the seal waiting on the lane lock"
            )
            await tx.commit()
        finally:
            await db.pool.release(writer)
        assert await sealing == "ab"
        marker = await seal_row(db, "c")
        assert (marker["high_water"], marker["gesture"]) == (2, "current")


async def _waiting_for_lock(db: Database) -> bool:
    waiting = await db.pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    )
    return bool(waiting)


async def test_a_seal_racing_a_late_chunk_never_loses_it(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A seal at last_seq racing a chunk at last_seq + 1: either the chunk
    is durable and the seal refused (SealChunkBeyondLastSeq), or the seal
    commits and the chunk is refused (KeySealed). Never both, never a
    Durable chunk the seal dropped."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        outcomes: set[str] = set()
        for round_ in range(20):
            key = f"race{round_}"
            await _push(pod, key, "a")
            seal, late = await asyncio.gather(
                pod.seal(acc, key, 0, hash_of("a")),
                pod.engine.push_chunk(acc, key, 1, b"late"),
                return_exceptions=True,
            )
            rows = await chunk_rows(db, key)
            if isinstance(seal, SealChunkBeyondLastSeq):
                assert not isinstance(late, BaseException)
                assert rows == [(0, b"a"), (1, b"late")]
                assert await seal_row(db, key) is None
                outcomes.add("chunk first")
            else:
                assert seal == "a", seal
                assert isinstance(late, KeySealed), late
                assert rows == []
                outcomes.add("seal first")
        assert outcomes  # at least one ordering observed; both are correct


async def test_the_flush_defers_a_key_a_slow_seal_holds(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """While a seal holds key A's lane lock, chunks of key B still commit at
    once; A's chunk is deferred to a later window (never parks the batch)
    and commits once the lock is released."""
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        holder = await db.pool.acquire()
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT pg_advisory_xact_lock($1)", lane_lock_key("text", "A"))
            parked = asyncio.create_task(pod.engine.push_chunk(acc, "A", 0, b"a"))
            receipt = await asyncio.wait_for(pod.engine.push_chunk(acc, "B", 0, b"b"), 2)
            assert int(receipt.seq) == 0
            await wait_until(
                lambda: pod.engine.lanes.accumulators.flusher.deferrals > 0, what="A's chunk deferred"
            )
            assert not parked.done()
            await tx.rollback()
        finally:
            await db.pool.release(holder)
        assert int((await asyncio.wait_for(parked, 5)).seq) == 0
        assert await chunk_rows(db, "A") == [(0, b"a")]


async def test_the_beat_purges_a_sealed_subject_its_pod_never_purged(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A seal committed by a pod that died before its purge leaves the
    marker unpurged; the beat of a live pod purges the key's subject and
    marks it, while the marker itself stays (it outlives the stream)."""
    from ..support.accumulator_support import producer

    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod, producer(nats_server) as source:
        await source.send("dead", 0, "a")
        await wait_until(lambda: _rows(db, "dead"), what="the frame folded")
        # The dead pod's seal: committed, never purged (no engine attached).
        orphan = text_accumulator()
        dead_pod = LanePod(pod.engine, pod.readiness, None)
        assert await dead_pod.seal(orphan, "dead", 0, hash_of("a")) == "a"
        assert (await seal_row(db, "dead"))["stream_purged"] is False
        assert await source.subject_count("dead") == 1
        await wait_until(
            lambda: _purged(db, "dead"), timeout=15, what="the beat's backstop purge"
        )
        assert await source.subject_count("dead") == 0
        assert (await seal_row(db, "dead"))["high_water"] == 1


async def _rows(db: Database, key: str) -> bool:
    return bool(await chunk_rows(db, key))


async def _purged(db: Database, key: str) -> bool:
    row = await seal_row(db, key)
    return bool(row is not None and row["stream_purged"])


async def test_markers_go_after_seal_retention_and_an_open_keys_chunks_never_do(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A purged marker is kept for seal_retention (which covers the stream's
    max_age, so it outlives every frame the stream could redeliver) and then
    swept, with any chunk a sealed key left behind. The acked chunks of a
    key still open are never swept by age: long past seal_retention its
    fold still starts at chunk 0 and a verified seal over it succeeds."""
    from datetime import timedelta

    from ..support.accumulator_support import lane_config

    await provision(nats_server, max_age=timedelta(seconds=1))
    acc = text_accumulator()
    config = lane_config(seal_retention=timedelta(seconds=1))
    async with lane_pod(db, nats_server, [acc], config=config) as pod:
        await _push(pod, "old", "a")
        await pod.seal(acc, "old", 0, hash_of("a"))
        await db.pool.execute(  # a leftover of the sealed key
            "INSERT INTO service_engine.accumulator_chunk (accumulator, key, seq, chunk) "
            "VALUES ('text', 'old', 7, 'x')"
        )
        await _push(pod, "open", "s")
        await db.pool.execute(
            "UPDATE service_engine.accumulator_chunk SET committed_at = now() - interval '1 day' "
            "WHERE key = 'open'"
        )
        await wait_until(
            lambda: _swept(db, "old"), timeout=15, what="the retention sweep"
        )
        await pod.engine.lanes.accumulators.beat()  # one more sweep, for good measure
        assert await chunk_rows(db, "open") == [(0, b"s")]
        await _push(pod, "open", "t", start=1)
        folded = await pod.engine.fold(acc, "open")
        assert (folded.state, folded.next_seq) == ("st", 2)
        assert await pod.seal(acc, "open", 1, hash_of("s", "t")) == "st"


async def _swept(db: Database, sealed: str) -> bool:
    return await seal_row(db, sealed) is None and not await chunk_rows(db, sealed)
