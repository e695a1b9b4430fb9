"""What a command writes, against real Postgres: the impacts of every row a
cascade takes, a create built through its entity's ``construct``, and the
typed answer to a write that slipped past a checked transition's lock.

Each test states the property it proves (the sample: `sample_commands`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from service_engine import Database
from service_engine.commands import (
    UUID_V7,
    Catalog,
    Caused,
    Command,
    CommandOutcome,
    CommandRunner,
    Const,
    Create,
    Delete,
    Fact,
    IdempotencyKey,
    Input,
    Mutate,
    Outcome,
    Read,
    Record,
    Return,
    Service,
    Set,
    Unique,
    Var,
)
from service_engine.pipeline import MutationError

from .support.sample_commands import (
    ADD_STEP,
    ALICE,
    CATALOG,
    CREATE_PROJECT,
    CREATE_TASK,
    DELETE_TASK,
    FACTS,
    KEY,
    LIFECYCLE,
    ORG,
    PROJECT,
    RENAME_TASK,
    START_TASK,
    STEP,
    TASK,
    Project,
    runner_for,
)
from .support.sample_counter import listen_impacts
from .test_commands import RacingTask

STEPS_IMPACTED = Catalog([PROJECT, TASK, replace(STEP, nouns=("cmd_step",))], [LIFECYCLE], FACTS)


async def ok(runner: CommandRunner, command: Any, **inputs: Any) -> CommandOutcome:
    outcome = await runner.run(command, ALICE, inputs)
    assert isinstance(outcome, CommandOutcome) and outcome.ok, outcome
    return outcome


async def test_a_cascade_impacts_every_row_it_deletes(db: Database) -> None:
    """A delete that cascades impacts the deleted row's nouns and, in the same
    commit, each cascaded child's nouns under the child's own key."""
    c = STEPS_IMPACTED
    runner = runner_for(db)
    await ok(runner, c.command(CREATE_PROJECT), request_key="p", org="acme", project_id="p1",
             name="P")
    await ok(runner, c.command(CREATE_TASK), request_key="t", org="acme", task_id="t1",
             project_id="p1", title="T")
    for step in ("s1", "s2"):
        await ok(runner, c.command(ADD_STEP), org="acme", task_id="t1", step_id=step, label="x")
    async with listen_impacts(db) as probe:
        await ok(runner, c.command(DELETE_TASK), org="acme", task_id="t1")
        impacts = await probe.next()
        assert sorted((i.noun, i.key) for i in impacts) == [
            ("cmd_step", ("acme", "s1")), ("cmd_step", ("acme", "s2")),
            ("cmd_task", ("acme", "t1")),
        ]
        await probe.assert_quiet()


async def test_a_create_is_built_by_its_entity_construct(db: Database) -> None:
    """An entity's ``construct`` builds every created aggregate from the
    fields the command set, its key and its first revision (1); what it
    returns is the row written."""
    seen: list[dict[str, Any]] = []

    def construct(fields: Mapping[str, Any]) -> Project:
        seen.append(dict(fields))
        return Project(**{**fields, "name": str(fields["name"]).strip()})

    catalog = Catalog([replace(PROJECT, construct=construct), TASK, STEP], [LIFECYCLE], FACTS)
    runner = runner_for(db)
    await ok(runner, catalog.command(CREATE_PROJECT), request_key="p", org="acme",
             project_id="p1", name="  Spaced  ")
    assert seen == [{"org": "acme", "id": "p1", "name": "  Spaced  ", "version": 1}]
    row = await db.pool.fetchrow("SELECT name, version FROM cmd_project WHERE id = 'p1'")
    assert row is not None and (row["name"], row["version"]) == ("Spaced", 1)


async def test_a_write_past_the_lock_answers_a_retryable_conflict(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A checked transition whose row changed between its check and the
    commit answers the retryable ``serialization_failure`` (the caller runs
    it again), and the operator's log names the row and the save stage."""
    racing = Catalog([PROJECT, replace(TASK, aggregate=RacingTask), STEP], [LIFECYCLE], FACTS)
    runner = runner_for(db)
    await ok(runner, racing.command(CREATE_PROJECT), request_key="p", org="acme",
             project_id="p1", name="P")
    await ok(runner, racing.command(CREATE_TASK), request_key="t", org="acme", task_id="t1",
             project_id="p1", title="T")
    writer = await db.connect_dedicated()
    try:
        RacingTask.Store.writer = writer
        with caplog.at_level(logging.WARNING, logger="service_engine.pipeline.executor"):
            outcome = await runner.run(racing.command(START_TASK), ALICE, {
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


@dataclass(frozen=True)
class Nameless:
    """A principal without the ``id`` fact the sample declares."""

    org: str = "acme"
    admin: bool = False


NAMED_BY_CALLER = Command(
    "NameByCaller", KEY, ORG, Input("project_id", str), IdempotencyKey("request_key"),
    Create("Project", (Var("org"), Var("project_id")), as_="project",
           else_=Outcome("ProjectExists")),
    Set("project", "name", Fact("id")),
    Return("Created"),
)
CAUSED_BY_CALLER = Command(
    "CauseByCaller", KEY, ORG, Input("project_id", str), IdempotencyKey("request_key"),
    Create("Project", (Var("org"), Var("project_id")), as_="project",
           else_=Outcome("ProjectExists")),
    Set("project", "name", Const("P")),
    Caused("project", "cmd_project", "project.created", {"by": Fact("id")}),
    Return("Created"),
)
RECORDED_BY_CALLER = Command(
    "RecordByCaller", KEY, ORG, Input("project_id", str), IdempotencyKey("request_key"),
    Create("Project", (Var("org"), Var("project_id")), as_="project",
           else_=Outcome("ProjectExists")),
    Set("project", "name", Const("P")),
    Record("project", "project.created", {"by": Fact("id")}),
    Return("Created"),
)


async def test_a_value_that_evaluates_to_nothing_names_its_clause(db: Database) -> None:
    """A set, cause or record value reading a fact the acting principal lacks fails
    the command naming the clause that read nothing, and writes nothing."""
    runner = runner_for(db)
    for command, message in ((NAMED_BY_CALLER, r"^set name evaluated to nothing"),
                             (CAUSED_BY_CALLER, r"^by evaluated to nothing"),
                             (RECORDED_BY_CALLER, r"^by evaluated to nothing")):
        with pytest.raises(Exception, match=message):
            await runner.run(CATALOG.command(command), Nameless(),
                             {"request_key": "k", "org": "acme", "project_id": "p1"})
    assert await db.pool.fetchval("SELECT count(*) FROM cmd_project") == 0


REPLACE_TASK = Command(
    "ReplaceTask",
    KEY, ORG, Input("old_id", str), Input("new_id", str), Input("project_id", str),
    Input("title", str), Service("created_id", UUID_V7),
    IdempotencyKey("request_key"),
    Mutate("Task", (Var("org"), Var("old_id")), as_="old", else_=Outcome("Missing")),
    Read("Project", (Var("org"), Var("project_id")), as_="project",
         else_=Outcome("ProjectMissing")),
    Create("Task", (Var("org"), Var("new_id")), as_="new", else_=Outcome("TaskExists"),
           taken={"by_title": Outcome("TitleTaken")}),
    Delete("old", too_many=Outcome("TooManySteps")),
    Set("new", "project_id", Var("project_id")),
    Set("new", "title", Var("title")),
    Set("new", "state", Const("queued")),
    Set("new", "locked", Const(False)),
    Set("new", "execution_id", Var("created_id")),
    Set("new", "started_at", Const(None)),
    Return("Replaced"),
)


async def test_a_command_deleting_one_row_claims_the_unique_values_of_another(
    db: Database,
) -> None:
    """One command that deletes a row and creates another claims the new
    row's unique values as a create alone does: a title another row holds
    answers TitleTaken and changes nothing; a free one is taken (a later
    create of it answers TitleTaken)."""
    runner = runner_for(db)
    replace_task = CATALOG.command(REPLACE_TASK)
    await ok(runner, CATALOG.command(CREATE_PROJECT), request_key="p", org="acme",
             project_id="p1", name="P")
    for task_id, title in (("t1", "old"), ("t2", "held")):
        await ok(runner, CATALOG.command(CREATE_TASK), request_key=task_id, org="acme",
                 task_id=task_id, project_id="p1", title=title)
    inputs = {"request_key": "r1", "org": "acme", "old_id": "t1", "new_id": "t3",
              "project_id": "p1", "title": "held"}
    taken = await runner.run(replace_task, ALICE, inputs)
    assert isinstance(taken, CommandOutcome) and taken.name == "TitleTaken", taken
    ids = await db.pool.fetch("SELECT id FROM cmd_task ORDER BY id")
    assert [r["id"] for r in ids] == ["t1", "t2"]
    await ok(runner, replace_task, **{**inputs, "request_key": "r2", "title": "new"})
    again = await runner.run(CATALOG.command(CREATE_TASK), ALICE, {
        "request_key": "t4", "org": "acme", "task_id": "t4", "project_id": "p1",
        "title": "new"})
    assert isinstance(again, CommandOutcome) and again.name == "TitleTaken", again


TWO_UNIQUE = Catalog([PROJECT, replace(TASK, unique=(
    Unique("by_execution", ("org", "execution_id")), Unique("by_title", ("org", "title")),
)), STEP], [LIFECYCLE], FACTS)


def _with_taken(command: Command, taken: dict[str, Outcome]) -> Command:
    return Command(command.name, *(
        replace(c, taken=taken) if isinstance(c, Create | Mutate) else c
        for c in command.clauses
    ))


async def test_a_changed_unique_value_is_claimed_after_an_unchanged_one(db: Database) -> None:
    """A row with two unique keys claims the one a command changes even when
    the key declared before it is unchanged: renaming onto a title another
    row holds answers TitleTaken."""
    taken = {"by_execution": Outcome("ExecutionTaken"), "by_title": Outcome("TitleTaken")}
    create = TWO_UNIQUE.command(_with_taken(CREATE_TASK, taken))
    rename = TWO_UNIQUE.command(_with_taken(RENAME_TASK, {"by_title": Outcome("TitleTaken")}))
    runner = runner_for(db)
    await ok(runner, TWO_UNIQUE.command(CREATE_PROJECT), request_key="p", org="acme",
             project_id="p1", name="P")
    for task_id, title in (("t1", "a"), ("t2", "b")):
        await ok(runner, create, request_key=task_id, org="acme", task_id=task_id,
                 project_id="p1", title=title)
    clash = await runner.run(rename, ALICE, {"org": "acme", "task_id": "t2", "title": "a"})
    assert isinstance(clash, CommandOutcome) and clash.name == "TitleTaken", clash
    row = await db.pool.fetchrow("SELECT title FROM cmd_task WHERE id = 't2'")
    assert row is not None and row["title"] == "b"


LABELLED = Catalog([PROJECT, TASK, replace(STEP, unique=(Unique("by_label", ("org", "label")),))],
                   [LIFECYCLE], FACTS)


async def test_a_cascade_frees_the_unique_values_of_the_rows_it_takes(db: Database) -> None:
    """A step's unique label is held while the step exists and freed when a
    cascade deletes it with its task: another step may take it after."""
    add = LABELLED.command(_with_taken(ADD_STEP, {"by_label": Outcome("LabelTaken")}))
    runner = runner_for(db)
    await ok(runner, LABELLED.command(CREATE_PROJECT), request_key="p", org="acme",
             project_id="p1", name="P")
    for task_id, title in (("t1", "one"), ("t2", "two")):
        await ok(runner, LABELLED.command(CREATE_TASK), request_key=task_id, org="acme",
                 task_id=task_id, project_id="p1", title=title)
    await ok(runner, add, org="acme", task_id="t1", step_id="s1", label="x")
    held = await runner.run(add, ALICE, {"org": "acme", "task_id": "t2", "step_id": "s2",
                                         "label": "x"})
    assert isinstance(held, CommandOutcome) and held.name == "LabelTaken", held
    await ok(runner, LABELLED.command(DELETE_TASK), org="acme", task_id="t1")
    await ok(runner, add, org="acme", task_id="t2", step_id="s2", label="x")
