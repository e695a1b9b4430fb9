"""What a command writes, against real Postgres: the impacts of every row a
cascade takes, the unique values it claims and frees, a transition that is a
command's only effect, and the clause named when a value reads nothing.

Each test states the property it proves (the sample: `sample_commands`);
each but the typed value_missing runs through the compiled function and
through the interpreter (its oracle, `test_commands_oracle.Interpreting`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from service_engine import Database, MutationError
from service_engine.commands import (
    UUID_V7,
    Catalog,
    Caused,
    CheckedCommand,
    Command,
    CommandOutcome,
    CommandRunner,
    Const,
    Create,
    Delete,
    Fact,
    Field,
    IdempotencyKey,
    Input,
    Mutate,
    Ne,
    Outcome,
    Read,
    Require,
    Return,
    Service,
    Set,
    Unique,
    Var,
)
from service_engine.embedded import ProvisionedDatabase

from ..support.sample_commands import (
    ADD_STEP,
    ALICE,
    CATALOG,
    CREATE_PROJECT,
    CREATE_TASK,
    DELETE_TASK,
    EVE,
    FACTS,
    FINISH_TASK,
    KEY,
    LIFECYCLE,
    ORG,
    PROJECT,
    RENAME_TASK,
    START_TASK,
    STEP,
    TASK,
    executor_for,
    install,
    runner_for,
)
from ..support.sample_counter import listen_impacts
from .test_commands_oracle import RUNNERS, Interpreting

STEPS_IMPACTED = Catalog([PROJECT, TASK, replace(STEP, nouns=("cmd_step",))], [LIFECYCLE], FACTS)


class Installing:
    """A runner that installs each command's function as the schema owner
    (what the service's migrate does) before its first run: these tests
    declare commands of their own."""

    def __init__(self, db: Database, database: ProvisionedDatabase,
                 kind: str = "compiled") -> None:
        self.runner: CommandRunner | Interpreting = (
            runner_for(db) if kind == "compiled" else Interpreting(executor_for(db))
        )
        self.owner_url = database.owner_url
        self.installed: set[str] = set()

    async def run(
        self, command: CheckedCommand, principal: Any, inputs: Mapping[str, Any]
    ) -> CommandOutcome | MutationError:
        if command.name not in self.installed:
            await install(self.owner_url, command)
            self.installed.add(command.name)
        return await self.runner.run(command, principal, inputs)


async def ok(runner: Installing, command: Any, **inputs: Any) -> CommandOutcome:
    outcome = await runner.run(command, ALICE, inputs)
    assert isinstance(outcome, CommandOutcome) and outcome.ok, outcome
    return outcome


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_cascade_impacts_every_row_it_deletes(db: Database, database: ProvisionedDatabase, kind: str) -> None:
    """A delete that cascades impacts the deleted row's nouns and, in the same
    commit, each cascaded child's nouns under the child's own key."""
    c = STEPS_IMPACTED
    runner = Installing(db, database, kind)
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


@dataclass(frozen=True)
class Nameless:
    """A principal without the ``id`` fact the sample declares."""

    org: str = "acme"
    admin: bool = False


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_principal_without_an_id_keeps_its_records_under_the_empty_scope(
    db: Database, database: ProvisionedDatabase, kind: str,
) -> None:
    """A keyed command run by a principal without an ``id`` stores its
    outcome under the empty scope: its retry answers from that record and
    runs nothing."""
    runner = Installing(db, database, kind)
    create = CATALOG.command(CREATE_PROJECT)
    inputs = {"request_key": "k", "org": "acme", "project_id": "p1", "name": "P"}
    first = await runner.run(create, Nameless(), inputs)
    assert isinstance(first, CommandOutcome) and first.ok and not first.replayed, first
    again = await runner.run(create, Nameless(), inputs)
    assert isinstance(again, CommandOutcome) and again.replayed, again
    assert (again.name, again.data) == (first.name, first.data)
    scopes = await db.pool.fetch("SELECT scope FROM service_engine.command_idempotency")
    assert [r["scope"] for r in scopes] == [""]


NAMED_BY_ITS_ID = Command(
    "NameByItsId", KEY, ORG, Input("project_id", str), IdempotencyKey("request_key"),
    Create("Project", (Var("org"), Var("project_id")), as_="project",
           else_=Outcome("ProjectExists")),
    Require("NotReserved", Ne(Field("project", "id"), Const("reserved")), Outcome("Reserved")),
    Set("project", "name", Field("project", "id")),
    Return("Created", name=Field("project", "name")),
)


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_create_reads_its_own_key_in_its_requirements_and_sets(
    db: Database, database: ProvisionedDatabase, kind: str,
) -> None:
    """A created row's fields are readable as the command sets them, its key
    first: a requirement judges the key given, and a set copies it."""
    runner = Installing(db, database, kind)
    create = CATALOG.command(NAMED_BY_ITS_ID)
    made = await ok(runner, create, request_key="a", org="acme", project_id="p1")
    assert (made.name, made.data) == ("Created", {"name": "p1"})
    refused = await runner.run(create, ALICE, {"request_key": "b", "org": "acme",
                                                "project_id": "reserved"})
    assert isinstance(refused, CommandOutcome) and refused.name == "Reserved", refused
    rows = await db.pool.fetch("SELECT id, name FROM cmd_project ORDER BY id")
    assert [tuple(r) for r in rows] == [("p1", "p1")]


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


async def test_a_value_that_evaluates_to_nothing_names_its_clause(
    db: Database, database: ProvisionedDatabase,
) -> None:
    """A set or cause value reading a fact the acting principal lacks answers
    the typed ``value_missing`` naming the clause that read nothing, and
    writes nothing."""
    runner = Installing(db, database)
    for command, message in (
        (NAMED_BY_CALLER, "set project.name evaluated to nothing"),
        (CAUSED_BY_CALLER, "caused project.created: by evaluated to nothing"),
    ):
        answer = await runner.run(CATALOG.command(command), Nameless(),
                                  {"request_key": "k", "org": "acme", "project_id": "p1"})
        assert isinstance(answer, MutationError) and answer.code == "value_missing", answer
        assert answer.message.startswith(message), answer
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


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_command_deleting_one_row_claims_the_unique_values_of_another(
    db: Database, database: ProvisionedDatabase, kind: str,
) -> None:
    """One command that deletes a row and creates another claims the new
    row's unique values as a create alone does: a title another row holds
    answers TitleTaken and changes nothing; a free one is taken (a later
    create of it answers TitleTaken)."""
    runner = Installing(db, database, kind)
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


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_changed_unique_value_is_claimed_after_an_unchanged_one(db: Database, database: ProvisionedDatabase, kind: str) -> None:
    """A row with two unique keys claims the one a command changes even when
    the key declared before it is unchanged: renaming onto a title another
    row holds answers TitleTaken; a create whose execution id is free and
    whose title is held answers TitleTaken and keeps neither value."""
    taken = {"by_execution": Outcome("ExecutionTaken"), "by_title": Outcome("TitleTaken")}
    create = TWO_UNIQUE.command(_with_taken(CREATE_TASK, taken))
    rename = TWO_UNIQUE.command(_with_taken(RENAME_TASK, {"by_title": Outcome("TitleTaken")}))
    runner = Installing(db, database, kind)
    await ok(runner, TWO_UNIQUE.command(CREATE_PROJECT), request_key="p", org="acme",
             project_id="p1", name="P")
    for task_id, title in (("t1", "a"), ("t2", "b")):
        await ok(runner, create, request_key=task_id, org="acme", task_id=task_id,
                 project_id="p1", title=title)
    clash = await runner.run(rename, ALICE, {"org": "acme", "task_id": "t2", "title": "a"})
    assert isinstance(clash, CommandOutcome) and clash.name == "TitleTaken", clash
    row = await db.pool.fetchrow("SELECT title FROM cmd_task WHERE id = 't2'")
    assert row is not None and row["title"] == "b"
    # A create claiming a free execution id and a held title keeps neither.
    held = await runner.run(create, ALICE, {"request_key": "t3", "org": "acme",
                                            "task_id": "t3", "project_id": "p1", "title": "b"})
    assert isinstance(held, CommandOutcome) and held.name == "TitleTaken", held
    assert await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.command_occupancy"
        " WHERE index_name = 'by_execution'") == 2


LABELLED = Catalog([PROJECT, TASK, replace(STEP, unique=(Unique("by_label", ("org", "label")),))],
                   [LIFECYCLE], FACTS)


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_cascade_frees_the_unique_values_of_the_rows_it_takes(db: Database, database: ProvisionedDatabase, kind: str) -> None:
    """A step's unique label is held while the step exists and freed when a
    cascade deletes it with its task: another step may take it after."""
    add = LABELLED.command(_with_taken(ADD_STEP, {"by_label": Outcome("LabelTaken")}))
    runner = Installing(db, database, kind)
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


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_transition_alone_writes_its_state_and_next_revision(
    db: Database, database: ProvisionedDatabase, kind: str,
) -> None:
    """A command whose only effect is a checked transition (FinishTask) is an
    update like any other: the update row policy judges it (another org's
    principal is refused and nothing is written), and it writes the new state
    with the next revision, which it answers."""
    runner = Installing(db, database, kind)
    await ok(runner, CATALOG.command(CREATE_PROJECT), request_key="p", org="acme",
             project_id="p1", name="P")
    await ok(runner, CATALOG.command(CREATE_TASK), request_key="t", org="acme", task_id="t1",
             project_id="p1", title="T")
    await ok(runner, CATALOG.command(START_TASK), request_key="s", org="acme", task_id="t1",
             expected_revision=1)
    finish = CATALOG.command(FINISH_TASK)
    inputs = {"org": "acme", "task_id": "t1", "expected_revision": 2}
    refused = await runner.run(finish, EVE, inputs)
    assert isinstance(refused, CommandOutcome), refused
    assert (refused.name, refused.data) == (
        "Refused", {"reason": "task.update_denied", "action": "update"})
    row = await db.pool.fetchrow("SELECT state, version FROM cmd_task WHERE id = 't1'")
    assert row is not None and tuple(row) == ("running", 2)
    finished = await ok(runner, finish, **inputs)
    assert (finished.name, finished.data) == ("Finished", {"revision": 3})
    row = await db.pool.fetchrow("SELECT state, version FROM cmd_task WHERE id = 't1'")
    assert row is not None and tuple(row) == ("done", 3)
