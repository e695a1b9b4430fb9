"""`Database.acquire(bound)`: an idle connection is handed over at once, and
the bound holds whenever the pool would make the caller wait. What
`acquire` takes, `Database.release` gives back (the connection and its turn
in the pool's queue)."""

from __future__ import annotations

import asyncio
from typing import Any

from service_engine import connect_pool
from service_engine.embedded import ProvisionedDatabase


async def test_the_bound_holds_while_another_acquire_runs_the_pools_setup(
    database: ProvisionedDatabase,
) -> None:
    """A holder in another acquire's ``setup`` hook still counts as idle in
    asyncpg; an acquire behind it times out within its bound instead of
    waiting for that setup (and the release after it)."""
    in_setup = asyncio.Event()
    leave_setup = asyncio.Event()

    async def setup(_conn: Any) -> None:
        in_setup.set()
        await leave_setup.wait()

    db = await connect_pool(database.app_url, min_size=1, max_size=1, setup=setup)
    try:
        first = asyncio.ensure_future(db.pool.acquire())
        await asyncio.wait_for(in_setup.wait(), 10)
        await _times_out(db.acquire(0.1))
        leave_setup.set()
        await db.pool.release(await first)
    finally:
        leave_setup.set()
        await db.aclose()


async def test_an_idle_connection_is_handed_over_and_a_busy_pool_bounds_the_wait(
    database: ProvisionedDatabase,
) -> None:
    """With a connection idle the acquire returns it; with none, the acquire
    raises within its bound; a released connection is taken again."""
    db = await connect_pool(database.app_url, min_size=1, max_size=1)
    try:
        conn = await db.acquire(1.0)
        assert await conn.fetchval("SELECT 1") == 1
        await _times_out(db.acquire(0.1))
        await db.release(conn)
        again = await db.acquire(1.0)
        assert await again.fetchval("SELECT 2") == 2
        await db.release(again)
    finally:
        await db.aclose()


async def _times_out(acquiring: Any) -> None:
    """The acquire itself raises its timeout (not a wait of ours around it)."""
    task = asyncio.ensure_future(acquiring)
    done, _ = await asyncio.wait({task}, timeout=10)
    if task not in done:
        task.cancel()
    assert task in done, "the acquire waited past its bound"
    assert isinstance(task.exception(), TimeoutError)


async def test_closing_unneeded_connections_keeps_the_count_asked_and_those_in_use(
    database: ProvisionedDatabase,
) -> None:
    """`close_idle_above(keep)` closes idle connections down to ``keep``
    (never below the floor), never one in use, and the pool still serves."""
    db = await connect_pool(database.app_url, min_size=1, max_size=4)
    held = [await db.acquire(1.0) for _ in range(4)]
    try:
        for conn in held[1:]:
            await db.release(conn)
        assert db.in_use() == 1
        assert await db.close_idle_above(2) == 2  # four open, two kept
        assert await db.close_idle_above(0) == 1  # down to the floor: the one in use
        assert not held[0].is_closed()
        assert await held[0].fetchval("SELECT 1") == 1
        await db.release(held[0])
        held.clear()
        assert await db.close_idle_above(0) == 0  # the floor stays
        conn = await db.acquire(1.0)
        assert await conn.fetchval("SELECT 3") == 3
        await db.release(conn)
    finally:
        if held:
            await db.release(held[0])
        await db.aclose()


async def test_a_close_with_a_connection_still_held_ends_within_its_bound(
    database: ProvisionedDatabase, caplog: Any
) -> None:
    """Closing a pool while a task still holds a connection (one it forgot to
    release) ends within the close's bound: the held connection is
    terminated, and a warning says how many were held."""
    pool = await connect_pool(database.app_url, max_size=2)
    await pool.acquire(5.0)  # never released
    with caplog.at_level("WARNING", logger="service_engine.db.pool"):
        async with asyncio.timeout(30):
            await pool.aclose(within=0.5)
    assert "1 connection(s) still held" in caplog.text
