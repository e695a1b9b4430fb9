"""Write-pipeline throughput per persistence style, side by side with raw asyncpg.

    python bench/pipeline.py [--seconds 3]

Starts a durable embedded Postgres (fsync on), provisions the engine and the
counter sample's tables, then for each style (CRUD, soft EDA, full EDA),
on one hot key and on distinct keys, with 1 and 8 concurrent clients,
measures increments/s through `MutationExecutor.ack` (advisory lock, the
store's FOR UPDATE, load, gate, save, one caused impact, commit) and
through a raw asyncpg transaction doing the same writes and the same
``pg_notify`` (row lock and read, write, notify, commit; for full EDA the
same snapshot + tail read and snapshot cadence), and prints the ratio. The
two sides alternate in short slices so disk and scheduler drift hit both.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.support.sample_counter import (  # noqa: E402
    WRITER,
    CrudCounter,
    EdaCounter,
    SoftCounter,
    create_counter,
    executor_for,
    increment,
)
from service_engine.db import Database, connect_pool, service_migrations  # noqa: E402
from service_engine.embedded import EmbeddedPostgres, provision_database  # noqa: E402
from service_engine.impacts import Cause, Impact, encode_group, new_group_id  # noqa: E402
from service_engine.impacts.transport import CHANNEL  # noqa: E402
from service_engine.pipeline import Success  # noqa: E402

DISTINCT_KEYS_PER_CLIENT = 100
SLICES = 6
Op = Callable[[str], Awaitable[None]]


def frame_for(key: str) -> str:
    [frame] = encode_group(
        new_group_id(), [Impact.entity("counter", key, Cause("counter.incremented", {"by": 1}))]
    )
    return frame


def raw_op(db: Database, style: str) -> Op:
    """The same writes and notify as the pipeline, in a plain transaction."""
    pool = db.pool

    async def crud(key: str, table: str = "sample_counter_crud") -> None:
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT id, value, frozen, last_actor, group_id FROM {table}"
                " WHERE id = $1 FOR UPDATE", key)
            assert row is not None
            await conn.execute(
                f"UPDATE {table} SET value = $2, frozen = $3, last_actor = $4, group_id = $5"
                " WHERE id = $1", key, row["value"] + 1, row["frozen"], "alice", row["group_id"])
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, frame_for(key))

    async def soft(key: str) -> None:
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT id, value, frozen, last_actor, group_id FROM sample_counter_soft"
                " WHERE id = $1 FOR UPDATE", key)
            assert row is not None
            await conn.execute(
                "WITH state AS (UPDATE sample_counter_soft SET value = $2, last_actor = $3"
                " WHERE id = $1 RETURNING id) INSERT INTO sample_counter_soft_fact"
                " (counter_id, fact_type, payload) SELECT id, 'incremented', $4::text::jsonb FROM state",
                key, row["value"] + 1, "alice", json.dumps({"actor": "alice", "by": 1}))
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, frame_for(key))

    async def full(key: str) -> None:
        # The kit's work by hand: lock, read snapshot + tail, append, and
        # rewrite the snapshot when a SNAPSHOT_EVERY boundary is crossed.
        key_json = json.dumps(key)
        every = EdaCounter.SNAPSHOT_EVERY
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", key_json)
            rows = await conn.fetch(RAW_FULL_LOAD, key_json)
            value, head, frozen = 0, 0, False
            for row in rows:
                if row["part"] == 0:
                    value, head = row["payload"]["value"], row["seq"]
                    frozen = row["payload"]["frozen"]
                else:
                    value += row["payload"].get("by", 0)
                    head = row["seq"]
            event = json.dumps({"actor": "alice", "by": 1})
            if (head + 1) % every == 0:
                state = json.dumps({"value": value + 1, "frozen": frozen, "last_actor": "alice"})
                await conn.execute(RAW_FULL_APPEND_SNAPSHOT, key_json, head + 1, event, state)
            else:
                await conn.execute(RAW_FULL_APPEND, key_json, head + 1, event)
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, frame_for(key))

    return {"crud": crud, "soft_eda": soft, "full_eda": full}[style]


RAW_FULL_LOAD = """
WITH snap AS (SELECT seq, state FROM service_engine.event_snapshot
               WHERE noun = 'sample_counter' AND key = $1)
