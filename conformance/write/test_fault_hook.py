"""The fault-injection seam does not change what the pipeline sends.

A `StageHook` observes the pipeline's stages; production runs without one.
These tests capture every statement the pipeline's connection sends (the
driver's query logger, on a one-connection pool) and compare a hooked run
with an unhooked one: the same statements in the same order, BEGIN with
``SET LOCAL lock_timeout`` and the first advisory lock in one round trip.
A firing `InjectFault` adds exactly its own failing statement.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from service_engine import Database
from service_engine.db.errors import Stage
from service_engine.db.types import Conn
from service_engine.pipeline import Mutation, MutationError, MutationExecutor, Success
from service_engine.testing.faults import RAISE_SQL, InjectFault

from ..support.harness import Statements
from ..support.sample_counter import (
    NOUN,
    WRITER,
    CrudCounter,
    Principal,
    create_counter,
    executor_for,
    increment,
)

_GROUP_ID = re.compile(r"(\$m\d+\$\d+\|)[0-9a-f]{16}\|")
_COUNT = re.compile(r'"value":\d+')


async def _sent(
    statements: Statements,
    executor: MutationExecutor,
    hook: Any,
    handler: Callable[..., Awaitable[object]],
    *args: object,
) -> tuple[object, list[str]]:
    """What one mutation answered and every statement it sent (an inlined
    impact frame's group id, fresh per commit, as ``<group>``; an inlined
    counter value, one more per run, as ``<n>``)."""
    statements.sent.clear()
    outcome = await executor.with_hook(hook).ack(WRITER, handler, *args)
    return outcome, [_COUNT.sub('"value":<n>', _GROUP_ID.sub(r"\1<group>|", s))
                     for s in statements.sent]


async def _touch_nothing(cx: Mutation[Principal]) -> None:
    cx.impact(NOUN, "elsewhere")


def _observer(seen: list[Stage]) -> Callable[[Stage, Conn], Awaitable[None]]:
    async def observe(stage: Stage, conn: Conn) -> None:
        seen.append(stage)

    return observe


@pytest.mark.parametrize("locks", [True, False], ids=["first-lock", "no-lock"])
async def test_a_hooked_pipeline_sends_the_statements_an_unhooked_one_sends(
    logged: tuple[Database, Statements], locks: bool
) -> None:
    """With an observing hook (and with an `InjectFault` that does not fire)
    a mutation sends exactly what it sends without a hook: BEGIN, the lock
    bound and the first advisory lock in one round trip, then the same
    statements to COMMIT (which carries the release reset); the hook still
    sees every stage."""
    db, statements = logged
    executor: MutationExecutor = executor_for(db)
    await executor.ack(WRITER, create_counter, CrudCounter, "h1")
    handler, args = (increment, (CrudCounter, "h1")) if locks else (_touch_nothing, ())
    seen: list[Stage] = []
    plain, unhooked = await _sent(statements, executor, None, handler, *args)
    observed, hooked = await _sent(statements, executor, _observer(seen), handler, *args)
    idle = InjectFault(Stage.BEGIN, times=0)
    _, with_idle_fault = await _sent(statements, executor, idle, handler, *args)
    assert plain == observed == Success()
    assert hooked == unhooked == with_idle_fault
    assert unhooked[0].startswith("BEGIN; SET LOCAL lock_timeout")
    # COMMIT carries the impacts' NOTIFY and the pool's release reset: the
    # last round trip, no other after it.
    assert [s for s in unhooked if "COMMIT" in s] == [unhooked[-1]]
    # (After the pinned row's save, which rides there too.)
    assert unhooked[-1].startswith('UPDATE "sample_counter_crud"' if locks else "SELECT pg_notify")
    assert "SELECT pg_notify('service_engine_impacts', $m0$1|<group>|" in unhooked[-1]
    assert "; COMMIT; " in unhooked[-1] and "RESET ALL" in unhooked[-1]
    assert ("pg_advisory_xact_lock" in unhooked[0]) is locks
    assert seen == [Stage.BEGIN, Stage.FLUSH, Stage.COMMIT]


@pytest.mark.parametrize("stage", [Stage.BEGIN, Stage.FLUSH])
async def test_a_firing_fault_adds_only_its_own_statement(
    logged: tuple[Database, Statements], stage: Stage
) -> None:
    """A fault that fires sends its one failing statement into the
    transaction at its stage, after the same statements as production; the
    pipeline then rolls back instead of going on."""
    db, statements = logged
    executor = executor_for(db)
    await executor.ack(WRITER, create_counter, CrudCounter, "h2")
    _, unhooked = await _sent(statements, executor, None, increment, CrudCounter, "h2")
    fault = InjectFault(stage)
    outcome, hooked = await _sent(statements, executor, fault, increment, CrudCounter, "h2")
    assert isinstance(outcome, MutationError) and outcome.code == "database"
    at = hooked.index(" ".join(RAISE_SQL.split()))
    assert hooked[:at] == unhooked[:at]
    assert hooked[at + 1] == "ROLLBACK"
    if stage is Stage.BEGIN:
        assert at == 1 and "pg_advisory_xact_lock" in hooked[0]


def test_the_driver_logs_what_a_pool_connection_sends() -> None:
    """The capture itself rests on asyncpg's query logger."""
    assert hasattr(asyncpg.Connection, "add_query_logger")
