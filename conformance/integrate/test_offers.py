"""Offers against a real Postgres and a spawned nats-server: the dirty mark
staged with the write, the leader drain's order (s188), convergence under
concurrent writes, retract after delete, failover mid-drain, the reconcile,
and a standalone KvDrainRelay's watermarks (the hosted relay, s171, is
``test_kv_relay_hosted.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from typing import Any, ClassVar

import nats
import pytest

from service_engine import Database, Engine, ReadinessHandle
from service_engine.beat.leader import LeaseLost
from service_engine.db.types import Conn
from service_engine.embedded import EmbeddedNats, provision_buckets
from service_engine.errors import DuplicateRegistration, WorkerStopped
from service_engine.messaging.nats import BucketMissing, KvBucket, Nats
from service_engine.metrics import Metrics
from service_engine.offers.drain import OfferDrain, OfferDrainBounds
from service_engine.offers.model import Offer, Published
from service_engine.offers.relay import KvDrainRelay, KvPut, KvRetract
from service_engine.testing.offers import OneShotDrainPause

from ..support.harness import fast_engine_config, wait_until
from ..support.nats_support import engine_nats
from ..support.sample_counter import (
    WRITER,
    CrudCounter,
    CrudCounterStore,
    create_counter,
    delete_counter,
    executor_for,
    increment,
)

BUCKET = "sample_published"


class OfferedCounter(CrudCounter):
    """A CRUD counter that carries `CounterOffer` (its own class, so no other
    test's counters stage dirty marks)."""


OfferedCounter.Store = CrudCounterStore(OfferedCounter)


class CounterPublished(Published):
    BUCKET: ClassVar[str] = BUCKET
    PREFIX: ClassVar[str] = "sample.counter"
    id: str
    value: int
    frozen: bool


class CounterOffer(Offer[OfferedCounter, str, CounterPublished]):
    NAME = "sample_counters"
    ROW = OfferedCounter
    PUBLISHED = CounterPublished

    def publish(self, row: OfferedCounter) -> CounterPublished | None:
        return CounterPublished(id=row.key, value=row.value, frozen=row.frozen)

    async def keys(self, conn: Conn) -> Iterable[str]:
        return [r["id"] for r in await conn.fetch("SELECT id FROM sample_counter_crud")]


@contextlib.asynccontextmanager
async def bucket_of(server: EmbeddedNats) -> AsyncIterator[tuple[Nats, KvBucket]]:
    await provision_buckets(server.url, [BUCKET])
    async with engine_nats(server) as conn:
        yield conn, await conn.bind_bucket(BUCKET)


async def bucket_values(bucket: KvBucket) -> dict[str, int]:
    entries, _ = await bucket.read_prefix(CounterPublished.PREFIX)
    return {k.rpartition(".")[2]: json.loads(e.value)["value"] for k, e in entries.items()}


async def store_values(db: Database) -> dict[str, int]:
    rows = await db.pool.fetch("SELECT id, value FROM sample_counter_crud")
    return {r["id"]: int(r["value"]) for r in rows}


def drain_of(db: Database, conn: Nats, holder: str, **bounds: Any) -> OfferDrain:
    settings: dict[str, Any] = {"lease": timedelta(seconds=1), "interval": timedelta(milliseconds=50)}
    settings.update(bounds)
    drain = OfferDrain(db, conn, holder, OfferDrainBounds(**settings))
    drain.add(CounterOffer())
    return drain


@contextlib.asynccontextmanager
async def running(db: Database, conn: Nats, **config: Any) -> AsyncIterator[Engine]:
    readiness = ReadinessHandle()
    settings: dict[str, Any] = {"lock_timeout": timedelta(seconds=1), **config}
    engine = await Engine.boot(fast_engine_config("sample", **settings), db, conn, readiness)
    engine.register_offer(CounterOffer())
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: readiness.is_up, what="the engine UP")
        yield engine
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)


@pytest.fixture(autouse=True)
def _offered() -> None:
    from service_engine.offers.model import register_offer_type

    register_offer_type(CounterOffer())


