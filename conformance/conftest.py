"""Real infrastructure for the conformance battery.

One embedded PostgreSQL per test session holds a migrated template; each
test gets a database as fresh as a new copy of it (a copy the session made
and reset after its last test: `support.database_pool`). NATS is spawned
per test where a test asks for it.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from service_engine.db import Database, connect_pool, service_migrations
from service_engine.embedded import (
    EmbeddedNats,
    EmbeddedPostgres,
    ProvisionedDatabase,
    provision_database,
    provision_streams,
)

from .support.database_pool import close_pools, pool_for
from .support.example_support import example_database
from .support.harness import Statements, logged_pool
from .support.inbound_support import declare_streams
from .support.sample_commands import install_samples

TEMPLATE = "service_engine_template"
SAMPLE_MIGRATIONS = Path(__file__).parent / "migrations"
"""The conformance samples' own tables, numbered above the engine's range."""


REUSE_SERVER = "SERVICE_ENGINE_TEST_REUSE_PG"
"""Set (by ``dev/mutate``) to keep one embedded PostgreSQL for every test
session of the process and its forks (a mutation tester runs a session per
mutant); it stops when the process that started it exits."""
_reused: list[EmbeddedPostgres] = []


def _start_server(directory: Path) -> EmbeddedPostgres:
    server = EmbeddedPostgres(directory, durable=False)
    server.start()
    try:
        extra = service_migrations(SAMPLE_MIGRATIONS) if SAMPLE_MIGRATIONS.is_dir() else []
        asyncio.run(
            provision_database(server, TEMPLATE, is_template=True, extra_migrations=extra,
                               owner_setup=install_samples)
        )
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    if os.environ.get(REUSE_SERVER):
        if not _reused:
            owner = os.getpid()
            server = _start_server(Path(tempfile.mkdtemp(prefix="service-engine-pg-")))
            atexit.register(lambda: server.stop() if os.getpid() == owner else None)
            _reused.append(server)
        yield _reused[0]
        asyncio.run(close_pools(_reused[0]))
        return
    server = _start_server(tmp_path_factory.mktemp("pg"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def database(pg_server: EmbeddedPostgres) -> AsyncIterator[ProvisionedDatabase]:
    """A database with the engine's and the samples' migrations, as fresh
    as a new copy of the template."""
    async with pool_for(pg_server, TEMPLATE, "t").database() as provisioned:
        yield provisioned


@pytest.fixture
async def store(pg_server: EmbeddedPostgres) -> AsyncIterator[ProvisionedDatabase]:
    """A database with the engine's and the reference service's migrations,
    as fresh as a new copy of the example template (built on first use)."""
    async with example_database(pg_server) as provisioned:
        yield provisioned


@pytest.fixture
async def db(database: ProvisionedDatabase) -> AsyncIterator[Database]:
    pool = await connect_pool(database.app_url, max_size=20)
    try:
        yield pool
    finally:
        await pool.aclose()


@pytest.fixture
async def logged(database: ProvisionedDatabase) -> AsyncIterator[tuple[Database, Statements]]:
    """A one-connection pool whose every statement is recorded."""
    async with logged_pool(database.app_url) as pair:
        yield pair


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats", sync_always=False)
    await asyncio.to_thread(server.start)
    try:
        await provision_streams(server.url)
        yield server
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def streams(nats_server: EmbeddedNats) -> EmbeddedNats:
    """The per-test nats-server with both integration streams declared with
    a bounded max_age, as the engine requires to bind them."""
    await declare_streams(nats_server.url)
    return nats_server
