"""A `KvDrainRelay` hosted by the running engine, against a real Postgres
and a spawned nats-server: registered before ``run``, its bucket bound at
``run``, drained on the beat by the pod holding its lease (s171)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import nats
import pytest

from service_engine import Database, Engine, ReadinessHandle
from service_engine.embedded import EmbeddedNats, provision_buckets
from service_engine.errors import ConfigError, DuplicateRegistration, WorkerStopped
from service_engine.messaging.nats import BucketMissing, KvBucket
from service_engine.offers import KvPut, KvRetract
from service_engine.offers.relay import KvChangeSet

from ..support.harness import fast_engine_config, wait_until
from ..support.nats_support import engine_nats

BUCKET = "people_published"
BOUND = 10.0


class StagedChanges:
    """A source of the published language: changes staged in memory, in
    order, until the relay acknowledges them."""

    def __init__(self) -> None:
        self.queue: list[KvChangeSet] = []
        self.acknowledged = 0

    def stage(self, *changes: KvChangeSet) -> None:
        self.queue.extend(changes)

    async def pending(self, limit: int) -> Sequence[KvChangeSet]:
        return self.queue[:limit]

    async def published(self, changes: Sequence[KvChangeSet]) -> None:
        done = len(changes)
        assert self.queue[:done] == list(changes)
        del self.queue[:done]
        self.acknowledged += done


@contextlib.asynccontextmanager
async def hosting(
    db: Database, server: EmbeddedNats, source: StagedChanges, pod_id: str = "pod-a"
) -> AsyncIterator[Engine]:
    """An engine hosting relay ``people`` over ``source``, running and UP."""
    async with engine_nats(server) as conn:
        readiness = ReadinessHandle()
        config = fast_engine_config("sample", pod_id=pod_id, lock_timeout=timedelta(seconds=1))
        engine = await Engine.boot(config, db, conn, readiness)
        engine.register_kv_relay("people", BUCKET, source)
        task = asyncio.create_task(engine.run())
        try:
            await wait_until(lambda: readiness.is_up or task.done(), what="the engine UP")
            if task.done():
                task.result()
            yield engine
        finally:
            engine.shutdown()
            with contextlib.suppress(WorkerStopped):
                await asyncio.wait_for(task, BOUND)


async def bucket_values(bucket: KvBucket) -> dict[str, bytes]:
    entries, _ = await bucket.read_prefix("p")
    return {key: entry.value for key, entry in entries.items()}


async def _drained(source: StagedChanges) -> bool:
    return not source.queue


async def test_s171_kv_drain_relay_hosted_by_the_engine(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s171 through the running engine: the relay registered on the engine
    binds its bucket at run and the pod holding ``kv_relay:people``
    publishes the source's changes on the beat, monotonically by key and
    version (a stale Put after a newer Retract is a no-op, yet
    acknowledged); after an operator truncates and rebuilds the bucket,
    re-staged unchanged versions are refused until ``reset_watermarks``,
    after which the re-staged set converges the rebuilt bucket."""
    await provision_buckets(nats_server.url, [BUCKET])
    source = StagedChanges()
    async with hosting(db, nats_server, source) as engine, engine_nats(nats_server) as reader:
        bucket = await reader.bind_bucket(BUCKET)
        hosted = engine.kv_relay("people")
        source.stage(KvPut("p.1", 1, b"ann"), KvPut("p.2", 4, b"bob"))
        await wait_until(lambda: _drained(source), timeout=BOUND, what="the first drain")
        assert await bucket_values(bucket) == {"p.1": b"ann", "p.2": b"bob"}
        holder = await db.pool.fetchval(
            "SELECT holder FROM service_engine.leader_slot WHERE slot = 'kv_relay:people'"
        )
        assert holder == "pod-a"

        source.stage(KvRetract("p.1", 2), KvPut("p.1", 1, b"ann"))  # the Put is stale
        await wait_until(lambda: _drained(source), timeout=BOUND, what="the retract")
        assert await bucket.get("p.1") is None
        assert await hosted.relay.watermark("p.1") == 2
        assert source.acknowledged == 4

        client = await nats.connect(nats_server.url)
        try:
            await client.jetstream().delete_key_value(BUCKET)
        finally:
            await client.close()
        await provision_buckets(nats_server.url, [BUCKET])
        rebuilt = await reader.bind_bucket(BUCKET)
        restaged = (KvPut("p.2", 4, b"bob"), KvPut("p.3", 1, b"cy"))
        source.stage(*restaged)
        await wait_until(lambda: _drained(source), timeout=BOUND, what="the re-staged set")
        assert await bucket_values(rebuilt) == {"p.3": b"cy"}, "an unchanged version re-put"

        assert await hosted.relay.reset_watermarks() == 3
        source.stage(*restaged)
        await wait_until(lambda: _drained(source), timeout=BOUND, what="the set after the reset")
        assert await bucket_values(rebuilt) == {"p.2": b"bob", "p.3": b"cy"}


async def test_the_hosted_relay_fails_over_to_the_next_lease_holder(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Two pods host the relay: only the lease holder drains; once it shut
    down (handing the lease over), the other pod drains what is staged."""
    await provision_buckets(nats_server.url, [BUCKET])
    source = StagedChanges()
    async with contextlib.AsyncExitStack() as pods, engine_nats(nats_server) as reader:
        bucket = await reader.bind_bucket(BUCKET)
        leader_pod = contextlib.AsyncExitStack()
        leader = await leader_pod.enter_async_context(hosting(db, nats_server, source, "pod-a"))
        pods.push_async_callback(leader_pod.aclose)
        await wait_until(lambda: leader.kv_relay("people").lease.current is not None,
                         timeout=BOUND, what="pod-a leads")
        standby = await pods.enter_async_context(hosting(db, nats_server, source, "pod-b"))
        source.stage(KvPut("p.1", 1, b"ann"))
        await wait_until(lambda: _drained(source), timeout=BOUND, what="a drain")
        assert standby.kv_relay("people").lease.current is None

        await leader_pod.aclose()
        source.stage(KvPut("p.1", 2, b"ann 2"))
        await wait_until(lambda: _drained(source), timeout=BOUND, what="the standby's drain")
        assert await bucket_values(bucket) == {"p.1": b"ann 2"}
        assert standby.kv_relay("people").lease.current is not None


async def test_register_kv_relay_refusals(db: Database, nats_server: EmbeddedNats) -> None:
    """register_kv_relay refuses an engine without NATS, a second relay of
    one name and a source without pending/published; a run whose bucket is
    not declared fails loud naming it and holds readiness DOWN."""
    config = fast_engine_config("sample", lock_timeout=timedelta(seconds=1))
    bare = await Engine.boot(config, db, None, ReadinessHandle())
    with pytest.raises(ConfigError, match="needs NATS"):
        bare.register_kv_relay("people", BUCKET, StagedChanges())
    async with engine_nats(nats_server) as conn:
        readiness = ReadinessHandle()
        engine = await Engine.boot(config, db, conn, readiness)
        engine.register_kv_relay("people", "absent_bucket", StagedChanges())
        with pytest.raises(DuplicateRegistration):
            engine.register_kv_relay("people", BUCKET, StagedChanges())
        with pytest.raises(ConfigError, match="pending"):
            engine.register_kv_relay("other", BUCKET, object())  # type: ignore[arg-type]
        with pytest.raises(BucketMissing, match="absent_bucket"):
            await asyncio.wait_for(engine.run(), BOUND)
        assert readiness.holds("kv_relay_boot")
