"""The interpreter (`runner.interpret`, the oracle the compiled commands are
proven against) where only a controlled clock shows it (real Postgres).

The random comparison (`test_commands_compiled`) runs on the wall clock
with a day's retention, so no record there expires: here each property of
the idempotency record's retention holds for the interpreter exactly as for
the compiled function (`CommandRunner`), on one stepped clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from service_engine import Database
from service_engine.clock import Timestamp
from service_engine.commands import (
    INVALID_INPUT,
    CheckedCommand,
    CommandConfig,
    CommandOutcome,
    CommandRunner,
)
from service_engine.commands.plan import InvalidInput
from service_engine.commands.runner import interpret
from service_engine.pipeline import MutationError, MutationExecutor

from ..support.sample_commands import ALICE, COMMANDS, executor_for

RETENTION = timedelta(minutes=1)
RUNNERS = ("compiled", "interpreted")


class SteppedClock:
    def __init__(self) -> None:
        self.at = Timestamp.now()

    def now(self) -> Timestamp:
        return self.at


class Interpreting:
    """`CommandRunner.run`'s answer through the interpreter."""

    def __init__(self, executor: MutationExecutor) -> None:
        self.executor = executor

    async def run(
        self, command: CheckedCommand, principal: Any, inputs: Mapping[str, object],
    ) -> CommandOutcome | MutationError:
        async def handler(cx: Any) -> CommandOutcome:
            return await interpret(cx, command, inputs, principal=cx.principal,
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
