"""`TableWindow`, the default populate, reads real Postgres as a hand-written
populate would: the caller's cohorts only, in order, a page at a time after
the cursor, within the limit; with no cohort filter, every row; on a plain
connection and on the engine's pool alike."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

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


async def test_many_windows_read_together_list_what_each_lists_alone(
    pg_server: EmbeddedPostgres,
) -> None:
    """`TableWindow.keys_many` over windows of different cohorts (plain,
    several, none, tagged), limits, orders and cursors lists for each
    window exactly what `TableWindow.keys` lists for it alone, in the same
    order; the head pages filtered by cohort are one statement."""
    async with notes_conn(pg_server) as conn:
        cohorts = [frozenset({"acme"}), frozenset({"globex"}), frozenset({"acme", "globex"}),
                   frozenset(), frozenset({"initech"}), None]
        for window in (TableWindow("note", cohort="org", limit=3),
                       TableWindow("note", cohort="org", order=("author", "id"), descending=True),
                       TableWindow("note", cohort="org", kind="org", limit=2),
                       TableWindow("note")):
            cxs = [PopulateCx(None, cursor, cohort, conn)
                   for cohort in cohorts for cursor in (None, "n1")]
            if window.kind is not None:
                cxs = [PopulateCx(None, cx.cursor, None if cx.cohorts is None else frozenset(
                    ("org", c) for c in cx.cohorts), conn) for cx in cxs]
            asked = [None if i % 3 else 1 for i in range(len(cxs))]
            alone = [await window.keys(cx, size) for cx, size in zip(cxs, asked, strict=True)]
            assert await window.keys_many(cxs, asked) == alone, window
            assert any(alone)


async def test_a_declared_window_populates_many_sessions_in_one_statement(
    pg_server: EmbeddedPostgres,
) -> None:
    """A projector declaring a ``WINDOW`` lists many sessions' head windows
    with `Projector.populate_many` in one statement (plus the column's type),
    each as its `populate` lists it; a projector implementing its own
    `populate` is called once per window by the default `populate_many`."""
    from dataclasses import dataclass

    from service_engine import Projector

    @dataclass(frozen=True)
    class Row:
        id: str
        org: str

    @dataclass(frozen=True)
    class Who:
        id: str

    class Declared(Projector[Row, str, Who, None]):
        NAME = "declared_notes"
        WINDOW = TableWindow("note", cohort="org")
        NOUN = "note"

        def project(self, row: Row, principal: Who) -> str:
            return row.id

    class Own(Declared):
        NAME = "own_notes"
        calls = 0

        async def populate(self, cx: Any, query: None) -> Sequence[Any]:
            Own.calls += 1
            return ["n9", *await TableWindow("note", cohort="org").keys(cx)]

    statements: list[str] = []

    class Counting:
        """The connection, each statement it is sent noted."""

        def __init__(self, conn: asyncpg.Connection) -> None:
            self.conn = conn

        async def fetch(self, query: str, *args: Any) -> Any:
            statements.append(query)
            return await self.conn.fetch(query, *args)

        async def fetchval(self, query: str, *args: Any) -> Any:
            statements.append(query)
            return await self.conn.fetchval(query, *args)

    async with notes_conn(pg_server) as plain:
        conn = Counting(plain)
        cohorts = [frozenset({"acme"}), frozenset({"globex"}), frozenset({"x"})] * 10
        windows = [(PopulateCx(None, None, c, cast(Any, conn)), None) for c in cohorts]
        declared = Declared()
        lists = await declared.populate_many(windows)
        assert len(statements) == 2  # the column's type, then the windows
        assert [list(keys) for keys in lists] == [
            list(await declared.populate(cx, None)) for cx, _ in windows]
        assert lists[0] == ["n1", "n2", "n4", "n5"] and lists[2] == []
        own = Own()
        assert [list(keys) for keys in await own.populate_many(windows[:3])] == [
            ["n9", "n1", "n2", "n4", "n5"], ["n9", "n3"], ["n9"]]
        assert Own.calls == 3
