"""`CrudStore.load_locked`, the pipeline's load of a CRUD aggregate: the row
is pinned and read in one statement (``SELECT cols ... FOR UPDATE``), a writer
outside the pipeline waits on the pin until the command commits, a store
with ``lock_rows=False`` reads plainly, and a subclass that overrides `load`
or `lock` keeps its own pair."""

from __future__ import annotations

import asyncio
from typing import Any

from service_engine import Database
from service_engine.persistence.base import load_pinned
from service_engine.pipeline import Success

from ..support.sample_counter import (
    WRITER,
    CrudCounter,
    CrudCounterNoLock,
    CrudCounterStore,
    create_counter,
    executor_for,
)


class Recording:
    """A connection that records the statements a store sends through it."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.sent: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._conn, name)
        if name in ("fetch", "fetchrow", "fetchval", "execute"):
            def recorded(sql: str, *args: Any) -> Any:
                self.sent.append(sql)
                return attr(sql, *args)
            return recorded
        return attr


async def test_a_crud_load_pins_and_reads_the_row_in_one_statement(db: Database) -> None:
    """A locking CRUD store's pipeline load is one `SELECT cols ... FOR UPDATE`; a
    ``lock_rows=False`` store's is one plain select; both return the stored state."""
    executor = executor_for(db)
    assert await executor.ack(WRITER, create_counter, CrudCounter, "k1") == Success()
    assert await executor.ack(WRITER, create_counter, CrudCounterNoLock, "k2") == Success()
    async with db.pool.acquire() as raw, raw.transaction():
        conn: Any = Recording(raw)
        pinned = await load_pinned(CrudCounter.Store, conn, "k1")
        plain = await load_pinned(CrudCounterNoLock.Store, conn, "k2")
        missing = await load_pinned(CrudCounter.Store, conn, "absent")
    assert pinned is not None and pinned.key == "k1"
    assert plain is not None and plain.key == "k2"
    assert missing is None
    assert len(conn.sent) == 3
    assert conn.sent[0].endswith("FOR UPDATE") and conn.sent[2].endswith("FOR UPDATE")
    assert "FOR UPDATE" not in conn.sent[1]


async def test_a_pinned_row_holds_off_a_writer_until_commit(db: Database) -> None:
    """The row a load pinned cannot be updated by another transaction until the loading
    transaction ends: the pin is a row lock, as `lock` then `load` was."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, CrudCounter, "k1")
    async with db.pool.acquire() as holder, db.pool.acquire() as writer:
        tr = holder.transaction()
        await tr.start()
        await load_pinned(CrudCounter.Store, holder, "k1")
        update = asyncio.create_task(
            writer.execute("UPDATE sample_counter_crud SET value = 9 WHERE id = 'k1'")
        )
        done, _ = await asyncio.wait({update}, timeout=0.3)
        assert not done, "the writer went through a pinned row"
        await tr.commit()
        assert await asyncio.wait_for(update, 5) == "UPDATE 1"


class OwnLoadStore(CrudCounterStore):
    """A subclass with its own `load`: the one-statement form must not bypass it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loads = 0  # this instance's own count: no state shared between runs

    async def load(self, conn: Any, key: str) -> CrudCounter | None:
        self.loads += 1
        return await super().load(conn, key)


async def test_a_store_overriding_load_keeps_lock_then_its_own_load(db: Database) -> None:
    """A CrudStore subclass that overrides `load` gets `lock` then its `load` (two
    statements), not the combined select."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, CrudCounter, "k1")
    store = OwnLoadStore(CrudCounter)
    async with db.pool.acquire() as raw, raw.transaction():
        conn: Any = Recording(raw)
        found = await load_pinned(store, conn, "k1")
    assert found is not None and store.loads == 1
    assert len(conn.sent) == 2 and conn.sent[0].startswith("SELECT 1 ") and conn.sent[0].endswith("FOR UPDATE")
