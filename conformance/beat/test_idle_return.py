"""A pod whose sessions all closed is back to idle (issue 11, item 5): the engine's
per-session structures are empty, their containers are back to the size they had at
boot, the beat has released the heap's free pages, and the next frame renders the one
session still open. RSS itself is measured, not asserted (``bench/idle_return.py``)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from service_engine import Database, Engine
from service_engine.memory import RELEASE_MIN_CLOSED, release_free_memory
from service_engine.render.cohort_index import CohortIndex
from service_engine.render.deltas import Reset, Upsert

from ..support.harness import wait_until
from ..support.render_support import running_engine, take, window
from ..support.sample_cards import Card, CardsView, Principal, write_card

MANY = RELEASE_MIN_CLOSED + 100
"""Sessions opened and closed: enough to grow every table well past its idle size
and for the beat's release to be due."""


def footprint(obj: object) -> int:
    """Bytes of the containers ``obj`` is or holds (dicts, sets, lists, tuples,
    nested), their hash tables and arrays included; other objects count nothing."""
    if isinstance(obj, dict):
        return sys.getsizeof(obj) + sum(footprint(v) for v in obj.values())
    if isinstance(obj, set | frozenset | list | tuple):
        return sys.getsizeof(obj) + sum(footprint(v) for v in obj)
    return 0


def session_containers(engine: Engine) -> dict[str, int]:
    """The footprint of each container of the render side that grows with sessions."""
    render: Any = engine.render
    sizes = {
        "sessions": footprint(render._sessions),
        "attaching": footprint(render.attach_batches.queued),
        "interest": footprint(vars(render.interest)),
    }
    for name, index in render.indexes.items():
        sizes[f"index:{name}"] = footprint({s: getattr(index, s) for s in CohortIndex.__slots__})
    return sizes


def pool_pids(db: Database) -> set[int]:
    """The server process of each connection the pool holds open now."""
    return {h._con.get_server_pid() for h in db.pool._holders  # type: ignore[attr-defined]
            if h.is_connected()}


async def test_closing_every_session_returns_the_render_side_to_its_boot_size(
    db: Database,
) -> None:
    """MANY sessions in 30 cohorts attach, go live and close: no session is left in the
    registry, its interest routes or its cohort index, each of those containers is back
    to its footprint at boot (not merely emptied with its grown table), the beat saw
    the fall, closed the pool connections the burst used and released free memory,
    and a session
    opened afterwards is routed and rendered as on a fresh pod."""
    async with db.pool.acquire() as conn:
        await write_card(conn, Card("c1", "acme", 1, "one"))
    async with running_engine(db, CardsView()) as engine:
        idle = session_containers(engine)
        principals = [Principal(f"p{i}", frozenset({"acme", f"org{i % 30}"}))
                      for i in range(MANY)]
        streams = await asyncio.gather(*(engine.attach(p, "cards", window()) for p in principals))
        for stream in streams:
            (reset,) = await take(stream, 1)
            assert isinstance(reset, Reset)
        held = session_containers(engine)
        assert all(held[name] > idle[name] for name in ("sessions", "interest", "index:cards"))
        await wait_until(lambda: engine.upkeep.release.peak >= MANY, what="the beat saw the peak")
        burst_pool = pool_pids(db)
        assert burst_pool

        for stream in streams:
            await stream.aclose()
        assert len(engine.render.sessions) == 0
        assert len(engine.render.interest) == 0
        after = session_containers(engine)
        assert all(after[name] <= idle[name] for name in idle), (after, idle)
        # The beat observed the settled fall and released (its peak restarts from 0).
        await wait_until(lambda: engine.upkeep.release.peak == 0, what="the release after the close")
        if release_free_memory():  # glibc: the release is counted
            assert engine.metrics.sample("service_engine_memory_releases_total") == 1
        # The release closed the pool's idle connections: none the burst used is left.
        assert not pool_pids(db) & burst_pool

        survivor = await engine.attach(Principal("last", frozenset({"acme"})), "cards", window())
        (reset,) = await take(survivor, 1)
        assert isinstance(reset, Reset) and reset.views == {'"c1"': ("acme", 1, "one")}
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "uno"))
        (upsert,) = await take(survivor, 1)
        assert isinstance(upsert, Upsert) and upsert.view == ("acme", 1, "uno")
        assert engine.render_loop.last_report.sessions == 1


BURST = "SELECT pg_backend_pid() + $1::int * 0"
"""The statement the burst prepares on every connection it uses."""


async def _backends(db: Database) -> set[int]:
    """The server's backends of this test's database other than the asking one."""
    conn = await db.connect_dedicated()
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()")
    finally:
        await conn.close()
    return {row["pid"] for row in rows}


async def test_closing_idle_connections_leaves_no_connection_or_statement_of_a_burst(
    db: Database,
) -> None:
    """A burst of concurrent work opens pool connections past the floor and prepares
    statements on them; `Database.close_idle_connections` closes every connection
    not in use (the server sees none of the burst's sessions afterwards, so none of
    its prepared statements) and leaves the one in use alone; the pool reopens its
    floor with a new session, on which the burst's statement is prepared anew. A
    release arms no timer (no idle-connection expiry per release)."""
    loop = asyncio.get_running_loop()
    held = await db.pool.acquire()
    try:
        held_pid = await held.fetchval("SELECT pg_backend_pid()")
        gate = asyncio.Event()

        async def burst(i: int) -> int:
            async with db.pool.acquire() as conn:
                await gate.wait()  # every one holds its connection at once
                pid: int = await conn.fetchval(BURST, i)
                return pid

        tasks = [asyncio.create_task(burst(i)) for i in range(8)]
        await wait_until(lambda: db.pool.get_idle_size() == 0 and db.pool.get_size() >= 9,
                         what="the burst holding its connections")
        gate.set()
        burst_pids = set(await asyncio.gather(*tasks))
        assert len(burst_pids) == 8 and held_pid not in burst_pids

        scheduled = len(loop._scheduled)  # type: ignore[attr-defined]
        for _ in range(50):
            async with db.pool.acquire() as conn:
                await conn.fetchval("SELECT 1")
        assert len(loop._scheduled) <= scheduled  # type: ignore[attr-defined]

        closed = await db.close_idle_connections()
        assert closed == 8
        assert db.pool.get_min_size() == 1 and db.pool.get_size() == 1  # the one in use

        async def only_held() -> bool:
            return await _backends(db) == {held_pid}

        # The sockets are closed at once; each server backend exits as it
        # reads their end (later on a loaded machine).
        await wait_until(only_held, what="the server left with the connection in use")

        async with db.pool.acquire() as conn:
            # A fresh session: the burst's statement is not prepared on it, then is anew.
            assert await conn.fetchval(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1", BURST) == 0
            assert await conn.fetchval(BURST, 1) not in burst_pids
            assert await conn.fetchval(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1", BURST) == 1
        assert await held.fetchval("SELECT 2") == 2  # the connection in use kept serving
    finally:
        await db.pool.release(held)
    # Both idle now: both close, and the pool reopens its floor with a new session.
    assert db.pool.get_size() == 2 and await db.close_idle_connections() == 2
    await wait_until(lambda: db.pool.get_size() == 1, what="the pool reopening its floor")

    async def only_the_new_floor() -> bool:
        backends = await _backends(db)
        return len(backends) == 1 and not backends & {held_pid, *burst_pids}

    await wait_until(only_the_new_floor, what="the server left with the new floor's session")
