"""The persistence contract, run against each of the three styles.

One suite (`PersistenceContract`), subclassed once per style: the same
commands give the same observable state and the same impacts whether the
counter is a CRUD row, a soft-EDA row with facts, or a full-EDA log; the
pipeline's advisory lock serialises concurrent commands on one key even
with the store's ``lock`` a no-op; reads are plain, batched where the style
has a table, and never wait on a writer's locks.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from service_engine import Database
from service_engine.db.locks import aggregate_lock_key
from service_engine.impacts import Cause, Impact
from service_engine.pipeline import Mutation, MutationError, Success

from ..support.sample_counter import (
    ADMIN,
    NOUN,
    WRITER,
    CrudCounter,
    CrudCounterNoLock,
    EdaCounter,
    EdaCounterNoLock,
    Principal,
    SoftCounter,
    SoftCounterNoLock,
    create_counter,
    delete_counter,
    executor_for,
    freeze,
    increment,
    listen_impacts,
    unfreeze,
)


class CountingConn:
    """A connection that counts the queries a store sends through it."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.queries = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._conn, name)
        if name in ("fetch", "fetchrow", "fetchval", "execute", "executemany"):
            self.queries += 1
        return attr


class PersistenceContract:
    """What every style promises. Subclasses set the counter classes."""

    style: ClassVar[type[Any]]
    no_lock: ClassVar[type[Any]]
    batched_read_many: ClassVar[bool]

    async def load(self, db: Database, key: str) -> Any:
        async with db.pool.acquire() as conn:
            return await self.style.Store.load(conn, key)

    async def test_same_commands_same_state_and_impacts(self, db: Database) -> None:
        """The same commands give the same state and the same impacts in every persistence
        style."""
        executor = executor_for(db)
        s = self.style
        async with listen_impacts(db) as probe:
            assert await executor.ack(WRITER, create_counter, s, "k1") == Success()
            assert await executor.ack(WRITER, increment, s, "k1", 2) == Success()
            assert await executor.ack(WRITER, increment, s, "k1", 3) == Success()
            assert await executor.ack(ADMIN, freeze, s, "k1") == Success()
            refused = await executor.ack(WRITER, increment, s, "k1", 1)
            assert await executor.ack(ADMIN, unfreeze, s, "k1") == Success()
            assert await executor.ack(WRITER, increment, s, "k1", 4) == Success()
            groups = [await probe.next() for _ in range(6)]
            await probe.assert_quiet()

        assert isinstance(refused, MutationError)
        assert (refused.code, refused.retryable) == ("counter.frozen", False)
        counter = await self.load(db, "k1")
        assert counter.observed() == ("k1", 9, False, "alice")
        entity = Impact.entity(NOUN, "k1")
        assert groups == [
            [entity],
            [Impact.entity(NOUN, "k1", Cause("counter.incremented", {"by": 2}))],
            [Impact.entity(NOUN, "k1", Cause("counter.incremented", {"by": 3}))],
            [entity],
            [entity],
            [Impact.entity(NOUN, "k1", Cause("counter.incremented", {"by": 4}))],
        ]

    async def test_create_of_an_existing_key_is_a_unique_violation(self, db: Database) -> None:
        """Creating an existing key answers unique_violation and leaves the aggregate as it
        was."""
        executor = executor_for(db)
        assert await executor.ack(WRITER, create_counter, self.style, "dup") == Success()
        await executor.ack(WRITER, increment, self.style, "dup", 5)
        outcome = await executor.ack(ADMIN, create_counter, self.style, "dup")
        assert isinstance(outcome, MutationError)
        assert (outcome.code, outcome.retryable) == ("unique_violation", False)
        assert (await self.load(db, "dup")).observed() == ("dup", 5, False, "alice")

    async def test_missing_aggregate_is_not_found(self, db: Database) -> None:
        """A command on a missing aggregate answers not_found and creates nothing."""
        executor = executor_for(db)
        outcome = await executor.ack(WRITER, increment, self.style, "nope")
        assert isinstance(outcome, MutationError)
        assert outcome.code == "not_found"
        assert await self.load(db, "nope") is None

    async def test_delete_removes_the_aggregate(self, db: Database) -> None:
        """Delete removes the aggregate with one impact; deleting it again is not_found."""
        executor = executor_for(db)
        await executor.ack(WRITER, create_counter, self.style, "gone")
        async with listen_impacts(db) as probe:
            assert await executor.ack(ADMIN, delete_counter, self.style, "gone") == Success()
            assert await probe.next() == [Impact.entity(NOUN, "gone")]
        assert await self.load(db, "gone") is None
        again = await executor.ack(ADMIN, delete_counter, self.style, "gone")
        assert isinstance(again, MutationError) and again.code == "not_found"

    async def test_read_many_finds_in_key_order(self, db: Database) -> None:
        """read_many finds the aggregates in the order of the keys asked, skipping missing
        ones, in one query where the style batches."""
        executor = executor_for(db)
        for key, by in (("a", 1), ("b", 2), ("c", 3)):
            await executor.ack(WRITER, create_counter, self.style, key)
            await executor.ack(WRITER, increment, self.style, key, by)
        async with db.pool.acquire() as conn:
            counting = CountingConn(conn)
            found = await self.style.Store.read_many(counting, ["c", "missing", "a", "b"])
            assert await self.style.Store.read_many(conn, []) == []
        assert [c.observed()[:2] for c in found] == [("c", 3), ("a", 1), ("b", 2)]
        expected_queries = 1 if self.batched_read_many else 4
        assert counting.queries == expected_queries

    async def test_reads_never_wait_on_a_writer(self, db: Database) -> None:
        """A writer holding the advisory lock and the row lock does not
        delay `load` nor `read_many` (the render side's reads)."""
        executor = executor_for(db)
        await executor.ack(WRITER, create_counter, self.style, "busy")
        store = self.style.Store
        async with db.pool.acquire() as writer, writer.transaction():
            await writer.execute(
                "SELECT pg_advisory_xact_lock($1)", aggregate_lock_key(store.store_type, "busy")
            )
            await store.lock(writer, "busy")
            async with db.pool.acquire() as reader:
                loaded = await asyncio.wait_for(store.load(reader, "busy"), 2)
                many = await asyncio.wait_for(store.read_many(reader, ["busy"]), 2)
        assert loaded.observed() == ("busy", 0, False, "alice")
        assert [c.observed() for c in many] == [loaded.observed()]

    async def test_concurrent_increments_on_one_key_serialise(self, db: Database) -> None:
        """N concurrent read-modify-write commands on one key give exactly N,
        with the store's ``lock`` a no-op: the advisory lock serialises."""
        n = 20
        # The last of n waits for the n - 1 before it: the bound is generous
        # so a loaded machine still shows serialisation, not lock_timeout.
        executor = executor_for(db, lock_timeout=timedelta(seconds=25))
        style = self.no_lock
        assert style.Store.lock_rows is False
        await executor.ack(WRITER, create_counter, style, "hot")

        async def slow_increment(cx: Mutation[Principal]) -> None:
            counter = await cx.load(style, "hot")
            await asyncio.sleep(0.005)  # widen the read-modify-write window
            counter.increment(1, cx.principal.id)
            await cx.save(counter)
            cx.impact(NOUN, "hot")

        outcomes = await asyncio.gather(*(executor.ack(WRITER, slow_increment) for _ in range(n)))
        assert outcomes == [Success()] * n
        assert (await self.load(db, "hot")).value == n

    async def test_a_refused_command_writes_nothing(self, db: Database) -> None:
        """A command the gate refuses answers forbidden, writes nothing and stages no
        impact."""
        executor = executor_for(db)
        await executor.ack(WRITER, create_counter, self.style, "calm")
        async with listen_impacts(db) as probe:
            outcome = await executor.ack(Principal("eve"), increment, self.style, "calm", 7)
            await probe.assert_quiet()
        assert isinstance(outcome, MutationError)
        assert (outcome.code, outcome.message) == ("forbidden", "increment refused: forbidden")
        assert (await self.load(db, "calm")).observed() == ("calm", 0, False, "alice")


