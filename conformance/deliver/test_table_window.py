"""`TableWindow`, the default populate, reads real Postgres as a hand-written
populate would: the caller's cohorts only, in order, a page at a time after
the cursor, within the limit; with no cohort filter, every row; on a plain
connection and on the engine's pool alike."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from service_engine import TableWindow, connect_pool
from service_engine.embedded import EmbeddedPostgres, drop_database
from service_engine.render.attached import PopulateCx

from ..reference.test_tutorial_notes import notes_database

NOTES = [  # (id, org, author)
    ("n1", "acme", "bob"), ("n2", "acme", "alice"), ("n3", "globex", "gina"),
    ("n4", "acme", "alice"), ("n5", "acme", "carol"),
]


@contextlib.asynccontextmanager
async def notes_conn(pg: EmbeddedPostgres) -> AsyncIterator[asyncpg.Connection]:
    """The app role's connection to a notes database holding `NOTES`."""
    store = await notes_database(pg)
    conn = await asyncpg.connect(store.app_url)
    try:
        await conn.executemany(
            "INSERT INTO note (id, org, author, body) VALUES ($1, $2, $3, '')", NOTES
        )
        yield conn
    finally:
        await conn.close()
        await drop_database(pg, store.name)


async def test_a_table_window_pages_on_the_engines_pool(pg_server: EmbeddedPostgres) -> None:
    """On a connection of the engine's pool (whose json codec encodes what
    it is sent), a page after a key and after the order values lists what
    it lists on a plain connection."""
    store = await notes_database(pg_server)
    db = await connect_pool(store.app_url, max_size=2)
    acme = frozenset({"acme"})
    try:
        async with db.connection("table window") as conn:
            await conn.executemany(
                "INSERT INTO note (id, org, author, body) VALUES ($1, $2, $3, '')", NOTES
            )
            by_key = TableWindow("note", cohort="org", limit=2)
            assert await by_key.keys(PopulateCx(None, "n2", acme, conn)) == ["n4", "n5"]
            by_author = TableWindow("note", cohort="org", order=("author", "id"), descending=True)
            assert await by_author.keys(PopulateCx(None, "n1", acme, conn)) == ["n4", "n2"]
            after = await by_author.keys(PopulateCx(None, ["bob", "n1"], acme, conn))
            assert after == ["n4", "n2"]
    finally:
        await db.aclose()
        await drop_database(pg_server, store.name)


async def test_a_table_window_pages_the_callers_cohorts_in_order(
    pg_server: EmbeddedPostgres,
) -> None:
    """By key: acme's notes only, two a page, each page after the cursor
    key; by (author, id) descending, a page after a key or after the order
    values; the tagged cohorts of a kind filter the same way; no filter
    lists every org's notes."""
    acme = frozenset({"acme"})
    async with notes_conn(pg_server) as conn:
        by_key = TableWindow("note", cohort="org", limit=2)
        assert await by_key.keys(PopulateCx(None, None, acme, conn)) == ["n1", "n2"]
        assert await by_key.keys(PopulateCx(None, "n2", acme, conn)) == ["n4", "n5"]
        assert await by_key.keys(PopulateCx(None, "n5", acme, conn)) == []
        assert await by_key.keys(PopulateCx(None, None, acme, conn), 1) == ["n1"]

        by_author = TableWindow("note", cohort="org", order=("author", "id"), descending=True)
        head = await by_author.keys(PopulateCx(None, None, acme, conn), 2)
        assert head == ["n5", "n1"]  # carol, bob
        assert await by_author.keys(PopulateCx(None, "n1", acme, conn)) == ["n4", "n2"]
        assert await by_author.keys(PopulateCx(None, ["bob", "n1"], acme, conn)) == ["n4", "n2"]

        tagged = TableWindow("note", cohort="org", kind="org")
        globex = frozenset({("org", "globex"), ("board", "acme")})
        assert await tagged.keys(PopulateCx(None, None, globex, conn)) == ["n3"]

        everyone = TableWindow("note", cohort="org")
        assert await everyone.keys(PopulateCx(None, None, None, conn)) == [n for n, _, _ in NOTES]
