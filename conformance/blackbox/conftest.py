"""Fixtures of the black-box battery: a provisioned store per test (roles,
engine + example migrations, from a template built once per session), the
per-test nats-server of the parent conftest, and the pods spawned on them."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service_engine.db import service_migrations
from service_engine.embedded import (
    EmbeddedNats,
    EmbeddedPostgres,
    ProvisionedDatabase,
    drop_database,
    provision_database,
)

from .harness import EXAMPLE_MIGRATIONS, Pods

EXAMPLE_TEMPLATE = "example_service_template"


@pytest.fixture(scope="session")
def example_template(pg_server: EmbeddedPostgres) -> str:
    """A database with the engine's and the example service's migrations."""
    asyncio.run(provision_database(
        pg_server, EXAMPLE_TEMPLATE, is_template=True,
        extra_migrations=service_migrations(EXAMPLE_MIGRATIONS),
    ))
    return EXAMPLE_TEMPLATE


@pytest.fixture
async def store(pg_server: EmbeddedPostgres, example_template: str
                ) -> AsyncIterator[ProvisionedDatabase]:
    name = f"bb_{secrets.token_hex(6)}"
    provisioned = await provision_database(pg_server, name, template=example_template)
    try:
        yield provisioned
    finally:
        await drop_database(pg_server, name)


@pytest.fixture
async def pods(store: ProvisionedDatabase, nats_server: EmbeddedNats, tmp_path: Path
               ) -> AsyncIterator[Pods]:
    spawned = Pods(store.app_url, nats_server.url, tmp_path)
    try:
        yield spawned
    finally:
        await spawned.aclose()
