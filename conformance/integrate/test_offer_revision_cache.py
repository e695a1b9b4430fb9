"""The offer drain's revision cache against a real Postgres and a spawned
nats-server: a key drained once under a lease is written again without a
bucket read; an outside write fails the compare-and-set on the remembered
revision and the next pass re-reads and converges (nothing regresses, s188);
a new fence starts from the bucket, not from what an older tenure
remembered; the cache holds at most its bound."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import timedelta
from typing import Any, cast

import pytest

from service_engine import Database, MutationExecutor
from service_engine.beat.leader import LeaseLost
from service_engine.embedded import EmbeddedNats
from service_engine.messaging.nats import KvBucket, KvEntry, Nats
from service_engine.offers.drain import REVISION_CACHE_KEYS, OfferDrain, OfferDrainBounds
from service_engine.testing.offers import OneShotDrainPause

from ..support.sample_counter import WRITER, create_counter, executor_for, increment
from .test_offers import CounterOffer, OfferedCounter, bucket_of, bucket_values, store_values

NAME = CounterOffer.NAME


@pytest.fixture(autouse=True)
def _offered() -> None:
    from service_engine.offers.model import register_offer_type

    register_offer_type(CounterOffer())


class CountingNats:
    """The engine's `Nats` whose bound buckets count their ``get`` calls by
    key (the real bucket underneath: every call still goes to the server)."""

    def __init__(self, nats: Nats) -> None:
        self.nats = nats
        self.gets: Counter[str] = Counter()

    async def bind_bucket(self, name: str) -> KvBucket:
        bucket = await self.nats.bind_bucket(name)
        real = bucket.get

        async def get(key: str) -> KvEntry | None:
            self.gets[key] += 1
            return await real(key)

        bucket.get = get  # type: ignore[method-assign]
        return bucket


def counting_drain(conn: Nats, db: Database, holder: str, **kwargs: Any) -> tuple[
    OfferDrain, CountingNats
]:
    counting = CountingNats(conn)
    # interval 1 ms: every pass asks for the lease (a takeover is seen at once)
    bounds = OfferDrainBounds(lease=timedelta(seconds=1), interval=timedelta(milliseconds=1))
    drain = OfferDrain(db, cast(Nats, counting), holder, bounds, **kwargs)
    drain.add(CounterOffer())
    return drain, counting


async def first_pass(
    conn: Nats, db: Database
) -> tuple[MutationExecutor, OfferDrain, CountingNats]:
    """A counter "k" created, and one pod's drain bound and through its first
    pass (the key published, its revision remembered)."""
    executor = executor_for(db)
    await executor.execute(WRITER, create_counter, OfferedCounter, "k")
    drain, counting = counting_drain(conn, db, "pod-a")
    await drain.bind()
    await drain.step()
    return executor, drain, counting


async def markers(db: Database) -> int:
    count: int = await db.pool.fetchval("SELECT count(*) FROM service_engine.offer_dirty")
    return count


def image(key: str, value: int) -> bytes:
    return json.dumps({"frozen": False, "id": key, "value": value}, separators=(",", ":")).encode()


async def expire(db: Database) -> None:
    await db.pool.execute(
        "UPDATE service_engine.leader_slot SET expires_at = clock_timestamp() WHERE slot = $1",
        CounterOffer().slot,
    )


async def test_a_second_write_of_a_key_under_one_lease_reads_no_revision(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A key the drain read once under this lease is written again without
    a bucket read, by compare-and-set on the revision its last write
    returned: the bucket holds the new image at the next revision."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        drain, counting = counting_drain(conn, db, "pod-a")
        await drain.bind()
        await drain.step()  # the tenure's reconcile: nothing to stage yet
        await executor.execute(WRITER, create_counter, OfferedCounter, "k")
        [report] = (await drain.step()).values()
        assert report.published == 1
        assert counting.gets == {"sample.counter.k": 1}  # not known yet: read
        first = await bucket.get("sample.counter.k")
        assert first is not None

        for _ in range(2):
            await executor.execute(WRITER, increment, OfferedCounter, "k")
            [report] = (await drain.step()).values()
            assert (report.published, report.conflicts) == (1, 0)
        assert counting.gets == {"sample.counter.k": 1}  # no read for either write
        entry = await bucket.get("sample.counter.k")
        assert entry is not None
        assert entry.value == image("k", 2)
        assert entry.revision == first.revision + 2
        assert await markers(db) == 0
        assert drain.cache_of(NAME).hits >= 2


async def test_s188_an_outside_write_fails_the_remembered_revision_and_the_next_pass_converges(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A value put into the bucket behind the drain's back between two passes
    moves the key off the remembered revision: the drain's compare-and-set
    fails, writing nothing, and the key stays dirty; the following pass reads
    the key and converges the bucket to the store's image (s188: never a
    write over a revision not observed)."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor, drain, counting = await first_pass(conn, db)
        assert await bucket_values(bucket) == {"k": 0}
        cache = drain.cache_of(NAME)
        assert "sample.counter.k" in cache
        reads = counting.gets["sample.counter.k"]

        await bucket.put("sample.counter.k", image("k", 99))  # the outside write
        await executor.execute(WRITER, increment, OfferedCounter, "k")
        [report] = (await drain.step()).values()
        assert (report.published, report.conflicts) == (0, 1)
        assert await bucket_values(bucket) == {"k": 99}  # not overwritten blind
        assert await markers(db) == 1  # still dirty
        assert "sample.counter.k" not in cache
        assert counting.gets["sample.counter.k"] == reads

        [report] = (await drain.step()).values()
        assert (report.published, report.conflicts) == (1, 0)
        assert counting.gets["sample.counter.k"] == reads + 1  # read again
        assert await bucket_values(bucket) == await store_values(db) == {"k": 1}
        assert await markers(db) == 0


async def test_an_outside_write_under_an_unchanged_image_is_repaired_by_the_reconcile(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A key dirtied with an unchanged image is left alone on the remembered
    value (only the lease holder writes the bucket); a value an outsider put
    meanwhile is repaired by the reconcile, which reads the bucket afresh."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor, drain, _ = await first_pass(conn, db)
        await bucket.put("sample.counter.k", image("k", 99))

        async def touch(cx: Any) -> None:
            cx.dirty_offer(OfferedCounter, "k")

        await executor.execute(WRITER, touch)
        [report] = (await drain.step()).values()
        assert report.unchanged == 1
        assert await markers(db) == 0

        await drain.reconcile(NAME)  # the periodic reconcile's work
        [report] = (await drain.step()).values()
        assert report.published == 1
        assert await bucket_values(bucket) == {"k": 0}


async def test_a_fence_change_clears_the_cache_and_the_new_tenure_reads(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """What a tenure remembered is not used by a later one: after pod-b took
    the lease over and wrote the key, pod-a's next tenure (a new fence)
    starts from the bucket's revision of pod-b's write and writes over it
    without a conflict; a pass that finds its lease lost forgets too."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        await executor.execute(WRITER, create_counter, OfferedCounter, "k")
        a, _ = counting_drain(conn, db, "pod-a")
        b, _ = counting_drain(conn, db, "pod-b")
        for drain in (a, b):
            await drain.bind()
        await a.step()
        cache = a.cache_of(NAME)
        old_fence = cache.fence
        old = await bucket.get("sample.counter.k")
        known, remembered = cache.lookup("sample.counter.k")
        assert known and remembered == old

        await expire(db)
        await executor.execute(WRITER, increment, OfferedCounter, "k")
        assert NAME in await b.step()  # pod-b's tenure writes value 1
        b_write = await bucket.get("sample.counter.k")
        assert b_write is not None and old is not None and b_write.revision > old.revision

        await expire(db)
        await b.aclose()
        await executor.execute(WRITER, increment, OfferedCounter, "k")
        [report] = (await a.step()).values()  # pod-a again, at a new fence
        assert report.reconciled and report.conflicts == 0 and report.published == 1
        assert cache.fence is not None and old_fence is not None and cache.fence > old_fence
        assert await bucket_values(bucket) == await store_values(db) == {"k": 2}

        # a pass that finds its lease taken over forgets what it knew
        await executor.execute(WRITER, increment, OfferedCounter, "k")
        pause = OneShotDrainPause()
        a.hook = pause
        frozen = asyncio.create_task(a.step())
        await asyncio.wait_for(pause.reached.wait(), 5)
        assert len(cache) > 0
        await expire(db)
        assert NAME in await b.step()
        pause.release()
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(frozen, 5)
        assert len(cache) == 0 and cache.fence is None
        assert await bucket_values(bucket) == await store_values(db) == {"k": 3}


async def test_the_cache_holds_at_most_its_bound(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """With room for 3 keys, a drain of 6 remembers exactly 3 (the rest are
    read on their next write) and the bucket still converges to the store;
    the default bound is 4,096 keys."""
    assert REVISION_CACHE_KEYS == 4096
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        keys = [f"k{i}" for i in range(6)]
        for key in keys:
            await executor.execute(WRITER, create_counter, OfferedCounter, key)
        drain, counting = counting_drain(conn, db, "pod-a", cache_keys=3)
        await drain.bind()
        await drain.step()
        cache = drain.cache_of(NAME)
        assert len(cache) == 3
        assert await bucket_values(bucket) == await store_values(db)

        for key in keys:
            await executor.execute(WRITER, increment, OfferedCounter, key)
        before = sum(counting.gets.values())
        [report] = (await drain.step()).values()
        assert (report.published, report.conflicts) == (6, 0)
        assert sum(counting.gets.values()) - before == 3  # the 3 not remembered
        assert len(cache) == 3
        assert await bucket_values(bucket) == await store_values(db) == dict.fromkeys(keys, 1)
        assert await markers(db) == 0
