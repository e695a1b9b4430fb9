"""Boot posture, schema-version singleton (s136), listener probe, supervision."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest

from service_engine import Database, Engine, EngineConfig, ReadinessHandle, connect_pool
from service_engine.embedded import EmbeddedPostgres, ProvisionedDatabase
from service_engine.errors import (
    ListenerProbeFailed,
    PostureBypassRls,
    PostureOwner,
    PostureSuperuser,
    SchemaVersionConflict,
    ShuttingDown,
    WorkerStopped,
)
from service_engine.readiness import REASON_SCHEMA_VERSION_DISPLACED, REASON_WORKER_STOPPED

from ..support.harness import wait_until

FAST = {"beat_interval": timedelta(milliseconds=50), "lease": timedelta(seconds=1)}


def config(**overrides: object) -> EngineConfig:
    return EngineConfig(service="boot-test", **{**FAST, **overrides})


@contextlib.asynccontextmanager
async def running(engine: Engine) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(engine.run())
    try:
        yield task
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)


async def pool_as(url: str) -> Database:
    return await connect_pool(url, min_size=1, max_size=4)


async def admin_exec(pg: EmbeddedPostgres, database: str, *sql: str) -> None:
    conn = await asyncpg.connect(pg.url(pg.SUPERUSER, pg.superuser_password, database))
    try:
        for statement in sql:
            await conn.execute(statement)
    finally:
        await conn.close()


async def test_app_role_boots_and_goes_up_when_running(db: Database) -> None:
    """The app role boots; readiness is UP only once run() is running and DOWN again while
    shutting down."""
    readiness = ReadinessHandle()
    engine = await Engine.boot(config(), db, None, readiness)
    assert not readiness.is_up, "UP before run() started"
    async with running(engine):
        await wait_until(lambda: readiness.is_up, what="readiness UP")
    assert readiness.current().to_json()["status"] == "DOWN"  # shutting down


async def test_superuser_is_refused(pg_server: EmbeddedPostgres, database: ProvisionedDatabase) -> None:
    """Boot refuses a superuser connection (PostureSuperuser) and readiness holds its
    reason, never UP."""
    db = await pool_as(pg_server.url(pg_server.SUPERUSER, pg_server.superuser_password, database.name))
    readiness = ReadinessHandle()
    try:
        with pytest.raises(PostureSuperuser):
            await Engine.boot(config(), db, None, readiness)
    finally:
        await db.aclose()
    assert readiness.holds(PostureSuperuser.reason)
    assert not readiness.is_up


async def test_bypassrls_is_refused(pg_server: EmbeddedPostgres, database: ProvisionedDatabase) -> None:
    """Boot refuses a role with BYPASSRLS (PostureBypassRls) and readiness holds its reason."""
    await admin_exec(
        pg_server, database.name,
        "DROP ROLE IF EXISTS se_bypass",
        "CREATE ROLE se_bypass LOGIN BYPASSRLS PASSWORD 'bypass'",
        f'GRANT CONNECT ON DATABASE "{database.name}" TO se_bypass',
        "GRANT USAGE ON SCHEMA service_engine TO se_bypass",
        "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA service_engine TO se_bypass",
    )
    db = await pool_as(pg_server.url("se_bypass", "bypass", database.name))
    readiness = ReadinessHandle()
    try:
        with pytest.raises(PostureBypassRls):
            await Engine.boot(config(), db, None, readiness)
    finally:
        await db.aclose()
        await admin_exec(pg_server, database.name, "DROP OWNED BY se_bypass", "DROP ROLE se_bypass")
    assert readiness.holds(PostureBypassRls.reason)


async def test_owner_and_owner_member_are_refused(
    pg_server: EmbeddedPostgres, database: ProvisionedDatabase
) -> None:
    """Boot refuses the schema owner and any member of the owner role (PostureOwner),
    readiness holding the reason."""
    owner_db = await pool_as(database.owner_url)
    readiness = ReadinessHandle()
    try:
        with pytest.raises(PostureOwner):
            await Engine.boot(config(), owner_db, None, readiness)
    finally:
        await owner_db.aclose()
    assert readiness.holds(PostureOwner.reason)

    await admin_exec(
        pg_server, database.name,
        "DROP ROLE IF EXISTS se_member",
        "CREATE ROLE se_member LOGIN PASSWORD 'member'",
        "GRANT service_engine_owner TO se_member",
    )
    member_db = await pool_as(pg_server.url("se_member", "member", database.name))
    readiness = ReadinessHandle()
    try:
        with pytest.raises(PostureOwner, match="member"):
            await Engine.boot(config(), member_db, None, readiness)
    finally:
        await member_db.aclose()
        await admin_exec(pg_server, database.name, "DROP ROLE se_member")
    assert readiness.holds(PostureOwner.reason)


async def test_s136_schema_version_singleton(db: Database) -> None:
    """s136: a second pod on another service version is refused while the
    first is live, names both versions, never blocks on a stale row, and a
    displaced running pod goes DOWN until it owns the row again."""
    first_ready = ReadinessHandle()
    first = await Engine.boot(config().with_service_version("1.0.0"), db, None, first_ready)
    second_ready = ReadinessHandle()
    with pytest.raises(SchemaVersionConflict) as refused:
        await Engine.boot(config().with_service_version("2.0.0"), db, None, second_ready)
    reason = second_ready.current().reasons[SchemaVersionConflict.reason]
    assert "1.0.0" in reason and "2.0.0" in reason
    assert "1.0.0" in str(refused.value) and "2.0.0" in str(refused.value)

    # Same version: a second pod shares the row.
    same = await Engine.boot(config().with_service_version("1.0.0"), db, None, ReadinessHandle())
    assert same.version == first.version

    async with running(first):
        await wait_until(lambda: first_ready.is_up, what="first pod UP")
        # The row goes stale (its heartbeat lapses): another version claims it.
        # The first pod's beat may refresh the row first (a refresh committed
        # while the claim waited on the row is live to it, whatever the
        # liveness); make it stale again and retry until the stale window is
        # caught (bounded: the liveness here is short).
        short = config(schema_version_liveness=timedelta(milliseconds=1)).with_service_version("3.0.0")
        claimed: list[Engine] = []

        async def third_claims() -> bool:
            await db.pool.execute(
                "UPDATE service_engine.schema_version SET heartbeat_at = now() - interval '1 hour'"
            )
            try:
                claimed.append(await Engine.boot(short, db, None, ReadinessHandle()))
            except SchemaVersionConflict:
                return False
            return True

        await wait_until(third_claims, what="another version claims the stale row")
        third = claimed[0]
        assert third.version.service_version == "3.0.0"
        # The first pod, still running, now finds a live row of another
        # version: it is displaced and goes DOWN.
        await wait_until(
            lambda: first_ready.holds(REASON_SCHEMA_VERSION_DISPLACED), what="displaced DOWN"
        )
        assert "3.0.0" in first_ready.current().reasons[REASON_SCHEMA_VERSION_DISPLACED]
        # Once the displacing pod's row goes stale, the first pod owns it again.
        await db.pool.execute(
            "UPDATE service_engine.schema_version SET heartbeat_at = now() - interval '1 hour'"
        )
        await wait_until(lambda: first_ready.is_up, what="first pod UP again")
        holder = await db.pool.fetchval("SELECT service_version FROM service_engine.schema_version")
        assert holder == "1.0.0"


async def test_listener_probe_refuses_a_connection_notify_never_reaches(
    pg_server: EmbeddedPostgres, database: ProvisionedDatabase, db: Database
) -> None:
    """Behind a transaction-mode pooler the LISTEN session is not the one the
    NOTIFY reaches; modelled for real by a LISTEN connection on another
    database (NOTIFY is per database), readiness stays DOWN with the reason."""
    await admin_exec(pg_server, "postgres", f'CREATE DATABASE "{database.name}_other"')
    try:
        elsewhere = Database(db.pool, database.app_url.replace(database.name, "postgres"))
        readiness = ReadinessHandle()
        with pytest.raises(ListenerProbeFailed, match="pooler"):
            await Engine.boot(
                config(listener_probe_timeout=timedelta(milliseconds=300)), elsewhere, None, readiness
            )
        assert readiness.holds(ListenerProbeFailed.reason)
    finally:
        await admin_exec(pg_server, "postgres", f'DROP DATABASE "{database.name}_other"')


@pytest.mark.parametrize("ending", ["raises", "returns"])
async def test_a_dead_worker_takes_readiness_down_and_run_raises(db: Database, ending: str) -> None:
    """A supervised worker that returns or raises takes readiness DOWN naming it, and run()
    raises WorkerStopped."""
    readiness = ReadinessHandle()
    engine = await Engine.boot(config(), db, None, readiness)
    release = asyncio.Event()

    async def fragile() -> None:
        await release.wait()
        if ending == "raises":
            raise RuntimeError("boom")

    engine.register_worker("fragile", fragile)
    task = asyncio.create_task(engine.run())
    await wait_until(lambda: readiness.is_up, what="UP")
    release.set()
    with pytest.raises(WorkerStopped) as stopped:
        await asyncio.wait_for(task, 10)
    assert stopped.value.name == "fragile"
    assert readiness.holds(REASON_WORKER_STOPPED)
    assert "fragile" in readiness.current().reasons[REASON_WORKER_STOPPED]


async def test_shutdown_refuses_new_work_and_run_returns(db: Database) -> None:
    """shutdown() makes run() return, refuses new work with ShuttingDown, and leaves
    readiness DOWN."""
    readiness = ReadinessHandle()
    engine = await Engine.boot(config(), db, None, readiness)
    task = asyncio.create_task(engine.run())
    await wait_until(lambda: readiness.is_up, what="UP")
    engine.shutdown()
    await asyncio.wait_for(task, 10)
    with pytest.raises(ShuttingDown):
        engine.ensure_accepting()
    assert not readiness.is_up


async def test_duplicate_worker_name_is_refused(db: Database) -> None:
    """A second worker under a name already registered is refused with
    DuplicateRegistration."""
    from service_engine.errors import DuplicateRegistration

    engine = await Engine.boot(config(), db, None, ReadinessHandle())

    async def loop() -> None:
        await asyncio.Event().wait()

    engine.register_worker("x", loop)
    with pytest.raises(DuplicateRegistration):
        engine.register_worker("x", loop)
