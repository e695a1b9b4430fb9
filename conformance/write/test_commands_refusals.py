"""What a declared command refuses, against real Postgres (seeds/003
semantics): inputs that do not match the declaration, expired idempotency
records, another tenant's rows, a declaration without its proofs or with
mistyped values, a requirement or row policy that does not hold, a write
that slipped past a checked transition's lock.

Each test states the property it proves (the sample: `sample_commands`;
the helpers: `test_commands`).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from service_engine import Database
from service_engine.clock import Timestamp
from service_engine.commands import (
    INVALID_INPUT,
    REFUSED,
    BindingError,
    Catalog,
    Command,
    CommandConfig,
    CommandOutcome,
    CommandRunner,
    Const,
    Delete,
    DuplicateName,
    Eq,
    Fact,
    Field,
    Input,
    Lt,
    Mutate,
    Ne,
    Not,
    Outcome,
    Require,
    Return,
    RowPolicy,
    Set,
    TypeMismatch,
    UnknownName,
    UnprovenSet,
    Var,
    WorkflowError,
    run_in,
    sweep_idempotency,
)
from service_engine.gates import Reason, affordances
from service_engine.pipeline import Mutation, MutationError

from ..support.harness import wait_until
from ..support.sample_commands import (
    ALICE,
    CATALOG,
    EVE,
    FACTS,
    LIFECYCLE,
    ORG,
    PROJECT,
    ROOT,
    STEP,
    SWAP_TITLES,
    TASK,
    Principal,
    Step,
    Task,
    executor_for,
    runner_for,
)
from .test_commands import C, Runner, count, holding, ok, run, seed, task_row
from .test_commands_oracle import RUNNERS, Interpreting


async def test_inputs_that_do_not_match_the_declaration_are_refused(db: Database) -> None:
    """A missing, mistyped, unknown or service-owned input is refused with
    ``invalid_input`` before anything runs, its message naming the input
    and what is wrong with it."""
    runner = runner_for(db)
    await seed(runner)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"org": "acme", "task_id": "t1"}, "input request_key is required"),
        ({"org": "acme", "task_id": "t1", "expected_revision": True, "request_key": "k"},
         "input expected_revision must be a int, got bool"),
        ({"org": "acme", "task_id": "t1", "expected_revision": 1, "request_key": "k", "x": 1},
         "StartTask has no input 'x'"),
        ({"org": "acme", "task_id": "t1", "expected_revision": 1, "request_key": "k",
          "execution_id": "01900000-0000-7000-8000-000000000001"},
         "execution_id is a service value: the engine samples it, never the caller"),
        ({"org": "acme", "task_id": "t1", "expected_revision": 1, "request_key": "k" * 129},
         "input request_key is longer than 128"),
    ]
    for inputs, message in cases:
        refused = await runner.run(C["StartTask"], ALICE, inputs)
        assert isinstance(refused, MutationError) and refused.code == INVALID_INPUT, inputs
        assert refused.message == message
    row = await task_row(db, "t1")
    assert row is not None and row["version"] == 1


class SteppedClock:
    def __init__(self) -> None:
        self.at = Timestamp.now()

    def now(self) -> Timestamp:
        return self.at


async def test_records_expire_after_their_retention_and_are_swept(db: Database) -> None:
    """A key answers from its record within the retention only; past it the
    key runs anew, and the sweep deletes expired records."""
    clock = SteppedClock()
    from dataclasses import replace
    executor = replace(executor_for(db), clock=clock)
    runner = CommandRunner(executor, CommandConfig(idempotency_retention=timedelta(minutes=1)))
    first = await ok(runner, "CreateProject", request_key="k", org="acme", project_id="p",
                     name="P")
    clock.at = clock.at + timedelta(seconds=59)
    assert await run(runner, "CreateProject", request_key="k", org="acme", project_id="p",
                     name="P") == first
    clock.at = clock.at + timedelta(seconds=2)
    anew = await run(runner, "CreateProject", request_key="k", org="acme", project_id="p",
                     name="P")
    assert anew.name == "ProjectExists" and not anew.replayed
    swept = await sweep_idempotency(db, older_than=clock.at + timedelta(seconds=1), batch=10)
    assert swept == 1
    assert await count(db, "SELECT count(*) FROM service_engine.command_idempotency") == 0


async def test_record_writes_sweep_expired_records(db: Database) -> None:
    """Every record write deletes a few records past their retention, so the
    table stays bounded by the retention while commands run."""
    clock = SteppedClock()
    from dataclasses import replace
    executor = replace(executor_for(db), clock=clock)
    runner = CommandRunner(executor, CommandConfig(idempotency_retention=timedelta(minutes=1)))
    for n in range(4):
        await ok(runner, "CreateProject", request_key=f"old{n}", org="acme",
                 project_id=f"p{n}", name="P")
    clock.at = clock.at + timedelta(minutes=2)
    for n in range(2):
        await ok(runner, "CreateProject", request_key=f"new{n}", org="acme",
                 project_id=f"q{n}", name="Q")
    keys = await db.pool.fetch("SELECT key FROM service_engine.command_idempotency")
    assert sorted(r["key"] for r in keys) == ["new0", "new1"]


async def test_two_tenants_hold_the_same_id(db: Database) -> None:
    """The store key is the complete key (org + id): two orgs each create a
    project and a task with the same ids, each sees and changes only its
    own, and a writer holding one org's row never blocks the other's."""
    runner = runner_for(db)
    await seed(runner)
    await ok(runner, "CreateProject", EVE, request_key="p", org="umbrella", project_id="p1",
             name="U")
    await ok(runner, "CreateTask", EVE, request_key="k", org="umbrella", task_id="t1",
             project_id="p1", title="first")
    await ok(runner, "RenameTask", EVE, org="umbrella", task_id="t1", title="theirs")
    rows = await db.pool.fetch("SELECT org, title, version FROM cmd_task WHERE id = 't1'")
    assert sorted((r["org"], r["title"], r["version"]) for r in rows) == [
        ("acme", "first", 1), ("umbrella", "theirs", 2)]
    # Neither observes the other's: another org's row is absent under its route.
    assert (await run(runner, "StartTask", EVE, request_key="s", org="umbrella", task_id="t1",
                      expected_revision=1)).name == "StaleRevision"
    short = CommandRunner(executor_for(db, lock_timeout=timedelta(milliseconds=200)))
    async with holding(db, Task.Store.store_type, ["acme", "t1"]):
        assert (await run(short, "RenameTask", EVE, org="umbrella", task_id="t1",
                          title="again")).ok
        blocked = await run(short, "RenameTask", org="acme", task_id="t1", title="mine")
        assert isinstance(blocked, MutationError) and blocked.code == "lock_timeout"
    await ok(runner, "DeleteTask", EVE, org="umbrella", task_id="t1")
    assert await task_row(db, "t1") is not None  # acme's t1 stays


@pytest.mark.parametrize("kind", RUNNERS)
async def test_cross_tenant_delete_is_refused(db: Database, kind: str) -> None:
    """A delete checks the current row against the entity's delete row
    policy (the task's update policy by default): another org's principal
    gets Refused and nothing is deleted; every row a cascade takes is
    checked too (a pinned step needs an admin); the delete affordance says
    denied exactly when the command answers Refused (the interpreter as the
    compiled function)."""
    runner: Runner = runner_for(db) if kind == "compiled" else Interpreting(executor_for(db))
    await seed(runner)
    await ok(runner, "AddStep", org="acme", task_id="t1", step_id="s1", label="x")
    refused = await run(runner, "DeleteTask", EVE, org="acme", task_id="t1")
    assert (refused.name, refused.data) == (
        REFUSED, {"reason": "task.update_denied", "action": "delete"})
    assert (await run(runner, "DeleteProject", EVE, org="acme", project_id="p1")).data == {
        "reason": "project.other_org", "action": "delete"}
    assert await task_row(db, "t1") is not None
    assert await count(db, "SELECT count(*) FROM cmd_step") == 1
    assert await count(db, "SELECT count(*) FROM cmd_project") == 1
    # A locked task is deleted only by an admin (the current row's policy).
    await ok(runner, "LockTask", ROOT, org="acme", task_id="t1", locked=True)
    assert (await run(runner, "DeleteTask", org="acme", task_id="t1")).name == REFUSED
    await ok(runner, "LockTask", ROOT, org="acme", task_id="t1", locked=False)
    # A pinned step refuses the cascade that would take it.
    pinned = await ok(runner, "PinStep", org="acme", step_id="s1", expected_revision=1)
    assert pinned.data == {"revision": 2}
    cascade = await run(runner, "DeleteTask", org="acme", task_id="t1")
    assert (cascade.name, cascade.data) == (
        REFUSED, {"reason": "step.delete_denied", "action": "delete"})
    assert await task_row(db, "t1") is not None
    assert await count(db, "SELECT count(*) FROM cmd_step") == 1
    async with db.pool.acquire() as conn:
        task = await Task.Store.load(conn, ["acme", "t1"])
        step = await Step.Store.load(conn, ["acme", "s1"])
    for principal in (ALICE, ROOT, EVE, Principal("none", org=None)):
        offered = affordances(task, principal)["delete"]  # type: ignore[index]
        step_offered = affordances(step, principal)["delete"]  # type: ignore[index]
        if principal is EVE or principal.org is None:
            assert not offered.allowed and not step_offered.allowed
        assert offered.allowed == (principal is not EVE and principal.org is not None)
        assert step_offered.allowed == (principal is ROOT)
    await ok(runner, "DeleteTask", ROOT, org="acme", task_id="t1")
    assert await task_row(db, "t1") is None
    assert await count(db, "SELECT count(*) FROM cmd_step") == 0


def _mutate_task(*extra: Any) -> Command:
    return Command(
        "Probe", ORG, Input("task_id", str), Input("title", str),
        Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing"),
               taken={"by_title": Outcome("TitleTaken")}),
        *extra, Return("Done"),
    )


def test_set_without_a_proof_is_refused_at_registration() -> None:
    """A Set on an existing row with no proof that it loses nothing (no
    initialisation, same-field arithmetic, checked_by, version fence or
    overwrite) is refused at registration with UnprovenSet naming the
    command and the clause; each proof is accepted."""
    swap = Command("SwapTitles", *(
        replace(c, overwrite=False) if isinstance(c, Set) else c for c in SWAP_TITLES.clauses
    ))
    with pytest.raises(UnprovenSet, match=r"command SwapTitles: set a\.title \(clause 6"):
        CATALOG.command(swap)
    with pytest.raises(UnprovenSet, match=r"command Probe: set task\.title \(clause 5"):
        CATALOG.command(_mutate_task(Set("task", "title", Var("title"))))
    # Reading another field of the binding is no proof.
    with pytest.raises(UnprovenSet):
        CATALOG.command(_mutate_task(
            Require("Unlocked", Not(Field("task", "locked")), Outcome("Locked")),
            Set("task", "title", Var("title")),
        ))
    # checked_by names a requirement of the command that observes the binding.
    with pytest.raises(UnknownName, match="checked_by 'Nope'"):
        CATALOG.command(_mutate_task(Set("task", "title", Var("title"), checked_by="Nope")))
    with pytest.raises(UnprovenSet, match="does not observe task"):
        CATALOG.command(_mutate_task(
            Require("Named", Ne(Var("title"), Const("")), Outcome("Unnamed")),
            Set("task", "title", Var("title"), checked_by="Named"),
        ))
    CATALOG.command(_mutate_task(
        Require("Unlocked", Not(Field("task", "locked")), Outcome("Locked")),
        Set("task", "title", Var("title"), checked_by="Unlocked"),
    ))
    CATALOG.command(_mutate_task(Set("task", "title", Var("title"), overwrite=True)))
    # The caller's revision compared with the row's fences the binding.
    fenced = Command(
        "Fenced", ORG, Input("task_id", str), Input("title", str), Input("rev", int),
        Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing"),
               taken={"by_title": Outcome("TitleTaken")}),
        Require("Current", Eq(Var("rev"), Field("task", "version")), Outcome("Stale")),
        Set("task", "title", Var("title")), Return("Done"),
    )
    CATALOG.command(fenced)
    with pytest.raises(UnprovenSet):  # a constant is no caller's revision
        CATALOG.command(Command("Fenced", *(
            Require("Current", Eq(Const(1), Field("task", "version")), Outcome("Stale"))
            if isinstance(c, Require) else c for c in fenced.clauses
        )))
    assert C["StartTask"].effects  # a Transition fences its binding's sets
    assert C["PinStep"].effects


def test_mistyped_declarations_are_refused_at_registration() -> None:
    """Each mistyped declaration is refused at registration (not at run
    time) with a named error whose message names the command and the clause:
    an enum-like field compared with a number or a value outside its states,
    an undeclared principal fact, a Set value the field's type cannot hold,
    a Set after the binding's Delete, two requirements with one name (the
    first's clause named)."""
    cases: list[tuple[Command, type[Exception], str]] = [
        (_mutate_task(Require("Queued", Eq(Field("task", "state"), Const(5)), Outcome("No"))),
         TypeMismatch, r"clause 5 \(Require Queued\).*task\.state == 5"),
        (_mutate_task(Require("Queued", Eq(Field("task", "state"), Const("queud")),
                              Outcome("No"))),
         TypeMismatch, r"clause 5 \(Require Queued\).*'queud' is not one of"),
        (_mutate_task(Require("Admin", Fact("admn"), Outcome("No"))),
         UnknownName, r"clause 5 \(Require Admin\).*Fact\('admn'\) is not a declared"),
        (_mutate_task(Set("task", "title", Const(5), overwrite=True)),
         TypeMismatch, r"set task\.title \(clause 5 .*5 \(int\), the field is str"),
        (_mutate_task(Set("task", "locked", Var("title"), overwrite=True)),
         TypeMismatch, r"set task\.locked .*the field is bool"),
        (_mutate_task(Set("task", "started_at", Const(None), overwrite=True),
                      Set("task", "title", Const(None), overwrite=True)),
         TypeMismatch, r"set task\.title \(clause 6 .*may be None"),
        (Command("Probe", ORG, Input("task_id", str),
                 Mutate("Task", (Var("org"), Var("task_id")), as_="task",
                        else_=Outcome("Missing")),
                 Delete("task", too_many=Outcome("TooMany")),
                 Set("task", "locked", Const(True), overwrite=True), Return("Done")),
         BindingError, r"set task\.locked \(clause 5 .*deleted before it"),
        (_mutate_task(Require("Open", Not(Field("task", "locked")), Outcome("Locked")),
                      Require("Open", Eq(Field("task", "title"), Var("title")), Outcome("No"))),
         DuplicateName, r"clause 6 \(Require Open\).*first declared at clause 5 \(Require Open\)"),
        (_mutate_task(Require("Titled", Field("task", "title"), Outcome("No"))),
         TypeMismatch, r"require Titled .*is str, not a bool"),
        (_mutate_task(Require("Older", Lt(Field("task", "version"), Var("title")),
                              Outcome("No"))),
         TypeMismatch, r"compares int with str"),
    ]
    for declaration, error, message in cases:
        with pytest.raises(error, match=f"command Probe: .*{message}"):
            CATALOG.command(declaration)
    # A workflow's states must be values of its field; a row policy is typed too.
    with pytest.raises(WorkflowError, match=r"not values of Task\.state"):
        Catalog([PROJECT, TASK, STEP], [replace(LIFECYCLE, states=("queued", "running", "gone"),
                                                transitions=())], FACTS)
    with pytest.raises(UnknownName, match=r"entity Task: the update row policy.*'admn'"):
        Catalog([PROJECT, replace(TASK, update_policy=RowPolicy(Fact("admn"), Reason("x"))),
                 STEP], [LIFECYCLE], FACTS)
    with pytest.raises(DuplicateName, match=r"entity Project \(entity #2\): the name is first declared by entity #1"):
        Catalog([PROJECT, PROJECT])


async def test_a_requirement_refuses_with_zero_mutation(db: Database) -> None:
    """A Require whose predicate is false answers its declared outcome and
    changes nothing; true, the command runs."""
    runner = runner_for(db)
    await seed(runner)
    await ok(runner, "StartTask", request_key="s", org="acme", task_id="t1", expected_revision=1)
    await ok(runner, "LockTask", ROOT, org="acme", task_id="t1", locked=True)
    before = await task_row(db, "t1")
    locked = await run(runner, "FinishTask", ROOT, org="acme", task_id="t1", expected_revision=3)
    assert (locked.name, locked.ok) == ("Locked", False)
    assert await task_row(db, "t1") == before
    await ok(runner, "LockTask", ROOT, org="acme", task_id="t1", locked=False)
    assert (await run(runner, "FinishTask", ROOT, org="acme", task_id="t1",
                      expected_revision=4)).name == "Finished"


async def test_an_update_is_refused_when_the_current_row_fails_its_policy(db: Database) -> None:
    """The update policy judges the current row too: unlocking a locked
    task (a proposed row the policy admits) is refused to a non-admin."""
    runner = runner_for(db)
    await seed(runner)
    await ok(runner, "LockTask", ROOT, org="acme", task_id="t1", locked=True)
    refused = await run(runner, "LockTask", org="acme", task_id="t1", locked=False)
    assert (refused.name, refused.data) == (
        REFUSED, {"reason": "task.update_denied", "action": "update"})
    row = await task_row(db, "t1")
    assert row is not None and row["locked"] and row["version"] == 2


async def test_a_write_past_the_lock_fails_the_checked_transition(db: Database) -> None:
    """A checked transition reads its row under the row's lock and decides
    and writes in one call: a writer outside the pipeline that holds the row
    makes the command wait for it, and the transition then judges the row
    that writer committed (a stale revision), so neither write is lost."""
    runner = runner_for(db)
    await seed(runner)
    writer = await db.connect_dedicated()
    try:
        outside = writer.transaction()
        await outside.start()
        await writer.execute("UPDATE cmd_task SET title = 'renamed', version = version + 1"
                             " WHERE org = 'acme' AND id = 't1'")
        running = asyncio.ensure_future(runner.run(C["StartTask"], ALICE, {
            "request_key": "k", "org": "acme", "task_id": "t1", "expected_revision": 1}))

        async def waiting() -> bool:
            found = await db.pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'")
            return bool(found) or running.done()

        await wait_until(waiting, what="the command waiting on the outside writer's row")
        await outside.commit()
        outcome = await asyncio.wait_for(running, 10)
    finally:
        await writer.close()
    assert isinstance(outcome, CommandOutcome) and outcome.name == "StaleRevision", outcome
    row = await task_row(db, "t1")
    assert row is not None
    assert (row["title"], row["state"], row["version"]) == ("renamed", "queued", 2)


async def test_run_in_answers_a_keyed_retry_from_its_record(db: Database) -> None:
    """A keyed command run inside a handler's transaction stores its outcome
    with the handler's commit (under the default retention): a retry
    through `run_in` answers it again and runs nothing."""
    runner = runner_for(db)
    await seed(runner)
    executor = executor_for(db)
    inputs = {"request_key": "k", "org": "acme", "task_id": "t1", "expected_revision": 1}

    async def start(cx: Mutation[Any]) -> CommandOutcome:
        return await run_in(cx, C["StartTask"], inputs)

    first = await executor.execute(ALICE, start)
    again = await executor.execute(ALICE, start)
    assert isinstance(first, CommandOutcome) and first.name == "Started" and not first.replayed
    assert again == first and isinstance(again, CommandOutcome) and again.replayed
    row = await task_row(db, "t1")
    assert row is not None and (row["state"], row["version"]) == ("running", 2)
