"""Fan-out: commit -> delta latency at the session queue, loads per frame
and CPU per delivered delta, for 100 / 1,000 / 10,000 sessions in 1, 50
and per-principal cohorts at a steady write rate, side by side with the
per-subscriber strategy (each session re-queries its own row per impact).

    python bench/fanout.py [--seconds 4] [--rate 200] [--sizes 100,1000,10000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.sample_cards import Card, CardsView, Principal, RankQuery, write_card
from service_engine import EngineConfig, Query, ReadinessHandle, WindowSpec
from service_engine.db import Database, connect_pool, service_migrations
from service_engine.embedded import EmbeddedPostgres, provision_database
from service_engine.impacts.transport import PgListenNotify
from service_engine.render.runtime import RenderRuntime

MIGRATIONS = Path(__file__).resolve().parents[1] / "conformance" / "migrations"
KEYS = 200


class PerPrincipal(CardsView):
    """The same view grouped per principal (the default cohort)."""

    NAME = "cards_pp"

    def cohort(self, principal: Principal) -> Any:  # the base default
        return super(CardsView, self).cohort(principal)


def principals(n: int, cohorts: str) -> list[Principal]:
    if cohorts == "1":
        return [Principal(f"p{i}", frozenset({"o0"})) for i in range(n)]
    return [Principal(f"p{i}", frozenset({f"o{i % 50}"})) for i in range(n)]


def org_for(cohorts: str, rng: random.Random) -> str:
    return "o0" if cohorts == "1" else f"o{rng.randrange(50)}"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _write(url: str, cohorts: str, rate: int, seconds: float) -> int:
    rng = random.Random(1)
    interval = 1.0 / rate
    writes = 0
    db = await connect_pool(url, min_size=1, max_size=1)
    async with db.pool.acquire() as conn:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            card = Card(f"k{rng.randrange(KEYS)}", org_for(cohorts, rng), rng.randrange(1000),
                        str(time.perf_counter_ns()))
            await write_card(conn, card)
            writes += 1
            await asyncio.sleep(max(0.0, start + writes * interval - time.perf_counter()))
    await db.aclose()
    return writes


def _writer_process(url: str, cohorts: str, rate: int, seconds: float,
                    out: multiprocessing.Queue[int]) -> None:
    out.put(asyncio.run(_write(url, cohorts, rate, seconds)))


async def write_load(url: str, cohorts: str, rate: int, seconds: float) -> int:
    """Commit ``rate`` writes/s from a child process (the writers are other
    pods; the engine under test shares no CPU time with them)."""
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[int] = ctx.Queue()
    proc = ctx.Process(target=_writer_process, args=(url, cohorts, rate, seconds, out))
    proc.start()
    writes: int = await asyncio.to_thread(out.get)
    await asyncio.to_thread(proc.join)
    return writes


async def engine_run(db: Database, url: str, n: int, cohorts: str, rate: int, seconds: float) -> str:
    config = EngineConfig(window_capacity=KEYS * 2, reset_threshold=10_000)
    listener = PgListenNotify(db, config, ReadinessHandle())
    runtime = RenderRuntime(db, config, listener.channel, debug=False)
    view = CardsView() if cohorts != "pp" else PerPrincipal()
    runtime.register_projector(view)
    latencies: list[float] = []
    loads: list[int] = []
    delivered = 0
    emit = runtime._emit

    def timed_emit(rec: Any, delta: Any) -> None:
        nonlocal delivered
        delivered += 1
        view_ = getattr(delta, "view", None)
        if view_ is not None:
            latencies.append((time.perf_counter_ns() - int(view_[2])) / 1e9)
        emit(rec, delta)

    runtime._emit = timed_emit  # type: ignore[method-assign]
    runtime.on_report = lambda r: loads.append(r.loads) if r.impacts else None
    listen_task = asyncio.create_task(listener.run())
    await listener.started.wait()
    streams = [await runtime.attach(p, view.NAME, WindowSpec(Query(RankQuery(KEYS))))
               for p in principals(n, cohorts)]
    render_task = asyncio.create_task(runtime.run())

    async def drain() -> None:
        while True:
            for s in streams:
                while s.get_nowait() is not None:
                    pass
            await asyncio.sleep(0.05)

    drainer = asyncio.create_task(drain())
    await asyncio.sleep(0.2)
    latencies.clear()
    loads.clear()
    delivered = 0
    cpu0 = time.process_time()
    writes = await write_load(url, cohorts, rate, seconds)
    await asyncio.sleep(0.5)
    cpu = time.process_time() - cpu0
    for t in (drainer, render_task, listen_task):
        t.cancel()
    await asyncio.gather(drainer, render_task, listen_task, return_exceptions=True)
    per_frame = sum(loads) / len(loads) if loads else 0.0
    return (f"{writes / seconds:>6.0f} {pct(latencies, .5):>8.2f} {pct(latencies, .99):>8.2f} "
            f"{per_frame:>8.2f} {delivered:>9} {cpu / max(delivered, 1) * 1e6:>9.1f}")


async def per_subscriber_run(db: Database, url: str, n: int, cohorts: str, rate: int, seconds: float) -> str:
    """Each session re-queries its own row for every impact it may care about."""
    config = EngineConfig()
    listener = PgListenNotify(db, config, ReadinessHandle())
    subs = principals(n, cohorts)
    last: list[dict[str, Any]] = [{} for _ in subs]
    latencies: list[float] = []
    delivered = 0
    queries = 0

    async def consume() -> None:
        nonlocal delivered, queries
        async with db.pool.acquire() as conn:
            while True:
                item = await listener.channel.get()
                if not isinstance(item, list):
                    continue
                for impact in item:
                    for i, p in enumerate(subs):
                        row = await conn.fetchrow(
                            "SELECT id, org, rank, title FROM sample_card WHERE id = $1"
                            " AND org = ANY($2)", impact.key, sorted(p.orgs))
                        queries += 1
                        if row is not None and last[i].get(row["id"]) != row["title"]:
                            last[i][row["id"]] = row["title"]
                            delivered += 1
                            latencies.append((time.perf_counter_ns() - int(row["title"])) / 1e9)

    listen_task = asyncio.create_task(listener.run())
    await listener.started.wait()
    consumer = asyncio.create_task(consume())
    cpu0 = time.process_time()
    writes = await write_load(url, cohorts, rate, seconds)
    await asyncio.sleep(0.5)
    backlog = len(listener.channel)
    cpu = time.process_time() - cpu0
    consumer.cancel()
    listen_task.cancel()
    await asyncio.gather(consumer, listen_task, return_exceptions=True)
    return (f"{writes / seconds:>6.0f} {pct(latencies, .5):>8.2f} {pct(latencies, .99):>8.2f} "
            f"{queries / max(writes, 1):>8.1f} {delivered:>9} {cpu / max(delivered, 1) * 1e6:>9.1f}"
            f"  backlog={backlog}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--per-subscriber-max", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", durable=True)
        pg.start()
        try:
            await provision_database(pg, "template_bench", is_template=True,
                                     extra_migrations=service_migrations(MIGRATIONS))
            print(f"{'strategy':<15} {'sessions':>8} {'cohorts':>7} | {'w/s':>6} {'p50 ms':>8} "
                  f"{'p99 ms':>8} {'loads/fr':>8} {'deltas':>9} {'cpu us/d':>9}")
            print(f"{'':<34}(per-subscriber: loads/fr = queries per write)")
            run = 0
            for n in (int(s) for s in args.sizes.split(",")):
                for cohorts in ("1", "50", "pp"):
                    for strategy in ("engine", "per-subscriber"):
                        if strategy == "per-subscriber" and n > args.per_subscriber_max:
                            continue
                        run += 1
                        name = f"bench_{run}"
                        provisioned = await provision_database(pg, name, template="template_bench")
                        db = await connect_pool(provisioned.app_url, min_size=2, max_size=8)
                        try:
                            fn = engine_run if strategy == "engine" else per_subscriber_run
                            line = await fn(db, provisioned.app_url, n, cohorts, args.rate, args.seconds)
                        finally:
                            await db.aclose()
                        print(f"{strategy:<15} {n:>8} {cohorts:>7} | {line}", flush=True)
        finally:
            pg.stop()


if __name__ == "__main__":
    asyncio.run(main())
