"""`CrudStore.create_locked`, the pipeline's create of a CRUD aggregate once
its transaction has begun: the aggregate's advisory lock and the insert are
one statement, the lock granted before the row is written and held to the
end of the same transaction; a refused lock writes nothing; a subclass that
overrides `create` keeps the lock and its own insert apart."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from service_engine import Database
from service_engine.db.locks import aggregate_lock_key
from service_engine.pipeline import Mutation, MutationError, Success

from ..support.sample_counter import WRITER, CrudCounter, CrudCounterStore, Principal, executor_for
from .test_crud_load_locked import Recording


def _lock_key(key: str) -> int:
    return aggregate_lock_key(CrudCounter.Store.store_type, key)


async def _stored(db: Database, key: str) -> int:
    count = await db.pool.fetchval("SELECT count(*) FROM sample_counter_crud WHERE id = $1", key)
    return int(count)


async def test_the_lock_and_the_insert_are_one_statement_and_the_lock_is_held(
    db: Database,
) -> None:
    """One statement takes the advisory lock and writes the row; the lock is
    this transaction's (held until it ends, released after)."""
    async with db.pool.acquire() as raw:
        conn: Any = Recording(raw)
        async with raw.transaction():
            await CrudCounter.Store.create_locked(conn, CrudCounter("c1"), _lock_key("c1"))
            held = await raw.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND pid = pg_backend_pid()"
            )
            assert held == 1
        after = await raw.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
    assert after == 0
    assert len(conn.sent) == 1 and "pg_advisory_xact_lock" in conn.sent[0]
    assert await _stored(db, "c1") == 1


async def test_the_lock_is_granted_before_the_row_is_written(db: Database) -> None:
    """While another transaction holds the key's advisory lock, the create
    has written nothing: the holder inserts the same key without waiting on
    it, and once the holder commits the create meets that row (unique)."""
    async with db.pool.acquire() as holder, db.pool.acquire() as creator:
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT pg_advisory_xact_lock($1)", _lock_key("c2"))
        waiting = creator.transaction()
        await waiting.start()
        create = asyncio.create_task(
            CrudCounter.Store.create_locked(creator, CrudCounter("c2"), _lock_key("c2"))
        )
        done, _ = await asyncio.wait({create}, timeout=0.3)
        assert not done, "the create went through a held advisory lock"
        # Had the row been written before the lock, this insert would wait on it.
        await asyncio.wait_for(
            holder.execute(
                "INSERT INTO sample_counter_crud (id, value, frozen, last_actor, group_id)"
                " VALUES ('c2', 7, false, 'holder', NULL)"
            ),
            5,
        )
        await held.commit()
        with pytest.raises(asyncpg.UniqueViolationError):
            await asyncio.wait_for(create, 5)
        await waiting.rollback()
    assert await db.pool.fetchval("SELECT value FROM sample_counter_crud WHERE id = 'c2'") == 7


async def test_a_refused_lock_is_a_lock_timeout_and_writes_nothing(db: Database) -> None:
    """Through the pipeline (the create after the transaction's first
    statement, so its lock rides with the insert): a lock held elsewhere past
    ``lock_timeout`` answers the retryable ``lock_timeout`` and commits nothing."""
    executor = executor_for(db, lock_timeout=timedelta(milliseconds=200))

    async def load_then_create(cx: Mutation[Principal], key: str) -> None:
        await cx.load_optional(CrudCounter, "someone-else")  # BEGIN rides with this lock
        await cx.create(CrudCounter.new(key, cx.principal.id))

    async with db.pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT pg_advisory_xact_lock($1)", _lock_key("c3"))
        outcome = await executor.ack(WRITER, load_then_create, "c3")
    assert isinstance(outcome, MutationError) and outcome.code == "lock_timeout", outcome
    assert outcome.retryable
    assert await _stored(db, "c3") == 0
    assert await executor.ack(WRITER, load_then_create, "c3") == Success()
    assert await _stored(db, "c3") == 1


class OwnCreateStore(CrudCounterStore):
    """A subclass with its own `create`: the one-statement form must not bypass it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.creates = 0  # this instance's own count: no state shared between runs

    async def create(self, conn: Any, aggregate: CrudCounter) -> None:
        self.creates += 1
        await super().create(conn, aggregate)


async def test_a_store_overriding_create_keeps_the_lock_then_its_own_create(
    db: Database,
) -> None:
    """A CrudStore subclass that overrides `create` gets the advisory lock,
    then its `create` (two statements), not the combined insert."""
    store = OwnCreateStore(CrudCounter)
    assert not store.creates_locked and CrudCounter.Store.creates_locked
    async with db.pool.acquire() as raw, raw.transaction():
        conn: Any = Recording(raw)
        await store.create_locked(conn, CrudCounter("c4"), _lock_key("c4"))
    assert store.creates == 1
    assert len(conn.sent) == 2 and conn.sent[0] == "SELECT pg_advisory_xact_lock($1)"
    assert conn.sent[1].startswith("INSERT INTO")
    assert await _stored(db, "c4") == 1
