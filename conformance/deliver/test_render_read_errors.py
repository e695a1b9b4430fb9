"""Driver errors on the render read paths are translated inside the adapter:
a caller of attach, fetch, fetch_window or page sees a `DatabaseError` with
a stable ``code`` (stage ``read``, the driver's error as its cause), never a
raw asyncpg exception."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest

from service_engine import Database, EngineConfig
from service_engine.db.errors import DatabaseError, Stage
from service_engine.embedded import ProvisionedDatabase
from service_engine.impacts.model import JsonValue
from service_engine.impacts.transport import ImpactChannel
from service_engine.render.projector import Populate
from service_engine.render.runtime import RenderRuntime
from service_engine.render.windows import Query, WindowSpec

from ..support.harness import owner_connection
from ..support.sample_cards import Card, CardsView, Principal, RankQuery, write_card

ALICE = Principal("alice", frozenset({"acme"}))


class SelfTerminatingCards(CardsView):
    """A projector whose populate loses its connection mid-read."""

    NAME = "self_terminating_cards"

    async def populate(self, cx: Populate[Principal], query: RankQuery) -> Sequence[JsonValue]:
        await cx.conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return []


@contextlib.asynccontextmanager
async def runtime(db: Database, *projectors: Any) -> AsyncIterator[RenderRuntime]:
    config = EngineConfig()
    rt = RenderRuntime(db, config, ImpactChannel(config.listener_channel_capacity))
    for projector in projectors:
        rt.registry.register_projector(projector)
    try:
        yield rt
    finally:
        rt.registry.end_all("test over")


def assert_translated(exc: BaseException) -> None:
    assert isinstance(exc, DatabaseError), type(exc)
    assert isinstance(exc.code, str) and exc.code
    assert exc.stage is Stage.READ
    assert isinstance(exc.__cause__, asyncpg.PostgresError | asyncpg.InterfaceError | OSError)


async def test_a_dropped_table_reaches_no_reader_as_a_driver_error(
    db: Database, database: ProvisionedDatabase
) -> None:
    """After the store's table is dropped, attach, fetch, fetch_window and
    page each raise a `DatabaseError` (SQLSTATE 42P01 kept), not asyncpg's
    UndefinedTableError; the failed attach leaves no session behind."""
    async with db.pool.acquire() as conn:
        await write_card(conn, Card("c1", "acme", 1, "one"))
    window = WindowSpec(Query(RankQuery(10)))
    async with runtime(db, CardsView()) as rt:
        live = await rt.registry.attach(ALICE, "cards", window)
        async with owner_connection(database) as owner:
            await owner.execute("DROP TABLE sample_card")
        reads: dict[str, Callable[[], Awaitable[Any]]] = {
            "attach": lambda: rt.registry.attach(ALICE, "cards", window),
            "fetch": lambda: rt.registry.fetch("cards", "c1", ALICE),
            "fetch_window": lambda: rt.registry.fetch_window("cards", RankQuery(10), ALICE),
            "page": lambda: rt.registry.page(str(live.id), ALICE, 1),
        }
        for name, read in reads.items():
            with pytest.raises(DatabaseError) as raised:
                await read()
            assert_translated(raised.value)
            assert raised.value.sqlstate == "42P01", name
        assert list(rt.registry.sessions) == [live.id]


async def test_a_terminated_backend_reaches_no_reader_as_a_driver_error(db: Database) -> None:
    """A read whose connection is terminated under it (populate's own SQL
    included) raises a `DatabaseError` from attach and fetch_window."""
    async with runtime(db, SelfTerminatingCards()) as rt:
        with pytest.raises(DatabaseError) as attached:
            await rt.registry.attach(ALICE, "self_terminating_cards", WindowSpec(Query(RankQuery(10))))
        assert_translated(attached.value)
        assert not rt.registry.sessions
        with pytest.raises(DatabaseError) as fetched:
            await rt.registry.fetch_window("self_terminating_cards", RankQuery(10), ALICE)
        assert_translated(fetched.value)
        # The pool recovers: the next read is served.
        assert await rt.registry.fetch("self_terminating_cards", "none", ALICE) is None