SELECT 0 AS part, seq, state AS payload FROM snap
UNION ALL
SELECT 1, seq, payload FROM service_engine.event_log
 WHERE noun = 'sample_counter' AND key = $1 AND seq > coalesce((SELECT seq FROM snap), 0)
ORDER BY 1, 2
"""
RAW_FULL_APPEND = """
INSERT INTO service_engine.event_log (noun, key, seq, event_type, event_version, payload)
VALUES ('sample_counter', $1, $2, 'incremented', 2, $3::text::jsonb)
"""
RAW_FULL_APPEND_SNAPSHOT = f"""
WITH appended AS ({RAW_FULL_APPEND.strip()} RETURNING 1)
INSERT INTO service_engine.event_snapshot (noun, key, seq, state)
VALUES ('sample_counter', $1, $2, $4::text::jsonb)
ON CONFLICT (noun, key) DO UPDATE SET seq = EXCLUDED.seq, state = EXCLUDED.state
"""


def pipeline_op(db: Database, style: type[Any]) -> Op:
    executor = executor_for(db)

    async def op(key: str) -> None:
        outcome = await executor.ack(WRITER, increment, style, key, 1)
        if outcome != Success():
            raise RuntimeError(f"increment failed: {outcome}")

    return op


async def run_for(op: Op, keys_of: Callable[[int], list[str]], clients: int,
                  seconds: float) -> tuple[int, float]:
    """(mutations done, seconds taken) by ``clients`` concurrent loops."""
    stop = time.perf_counter() + seconds
    done = 0

    async def client(c: int) -> None:
        nonlocal done
        for key in itertools.cycle(keys_of(c)):
            if time.perf_counter() >= stop:
                return
            await op(key)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return done, time.perf_counter() - started


async def compare(ours: Op, raw: Op, keys_of: Callable[[int], list[str]], clients: int,
                  seconds: float, slices: int = SLICES) -> tuple[float, float]:
    """Rates of both, measured in alternating slices so disk and scheduler
    drift hit both sides alike."""
    totals = {"ours": [0, 0.0], "raw": [0, 0.0]}
    await run_for(ours, keys_of, clients, 0.3)  # warm up (prepared statements, caches)
    await run_for(raw, keys_of, clients, 0.3)
    for _ in range(slices):
        for name, op in (("ours", ours), ("raw", raw)):
            done, took = await run_for(op, keys_of, clients, seconds / slices)
            totals[name][0] += done
            totals[name][1] += took
    return totals["ours"][0] / totals["ours"][1], totals["raw"][0] / totals["raw"][1]


async def main(seconds: float) -> None:
    styles = {"crud": CrudCounter, "soft_eda": SoftCounter, "full_eda": EdaCounter}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        pg = EmbeddedPostgres(Path(tmp), durable=True)
        await asyncio.to_thread(pg.start)
        try:
            provisioned = await provision_database(
                pg, "bench", extra_migrations=service_migrations(ROOT / "conformance/migrations")
            )
            db = await connect_pool(provisioned.app_url, min_size=10, max_size=10)
            try:
                setup = executor_for(db)
                keys: dict[str, list[str]] = {"hot": ["hot"]}
                for c in range(8):
                    keys[f"d{c}"] = [f"d{c}-{i}" for i in range(DISTINCT_KEYS_PER_CLIENT)]
                for style in styles.values():
                    for key in itertools.chain.from_iterable(keys.values()):
                        await setup.ack(WRITER, create_counter, style, key)

                print(f"mutations/s ({seconds:g}s per cell, durable Postgres, "
                      "increment + one caused impact per commit)")
                print(f"{'style':9} {'keys':9} {'clients':>7} {'pipeline':>10} {'raw':>10} "
                      f"{'ratio':>6}")
                for name, style in styles.items():
                    for workload in ("hot", "distinct"):
                        def keys_of(c: int, workload: str = workload) -> list[str]:
                            return keys["hot"] if workload == "hot" else keys[f"d{c}"]

                        for clients in (1, 8):
                            ours, raw = await compare(
                                pipeline_op(db, style), raw_op(db, name), keys_of, clients,
                                seconds,
                            )
                            print(f"{name:9} {workload:9} {clients:>7} {ours:>10.0f} "
                                  f"{raw:>10.0f} {ours / raw:>6.2f}", flush=True)
            finally:
                await db.aclose()
        finally:
            await asyncio.to_thread(pg.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    asyncio.run(main(parser.parse_args().seconds))
