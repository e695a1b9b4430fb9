"""A task that holds a pooled connection is refused a second one of the
same pool at once, with `NestedConnectionError`, instead of waiting for it.

A handler, a custom store, a projector hook or an erasable runs while the
engine holds a connection for it (the pipeline's transaction, a render
read). Reaching the pool again from there (`Engine.fetch`,
`Engine.load_principal_facts`, `Database.fetch`, another mutation) would
wait for a second connection while holding the first: with every
connection so held, the pod stops for good. Over a real engine on a
two-connection pool: the misuse fails at once, commits nothing and leaves
the pool whole; what runs after the release (``after_commit``) and what a
task started inside the block does are not refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from service_engine import Database, Engine, Erase, MutationError, MutationExecutor, connect_pool
from service_engine.db.types import Conn
from service_engine.embedded import ProvisionedDatabase
from service_engine.errors import NestedConnectionError
from service_engine.impacts.model import JsonValue
from service_engine.pipeline import Mutation
from service_engine.principal_facts import PrincipalFactLoadFailed
from service_engine.render.projector import Populate
from service_engine.render.windows import Query, WindowSpec

from ..support.harness import engine_running, fast_engine_config, wait_until
from ..support.sample_cards import Card, CardStore, CardsView, Principal, RankQuery

ALICE = Principal("alice", frozenset({"acme"}))
POOL = 2
"""Connections in the pool: fewer than the concurrent callers below."""
CALLERS = 2 * POOL
BOUND = 10.0
"""Seconds a call may take before it counts as waiting for a connection."""

Reach = Callable[[], Awaitable[object]]


@dataclass
class NestedCard(Card):
    """A card whose store runs ``reach`` inside its ``create`` (not a column)."""

    Store: ClassVar[Any] = None
    reach: Reach | None = None

    def blob_refs(self) -> tuple[str, ...]:
        return ()


class NestedCardStore(CardStore):
    """A custom store method that may reach the pool from inside the pipeline."""

    def from_row(self, row: Any) -> NestedCard:
        return NestedCard(row["id"], row["org"], row["rank"], row["title"])

    async def create(self, conn: Conn, aggregate: Card) -> None:
        reach = getattr(aggregate, "reach", None)
        if reach is not None:
            await reach()
        await super().create(conn, aggregate)


NestedCard.Store = NestedCardStore()


def reaching_populate(reach: Reach) -> CardsView:
    """The cards projector whose ``populate`` first runs ``reach``."""

    class ReachingPopulate(CardsView):
        NAME = "reaching_populate"

        async def populate(self, cx: Populate[Principal], query: RankQuery) -> Sequence[JsonValue]:
            await reach()
            return await super().populate(cx, query)

    return ReachingPopulate()


def reaching_store(reach: Reach) -> CardsView:
    """The cards projector whose store's ``read_many`` first runs ``reach``."""

    class ReachingStore(NestedCardStore):
        async def read_many(self, conn: Conn, keys: Sequence[str]) -> list[Card]:
            await reach()
            return await super().read_many(conn, keys)

    class ReachingStoreView(CardsView):
        NAME = "reaching_store"
        STORE: ClassVar[Any] = ReachingStore()

    return ReachingStoreView()


@pytest.fixture
async def two(database: ProvisionedDatabase) -> AsyncIterator[Database]:
    """A pool of `POOL` connections, closed (or terminated, if a test left
    connections held) at the end."""
    db = await connect_pool(database.app_url, min_size=1, max_size=POOL)
    try:
        yield db
    finally:
        try:
            await asyncio.wait_for(db.aclose(), BOUND)
        except TimeoutError:
            db.pool.terminate()  # held connections would keep aclose waiting


def running(db: Database, *projectors: Any) -> contextlib.AbstractAsyncContextManager[Engine]:
    config = fast_engine_config(None, lock_timeout=timedelta(seconds=1))
    return engine_running(config, db, *projectors, bound=BOUND)


async def at_once(calls: Sequence[Awaitable[Any]], what: str) -> list[Any]:
    """Every call's result or exception; the test fails if they do not all
    end within `BOUND` (a caller waiting for a connection it cannot get)."""
    running = asyncio.ensure_future(asyncio.gather(*calls, return_exceptions=True))
    done, _ = await asyncio.wait({running}, timeout=BOUND)
    if not done:
        running.cancel()
        pytest.fail(f"{what}: callers holding the pool's connections waited for more of them")
    return list(running.result())


