"""The NATS lanes' speed figures.

    python bench/lanes.py [--puts 200] [--sessions 1,1000] [--interval-ms 10]

Starts a durable embedded Postgres (fsync on) and a nats-server with
``sync_interval: always`` (as production should run it), provisions the
presence bucket the way an operator does, then measures:

**Presence (lane B)**, put -> subscriber delta:

* **engine**: one engine with one presence lane (Unrestricted, so every
  session shares one load) and N live sessions watching it. The bench puts
  ``--puts`` distinct keys through `PresenceHandle.put`, one every
  ``--interval-ms``, and times each put's start to its Upsert on every
  session (p50 / p99 over every (put, session) pair) and to its Upsert on
  the last session (the fan-out complete);
* **raw KV**: the same puts as raw JetStream publishes with ``Nats-TTL`` to
  the bucket's subject, timed to one ordered-consumer watcher on the
  bucket's stream: the broker's ceiling for this path, no engine.

**Accumulated lane (lane A)**, chunks folded durable per second
(`chunk_section`), ``--chunks`` chunks of ``--chunk-bytes`` over
``--chunk-keys`` keys, side by side in one run:

* **push_chunk**: `Engine.push_chunk` with ``--in-flight`` calls at once;
  each returns its Durable receipt once its flush committed;
* **NATS ingress**: the chunks published as lane frames on
  ``stream.{service}.{key}`` by a separate connection, folded by the pod's
  ephemeral consumer into Postgres: a backlog published before the pod
  starts (the fold alone: start to the last chunk durable), and a live
  publish (first publish to the last chunk durable, the publisher's acks
  included);
* **raw JetStream**: the same payloads published to a plain stream and
  consumed (pull, explicit ack) by another connection: the broker's ceiling;
* **raw Postgres**: the same rows inserted into ``accumulator_chunk``, one
  transaction per row with ``--in-flight`` at once, and one multi-row insert
  per ``--in-flight`` rows: the database's ceiling, no engine.

Each section is its own function (`presence_section`, ...), so a lane's
figures can be added without touching another's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nats  # noqa: E402
from nats.js.api import ConsumerConfig, DeliverPolicy  # noqa: E402

from service_engine import Engine, EngineConfig, ReadinessHandle  # noqa: E402
from service_engine.db import Database, connect_pool  # noqa: E402
from service_engine.embedded import (  # noqa: E402
    EmbeddedNats,
    EmbeddedPostgres,
    provision_database,
    provision_presence_bucket,
)
from service_engine.lanes import PresenceEntry, PresenceProjector  # noqa: E402
from service_engine.messaging.nats import Nats, open_nats  # noqa: E402
from service_engine.render import Query, Unrestricted, Upsert, WindowSpec  # noqa: E402

SERVICE = "bench"
BUCKET = f"EPHEMERAL_{SERVICE}"


@dataclass(frozen=True)
class Who:
    id: str


class Typing(PresenceProjector[Any, Who, None]):
    NAME = "typing"
    VISIBILITY = Unrestricted()

    def project(self, row: PresenceEntry, principal: Who) -> Any:
        return row.value


def _ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Figures:
    label: str
    p50: float
    p99: float
    last_p50: float
    last_p99: float
    missing: int

    def row(self) -> str:
        return (f"  {self.label:<28} p50 {self.p50:7.2f} ms  p99 {self.p99:7.2f} ms   "
                f"fan-out done p50 {self.last_p50:7.2f} ms  p99 {self.last_p99:7.2f} ms"
                f"   missing {self.missing}")


# -- infrastructure ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def infrastructure(root: Path) -> AsyncIterator[tuple[Database, EmbeddedNats]]:
    postgres = EmbeddedPostgres(root / "pg")
    server = EmbeddedNats(root / "nats", sync_always=True)
    await asyncio.to_thread(postgres.start)
    await asyncio.to_thread(server.start)
    try:
        provisioned = await provision_database(postgres, "bench")
        await provision_presence_bucket(server.url, SERVICE)
        db = await connect_pool(provisioned.app_url, max_size=10)
        try:
            yield db, server
        finally:
            await db.aclose()
    finally:
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(postgres.stop)


# -- presence ----------------------------------------------------------------------------------


async def _engine_puts(db: Database, conn: Nats, sessions: int, puts: int,
                       interval: float, round_: int) -> Figures:
    config = EngineConfig(
        service=SERVICE, beat_interval=timedelta(milliseconds=200), lease=timedelta(seconds=2),
        window_capacity=max(1024, puts * 2),
    )
    readiness = ReadinessHandle()
    engine = await Engine.boot(config, db, conn, readiness)
    handle = engine.register_presence(Typing(), timedelta(seconds=120))
    task = asyncio.create_task(engine.run())
    started: dict[str, float] = {}
    arrivals: dict[str, list[float]] = {}
    readers: list[asyncio.Task[None]] = []
    try:
        while not readiness.is_up:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        assert engine.lanes.presence_lanes is not None
        await engine.lanes.presence_lanes.seeded.wait()
        streams = [
            await engine.attach(Who(f"p{i}"), "typing", WindowSpec(Query(None)))
            for i in range(sessions)
        ]
        for stream in streams:
            await stream.next()  # the Reset

        complete = asyncio.Event()
        expected = puts * sessions
        seen = 0

        async def read(stream: Any) -> None:
            nonlocal seen
            while True:
                delta = await stream.next()
                if isinstance(delta, Upsert):
                    arrivals.setdefault(delta.key, []).append(time.perf_counter())
                    seen += 1
                    if seen >= expected:
                        complete.set()

        readers = [asyncio.create_task(read(s)) for s in streams]
        for i in range(puts):
            key = f"r{round_}.k{i}"
            started[f'"{key}"'] = time.perf_counter()
            await handle.put(key, {"i": i})
            await asyncio.sleep(interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(complete.wait(), 10)
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        engine.shutdown()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
    every = [t - started[k] for k, ts in arrivals.items() if k in started for t in ts]
    last = [max(ts) - started[k] for k, ts in arrivals.items() if k in started and len(ts) == sessions]
    missing = sum(sessions - len(arrivals.get(k, ())) for k in started)
    return Figures(f"engine, {sessions} session(s)", _ms(every, 0.5), _ms(every, 0.99),
                   _ms(last, 0.5), _ms(last, 0.99), missing)


async def _raw_puts(server: EmbeddedNats, puts: int, interval: float) -> Figures:
    client = await nats.connect(server.url)
    js = client.jetstream()
    started: dict[str, float] = {}
    arrived: dict[str, float] = {}
    info = await js.stream_info(f"KV_{BUCKET}")
    sub = await js.subscribe(
        f"$KV.{BUCKET}.raw.>", stream=f"KV_{BUCKET}", ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                              opt_start_seq=int(info.state.last_seq) + 1),
    )

    complete = asyncio.Event()

    async def read() -> None:
        while True:
            msg = await sub.next_msg(timeout=30)
            arrived[msg.subject] = time.perf_counter()
            if len(arrived) >= puts:
                complete.set()

    reader = asyncio.create_task(read())
    try:
        for i in range(puts):
            subject = f"$KV.{BUCKET}.raw.k{i}"
            started[subject] = time.perf_counter()
            await js.publish(subject, b'{"i":%d}' % i, headers={"Nats-TTL": "120s"})
            await asyncio.sleep(interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(complete.wait(), 10)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await sub.unsubscribe()
        await client.close()
    lat = [arrived[s] - started[s] for s in started if s in arrived]
    return Figures("raw KV publish -> watch", _ms(lat, 0.5), _ms(lat, 0.99),
                   _ms(lat, 0.5), _ms(lat, 0.99), len(started) - len(arrived))


async def presence_section(db: Database, server: EmbeddedNats, args: argparse.Namespace) -> None:
    """Presence put -> subscriber delta, engine beside raw KV, per session count."""
    interval = args.interval_ms / 1000
    print(f"presence put -> Upsert ({args.puts} puts, one every {args.interval_ms} ms)")
    print((await _raw_puts(server, args.puts, interval)).row())
    conn = await open_nats(server.url)
    try:
        for round_, sessions in enumerate(int(n) for n in args.sessions.split(",")):
            print((await _engine_puts(db, conn, sessions, args.puts, interval, round_)).row())
    finally:
        await conn.aclose()


# -- the accumulated lane (lane A) ---------------------------------------------------------------

CHUNK_STREAM = f"STREAMING_{SERVICE}"
RAW_STREAM = "BENCH_RAW_CHUNKS"


def _chunk_plan(args: argparse.Namespace, prefix: str) -> list[tuple[str, int, bytes]]:
    keys = max(1, args.chunk_keys)
    payload = b"x" * args.chunk_bytes
    per_key = -(-args.chunks // keys)
    return [(f"{prefix}{k}", seq, payload) for k in range(keys) for seq in range(per_key)][
        : args.chunks
    ]


def _rate(label: str, count: int, seconds: float) -> str:
    return f"  {label:<34} {count / seconds:10.0f} chunks/s   ({count} in {seconds:6.2f} s)"


async def _durable_count(db: Database, prefix: str) -> int:
    value = await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.accumulator_chunk WHERE key LIKE $1", prefix + "%"
    )
    return int(value)


async def _bench_push_chunk(engine: Engine, plan: list[tuple[str, int, bytes]],
                            in_flight: int) -> float:
    from service_engine.lanes import Accumulator

    accumulator: Accumulator[Any] = engine.lanes.accumulators.resolve(None)
    gate = asyncio.Semaphore(in_flight)

    async def one(key: str, seq: int, chunk: bytes) -> None:
        async with gate:
            await engine.push_chunk(accumulator, key, seq, chunk)

    started = time.perf_counter()
    await asyncio.gather(*(one(*item) for item in plan))
    return time.perf_counter() - started


async def _publish_frames(server: EmbeddedNats, plan: list[tuple[str, int, bytes]]) -> None:
    from service_engine.lanes import ChunkFrame, ChunkSeq, encode_frame

    client = await nats.connect(server.url)
    try:
        js = client.jetstream()
        pending = []
        for key, seq, chunk in plan:
            subject, headers, payload = encode_frame(SERVICE, ChunkFrame(key, ChunkSeq(seq), chunk))
            pending.append(js.publish(subject, payload, headers=headers))
            if len(pending) >= 256:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await client.close()


async def _until_durable(db: Database, prefix: str, count: int) -> None:
    while await _durable_count(db, prefix) < count:  # noqa: ASYNC110 (an outside observer polls)
        await asyncio.sleep(0.005)


async def _bench_ingress(db: Database, server: EmbeddedNats,
                         plan: list[tuple[str, int, bytes]], prefix: str) -> float:
    started = time.perf_counter()
    await _publish_frames(server, plan)
    await _until_durable(db, prefix, len(plan))
    return time.perf_counter() - started


async def _bench_raw_jetstream(server: EmbeddedNats, plan: list[tuple[str, int, bytes]]) -> float:
    from nats.js.api import AckPolicy, StreamConfig

    producer = await nats.connect(server.url)
    consumer = await nats.connect(server.url)
    try:
        js = producer.jetstream()
        await js.add_stream(StreamConfig(name=RAW_STREAM, subjects=["rawchunk.>"]))
        sub = await consumer.jetstream().pull_subscribe(
            "rawchunk.>", stream=RAW_STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL),
        )
        acked = 0

        async def consume() -> None:
            nonlocal acked
            while acked < len(plan):
                try:
                    msgs = await sub.fetch(256, timeout=1)
                except TimeoutError:
                    continue
                await asyncio.gather(*(m.ack() for m in msgs))
                acked += len(msgs)

        started = time.perf_counter()
        reader = asyncio.create_task(consume())
        pending = []
        for key, seq, chunk in plan:
            pending.append(js.publish(f"rawchunk.{key}", chunk, headers={"Br-Chunk-Seq": str(seq)}))
            if len(pending) >= 256:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
        await reader
        return time.perf_counter() - started
    finally:
        await producer.close()
        await consumer.close()


async def _bench_raw_insert(db: Database, plan: list[tuple[str, int, bytes]], in_flight: int,
                            batched: bool) -> float:
    sql = ("INSERT INTO service_engine.accumulator_chunk (accumulator, key, seq, chunk) "
           "SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[])")
    started = time.perf_counter()
    if batched:
        for i in range(0, len(plan), in_flight):
            part = plan[i:i + in_flight]
            await db.pool.execute(sql, ["raw"] * len(part), [k for k, _, _ in part],
                                  [s for _, s, _ in part], [c for _, _, c in part])
    else:
        gate = asyncio.Semaphore(min(in_flight, 9))  # the pool's size bounds it anyway

        async def one(key: str, seq: int, chunk: bytes) -> None:
            async with gate:
                await db.pool.execute(sql, ["raw1"], [key], [seq], [chunk])

        await asyncio.gather(*(one(*item) for item in plan))
    return time.perf_counter() - started


async def chunk_section(db: Database, server: EmbeddedNats, args: argparse.Namespace) -> None:
    """Lane A chunks folded durable per second: the engine's two paths beside
    raw JetStream and raw Postgres, on the same rows."""
    from service_engine.embedded import provision_lane_stream
    from service_engine.lanes import Accumulator

    await provision_lane_stream(server.url, SERVICE)
    print(f"lane A chunks durable ({args.chunks} chunks of {args.chunk_bytes} B over "
          f"{args.chunk_keys} keys, {args.in_flight} in flight)")
    conn = await open_nats(server.url)
    try:
        config = EngineConfig(
            service=SERVICE, beat_interval=timedelta(milliseconds=200),
            lease=timedelta(seconds=2),
        )
        backlog = _chunk_plan(args, "backlog-")
        await _publish_frames(server, backlog)  # waiting in the stream before the pod starts
        engine = await Engine.boot(config, db, conn, ReadinessHandle())
        engine.register_accumulator(
            Accumulator("bench", initial=bytes, fold=lambda state, chunk: state + chunk)
        )
        started = time.perf_counter()
        task = asyncio.create_task(engine.run())
        try:
            await _until_durable(db, "backlog-", len(backlog))
            print(_rate("engine NATS ingress, a backlog", len(backlog),
                        time.perf_counter() - started))
            while not engine.readiness.is_up:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
            plan = _chunk_plan(args, "push-")
            seconds = await _bench_push_chunk(engine, plan, args.in_flight)
            print(_rate("engine push_chunk", len(plan), seconds))
            plan = _chunk_plan(args, "ingress-")
            seconds = await _bench_ingress(db, server, plan, "ingress-")
            print(_rate("engine NATS ingress, live publish", len(plan), seconds))
            flusher = engine.lanes.accumulators.flusher
            print(f"  {'':<34} (flush passes {flusher.passes}, "
                  f"{(3 * len(plan)) / max(1, flusher.passes):.0f} chunks per transaction)")
        finally:
            engine.shutdown()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
    finally:
        await conn.aclose()
    plan = _chunk_plan(args, "raw-")
    print(_rate("raw JetStream publish+consume", len(plan),
                await _bench_raw_jetstream(server, plan)))
    print(_rate("raw Postgres insert, 1 row/txn", len(plan),
                await _bench_raw_insert(db, plan, args.in_flight, batched=False)))
    await db.pool.execute("DELETE FROM service_engine.accumulator_chunk WHERE accumulator = 'raw'")
    print(_rate(f"raw Postgres insert, {args.in_flight} rows/txn", len(plan),
                await _bench_raw_insert(db, plan, args.in_flight, batched=True)))


# -- main ----------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-lanes-") as tmp:
        async with infrastructure(Path(tmp)) as (db, server):
            if not args.skip_presence:
                await presence_section(db, server, args)
            await chunk_section(db, server, args)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--puts", type=int, default=200)
    parser.add_argument("--sessions", default="1,1000")
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--chunk-bytes", type=int, default=64)
    parser.add_argument("--chunk-keys", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--skip-presence", action="store_true",
                        help="run only the lane A section")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
