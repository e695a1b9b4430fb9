"""The queues in front of the pool (`db.pool.ConnectionQueue`) on a real
pool: mutations past the pool's connections wait their turn in arrival
order, past ``max_queue`` waiters one is refused at once, retryable, with
nothing written, and writers past the write pipeline's share of the pool
wait in front of it while a read still gets its connection."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from service_engine import Database, MutationError, Success, connect_pool
from service_engine.embedded import ProvisionedDatabase
from service_engine.pipeline import Mutation

from ..support.harness import wait_until
from ..support.sample_counter import WRITER, CrudCounter, create_counter, executor_for


def _waiting(db: Database, count: int) -> bool:
    return db.waiting == count


@pytest.fixture
async def one_connection(database: ProvisionedDatabase) -> AsyncIterator[Database]:
    """A pool of one connection with room for two waiters."""
    db = await connect_pool(database.app_url, min_size=1, max_size=1, max_queue=2)
    try:
        yield db
    finally:
        await db.aclose()


async def test_mutations_past_the_pool_run_in_arrival_order(one_connection: Database) -> None:
    """With the pool's one connection held by a mutation, the mutations sent
    after it wait and then run one at a time in the order they arrived,
    each committing."""
    db = one_connection
    executor = executor_for(db, lock_timeout=timedelta(seconds=20))
    release = asyncio.Event()
    ran: list[str] = []

    async def hold(cx: Mutation[Any]) -> None:
        await cx.create(CrudCounter.new("held", "alice"))
        await release.wait()

    async def record(cx: Mutation[Any], key: str) -> None:
        ran.append(key)
        await create_counter(cx, CrudCounter, key)

    holder = asyncio.create_task(executor.ack(WRITER, hold))
    await wait_until(lambda: db.in_use() == 1, timeout=10, what="the holder's connection")
    waiters = []
    for key in ("w1", "w2"):
        waiters.append(asyncio.create_task(executor.ack(WRITER, record, key)))
        await wait_until(functools.partial(_waiting, db, len(waiters)), timeout=10,
                         what="the waiter queued")
    release.set()
    assert await holder == Success()
    assert await asyncio.gather(*waiters) == [Success(), Success()]
    assert ran == ["w1", "w2"]
    keys = await db.fetch("SELECT id FROM sample_counter_crud ORDER BY id")
    assert [r["id"] for r in keys] == ["held", "w1", "w2"]


async def test_a_mutation_past_a_full_queue_is_refused_at_once(one_connection: Database) -> None:
    """With the connection held and ``max_queue`` mutations waiting, one more
    answers the retryable ``database`` error at once and writes nothing;
    the waiting ones still commit."""
    db = one_connection
    executor = executor_for(db, lock_timeout=timedelta(seconds=20))
    release = asyncio.Event()

    async def hold(cx: Mutation[Any]) -> None:
        await cx.create(CrudCounter.new("held", "alice"))
        await release.wait()

    holder = asyncio.create_task(executor.ack(WRITER, hold))
    await wait_until(lambda: db.in_use() == 1, timeout=10, what="the holder's connection")
    waiters = [asyncio.create_task(executor.ack(WRITER, create_counter, CrudCounter, f"q{n}"))
               for n in range(2)]
    await wait_until(lambda: db.waiting == 2, timeout=10, what="two waiters")
    refused = await asyncio.wait_for(
        executor.ack(WRITER, create_counter, CrudCounter, "refused"), 5)
    assert isinstance(refused, MutationError)
    assert refused.code == MutationError.DATABASE and refused.retryable
    release.set()
    assert await holder == Success()
    assert await asyncio.gather(*waiters) == [Success(), Success()]
    keys = await db.fetch("SELECT id FROM sample_counter_crud ORDER BY id")
    assert [r["id"] for r in keys] == ["held", "q0", "q1"]


async def test_a_pool_saturated_by_writers_still_serves_a_read(
    database: ProvisionedDatabase,
) -> None:
    """With every write slot of a five-connection pool held by a mutation
    and more mutations waiting, the waiters queue at the write pipeline's
    admission (`Database.writes`), holding no connection, and a read gets
    the reserved connection at once; released, every writer commits."""
    db = await connect_pool(database.app_url, min_size=1, max_size=5)
    try:
        executor = executor_for(db, lock_timeout=timedelta(seconds=20))
        release = asyncio.Event()

        async def hold(cx: Mutation[Any], key: str) -> None:
            await create_counter(cx, CrudCounter, key)
            await release.wait()

        slots = 4
        holders = [asyncio.create_task(executor.ack(WRITER, hold, f"h{n}")) for n in range(slots)]
        await wait_until(lambda: db.in_use() == slots, timeout=10, what="the write slots held")
        waiters = [asyncio.create_task(executor.ack(WRITER, create_counter, CrudCounter, f"w{n}"))
                   for n in range(3)]
        await wait_until(lambda: db.writes.waiting == 3, timeout=10, what="three writers queued")
        assert db.queue.waiting == 0 and db.in_use() == slots
        assert [r["n"] for r in await db.fetch("SELECT 1 AS n", bound=5.0)] == [1]
        release.set()
        assert await asyncio.gather(*holders, *waiters) == [Success()] * (slots + 3)
        [count] = await db.fetch("SELECT count(*) AS n FROM sample_counter_crud")
        assert count["n"] == slots + 3
    finally:
        await db.aclose()