async def whole(db: Database) -> None:
    """Every connection is back in the pool."""
    await wait_until(lambda: db.in_use() == 0, what="every pool connection released")


async def cards_named(db: Database, prefix: str) -> int:
    count: int = await db.pool.fetchval(
        "SELECT count(*) FROM sample_card WHERE id LIKE $1", f"{prefix}%"
    )
    return count


async def create(cx: Mutation[Principal], card_id: str, reach: Reach | None = None) -> None:
    await cx.create(NestedCard(card_id, "acme", 1, card_id, reach))
    cx.impact("card", card_id)


def entries(engine: Engine, db: Database, executor: MutationExecutor) -> dict[str, Reach]:
    """Engine entries that take a connection of the engine's pool."""
    return {
        "Engine.fetch": lambda: engine.fetch("cards", "x", ALICE),
        "Engine.fetch_window": lambda: engine.fetch_window("cards", RankQuery(5), ALICE),
        "Database.fetch": lambda: db.fetch("SELECT 1"),
        "a second mutation": lambda: executor.execute(ALICE, create, "inner-mutation"),
    }


async def test_a_handler_reaching_the_pool_is_refused_and_commits_nothing(two: Database) -> None:
    """A mutation handler that awaits an engine read, a pool fetch or another
    mutation while its pipeline holds a connection gets `NestedConnectionError`
    at once, for more such mutations at once than the pool has connections:
    none commits its row, every connection is released, and the next
    mutation commits."""
    async with running(two, CardsView()) as engine:
        executor = engine.mutation_executor()

        async def handler(cx: Mutation[Principal], card_id: str, reach: Reach) -> None:
            await create(cx, card_id)
            await reach()

        for name, reach in entries(engine, two, executor).items():
            results = await at_once(
                [executor.execute(ALICE, handler, f"h{i}", reach) for i in range(CALLERS)], name
            )
            assert all(isinstance(r, NestedConnectionError) for r in results), (name, results)
            assert "use the connection you were given" in str(results[0])
        assert await cards_named(two, "h") == 0
        assert await cards_named(two, "inner-mutation") == 0
        await whole(two)
        await executor.execute(ALICE, create, "after")
        assert await cards_named(two, "after") == 1


async def test_principal_facts_loaded_inside_a_handler_fail_closed(two: Database) -> None:
    """A handler that loads principal facts (a loader reading the pool) while
    holding its connection fails closed: the loader's `NestedConnectionError`
    surfaces as `PrincipalFactLoadFailed` (its cause), nothing commits and
    the pool is whole; outside a pipeline the same load succeeds."""
    async with running(two, CardsView()) as engine:
        async def loader(principal: Principal) -> Principal:
            await two.fetch("SELECT 1")  # a fact's one SELECT on the same pool
            return principal

        engine.register_principal_fact(loader)
        executor = engine.mutation_executor()

        async def handler(cx: Mutation[Principal], card_id: str) -> None:
            await create(cx, card_id)
            await engine.load_principal_facts(cx.principal)

        results = await at_once(
            [executor.execute(ALICE, handler, f"f{i}") for i in range(CALLERS)], "facts"
        )
        for result in results:
            assert isinstance(result, PrincipalFactLoadFailed), result
            assert isinstance(result.__cause__, NestedConnectionError)
        assert await cards_named(two, "f") == 0
        await whole(two)
        assert await engine.load_principal_facts(ALICE) == ALICE


async def test_a_store_method_reaching_the_pool_is_refused(two: Database) -> None:
    """A custom store's ``create`` that reads through the engine's pool
    instead of its ``conn`` is refused inside the pipeline: nothing commits,
    the pool is whole."""
    async with running(two, CardsView()) as engine:
        executor = engine.mutation_executor()
        results = await at_once(
            [executor.execute(ALICE, create, f"s{i}", lambda: two.fetch("SELECT 1"))
             for i in range(CALLERS)],
            "store",
        )
        assert all(isinstance(r, NestedConnectionError) for r in results), results
        assert await cards_named(two, "s") == 0
        await whole(two)


async def test_an_erasable_reaching_the_pool_is_refused(two: Database) -> None:
    """An `Erasable` that reads through the engine's pool inside the
    erasure's one transaction is refused: the erasure raises
    `NestedConnectionError`, records nothing and leaves the pool whole."""
    async with running(two, CardsView()) as engine:
        class Reaching:
            async def erase(self, cx: Erase, person: str) -> None:
                await two.fetch("SELECT 1")

        engine.register_erasable("reaching", Reaching())
        with pytest.raises(NestedConnectionError):
            await asyncio.wait_for(engine.erase("p-1"), BOUND)
        recorded = await two.pool.fetchval(
            "SELECT count(*) FROM service_engine.person_erasure WHERE person = 'p-1'"
        )
        assert recorded == 0
        await whole(two)


