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
        assert engine.presence_lanes is not None
        await engine.presence_lanes.seeded.wait()
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


# -- main ----------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-lanes-") as tmp:
        async with infrastructure(Path(tmp)) as (db, server):
            await presence_section(db, server, args)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--puts", type=int, default=200)
    parser.add_argument("--sessions", default="1,1000")
    parser.add_argument("--interval-ms", type=float, default=10.0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