class TestCrud(PersistenceContract):
    style = CrudCounter
    no_lock = CrudCounterNoLock
    batched_read_many = True


class TestSoftEda(PersistenceContract):
    style = SoftCounter
    no_lock = SoftCounterNoLock
    batched_read_many = True


class TestFullEda(PersistenceContract):
    style = EdaCounter
    no_lock = EdaCounterNoLock
    batched_read_many = False


@pytest.mark.parametrize("style", [CrudCounter, SoftCounter, EdaCounter])
async def test_events_follow_the_style(db: Database, style: type[Any]) -> None:
    """CRUD writes no events; soft EDA writes one fact per command next to
    the row; full EDA's log is the state."""
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, style, "ev")
    await executor.ack(WRITER, increment, style, "ev", 2)
    facts = await db.pool.fetch(
        "SELECT fact_type, payload FROM sample_counter_soft_fact WHERE counter_id = 'ev' ORDER BY id"
    )
    log = await db.pool.fetch(
        "SELECT seq, event_type, payload FROM service_engine.event_log WHERE key = '\"ev\"' ORDER BY seq"
    )
    if style is CrudCounter:
        assert (facts, log) == ([], [])
    elif style is SoftCounter:
        assert [(f["fact_type"], f["payload"]) for f in facts] == [
            ("created", {"actor": "alice"}), ("incremented", {"by": 2, "actor": "alice"}),
        ]
        assert log == []
    else:
        assert facts == []
        assert [(e["seq"], e["event_type"], e["payload"]) for e in log] == [
            (1, "created", {"actor": "alice"}), (2, "incremented", {"by": 2, "actor": "alice"}),
        ]
