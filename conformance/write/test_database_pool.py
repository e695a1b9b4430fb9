"""The battery's database pool (``support.database_pool``): a database it
hands out again is as fresh as a new copy of the template, whatever the
test before did to it; one whose schema, grants or seeded rows it cannot
put back is replaced by a new copy."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from service_engine.embedded import EmbeddedPostgres, ProvisionedDatabase

from ..conftest import TEMPLATE
from ..support.database_pool import FINGERPRINT, DatabasePool


@contextlib.asynccontextmanager
async def admin(pg: EmbeddedPostgres, name: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(pg.url(pg.SUPERUSER, pg.superuser_password, name))
    try:
        yield conn
    finally:
        await conn.close()


async def state(pg: EmbeddedPostgres, name: str) -> dict[str, Any]:
    """Everything a test could see of a database: its catalog's fingerprint,
    each table's rows, each sequence's value, the sessions and locks on it,
    its statistics counters."""
    async with admin(pg, name) as conn:
        tables = [
            row[0] for row in await conn.fetch(
                "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables"
                " WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
            )
        ]
        rows = {
            table: await conn.fetchval(
                f"SELECT coalesce(string_agg(t::text, ',' ORDER BY t::text), '') FROM {table} t"
            )
            for table in tables
        }
        return {
            "fingerprint": await conn.fetchval(FINGERPRINT),
            "rows": rows,
            "sequences": await conn.fetch(
                "SELECT schemaname, sequencename, last_value FROM pg_sequences ORDER BY 1, 2"
            ),
            "sessions": await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ),
            "locks": await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ),
            "inserted": await conn.fetchval(
                "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
            ),
        }


async def taken_twice(pool: DatabasePool, use: Any) -> tuple[ProvisionedDatabase, dict[str, Any],
                                                             ProvisionedDatabase, dict[str, Any]]:
    """The pool's database and its state when new, then, after ``use`` ran
    on it and it went back, the database the pool hands out next and its state."""
    async with pool.database() as first:
        fresh = await state(pool.server, first.name)
        await use(first)
    async with pool.database() as second:
        return first, fresh, second, await state(pool.server, second.name)


async def test_a_reused_database_is_as_fresh_as_a_new_copy(pg_server: EmbeddedPostgres) -> None:
    """Rows in engine and sample tables, advanced sequences, tables, views,
    functions, triggers, policies, types and schemas a test created, and a
    session it left open holding a LISTEN, an advisory lock and a temporary
    table: the pool hands the same database out again with none of it left,
    its catalog, rows, sequences and counters those of the new copy."""
    pool = DatabasePool(pg_server, TEMPLATE, "pool")
    left_open: list[asyncpg.Connection] = []

    async def use(db: ProvisionedDatabase) -> None:
        async with admin(pg_server, db.name) as conn:
            await conn.execute("""
                INSERT INTO cmd_project VALUES ('p1', 'o', 'n', 1);
                INSERT INTO sample_card VALUES ('c1', 'o', 1, 't');
                INSERT INTO sample_counter_soft_fact (counter_id, fact_type, payload)
                     VALUES ('k', 'made', '{}');
                INSERT INTO service_engine.scheduled_impact (due_at, impacts)
                     VALUES (now(), '[]');
                SELECT nextval('sample_commit_fault_id_seq');
                CREATE SCHEMA scratch;
                CREATE TABLE scratch.t (id int);
                CREATE TABLE made (id serial PRIMARY KEY, project text);
                CREATE VIEW made_view AS SELECT * FROM cmd_project;
                CREATE TYPE mood AS ENUM ('ok', 'not');
                CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql
                    AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
                CREATE TRIGGER refuse_cards BEFORE INSERT ON sample_card
                    FOR EACH ROW EXECUTE FUNCTION refuse();
                CREATE POLICY see_all ON cmd_task USING (true);
            """)
        session = await asyncpg.connect(db.owner_url)
        left_open.append(session)
        await session.execute("LISTEN pool_channel")
        await session.execute("SELECT pg_advisory_lock(42)")
        await session.execute("CREATE TEMPORARY TABLE scratchpad (id int)")

    try:
        first, fresh, second, again = await taken_twice(pool, use)
    finally:
        for session in left_open:
            session.terminate()
        await pool.close()
    assert second.name == first.name
    assert again == fresh
    assert fresh["sessions"] == 0 and fresh["locks"] == 0 and fresh["inserted"] == 0
    assert fresh["rows"]["service_engine.schema_migrations"]


async def test_a_database_whose_schema_changed_is_replaced(pg_server: EmbeddedPostgres) -> None:
    """A column added to a migrated table, a revoked grant, a seeded row
    deleted (what the pool cannot put back by dropping new objects): the
    next test gets a new copy, and the changed database is dropped."""
    changes = [
        "ALTER TABLE cmd_project ADD COLUMN extra text",
        "REVOKE INSERT ON cmd_task FROM service_engine_app",
        "DELETE FROM service_engine.schema_migrations"
        " WHERE version = (SELECT max(version) FROM service_engine.schema_migrations)",
    ]
    for change in changes:
        pool = DatabasePool(pg_server, TEMPLATE, "pool")

        async def use(db: ProvisionedDatabase, change: str = change) -> None:
            async with admin(pg_server, db.name) as conn:
                await conn.execute(change)

        try:
            first, fresh, second, again = await taken_twice(pool, use)
        finally:
            await pool.close()
        assert second.name != first.name, change
        assert again["rows"] == fresh["rows"], change
        async with admin(pg_server, "postgres") as conn:
            assert not await conn.fetchval(
                "SELECT 1 FROM pg_database WHERE datname = $1", first.name
            ), change


async def test_a_copy_in_use_is_never_handed_out(pg_server: EmbeddedPostgres) -> None:
    """Two databases held at once are two copies; both go back to the pool."""
    pool = DatabasePool(pg_server, TEMPLATE, "pool")
    try:
        async with pool.database() as one, pool.database() as two:
            assert one.name != two.name
        async with pool.database() as three, pool.database() as four:
            assert {three.name, four.name} == {one.name, two.name}
    finally:
        await pool.close()
