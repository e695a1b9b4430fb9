"""A `CrudStore` write of a row the transaction did not load first (a blind
save, a delete): under the aggregate's advisory lock, in one round trip
with it (and BEGIN while deferred), its values inlined; with the lock
already held, the store's own prepared statement; a store with its own
`save` or `delete` takes the lock (and its `settings`) first, then runs it.
Whatever the path, a missing row is `NotFound` naming its key, a broken
constraint is the write's stage, and a lock held elsewhere is refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from service_engine import Database, Mutation, MutationError, Success
from service_engine.clock import SystemClock
from service_engine.db.errors import ConstraintViolation, DatabaseError, Stage
from service_engine.db.locks import aggregate_lock_key
from service_engine.embedded import ProvisionedDatabase
from service_engine.persistence.base import NotFound
from service_engine.pipeline.run import run_pipeline
from service_engine.testing.faults import InjectFault

from ..support.example_support import example_config
from ..support.harness import Statements, owner_connection
from ..support.sample_counter import (
    WRITER,
    CrudCounter,
    CrudCounterStore,
    create_counter,
    executor_for,
)
from ..support.sample_orders import Order, OrderStore


class OwnWrites(CrudCounter):
    """A counter whose store has its own create, save and delete, and a setting."""


class OwnWritesStore(CrudCounterStore):
    def settings(self, aggregate: CrudCounter) -> Mapping[str, str]:
        return {"app.tag": "on"}

    async def create(self, conn: Any, aggregate: CrudCounter) -> None:
        await super().create(conn, aggregate)

    async def save(self, conn: Any, aggregate: CrudCounter) -> None:
        await super().save(conn, aggregate)

    async def delete(self, conn: Any, aggregate: CrudCounter) -> None:
        await super().delete(conn, aggregate)


OwnWrites.Store = OwnWritesStore(OwnWrites)


class Settled(CrudCounter):
    """A counter whose store names a setting: its create travels inlined,
    so it waits for the next statement once the transaction has begun."""


class SettledStore(CrudCounterStore):
    def settings(self, aggregate: CrudCounter) -> Mapping[str, str]:
        return {"app.tag": "on"}


Settled.Store = SettledStore(Settled)


@dataclass
class SettledOrder(Order):
    """An order whose store names a setting (another table than the counters')."""


class SettledOrderStore(OrderStore):
    def settings(self, aggregate: Order) -> Mapping[str, str]:
        return {"app.tag": "on"}


SettledOrder.Store = SettledOrderStore()


def counter(style: type[CrudCounter], key: str, value: int) -> CrudCounter:
    return style(key, value, last_actor="w")


async def put(cx: Mutation[Any], style: type[CrudCounter], key: str, *values: int) -> None:
    for value in values:
        await cx.save(counter(style, key, value))


async def drop(cx: Mutation[Any], style: type[CrudCounter], key: str) -> None:
    await cx.delete(counter(style, key, 0))


async def create_then_put(cx: Mutation[Any], style: type[CrudCounter], key: str,
                          after: str | None = None) -> None:
    if after is not None:  # BEGIN rides with another key's lock and load first
        await cx.load_optional(style, after)
    await cx.create(counter(style, key, 1))
    await cx.save(counter(style, key, 2))


async def _pipeline(db: Database, handler: Any, *args: Any, hook: Any = None) -> Any:
    return await run_pipeline(db, example_config(), lambda conn, now: Mutation(
        conn, example_config(), now, WRITER), lambda cx: handler(cx, *args), clock=SystemClock(),
        hook=hook)


async def test_a_blind_save_or_delete_rides_with_its_lock(
    logged: tuple[Database, Statements],
) -> None:
    """A save of a row not loaded is one round trip with BEGIN and its lock,
    a second save of it (the lock held) the store's prepared UPDATE, and a
    delete one round trip with its lock; then COMMIT's. A create holds its
    key's lock for a save after it, whether the lock rode with BEGIN or with
    the INSERT."""
    db, statements = logged
    executor = executor_for(db)
    for key in ("warm", "k1"):
        assert await executor.ack(WRITER, create_counter, CrudCounter, key) == Success()
    assert await executor.ack(WRITER, put, CrudCounter, "warm", 1) == Success()
    statements.take()
    assert await executor.ack(WRITER, put, CrudCounter, "k1", 4, 5) == Success()
    saved = statements.take_own()
    assert await executor.ack(WRITER, drop, CrudCounter, "k1") == Success()
    dropped = statements.take_own()
    assert len(saved) == 3 and len(dropped) == 2, (saved, dropped)
    first = saved[0].split("; ")
    assert first[0].startswith("BEGIN") and first[2].startswith("SELECT pg_advisory_xact_lock(")
    assert first[3].startswith('UPDATE "sample_counter_crud"') and "json_populate_record" in first[3]
    assert saved[1].startswith('UPDATE "sample_counter_crud"') and "$1" in saved[1], saved
    assert dropped[0].split("; ")[3].startswith('DELETE FROM "sample_counter_crud"'), dropped
    assert saved[-1].startswith("COMMIT") and dropped[-1].startswith("COMMIT")
    assert await db.pool.fetchval("SELECT count(*) FROM sample_counter_crud WHERE id = 'k1'") == 0
    statements.take()
    assert await executor.ack(WRITER, create_then_put, CrudCounter, "k2") == Success()
    both = statements.take_own()
    assert len(both) == 3 and both[0].count("pg_advisory_xact_lock") == 1, both
    assert both[1].startswith('UPDATE "sample_counter_crud"') and "$1" in both[1], both
    assert await executor.ack(WRITER, create_then_put, CrudCounter, "k3", "k2") == Success()
    later = statements.take_own()
    assert len(later) == 5 and "pg_advisory_xact_lock" in later[2], later  # the create's own
    assert later[3].startswith('UPDATE "sample_counter_crud"') and "$1" in later[3], later


async def test_a_blind_writes_refusals_name_its_key_stage_and_lock(
    database: ProvisionedDatabase, db: Database,
) -> None:
    """On the inlined path and on a store's own writes alike: a taken key is
    a `ConstraintViolation` at stage ``create``, a missing row `NotFound`
    naming its key, a value the table's check refuses a violation at stage
    ``save``; the own create and save run under the store's settings (a
    check on ``current_setting`` admits them, and refuses a store without
    them); a key whose advisory lock is held elsewhere is ``lock_timeout``."""
    async with owner_connection(database) as conn:
        await conn.execute("ALTER TABLE sample_counter_crud ADD CONSTRAINT tagged CHECK"
                           " (id NOT LIKE 'own%' OR coalesce(current_setting('app.tag', true), '') = 'on')"
                           " NOT VALID")
    executor = executor_for(db, lock_timeout=timedelta(milliseconds=200))
    refused = await executor.ack(WRITER, create_counter, CrudCounter, "own-untagged")
    assert isinstance(refused, MutationError), refused  # the check is real
    for style, key in ((CrudCounter, "c1"), (OwnWrites, "own1")):
        assert await executor.ack(WRITER, create_counter, style, key) == Success()
        with pytest.raises(ConstraintViolation) as taken:
            await _pipeline(db, create_counter, style, key)
        assert (taken.value.kind, taken.value.stage) == ("unique", Stage.CREATE)
        with pytest.raises(NotFound) as missing:
            await _pipeline(db, put, style, f"{key}-none", 1)
        assert missing.value.key == f"{key}-none"
        with pytest.raises(ConstraintViolation) as broken:
            await _pipeline(db, put, style, key, 2_000_000)
        assert (broken.value.kind, broken.value.stage) == ("check", Stage.SAVE)
        assert await executor.ack(WRITER, put, style, key, 7) == Success()
        assert await db.pool.fetchval(
            "SELECT value FROM sample_counter_crud WHERE id = $1", key) == 7
        async with db.pool.acquire() as holder, holder.transaction():
            await holder.execute("SELECT pg_advisory_xact_lock($1)",
                                 aggregate_lock_key(style.Store.store_type, key))
            refused = await executor.ack(WRITER, put, style, key, 8)
        assert isinstance(refused, MutationError) and refused.code == "lock_timeout", refused
        assert await executor.ack(WRITER, drop, style, key) == Success()
        assert await db.pool.fetchval(
            "SELECT count(*) FROM sample_counter_crud WHERE id = $1", key) == 0


async def test_a_fault_right_after_begin_is_begins_when_an_insert_rode_with_it(
    database: ProvisionedDatabase, db: Database,
) -> None:
    """The fault hook's BEGIN stage runs once the round trip that began the
    transaction returned; when an INSERT rode in that round trip, a failure
    of the hook's own statement is still BEGIN's, not the insert's, and a
    hook that passes lets the insert commit (under its store's settings)."""
    with pytest.raises(DatabaseError) as caught:
        await _pipeline(db, create_counter, CrudCounter, "f1", hook=InjectFault(Stage.BEGIN))
    assert caught.value.stage is Stage.BEGIN
    stages: list[Stage] = []

    async def passing(stage: Stage, conn: Any) -> None:
        stages.append(stage)

    await _pipeline(db, create_counter, CrudCounter, "f2", hook=passing)
    assert stages == [Stage.BEGIN, Stage.FLUSH, Stage.COMMIT]
    async with owner_connection(database) as conn:
        await conn.execute("ALTER TABLE sample_counter_crud ADD CONSTRAINT tagged CHECK"
                           " (id NOT LIKE 'own%' OR coalesce(current_setting('app.tag', true), '') = 'on')"
                           " NOT VALID")
    await _pipeline(db, create_counter, Settled, "own-f3", hook=passing)  # under its settings
    assert await db.pool.fetchval(
        "SELECT array_agg(id ORDER BY id) FROM sample_counter_crud WHERE id LIKE '%f%'"
    ) == ["f2", "own-f3"]


async def create_then(cx: Mutation[Any], key: str, then: str) -> int | None:
    other = await cx.load(CrudCounter, f"{key}-other") if then == "save-other" else None
    await cx.create(counter(Settled if other is not None else CrudCounter, key, 1))
    if then == "load":
        return (await cx.load(CrudCounter, key)).value
    if then == "lock":
        await cx.lock_all((CrudCounter, f"{key}-next"))
    if then == "create":
        await cx.create(counter(CrudCounter, f"{key}-next", 1))
    if then.startswith("create-settled"):
        await cx.create(counter(Settled, f"{key}-next", 1))
    if then == "create-settled-load":  # both wait, then go before the load
        return (await cx.load(Settled, f"{key}-next")).value
    if other is not None:  # pinned before the create, saved after it
        other.value = 2_000_000  # the table's check refuses it
        await cx.save(other)
    return None


async def save_then_create(cx: Mutation[Any], key: str, created: Order | CrudCounter) -> None:
    pinned = await cx.load(CrudCounter, key)
    pinned.value += 1
    await cx.save(pinned)  # waits for COMMIT's round trip
    await cx.create(created)  # behind its settings: waits too


async def test_a_create_waits_for_the_next_statement(
    logged: tuple[Database, Statements],
) -> None:
    """A blind insert as the transaction's first statement waits for the
    next one, behind its advisory lock: alone, BEGIN, the lock, the INSERT
    and COMMIT are one round trip; a second create after it is the store's
    prepared insert with its lock, sent after the first, unless its store
    names settings (then it waits too, and rides with the first); a load of its key
    after it reads the new row; a lock taken after it comes after the
    create's own (the handler's lock order)."""
    db, statements = logged
    executor = executor_for(db)
    assert await executor.ack(WRITER, create_counter, CrudCounter, "warm") == Success()
    statements.take()
    assert await executor.ack(WRITER, create_counter, CrudCounter, "d1") == Success()
    [sent] = statements.take_own()
    assert sent.index("pg_advisory_xact_lock") < sent.index('INSERT INTO "sample_counter_crud"')
    assert sent.index('INSERT INTO "sample_counter_crud"') < sent.index("; COMMIT; ")
    assert await executor.ack(WRITER, create_then, "d0", "create") == Success()
    first, second, last = statements.take_own()
    assert first.startswith("BEGIN") and 'INSERT INTO "sample_counter_crud"' in first
    assert second.startswith("WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock($1))")
    assert last.startswith("COMMIT")
    assert await executor.ack(WRITER, create_then, "d4", "create-settled") == Success()
    [sent] = statements.take_own()
    assert sent.count('INSERT INTO "sample_counter_crud"') == 2 and "; COMMIT; " in sent, sent
    assert await executor.execute(WRITER, create_then, "d5", "create-settled-load") == 1
    both, load, _ = statements.take_own()
    assert both.count('INSERT INTO "sample_counter_crud"') == 2 and load.endswith("FOR UPDATE")
    assert await executor.execute(WRITER, create_then, "d2", "load") == 1
    assert await executor.ack(WRITER, create_then, "d3", "lock") == Success()
    sent = "; ".join(s for s in statements.take() if "pg_advisory_xact_lock" in s)
    d3, following = (aggregate_lock_key(CrudCounter.Store.store_type, k) for k in ("d3", "d3-next"))
    assert sent.index(f"pg_advisory_xact_lock({d3})") < sent.index(f"({following})"), sent
    assert await db.pool.fetchval(
        "SELECT array_agg(id ORDER BY id) FROM sample_counter_crud WHERE id LIKE 'd%'"
    ) == ["d0", "d0-next", "d1", "d2", "d3", "d4", "d4-next", "d5", "d5-next"]


async def test_a_waiting_creates_errors_stay_its_own(db: Database) -> None:
    """A blind insert that waited for COMMIT's round trip keeps its errors:
    a taken key is ``unique`` at stage ``create`` (also beside a pinned save,
    of its table or another), a lock held elsewhere ``lock_timeout`` at stage
    ``lock`` (as a blind save's is), and a pinned save of another row of its
    table after it still ``save``'s; none commits anything."""
    executor = executor_for(db, lock_timeout=timedelta(milliseconds=200))
    assert await executor.ack(WRITER, create_counter, CrudCounter, "e1") == Success()
    with pytest.raises(ConstraintViolation) as taken:
        await _pipeline(db, create_counter, CrudCounter, "e1")
    assert (taken.value.kind, taken.value.stage) == ("unique", Stage.CREATE)
    async with db.pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT pg_advisory_xact_lock($1)",
                             aggregate_lock_key(CrudCounter.Store.store_type, "e2"))
        refused = await executor.ack(WRITER, create_counter, CrudCounter, "e2")
        with pytest.raises(DatabaseError) as held:
            await run_pipeline(
                db, example_config(lock_timeout=timedelta(milliseconds=200)),
                lambda conn, now: Mutation(conn, example_config(), now, WRITER),
                lambda cx: create_counter(cx, CrudCounter, "e2"), clock=SystemClock())
        with pytest.raises(DatabaseError) as blind:
            await run_pipeline(
                db, example_config(lock_timeout=timedelta(milliseconds=200)),
                lambda conn, now: Mutation(conn, example_config(), now, WRITER),
                lambda cx: put(cx, CrudCounter, "e2", 1), clock=SystemClock())
    assert isinstance(refused, MutationError) and refused.code == "lock_timeout", refused
    assert held.value.stage is Stage.LOCK and blind.value.stage is Stage.LOCK
    await _pipeline(db, lambda cx: cx.create(Order("e-o", "pen", 1)))
    for created in (SettledOrder("e-o", "ink", 2), counter(Settled, "e1", 1)):
        with pytest.raises(ConstraintViolation) as beside:
            await _pipeline(db, save_then_create, "e1", created)
        assert (beside.value.kind, beside.value.stage) == ("unique", Stage.CREATE), created
    assert await executor.ack(WRITER, create_counter, CrudCounter, "e3-other") == Success()
    with pytest.raises(ConstraintViolation) as broken:
        await _pipeline(db, create_then, "e3", "save-other")
    assert (broken.value.kind, broken.value.stage) == ("check", Stage.SAVE)
    assert await db.pool.fetchval(
        "SELECT array_agg(id ORDER BY id) FROM sample_counter_crud WHERE id LIKE 'e%'"
    ) == ["e1", "e3-other"]