@contextlib.asynccontextmanager
async def frozen_pass(drain: Any, pause: OneShotDrainPause) -> AsyncIterator[asyncio.Task[Any]]:
    """``drain``'s next pass as a task, frozen at ``pause``; on leaving, the
    pause is released and the pass ended, whatever failed in between (a pass
    left frozen would hold its connection past the test)."""
    frozen = asyncio.create_task(drain.step())
    try:
        yield frozen
    finally:
        pause.release()
        frozen.cancel()
        with contextlib.suppress(asyncio.CancelledError, LeaseLost):
            await frozen


async def test_a_write_stages_its_dirty_key_in_its_own_transaction(db: Database) -> None:
    """A create, a save and a delete of an offered noun each stage the key's
    dirty mark with the write (a bumped generation when one was waiting); a
    write that rolls back stages nothing."""
    executor = executor_for(db)
    await executor.execute(WRITER, create_counter, OfferedCounter, "a")
    [row] = await db.pool.fetch("SELECT * FROM service_engine.offer_dirty")
    assert (row["offer"], row["kv_key"], row["agg_key"], row["gen"]) == (
        "sample_counters", "sample.counter.a", "a", 1,
    )
    await executor.execute(WRITER, increment, OfferedCounter, "a")
    assert await db.pool.fetchval("SELECT gen FROM service_engine.offer_dirty") == 2

    async def failing(cx: Any) -> None:
        counter = await cx.load(OfferedCounter, "a")
        counter.increment(1, "x")
        await cx.save(counter)
        raise RuntimeError("the handler fails after the save")

    with pytest.raises(RuntimeError):
        await executor.execute(WRITER, failing)
    assert await db.pool.fetchval("SELECT gen FROM service_engine.offer_dirty") == 2
    # a plain counter carries no offer
    await executor.execute(WRITER, create_counter, CrudCounter, "plain")
    assert await db.pool.fetchval("SELECT count(*) FROM service_engine.offer_dirty") == 1


