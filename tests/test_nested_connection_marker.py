"""The "this task holds a pooled connection" mark (`service_engine.db.pool`):
who counts as the holder. Pure: the pools are stand-ins, nothing connects."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service_engine import Database
from service_engine.db.pool import holds
from service_engine.errors import EngineError, NestedConnectionError


def database(pool: object) -> Database:
    stand_in: Any = pool  # `hold` / `refuse_nested` compare the pool by identity only
    return Database(stand_in, "postgresql://unused")


def test_the_holder_is_one_task_of_one_pool() -> None:
    """Only the same task and the same pool count as holding; no mark holds nothing."""
    task, other_task, pool, other_pool = object(), object(), object(), object()
    assert holds((task, pool), task, pool)
    assert not holds((task, pool), other_task, pool)
    assert not holds((task, pool), task, other_pool)
    assert not holds(None, task, pool)


async def test_a_holding_task_is_refused_and_a_task_it_starts_is_not() -> None:
    """While a task holds a connection of a pool, that task's next entry to
    the same pool raises `NestedConnectionError` (an `EngineError` naming
    the entry and what to do); a task started inside the block copies the
    mark with its context but is not the holder; another pool is not
    refused; after `unhold` nothing is."""
    pool = object()
    db, same_pool, other = database(pool), database(pool), database(object())
    held = db.hold()
    try:
        with pytest.raises(NestedConnectionError) as raised:
            db.refuse_nested("Database.fetch")
        assert isinstance(raised.value, EngineError)
        assert raised.value.code == "nested_connection"
        assert "Database.fetch" in str(raised.value)
        assert "use the connection you were given" in str(raised.value)
        with pytest.raises(NestedConnectionError):
            same_pool.refuse_nested("a render read")  # another wrapper of the same pool
        other.refuse_nested("another pool")

        async def child() -> None:
            db.refuse_nested("a task started inside the block")

        await asyncio.create_task(child())
    finally:
        db.unhold(held)
    db.refuse_nested("after the release")


async def test_marks_nest_and_unwind() -> None:
    """A mark set over another (a second pool held inside the first) unwinds
    to the outer one: the outer pool is refused again once the inner is released."""
    outer, inner = database(object()), database(object())
    first = outer.hold()
    second = inner.hold()
    with pytest.raises(NestedConnectionError):
        inner.refuse_nested("inner")
    inner.unhold(second)
    with pytest.raises(NestedConnectionError):
        outer.refuse_nested("outer")
    outer.unhold(first)
    outer.refuse_nested("outer, released")
