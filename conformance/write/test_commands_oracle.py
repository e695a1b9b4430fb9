"""The interpreter (`runner.interpret`, the oracle the compiled commands are
proven against) where only a controlled clock or a store without row locks
shows it (real Postgres).

The random comparison (`test_commands_compiled`) runs on the wall clock
with a day's retention, so no record there expires: here each property of
the idempotency record's retention holds for the interpreter exactly as for
the compiled function (`CommandRunner`), on one stepped clock. Its stores
pin every row they load, so no write slips between a check and the commit
there: here a store without row locks lets one in, and the interpreter's
read dependency fails the commit instead of losing it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from service_engine import Database
from service_engine.clock import Timestamp
from service_engine.commands import (
    INVALID_INPUT,
    Catalog,
    CheckedCommand,
    CommandConfig,
    CommandOutcome,
    CommandRunner,
)
from service_engine.commands.plan import InvalidInput
from service_engine.commands.runner import interpret
from service_engine.db.types import Conn
from service_engine.pipeline import MutationError, MutationExecutor

from ..support.sample_commands import (
    ALICE,
    COMMANDS,
    CREATE_PROJECT,
    CREATE_TASK,
    FACTS,
    LIFECYCLE,
    PROJECT,
    START_TASK,
    STEP,
    TASK,
    Task,
    TaskStore,
    executor_for,
)

RETENTION = timedelta(minutes=1)
RUNNERS = ("compiled", "interpreted")


class SteppedClock:
    def __init__(self) -> None:
        self.at = Timestamp.now()

    def now(self) -> Timestamp:
        return self.at


class Interpreting:
    """`CommandRunner.run`'s answer through the interpreter (acting as the
    principal the pipeline's context holds: `interpret`'s default, where the
    random comparison names the principal)."""

    def __init__(self, executor: MutationExecutor) -> None:
        self.executor = executor

    async def run(
        self, command: CheckedCommand, principal: Any, inputs: Mapping[str, object],
    ) -> CommandOutcome | MutationError:
        async def handler(cx: Any) -> CommandOutcome:
            return await interpret(cx, command, inputs,
                                   config=CommandConfig(idempotency_retention=RETENTION))

        try:
            return await self.executor.execute(principal, handler)
        except InvalidInput as exc:
            return MutationError(INVALID_INPUT, str(exc))


def _runner(kind: str, db: Database, clock: SteppedClock) -> Any:
    executor = replace(executor_for(db), clock=clock)
    if kind == "compiled":
        return CommandRunner(executor, CommandConfig(idempotency_retention=RETENTION))
    return Interpreting(executor)


async def _create_project(runner: Any, key: str, project_id: str) -> Any:
    return await runner.run(COMMANDS["CreateProject"], ALICE, {
        "request_key": key, "org": "acme", "project_id": project_id, "name": "P"})


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_record_answers_for_exactly_its_retention(db: Database, kind: str) -> None:
    """A keyed retry answers from its record up to and including the instant
    its retention ends, and runs anew one microsecond later (the interpreter
    as the compiled function)."""
    clock = SteppedClock()
    runner = _runner(kind, db, clock)
    first = await _create_project(runner, "k", "p")
    assert isinstance(first, CommandOutcome) and first.ok, first
    clock.at = clock.at + RETENTION
    replay = await _create_project(runner, "k", "p")
    assert replay == first and replay.replayed, replay
    clock.at = clock.at + timedelta(microseconds=1)
    anew = await _create_project(runner, "k", "p")
    assert isinstance(anew, CommandOutcome), anew
    assert (anew.name, anew.replayed) == ("ProjectExists", False)


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_record_write_sweeps_expired_records(db: Database, kind: str) -> None:
    """Every record write deletes up to two records past their retention (the
    interpreter as the compiled function), so the table stays bounded while
    commands run."""
    clock = SteppedClock()
    runner = _runner(kind, db, clock)
    for n in range(4):
        made = await _create_project(runner, f"old{n}", f"p{n}")
        assert isinstance(made, CommandOutcome) and made.ok, made
    clock.at = clock.at + 2 * RETENTION
    for n in range(2):
        made = await _create_project(runner, f"new{n}", f"q{n}")
        assert isinstance(made, CommandOutcome) and made.ok, made
    keys = await db.pool.fetch("SELECT key FROM service_engine.command_idempotency")
    assert sorted(r["key"] for r in keys) == ["new0", "new1"]


class RacingTask(Task):
    """A task whose store pins no row and lets a write in right after its
    first load: a writer outside the pipeline between a check and the
    commit."""

    Store: ClassVar[RacingStore]


class RacingStore(TaskStore):
    def __init__(self) -> None:
        super().__init__(lock_rows=False, store_type=Task.Store.store_type)
        self.writer: Conn | None = None

    def from_row(self, row: Mapping[str, Any]) -> RacingTask:
        return RacingTask(**vars(super().from_row(row)))

    async def load_locked(self, conn: Conn, key: Sequence[str]) -> Any:
        found = await super().load_locked(conn, key)
        writer, self.writer = self.writer, None
        if writer is not None:
            await writer.execute("UPDATE cmd_task SET title = 'renamed', version = version + 1"
                                 " WHERE org = $1 AND id = $2", key[0], key[1])
        return found


RacingTask.Store = RacingStore()
RACING = Catalog([PROJECT, replace(TASK, aggregate=RacingTask), STEP], [LIFECYCLE], FACTS)


async def test_the_interpreter_fails_a_transition_whose_row_changed_after_its_check(
    db: Database, caplog: pytest.LogCaptureFixture,
) -> None:
    """A checked transition keeps its row's revision as a read dependency: a
    write that slips in between the check and the commit (a store without
    row locks, a writer outside the pipeline) is never lost. The command
    answers the retryable ``serialization_failure``, the operator's log names
    the row and the save stage, and the row keeps the outside write."""
    runner = Interpreting(executor_for(db))
    for command, inputs in (
        (CREATE_PROJECT, {"request_key": "p", "org": "acme", "project_id": "p1", "name": "P"}),
        (CREATE_TASK, {"request_key": "t", "org": "acme", "task_id": "t1", "project_id": "p1",
                       "title": "T"}),
    ):
        made = await runner.run(RACING.command(command), ALICE, inputs)
        assert isinstance(made, CommandOutcome) and made.ok, made
    writer = await db.connect_dedicated()
    try:
        RacingTask.Store.writer = writer
        with caplog.at_level(logging.WARNING, logger="service_engine.pipeline.executor"):
            outcome = await runner.run(RACING.command(START_TASK), ALICE, {
                "request_key": "s", "org": "acme", "task_id": "t1", "expected_revision": 1})
    finally:
        RacingTask.Store.writer = None
        await writer.close()
    assert isinstance(outcome, MutationError), outcome
    assert (outcome.code, outcome.retryable) == ("serialization_failure", True)
    assert any(
        "at stage save: Task ['acme', 't1'] changed between its check and the commit"
        in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    row = await db.pool.fetchrow("SELECT title, state, version FROM cmd_task WHERE id = 't1'")
    assert row is not None and tuple(row) == ("renamed", "queued", 2)
