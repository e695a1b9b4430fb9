"""Offers and mirrors: the leader's drain and the mirror's projection beside raw KV, in one run.

    python bench/offers.py [--keys 2000] [--samples 200] [--rate 20]

Starts a durable embedded Postgres (fsync on) and a nats-server, provisions
the engine's, the conformance samples' and the example service's tables and
two KV buckets, and prints side by side:

* **drain throughput**: ``--keys`` offered counters dirtied while the drain
  is stopped, then drained by one leader (claim, revision read, fenced image
  read, create/CAS, fenced watermark + marker) — keys/s — against raw KV
  puts of the same values from one client (sequential, and 64 in flight);
* **commit -> KV visible**: single writes at ``--rate``/s through the write
  pipeline of a running engine, from the commit returning to the value
  arriving on a watch of the bucket — p50/p99 — against a raw put of the
  same value from the put call to its arrival on the watch;
* **mirror**: a person put into the roster bucket -> ``known_persons``
  committed by the leader's projection -> the live Upsert on a session over
  the roster's people view — p50/p99 of both stages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.support.sample_counter import (  # noqa: E402
    WRITER,
    CrudCounter,
    CrudCounterStore,
    create_counter,
    increment,
)
from example_service.kernel import Principal  # noqa: E402
from example_service.slices.roster.domain import ROSTER  # noqa: E402
from example_service.slices.roster.views import PEOPLE, PeopleQuery, PeopleView  # noqa: E402
from service_engine import Engine, EngineConfig, Query, ReadinessHandle, WindowSpec  # noqa: E402
from service_engine.db import Database, connect_pool, service_migrations  # noqa: E402
from service_engine.db.types import Conn  # noqa: E402
from service_engine.embedded import (  # noqa: E402
    EmbeddedNats,
    EmbeddedPostgres,
    provision_buckets,
    provision_database,
)
from service_engine.errors import WorkerStopped  # noqa: E402
from service_engine.messaging.nats import KvBucket, Nats, open_nats  # noqa: E402
from service_engine.offers import Offer, Published  # noqa: E402
from service_engine.offers.drain import OfferDrain, OfferDrainBounds  # noqa: E402
from service_engine.pipeline import MutationExecutor  # noqa: E402
from service_engine.render import Upsert  # noqa: E402

BUCKET = "BENCH_published"
ROSTER_BUCKET = "PUBLISHED_twin"


class BenchCounter(CrudCounter):
    pass


BenchCounter.Store = CrudCounterStore(BenchCounter)


class CounterPublished(Published):
    BUCKET: ClassVar[str] = BUCKET
    PREFIX: ClassVar[str] = "bench.counter"
    id: str
    value: int
    frozen: bool


class CounterOffer(Offer[BenchCounter, str, CounterPublished]):
    NAME = "bench_counters"
    ROW = BenchCounter
    PUBLISHED = CounterPublished

    def publish(self, row: BenchCounter) -> CounterPublished | None:
        return CounterPublished(id=row.key, value=row.value, frozen=row.frozen)

    async def keys(self, conn: Conn) -> Iterable[str]:
        return [r["id"] for r in await conn.fetch("SELECT id FROM sample_counter_crud")]


def percentiles(samples: list[float]) -> str:
    if not samples:
        return "no samples"
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered) * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms"


def config(pod: str, **overrides: Any) -> EngineConfig:
    settings: dict[str, Any] = {"service": "bench", "pod_id": pod, **overrides}
    return EngineConfig(**settings)


@contextlib.asynccontextmanager
async def running(engine: Engine) -> Any:
    task = asyncio.create_task(engine.run())
    try:
        deadline = time.monotonic() + 30
        while not engine.readiness.is_up:
            if task.done():
                task.result()
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine not UP: {engine.readiness.current().to_json()}")
            await asyncio.sleep(0.01)
        yield engine
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)


async def drain_throughput(db: Database, nats: Nats, bucket: KvBucket, keys: int) -> None:
    executor = MutationExecutor(db, config("writer"), None)  # type: ignore[arg-type]
    names = [f"k{i}" for i in range(keys)]
    for name in names:
        await executor.execute(WRITER, create_counter, BenchCounter, name)
    drain = OfferDrain(db, nats, "bench-leader", OfferDrainBounds())
    drain.add(CounterOffer())
    await drain.bind()
    started = time.perf_counter()
    await drain.step()
    drained = time.perf_counter() - started
    left = await db.pool.fetchval("SELECT count(*) FROM service_engine.offer_dirty")
    assert left == 0, f"{left} keys left dirty"
    for name in names:
        await executor.execute(WRITER, increment, BenchCounter, name)
    started = time.perf_counter()
    await drain.step()  # the same leader: no reconcile due
    steady = time.perf_counter() - started
    await drain.aclose()

    values = [CounterPublished(id=n, value=1, frozen=False).encode() for n in names]
    started = time.perf_counter()
    for name, value in zip(names, values, strict=True):
        await bucket.put(f"raw.seq.{name}", value)
    sequential = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(0, keys, 64):
        await asyncio.gather(*(
            bucket.put(f"raw.par.{n}", v)
            for n, v in zip(names[i:i + 64], values[i:i + 64], strict=True)
        ))
    parallel = time.perf_counter() - started
    print(f"drain throughput ({keys} dirty keys, one leader)")
    print(f"  offer drain, first pass    {keys / drained:10.0f} keys/s  (with its reconcile)")
    print(f"  offer drain, steady        {keys / steady:10.0f} keys/s")
    print(f"  raw KV put, sequential     {keys / sequential:10.0f} puts/s")
    print(f"  raw KV put, 64 in flight   {keys / parallel:10.0f} puts/s")


async def visible_latency(
    db: Database, nats: Nats, bucket: KvBucket, samples: int, rate: float
) -> None:
    engine = await Engine.boot(
        config("leader", beat_interval=0.2, lease=2), db, nats, ReadinessHandle()
    )
    engine.register_offer(CounterOffer())
    arrivals: dict[tuple[str, bytes], float] = {}
    watch = await bucket.watch_prefix("", await bucket.last_revision() + 1)

    async def watcher() -> None:
        while True:
            change = await watch.next(5.0)
            if change is not None and change.value is not None:
                arrivals[(change.key, change.value)] = time.perf_counter()

    reader = asyncio.create_task(watcher())
    offered: list[float] = []
    raw: list[float] = []
    try:
        async with running(engine):
            executor = engine.mutation_executor()
            await asyncio.sleep(0.5)
            for i in range(samples):
                key = f"k{i % 50}"
                await executor.execute(WRITER, increment, BenchCounter, key)
                committed = time.perf_counter()
                row = await db.pool.fetchrow(
                    "SELECT value, frozen FROM sample_counter_crud WHERE id = $1", key
                )
                image = CounterPublished(id=key, value=row["value"], frozen=row["frozen"]).encode()
                want = (f"bench.counter.{key}", image)
                raw_value = json.dumps({"raw": i}).encode()
                put_at = time.perf_counter()
                await bucket.put(f"raw.lat.{i % 50}", raw_value)
                deadline = time.monotonic() + 5
                while (want not in arrivals or (f"raw.lat.{i % 50}", raw_value) not in arrivals):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sample {i} never became visible")
                    await asyncio.sleep(0.0005)
                offered.append(arrivals[want] - committed)
                raw.append(arrivals[(f"raw.lat.{i % 50}", raw_value)] - put_at)
                await asyncio.sleep(1 / rate)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await watch.aclose()
    print(f"commit -> KV visible ({samples} writes at {rate:g}/s, running engine)")
    print(f"  offer (commit -> watch)    {percentiles(offered)}")
    print(f"  raw KV put (put -> watch)  {percentiles(raw)}")


async def mirror_latency(db: Database, nats: Nats, samples: int, rate: float) -> None:
    roster = await nats.bind_bucket(ROSTER_BUCKET)
    await roster.put("twin.person.seed", b'{"id":"seed","name":"Seed","org":"acme"}')
    engine = await Engine.boot(
        config("mirror", beat_interval=0.2, lease=2), db, nats, ReadinessHandle()
    )
    engine.register_projector(PeopleView())
    engine.register_mirror(ROSTER)
    committed_at: list[float] = []
    delivered_at: list[float] = []
    async with running(engine):
        runtime = engine.mirror("roster")
        principal = Principal(id="bench", actor="bench", org="acme", roles=frozenset())
        stream = await engine.attach(principal, PEOPLE, WindowSpec(Query(PeopleQuery(limit=500))))
        await stream.next()  # the Reset
        try:
            for i in range(samples):
                runtime.projected.clear()
                value = json.dumps({"id": f"p{i}", "name": f"P{i}", "org": "acme"}).encode()
                put_at = time.perf_counter()
                await roster.put(f"twin.person.p{i % 400}", value)
                await asyncio.wait_for(runtime.projected.wait(), 5)
                committed = time.perf_counter()
                while True:
                    delta = await asyncio.wait_for(stream.next(), 5)
                    if isinstance(delta, Upsert) and delta.view.name == f"P{i}":
                        break
                delivered = time.perf_counter()
                committed_at.append(committed - put_at)
                delivered_at.append(delivered - put_at)
                await asyncio.sleep(1 / rate)
        finally:
            await stream.aclose()
    print(f"mirror ({samples} puts at {rate:g}/s, leader pod, one live session)")
    print(f"  KV put -> known_* committed   {percentiles(committed_at)}")
    print(f"  KV put -> live Upsert         {percentiles(delivered_at)}")


async def main(keys: int, samples: int, rate: float) -> None:
    from service_engine.offers.model import register_offer_type

    register_offer_type(CounterOffer())
    with tempfile.TemporaryDirectory(prefix="bench-offers-") as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", durable=True)
        server = EmbeddedNats(Path(tmp) / "nats", sync_always=False)
        await asyncio.to_thread(pg.start)
        await asyncio.to_thread(server.start)
        try:
            migrations = [
                *service_migrations(REPO / "conformance/migrations"),
                *service_migrations(REPO / "example_service/migrations"),
            ]
            provisioned = await provision_database(pg, "bench", extra_migrations=migrations)
            await provision_buckets(server.url, [BUCKET, ROSTER_BUCKET])
            db = await connect_pool(provisioned.app_url, min_size=4, max_size=20)
            nats = await open_nats(server.url)
            try:
                await drain_throughput(db, nats, await nats.bind_bucket(BUCKET), keys)
                await visible_latency(db, nats, await nats.bind_bucket(BUCKET), samples, rate)
                await mirror_latency(db, nats, samples, rate)
            finally:
                await nats.aclose()
                await db.aclose()
        finally:
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(pg.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    asyncio.run(main(args.keys, args.samples, args.rate))
