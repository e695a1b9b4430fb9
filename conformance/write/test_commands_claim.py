"""A unique value's claim in one round trip (issue 11, the mutation's CPU).

A command that claims one unique value (a create, a rename) sends the
values' locks, the claim and the release of the value the row gives up as
one statement sequence in one round trip, every value an inlined literal;
the release happens only when the claim took the value. The impacts'
NOTIFY rides in COMMIT's round trip the same way. These tests prove that
the statements carry any title exactly, that a held value changes nothing,
and that the round trip is one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service_engine import Database
from service_engine.commands import CommandOutcome, CommandRunner
from service_engine.commands.rows import Occupancy, claim_statement, claimed
from service_engine.embedded import ProvisionedDatabase

from ..support.harness import Statements, logged_pool
from ..support.sample_commands import ALICE, COMMANDS, runner_for
from ..support.sample_counter import listen_impacts

HOSTILE_TITLES = (
    "it's", 'a "quoted" one', "$m0$", "$m0$ $m1$ tail$m0", "back\\slash", "$$", "$1",
    "naïve ✓", "a; DROP TABLE cmd_task; --", "'); DELETE FROM service_engine.command_occupancy; --",
)


async def _run(runner: CommandRunner, command: str, **inputs: Any) -> CommandOutcome:
    outcome = await runner.run(COMMANDS[command], ALICE, inputs)
    assert isinstance(outcome, CommandOutcome), outcome
    return outcome


def _value(title: str) -> str:
    return json.dumps([title], separators=(",", ":"), ensure_ascii=False)


async def _held(db: Database) -> list[tuple[str, str]]:
    rows = await db.pool.fetch(
        "SELECT value, owner FROM service_engine.command_occupancy"
        " WHERE entity = 'Task' ORDER BY value, owner")
    return [(r["value"], r["owner"]) for r in rows]


async def _seed(runner: CommandRunner) -> None:
    await _run(runner, "CreateProject", request_key="p", org="acme", project_id="p1", name="P")
    for task_id, title in (("t1", "first"), ("t2", "second")):
        created = await _run(runner, "CreateTask", request_key=task_id, org="acme",
                             task_id=task_id, project_id="p1", title=title)
        assert created.ok, created


@pytest.fixture
async def logged(database: ProvisionedDatabase) -> AsyncIterator[tuple[Database, Statements]]:
    """A pool whose every statement is recorded."""
    async with logged_pool(database.app_url, max_size=2) as pair:
        yield pair


async def test_a_claim_carries_any_title_exactly(db: Database) -> None:
    """Every hostile title (quotes, dollar-quote tags, statement separators)
    is claimed as exactly its text, the old one released each time: the
    occupancy holds the task's current title alone, and the title given up
    is free again for another task."""
    runner = runner_for(db)
    await _seed(runner)
    previous = "first"
    for title in HOSTILE_TITLES:
        renamed = await _run(runner, "RenameTask", org="acme", task_id="t1", title=title)
        assert renamed.ok, (title, renamed)
        row = await db.pool.fetchrow("SELECT title FROM cmd_task WHERE id = 't1'")
        assert row is not None and row["title"] == title
        values = {v for v, _ in await _held(db)}  # the org is the partition
        assert _value(title) in values and _value(previous) not in values
        previous = title
    assert len(await _held(db)) == 2
    assert await db.pool.fetchval("SELECT count(*) FROM cmd_task") == 2
    taken_back = await _run(runner, "RenameTask", org="acme", task_id="t2", title="first")
    assert taken_back.ok, taken_back


async def test_a_held_value_releases_nothing(db: Database) -> None:
    """A rename onto a title another task holds answers TitleTaken and
    leaves every occupancy row as it was: the renamer keeps its own title
    (the release rides only with a claim that took its value)."""
    runner = runner_for(db)
    await _seed(runner)
    before = await _held(db)
    taken = await _run(runner, "RenameTask", org="acme", task_id="t1", title="second")
    assert taken.name == "TitleTaken" and not taken.ok
    assert await _held(db) == before
    again = await _run(runner, "CreateTask", request_key="t3", org="acme", task_id="t3",
                       project_id="p1", title="first")
    assert again.name == "TitleTaken"


async def test_the_locks_the_claim_and_the_release_ride_one_round_trip(
    logged: tuple[Database, Statements],
) -> None:
    """A rename onto a free title takes both values' locks, claims the new
    one and releases the old inside its one call (the compiled command's
    round trip between BEGIN and COMMIT): no statement of the run names the
    occupancy table, and the new title is held by the row, the old free."""
    db, statements = logged
    runner = runner_for(db)
    await _seed(runner)
    statements.sent.clear()
    renamed = await _run(runner, "RenameTask", org="acme", task_id="t1", title="third")
    assert renamed.ok, renamed
    sent = list(statements.sent)
    assert not [s for s in sent if "command_occupancy" in s], sent
    assert [s for s in sent if s.startswith("SELECT service_engine.")] != [], sent
    assert await _held(db) == [(_value("second"), '["acme","t2"]'),
                               (_value("third"), '["acme","t1"]')]


async def test_an_inlined_notify_carries_any_cause_exactly(db: Database) -> None:
    """The impacts' NOTIFY rides in COMMIT's round trip with its frame
    inlined: every hostile title arrives in the cause as exactly its text,
    one impact per commit, none for a refused rename."""
    runner = runner_for(db)
    await _seed(runner)
    async with listen_impacts(db) as probe:
        for title in HOSTILE_TITLES:
            assert (await _run(runner, "RenameTask", org="acme", task_id="t1", title=title)).ok
            [impact] = await probe.next()
            assert impact.cause is not None and impact.cause.data == {"title": title}
        refused = await _run(runner, "RenameTask", org="acme", task_id="t1", title="second")
        assert refused.name == "TitleTaken"
        await probe.assert_quiet()


def test_the_claim_statement_answers_by_its_status() -> None:
    """The statement's status says whether the value was taken: ``SELECT 1``
    claimed, ``SELECT 0`` held elsewhere."""
    sql = claim_statement(Occupancy("E", "u", "[]", '["x"]', '"k"'), [["E", "u", "[]", '["y"]']])
    assert sql.count("DELETE") == 1 and "EXISTS (SELECT 1 FROM claimed)" in sql
    assert claimed("SELECT 1") and not claimed("SELECT 0")