async def test_the_engine_drains_writes_and_retracts_a_deleted_row(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A running engine publishes each write of an offered noun to the bucket
    (woken by the commit) and retracts a deleted row's key; the markers go."""
    async with bucket_of(nats_server) as (conn, bucket), running(db, conn):
        executor = executor_for(db)
        for key in ("a", "b"):
            await executor.execute(WRITER, create_counter, OfferedCounter, key)
        await executor.execute(WRITER, increment, OfferedCounter, "a", 5)

        async def published() -> bool:
            return await bucket_values(bucket) == {"a": 5, "b": 0}

        await wait_until(published, what="both counters in the bucket")
        await executor.execute(WRITER, delete_counter, OfferedCounter, "b")

        async def retracted() -> bool:
            return await bucket_values(bucket) == {"a": 5}

        await wait_until(retracted, what="the deleted counter retracted")
        await wait_until(
            lambda: _no_markers(db), what="every marker drained"
        )


async def _no_markers(db: Database) -> bool:
    count: int = await db.pool.fetchval("SELECT count(*) FROM service_engine.offer_dirty")
    return count == 0


async def test_the_drain_under_concurrent_mutations_converges_to_the_store(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Writers hammering offered keys while the leader drains never wait on
    it and the bucket converges to exactly the store."""
    async with bucket_of(nats_server) as (conn, bucket), running(db, conn):
        executor = executor_for(db)
        keys = [f"k{i}" for i in range(6)]
        for key in keys:
            await executor.execute(WRITER, create_counter, OfferedCounter, key)

        async def writer(key: str) -> None:
            for _ in range(15):
                await executor.execute(WRITER, increment, OfferedCounter, key)

        await asyncio.gather(*(writer(k) for k in keys))
        assert await store_values(db) == dict.fromkeys(keys, 15)

        async def converged() -> bool:
            return await bucket_values(bucket) == await store_values(db)

        await wait_until(converged, what="the bucket equal to the store")
        await wait_until(lambda: _no_markers(db), what="every marker drained")


async def test_s188_a_lease_expiring_between_revision_and_image_cannot_regress_the_bucket(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s188: the leader is frozen after reading a key's bucket revision and
    before resolving its image; its lease expires and another pod takes over
    and publishes a newer image. The frozen leader's fenced image read fails
    (LeaseLost): it writes nothing, and the bucket holds the newest image."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        await executor.execute(WRITER, create_counter, OfferedCounter, "k")
        a, b = drain_of(db, conn, "pod-a"), drain_of(db, conn, "pod-b")
        for drain in (a, b):
            await drain.bind()
        await a.step()
        assert await bucket_values(bucket) == {"k": 0}

        await executor.execute(WRITER, increment, OfferedCounter, "k")  # value 1: dirty
        pause = OneShotDrainPause()
        a.hook = pause
        async with frozen_pass(a, pause) as frozen:
            await asyncio.wait_for(pause.reached.wait(), 15)
            # A is frozen holding revision r of value 0; its lease expires.
            await db.pool.execute(
                "UPDATE service_engine.leader_slot SET expires_at = clock_timestamp() "
                "WHERE slot = $1",
                CounterOffer().slot,
            )
            await executor.execute(WRITER, increment, OfferedCounter, "k")  # value 2
            reports = await b.step()
            assert reports["sample_counters"].published >= 1
            assert await bucket_values(bucket) == {"k": 2}

            pause.release()
            with pytest.raises(LeaseLost):
                await asyncio.wait_for(frozen, 15)
        assert await bucket_values(bucket) == {"k": 2}
        assert (await bucket.get("sample.counter.k")) is not None


async def test_a_write_between_revision_read_and_image_loses_nothing(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A write landing while the leader sits between the revision read and
    the image read is published by that very pass or the next (its marker
    survives the pass that read it before the write): the bucket converges."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        await executor.execute(WRITER, create_counter, OfferedCounter, "k")
        a = drain_of(db, conn, "pod-a")
        await a.bind()
        pause = OneShotDrainPause()
        a.hook = pause
        step = asyncio.create_task(a.step())
        await asyncio.wait_for(pause.reached.wait(), 5)
        # the frozen drain holds no lock a write waits on
        await asyncio.wait_for(executor.execute(WRITER, increment, OfferedCounter, "k", 7), 2)
        pause.release()
        await asyncio.wait_for(step, 5)
        await a.step()
        assert await bucket_values(bucket) == {"k": 7}
        assert await _no_markers(db)


async def test_leader_failover_mid_drain_finishes_without_regressing(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The leader freezes mid-drain; the other pod takes over once the lease
    expires and finishes the drain; the old leader's resumed pass writes
    nothing. Every key's published values only ever rise (nothing published
    out of order) and the bucket ends equal to the store."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        keys = [f"k{i}" for i in range(5)]
        for key in keys:
            await executor.execute(WRITER, create_counter, OfferedCounter, key)
        a, b = drain_of(db, conn, "pod-a"), drain_of(db, conn, "pod-b")
        for drain in (a, b):
            await drain.bind()
        history: dict[str, list[int]] = {k: [] for k in keys}
        watch = await bucket.watch_prefix(CounterPublished.PREFIX, 1)

        pause = OneShotDrainPause()
        a.hook = pause
        async with frozen_pass(a, pause) as frozen:
            await asyncio.wait_for(pause.reached.wait(), 15)
            for key in keys:
                await executor.execute(WRITER, increment, OfferedCounter, key, 3)

            async def taken_over() -> bool:
                return "sample_counters" in await b.step()

            await wait_until(taken_over, timeout=15, what="pod-b taking the expired lease")
            pause.release()
            with pytest.raises(LeaseLost):
                await asyncio.wait_for(frozen, 15)
        await b.step()
        assert await bucket_values(bucket) == await store_values(db)
        while (change := await watch.next(0.3)) is not None:
            if change.value is not None:
                history[change.key.rpartition(".")[2]].append(json.loads(change.value)["value"])
        await watch.aclose()
        for key, values in history.items():
            assert values == sorted(values), f"{key} published out of order: {values}"
            assert values[-1] == 3


async def test_reconcile_repairs_a_drifted_and_a_foreign_key(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The first drain after boot reconciles: a key edited behind the
    engine's back is re-put from the store, a key with no row behind it is
    retracted, a key missing from the bucket is published."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        for key in ("a", "b"):
            await executor.execute(WRITER, create_counter, OfferedCounter, key)
        await db.pool.execute("DELETE FROM service_engine.offer_dirty")  # as if drained
        await bucket.put("sample.counter.a", b'{"frozen":false,"id":"a","value":99}')
        await bucket.put("sample.counter.ghost", b'{"frozen":false,"id":"ghost","value":1}')
        drain = drain_of(db, conn, "pod-a")
        await drain.bind()
        [report] = (await drain.step()).values()
        assert report.reconciled
        assert await bucket_values(bucket) == {"a": 0, "b": 0}


async def test_a_standalone_relay_refuses_a_rebuilt_buckets_unchanged_versions_until_reset(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A KvDrainRelay used on its own, without an engine (the scenario
    through the running engine is `test_s171_kv_drain_relay_hosted_by_the_engine`),
    publishes monotonically by key and version (a stale
    Put after a newer Retract is a no-op); after an operator truncates and
    rebuilds the bucket, re-staged unchanged versions are refused until
    reset_watermarks clears the watermarks, after which the re-staged set
    converges the rebuilt bucket."""
    async with bucket_of(nats_server) as (conn, bucket):
        relay = KvDrainRelay(db, "people", bucket)
        staged = [KvPut("p.1", 1, b"ann"), KvPut("p.2", 4, b"bob")]
        assert (await relay.drain(staged)).applied == 2
        assert await relay.publish(KvRetract("p.1", 2))
        assert not await relay.publish(KvPut("p.1", 1, b"ann"))  # stale after the retract
        assert await bucket.get("p.1") is None
        assert await relay.watermark("p.1") == 2

        client = await nats.connect(nats_server.url)
        try:
            js = client.jetstream()
            await js.delete_key_value(BUCKET)
        finally:
            await client.close()
        await provision_buckets(nats_server.url, [BUCKET])
        rebuilt = await conn.bind_bucket(BUCKET)
        relay = KvDrainRelay(db, "people", rebuilt)
        restaged = [KvPut("p.2", 4, b"bob"), KvPut("p.3", 1, b"cy")]
        report = await relay.drain(restaged)
        assert (report.applied, report.stale) == (1, 1)
        assert await rebuilt.get("p.2") is None, "an unchanged version re-put before the reset"

        assert await relay.reset_watermarks() == 3
        assert (await relay.drain(restaged)).applied == 2
        assert {k: e.value for k, e in (await rebuilt.read_prefix("p"))[0].items()} == {
            "p.2": b"bob", "p.3": b"cy",
        }


async def test_register_offer_without_a_broker_a_duplicate_and_an_absent_bucket(
    db: Database, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """On an engine without NATS register_offer validates the offer and
    leaves it unpublished, saying so in the log (a slice never asks whether
    NATS is there); with NATS it refuses a second offer of one name; a run
    whose offer bucket is not declared fails loud naming it and holds
    readiness DOWN (the engine never creates a bucket)."""
    config = fast_engine_config("sample", lock_timeout=timedelta(seconds=1))
    bare = await Engine.boot(config, db, None, ReadinessHandle())
    with caplog.at_level(logging.INFO, logger="service_engine.offers.component"):
        bare.register_offer(CounterOffer())
    assert "is not published: the engine has no NATS connection" in caplog.text
    assert bare.offers.drain is None
    async with engine_nats(nats_server) as conn:
        readiness = ReadinessHandle()
        engine = await Engine.boot(config, db, conn, readiness)
        engine.register_offer(CounterOffer())
        with pytest.raises(DuplicateRegistration):
            engine.register_offer(CounterOffer())
        with pytest.raises(BucketMissing, match=BUCKET):
            await asyncio.wait_for(engine.run(), 10)
        assert readiness.holds("offer_boot")


async def test_dirty_offer_republishes_a_row_changed_outside_the_aggregate_api(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A row rewritten by hand-written SQL (an erasure's anonymising UPDATE)
    and dirtied with cx.dirty_offer is re-published from the store; a row
    deleted the same way and dirtied is retracted."""
    async with bucket_of(nats_server) as (conn, bucket), running(db, conn):
        executor = executor_for(db)
        for key in ("a", "b"):
            await executor.execute(WRITER, create_counter, OfferedCounter, key)

        async def both() -> bool:
            return await bucket_values(bucket) == {"a": 0, "b": 0}

        await wait_until(both, what="both counters offered")

        async def by_hand(cx: Any) -> None:
            await cx._ensure_begun()  # the raw statements run inside the pipeline's transaction
            await cx._conn.execute("UPDATE sample_counter_crud SET value = 42 WHERE id = 'a'")
            await cx._conn.execute("DELETE FROM sample_counter_crud WHERE id = 'b'")
            cx.dirty_offer(OfferedCounter, "a")
            cx.dirty_offer(OfferedCounter, "b")

        await executor.execute(WRITER, by_hand)

        async def followed() -> bool:
            return await bucket_values(bucket) == {"a": 42}

        await wait_until(followed, what="the hand-written change offered and retracted")


async def test_the_periodic_reconcile_repairs_a_drifted_bucket_under_a_stable_leader(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Every offer_reconcile period the stable leader reconciles again: a
    value overwritten in the bucket behind its back is put back from the store."""
    async with bucket_of(nats_server) as (conn, bucket), running(
        db, conn, offer_reconcile=timedelta(milliseconds=300)
    ):
        executor = executor_for(db)
        await executor.execute(WRITER, create_counter, OfferedCounter, "a")

        async def offered() -> bool:
            return await bucket_values(bucket) == {"a": 0}

        await wait_until(offered, what="the counter offered")
        await bucket.put("sample.counter.a", b'{"frozen":true,"id":"a","value":7}')
        await wait_until(offered, what="the drifted value repaired")


class FlakyCounterOffer(CounterOffer):
    """`CounterOffer` whose publish raises for key ``a`` (same NAME, so it
    drains the same markers)."""

    def publish(self, row: OfferedCounter) -> CounterPublished | None:
        if row.key == "a":
            raise RuntimeError("a bad row")
        return super().publish(row)


async def test_a_key_whose_publish_raises_never_stops_another_key(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A key whose publish raises is isolated: the rest of the batch reaches
    the bucket, the bad key stays dirty and counted, and it moves to the back
    of the claim order so even a one-key batch reaches the next key."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        for key in ("a", "b", "c"):
            await executor.execute(WRITER, create_counter, OfferedCounter, key)
        for batch in (256, 1):
            await db.pool.execute("DELETE FROM service_engine.offer_dirty")
            for key in ("a", "b", "c"):
                await executor.execute(WRITER, increment, OfferedCounter, key)
            drain = OfferDrain(
                db, conn, f"pod-{batch}",
                OfferDrainBounds(batch=batch, lease=timedelta(seconds=5)),
            )
            drain.add(FlakyCounterOffer())
            await drain.bind()
            for _ in range(3):
                await drain.step()
            values = await bucket_values(bucket)
            assert "a" not in values and values == {k: v for k, v in (await store_values(db)).items()
                                                    if k != "a"}, batch
            rows = await db.pool.fetch("SELECT kv_key FROM service_engine.offer_dirty")
            assert [r["kv_key"] for r in rows] == ["sample.counter.a"], batch
            assert drain.failures["sample_counters"] >= 1
            assert set(drain.failing) == {("sample_counters", "sample.counter.a")}
            await drain.aclose()


async def test_a_publish_that_raises_is_counted_in_the_offer_failure_metric(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Every failed publish counts once in
    ``service_engine_offer_publish_failures_total{offer}``, in step with
    `OfferDrain.failures`; keys that publish count nothing. The engine's
    drain counts into the engine's metrics."""
    name = "service_engine_offer_publish_failures_total"
    async with bucket_of(nats_server) as (conn, bucket):
        async with running(db, conn) as engine:
            assert engine.offers.drain is not None and engine.offers.drain.metrics is engine.metrics
        executor = executor_for(db)
        for key in ("a", "b", "c"):
            await executor.execute(WRITER, create_counter, OfferedCounter, key)
        metrics = Metrics("sample", "pod-metrics")
        drain = OfferDrain(
            db, conn, "pod-metrics", OfferDrainBounds(lease=timedelta(seconds=5)), metrics=metrics
        )
        drain.add(FlakyCounterOffer())
        await drain.bind()
        try:
            await drain.step()
            assert metrics.sample(name, offer="sample_counters") == 1
            assert await bucket_values(bucket) == {"b": 0, "c": 0}
            await drain.step()
            await drain.step()
            assert metrics.sample(name, offer="sample_counters") == 3
            assert drain.failures == {"sample_counters": 3}
        finally:
            await drain.aclose()
            metrics.shutdown()


async def test_concurrent_relay_publishes_of_v3_and_v2_leave_v3_in_the_bucket(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Two publishers of one key (v3 and v2), each held between its read and
    its put while the other runs, end with v3 in the bucket and watermark 3,
    whichever reads first; a writer landing between a publisher's read and
    its put (outside the relay's lock) wins the compare-and-set, so the stale
    v2 never overwrites it."""
    async with bucket_of(nats_server) as (_conn, bucket):
        for first, key in ((2, "p.a"), (3, "p.b")):
            held = asyncio.Event()
            release = asyncio.Event()

            async def hook(
                change: KvPut | KvRetract,
                first: int = first, held: asyncio.Event = held, release: asyncio.Event = release,
            ) -> None:
                if change.version == first and not held.is_set():
                    held.set()
                    await release.wait()

            relay = KvDrainRelay(db, f"race-{key}", bucket, hook=hook)
            early = asyncio.create_task(relay.publish(KvPut(key, first, f"v{first}".encode())))
            await asyncio.wait_for(held.wait(), 10)
            other = 5 - first
            late = asyncio.create_task(relay.publish(KvPut(key, other, f"v{other}".encode())))

            async def waiting() -> bool:
                count: int = await db.pool.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                return count >= 1

            await wait_until(waiting, what="the second publisher waiting on the key")
            release.set()
            results = await asyncio.wait_for(asyncio.gather(early, late), 10)
            assert list(results) == ([True, True] if first == 2 else [True, False])
            entry = await bucket.get(key)
            assert entry is not None and entry.value == b"v3", first
            assert await relay.watermark(key) == 3

        # a writer outside the lock lands between v2's read and its put
        async def foreign(change: KvPut | KvRetract) -> None:
            if change.version == 2:
                await bucket.put("p.c", b"v3")
                await db.pool.execute(
                    "INSERT INTO service_engine.kv_relay_watermark (relay, key, version, retracted)"
                    " VALUES ('race-c', 'p.c', 3, false)"
                )

        await bucket.put("p.c", b"v1")
        stale = KvDrainRelay(db, "race-c", bucket, hook=foreign)
        assert not await stale.publish(KvPut("p.c", 2, b"v2"))
        entry = await bucket.get("p.c")
        assert entry is not None and entry.value == b"v3"
        assert await stale.watermark("p.c") == 3


async def test_the_offer_drain_converges_a_rebuilt_bucket_without_a_revision_watermark(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """The offer path keeps no KV-revision watermark (a rebuilt bucket's
    revisions restart at 1 and would freeze it): it publishes by
    compare-and-set on the observed revision, and after an operator truncates
    and rebuilds the bucket the next tenure's reconcile re-puts every key,
    then later writes keep landing."""
    async with bucket_of(nats_server) as (conn, bucket):
        executor = executor_for(db)
        for key in ("a", "b"):
            await executor.execute(WRITER, create_counter, OfferedCounter, key)
        await executor.execute(WRITER, increment, OfferedCounter, "a", 3)
        drain = drain_of(db, conn, "pod-1")
        await drain.bind()
        await drain.step()
        assert await bucket_values(bucket) == {"a": 3, "b": 0}
        await drain.aclose()
        assert await db.pool.fetchval(
            "SELECT count(*) FROM service_engine.kv_relay_watermark WHERE relay LIKE 'offer:%'"
        ) == 0

        client = await nats.connect(nats_server.url)
        try:
            await client.jetstream().delete_key_value(BUCKET)
        finally:
            await client.close()
        await provision_buckets(nats_server.url, [BUCKET])
        rebuilt = await conn.bind_bucket(BUCKET)
        drain = drain_of(db, conn, "pod-2")
        await drain.bind()
        await drain.step()  # a new tenure: reconcile re-stages every key
        assert await bucket_values(rebuilt) == {"a": 3, "b": 0}
        await executor.execute(WRITER, increment, OfferedCounter, "b", 2)
        await drain.step()
        assert await bucket_values(rebuilt) == {"a": 3, "b": 2}
        await drain.aclose()
