"""Erasure in the reference service: the board slice is Erasable (a
person's memberships go, and with them the BoardMemberships fact); other
people's memberships and the boards themselves stay."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from service_engine.embedded import EmbeddedPostgres, ProvisionedDatabase

from .example_support import example_database, person, running


@pytest.fixture
async def store(pg_server: EmbeddedPostgres) -> AsyncIterator[ProvisionedDatabase]:
    async with example_database(pg_server) as provisioned:
        yield provisioned


async def test_the_board_slice_erases_a_persons_memberships(store: ProvisionedDatabase) -> None:
    """Erasing a person removes their board memberships only; their
    principal facts, reloaded by the engine's loader, no longer list the
    board; a second erase is a no-op that answers not fresh."""
    conn = await asyncpg.connect(store.owner_url)
    try:
        await conn.execute("INSERT INTO board (id, org, title, owner) VALUES ('b1', 'acme', 'Plans', 'ann')")
        await conn.executemany(
            "INSERT INTO board_member (id, board_id, person) VALUES ($1, 'b1', $2)",
            [("m1", "zoe"), ("m2", "yan")],
        )
    finally:
        await conn.close()
    async with running(store, ["board"]) as run:
        zoe = person("zoe", "other")
        assert (await run.engine.load_principal_facts(zoe)).fact("board_memberships") == {"b1"}
        first = await run.engine.erase("zoe")
        assert first.fresh
        assert (await run.engine.load_principal_facts(zoe)).fact("board_memberships") == frozenset()
        assert (await run.engine.load_principal_facts(person("yan", "other"))).fact(
            "board_memberships"
        ) == {"b1"}
        assert not (await run.engine.erase("zoe")).fresh