async def test_a_projector_hook_reaching_the_pool_during_a_render_read_is_refused(
    two: Database,
) -> None:
    """A projector's ``populate`` or its store's ``read_many`` that reaches
    the pool during a render read (fetch, fetch_window, attach) gets
    `NestedConnectionError` at once, for more reads at once than the pool
    has connections; the pool is whole and a plain projector's reads go on."""
    def reach() -> Awaitable[object]:
        return two.fetch("SELECT 1")

    async with running(two, CardsView(), reaching_populate(reach), reaching_store(reach)) as engine:
        async with two.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO sample_card (id, org, rank, title) VALUES ('r1', 'acme', 1, 'one')"
            )
        reads: dict[str, Callable[[], Awaitable[object]]] = {
            "populate": lambda: engine.fetch_window("reaching_populate", RankQuery(5), ALICE),
            "read_many (fetch)": lambda: engine.fetch("reaching_store", "r1", ALICE),
            "read_many (fetch_window)": lambda: engine.fetch_window(
                "reaching_store", RankQuery(5), ALICE
            ),
            "attach": lambda: engine.attach(
                ALICE, "reaching_populate", WindowSpec(Query(RankQuery(5)))
            ),
        }
        for name, read in reads.items():
            results = await at_once([read() for _ in range(CALLERS)], name)
            assert all(isinstance(r, NestedConnectionError) for r in results), (name, results)
        await whole(two)
        assert await engine.fetch("cards", "r1", ALICE) == ("acme", 1, "one")


async def test_after_commit_and_a_task_started_inside_may_take_a_connection(
    two: Database,
) -> None:
    """What runs after the pipeline released its connection (an
    ``after_commit`` hook reading a view) is not refused: more such
    mutations at once than the pool has connections all commit and each
    hook sees its committed row. Nor is a task the handler starts (it copied
    the mark with its context but is not the holder): with a connection to
    spare, it reads and the mutation commits."""
    async with running(two, CardsView()) as engine:
        executor = engine.mutation_executor()
        seen: list[Any] = []

        async def handler(cx: Mutation[Principal], card_id: str) -> None:
            await create(cx, card_id)

            async def read_after() -> None:
                seen.append(await engine.fetch("cards", card_id, ALICE))

            # The seam seals and presence puts use: run once committed and released.
            cx._after_commit.append(read_after)

        results = await at_once(
            [executor.execute(ALICE, handler, f"a{i}") for i in range(CALLERS)], "after_commit"
        )
        assert all(not isinstance(r, BaseException) for r in results), results
        assert await cards_named(two, "a") == CALLERS
        assert sorted(seen) == sorted(("acme", 1, f"a{i}") for i in range(CALLERS))

        async def spawning(cx: Mutation[Principal], card_id: str) -> None:
            await create(cx, card_id)
            assert len(await asyncio.create_task(two.fetch("SELECT 1"))) == 1

        await at_once([executor.execute(ALICE, spawning, "t0")], "a task of its own")
        assert await cards_named(two, "t0") == 1
        await whole(two)


async def test_a_wait_the_mark_does_not_see_is_bounded(two: Database) -> None:
    """A handler that waits on a task of its own which needs a second
    connection for a bounded read (the mark names the holding task, so the
    child is not refused) cannot hang the pod: with more such mutations at once than the
    pool has connections, each ends within the acquire's bound, committed or
    refused as a `DatabaseError` (answered as the ``database`` `MutationError`), and the pool is whole afterwards."""
    async with running(two, CardsView()) as engine:
        executor = engine.mutation_executor()

        async def spawning(cx: Mutation[Principal], card_id: str) -> None:
            await create(cx, card_id)
            await asyncio.create_task(two.fetch("SELECT 1", bound=1.0))

        results = await at_once(
            [executor.execute(ALICE, spawning, f"w{i}") for i in range(CALLERS)], "child tasks"
        )
        assert not [r for r in results if isinstance(r, BaseException)], results
        refused = [r for r in results if isinstance(r, MutationError)]
        assert all(r.code == MutationError.DATABASE for r in refused), refused
        assert await cards_named(two, "w") == CALLERS - len(refused)
        await whole(two)
        await executor.execute(ALICE, create, "after")
        assert await cards_named(two, "after") == 1
