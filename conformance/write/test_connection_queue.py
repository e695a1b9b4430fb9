"""The queue in front of the pool (`db.pool.ConnectionQueue`) on a real pool:
mutations past the pool's connections wait their turn in arrival order,
and past ``max_queue`` waiters one is refused at once, retryable, with
nothing written."""

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
    return db.queue.waiting == count


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
    await wait_until(lambda: db.queue.waiting == 2, timeout=10, what="two waiters")
    refused = await asyncio.wait_for(
        executor.ack(WRITER, create_counter, CrudCounter, "refused"), 5)
    assert isinstance(refused, MutationError)
    assert refused.code == MutationError.DATABASE and refused.retryable
    release.set()
    assert await holder == Success()
    assert await asyncio.gather(*waiters) == [Success(), Success()]
    keys = await db.fetch("SELECT id FROM sample_counter_crud ORDER BY id")
    assert [r["id"] for r in keys] == ["held", "q0", "q1"]
