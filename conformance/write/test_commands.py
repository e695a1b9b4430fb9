"""The declarative command layer against real Postgres (seeds/003 semantics).

Each test states the property it proves. The sample (`sample_commands`)
declares projects, tasks (a workflow, a unique title per org, an update row
policy, a cascade of steps) and steps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from service_engine import Database
from service_engine.commands import (
    IDEMPOTENCY_CONFLICT,
    INVALID_INPUT,
    REFUSED,
    Catalog,
    Command,
    CommandOutcome,
    CommandRunner,
    Const,
    Eq,
    Fact,
    Field,
    Input,
    Mutate,
    Not,
    Outcome,
    Require,
    Return,
    ReverseIndex,
    Set,
    Var,
    run_in,
)
from service_engine.db.errors import Stage
from service_engine.db.locks import aggregate_lock_key
from service_engine.db.types import Conn
from service_engine.embedded import APP_ROLE, ProvisionedDatabase
from service_engine.gates import affordances
from service_engine.pipeline import Mutation, MutationError

from ..support.harness import wait_until
from ..support.sample_commands import (
    ALICE,
    CATALOG,
    COMMANDS,
    DELETE_TASK,
    EVE,
    FACTS,
    LIFECYCLE,
    MAX_STEPS,
    ORG,
    PROJECT,
    ROOT,
    STEP,
    TASK,
    Principal,
    Task,
    executor_for,
    install,
    runner_for,
)
from ..support.sample_counter import listen_impacts
from .test_commands_oracle import RUNNERS, Interpreting

C = COMMANDS
Runner = CommandRunner | Interpreting
"""The compiled function's runner, or the interpreter's (its oracle)."""


async def run(
    runner: Runner, command: str, principal: Any = ALICE, /, **inputs: Any
) -> Any:
    return await runner.run(C[command], principal, inputs)


async def ok(
    runner: Runner, command: str, principal: Any = ALICE, /, **inputs: Any
) -> Any:
    outcome = await run(runner, command, principal, **inputs)
    assert isinstance(outcome, CommandOutcome) and outcome.ok, outcome
    return outcome


async def task_row(db: Database, task_id: str) -> dict[str, Any] | None:
    row = await db.pool.fetchrow("SELECT * FROM cmd_task WHERE id = $1", task_id)
    return None if row is None else dict(row)


async def count(db: Database, sql: str, *args: Any) -> int:
    value = await db.pool.fetchval(sql, *args)
    assert isinstance(value, int)
    return value


async def seed(runner: Runner, task_id: str = "t1", title: str = "first",
               project: str = "p1") -> CommandOutcome:
    await run(runner, "CreateProject", request_key=f"p-{project}", org="acme",
              project_id=project, name="Project")
    created: CommandOutcome = await ok(
        runner, "CreateTask", request_key=f"t-{task_id}", org="acme", task_id=task_id,
        project_id=project, title=title,
    )
    return created


async def test_lost_response_retry_runs_once_with_the_same_sealed_values(db: Database) -> None:
    """A retry with the key of a run whose response was lost runs nothing and
    answers the stored outcome with the originally sealed uuid_v7 and time."""
    runner = runner_for(db)
    await seed(runner)
    first = await ok(runner, "StartTask", request_key="k1", org="acme", task_id="t1",
                     expected_revision=1)
    # A fresh runner over the same database: a restarted pod answers the same.
    again = await run(runner_for(db), "StartTask", request_key="k1", org="acme",
                      task_id="t1", expected_revision=1)
    assert again == first and again.replayed and not first.replayed
    assert again.sealed["execution_id"] == first.sealed["execution_id"]
    assert again.data["execution_id"] == first.data["execution_id"]
    assert again.data["started_at"] == first.data["started_at"]
    row = await task_row(db, "t1")
    assert row is not None
    assert (row["state"], row["version"]) == ("running", 2)
    assert str(row["execution_id"]) == first.sealed["execution_id"]
    assert row["started_at"].isoformat() == first.sealed["started_at"]
    assert str(first.sealed["execution_id"])[14] == "7"  # a version-7 uuid


async def test_same_key_with_other_inputs_is_refused(db: Database) -> None:
    """The same key with other inputs answers IdempotencyConflict and changes nothing."""
    runner = runner_for(db)
    await seed(runner)
    await seed(runner, "t2", "second")
    await ok(runner, "StartTask", request_key="k1", org="acme", task_id="t1",
             expected_revision=1)
    before = await task_row(db, "t2")
    conflict = await run(runner, "StartTask", request_key="k1", org="acme", task_id="t2",
                         expected_revision=1)
    assert isinstance(conflict, CommandOutcome)
    assert (conflict.name, conflict.ok) == (IDEMPOTENCY_CONFLICT, False)
    assert await task_row(db, "t2") == before
    # Keys are the caller's own: another principal's same key is its own first run.
    other = await run(runner, "StartTask", ROOT, request_key="k1", org="acme", task_id="t2",
                      expected_revision=1)
    assert isinstance(other, CommandOutcome) and other.name == "Started"


async def test_a_refusal_is_stored_and_replayed_without_running(db: Database) -> None:
    """A declared zero-mutation outcome is the key's stored outcome: a retry
    answers it again even once running the command would now succeed."""
    runner = runner_for(db)
    await seed(runner)
    stale = await run(runner, "StartTask", request_key="k", org="acme", task_id="t1",
                      expected_revision=2)
    assert isinstance(stale, CommandOutcome) and stale.name == "StaleRevision"
    await ok(runner, "RenameTask", org="acme", task_id="t1", title="renamed")  # revision 2
    replay = await run(runner, "StartTask", request_key="k", org="acme", task_id="t1",
                       expected_revision=2)
    assert replay == stale and replay.replayed
    row = await task_row(db, "t1")
    assert row is not None and (row["state"], row["version"]) == ("queued", 2)


async def test_twenty_concurrent_creates_of_one_title_one_wins(db: Database) -> None:
    """Twenty concurrent creates of one unique value: exactly one Created, the
    others the declared TitleTaken, and one occupancy row."""
    runner = runner_for(db)
    await run(runner, "CreateProject", request_key="p", org="acme", project_id="p1", name="P")
    outcomes = await asyncio.gather(*(
        run(runner, "CreateTask", request_key=f"k{n}", org="acme", task_id=f"t{n}",
            project_id="p1", title="same")
        for n in range(20)
    ))
    names = sorted(o.name for o in outcomes)
    assert names == ["Created"] + ["TitleTaken"] * 19, names
    assert await count(db, "SELECT count(*) FROM cmd_task WHERE title = 'same'") == 1
    assert await count(db, "SELECT count(*) FROM service_engine.command_occupancy") == 1


async def test_unique_is_per_partition_and_renames_move_the_occupancy(db: Database) -> None:
    """A title is unique within its org only; a rename frees the old title
    and takes the new one in the same commit; a rename onto a taken title is
    TitleTaken with zero mutation."""
    runner = runner_for(db)
    await seed(runner, "t1", "alpha")
    await run(runner, "CreateProject", EVE, request_key="p", org="umbrella", project_id="u1",
              name="U")
    await ok(runner, "CreateTask", EVE, request_key="k", org="umbrella", task_id="u-t1",
             project_id="u1", title="alpha")
    await ok(runner, "RenameTask", org="acme", task_id="t1", title="beta")
    await ok(runner, "CreateTask", request_key="k2", org="acme", task_id="t2",
             project_id="p1", title="alpha")
    before = await task_row(db, "t2")
    taken = await run(runner, "RenameTask", org="acme", task_id="t2", title="beta")
    assert taken.name == "TitleTaken"
    assert await task_row(db, "t2") == before
    taken = await run(runner, "CreateTask", request_key="k3", org="acme", task_id="t3",
                      project_id="p1", title="beta")
    assert taken.name == "TitleTaken"
    assert await count(db, "SELECT count(*) FROM service_engine.command_occupancy") == 3


async def test_stale_and_illegal_transitions_are_idempotent_zero_mutation(db: Database) -> None:
    """The revision is compared before the source state: a mismatch is
    StaleRevision, a match outside the source set IllegalState; both leave
    the row as it was, however often they are sent."""
    runner = runner_for(db)
    await seed(runner)
    queued = await task_row(db, "t1")
    for _ in range(2):
        stale = await run(runner, "FinishTask", org="acme", task_id="t1", expected_revision=7)
        assert stale.name == "StaleRevision"
        illegal = await run(runner, "FinishTask", org="acme", task_id="t1", expected_revision=1)
        assert illegal.name == "IllegalState"
    assert await task_row(db, "t1") == queued
    await ok(runner, "StartTask", request_key="s", org="acme", task_id="t1", expected_revision=1)
    running = await task_row(db, "t1")
    # Stale wins over illegal: the wrong revision in the wrong state is stale.
    assert (await run(runner, "StartTask", request_key="s2", org="acme", task_id="t1",
                      expected_revision=1)).name == "StaleRevision"
    assert (await run(runner, "StartTask", request_key="s3", org="acme", task_id="t1",
                      expected_revision=2)).name == "IllegalState"
    assert await task_row(db, "t1") == running
    done = await ok(runner, "FinishTask", org="acme", task_id="t1", expected_revision=2)
    assert done.data == {"revision": 3}


async def _waiting_locks(db: Database) -> int:
    return await count(db, "SELECT count(*) FROM pg_locks WHERE NOT granted")


@pytest.mark.parametrize("writer", ["pipeline", "raw_sql"])
async def test_a_concurrent_write_between_check_and_commit_is_not_lost(
    db: Database, writer: str
) -> None:
    """A write that arrives while a checked transition is between its check
    and its commit waits for it and applies after: both changes survive and
    the revision counts both (no lost update)."""
    runner = runner_for(db)
    await seed(runner)
    concurrent: list[asyncio.Task[Any]] = []

    async def write_now(stage: Stage, conn: Conn) -> None:
        if stage is not Stage.COMMIT:
            return
        if writer == "pipeline":
            coro: Any = run(runner, "RenameTask", org="acme", task_id="t1", title="renamed")
        else:
            coro = db.pool.execute(
                "UPDATE cmd_task SET title = 'renamed', version = version + 1 WHERE id = 't1'"
            )
        concurrent.append(asyncio.ensure_future(coro))
        await wait_until(lambda: _at_least_one(db), what="the concurrent writer to wait")

    hooked = CommandRunner(executor_for(db).with_hook(write_now), runner.config)
    started = await hooked.run(C["StartTask"], ALICE, {
        "request_key": "k", "org": "acme", "task_id": "t1", "expected_revision": 1,
    })
    assert isinstance(started, CommandOutcome) and started.name == "Started"
    await asyncio.wait_for(concurrent[0], 10)
    row = await task_row(db, "t1")
    assert row is not None
    assert (row["state"], row["title"], row["version"]) == ("running", "renamed", 3)


async def _at_least_one(db: Database) -> bool:
    return await _waiting_locks(db) >= 1


async def test_restrict_refuses_while_referenced(db: Database) -> None:
    """Deleting a project a task references answers Referenced and deletes
    nothing; once the reference is gone the delete commits."""
    runner = runner_for(db)
    await seed(runner)
    referenced = await run(runner, "DeleteProject", org="acme", project_id="p1")
    assert referenced.name == "Referenced"
    assert await count(db, "SELECT count(*) FROM cmd_project") == 1
    await ok(runner, "DeleteTask", org="acme", task_id="t1")
    await ok(runner, "DeleteProject", org="acme", project_id="p1")
    assert await count(db, "SELECT count(*) FROM cmd_project") == 0


async def test_cascade_deletes_at_most_its_maximum_and_refuses_beyond(db: Database) -> None:
    """A task with MAX_STEPS steps is deleted with its steps (and frees its
    title); one with more answers TooManySteps and keeps everything."""
    runner = runner_for(db)
    await seed(runner, "t1", "small")
    await seed(runner, "t2", "large")
    for n in range(MAX_STEPS):
        await ok(runner, "AddStep", org="acme", task_id="t1", step_id=f"s1-{n}", label="x")
    for n in range(MAX_STEPS + 1):
        await ok(runner, "AddStep", org="acme", task_id="t2", step_id=f"s2-{n}", label="x")
    too_many = await run(runner, "DeleteTask", org="acme", task_id="t2")
    assert too_many.name == "TooManySteps" and too_many.data == {"maximum": MAX_STEPS}
    assert await count(db, "SELECT count(*) FROM cmd_step WHERE task_id = 't2'") == MAX_STEPS + 1
    assert await task_row(db, "t2") is not None
    await ok(runner, "DeleteTask", org="acme", task_id="t1")
    assert await count(db, "SELECT count(*) FROM cmd_step WHERE task_id = 't1'") == 0
    assert await task_row(db, "t1") is None
    await ok(runner, "CreateTask", request_key="again", org="acme", task_id="t3",
             project_id="p1", title="small")


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_reverse_index_finds_rows_through_its_own_columns(
    db: Database, database: ProvisionedDatabase, kind: str,
) -> None:
    """A reverse index whose table names its columns apart from the
    entity's fields (``columns``, ``key_columns``) is scanned through those
    columns: a cascade over it finds, judges and deletes every step of the
    task, and refuses beyond its maximum, which it names (the interpreter as
    the compiled function)."""
    owner = await asyncpg.connect(database.owner_url)
    try:
        await owner.execute(
            "CREATE VIEW cmd_step_by_parent AS "
            "SELECT org AS step_org, id AS step_id, task_id AS parent FROM cmd_step")
        await owner.execute(f"GRANT SELECT ON cmd_step_by_parent TO {APP_ROLE}")
    finally:
        await owner.close()
    by_parent = ReverseIndex("by_task", ("org", "task_id"), table="cmd_step_by_parent",
                             columns=("step_org", "parent"), key_columns=("step_org", "step_id"))
    catalog = Catalog([PROJECT, TASK, replace(STEP, indexes=(by_parent,))], [LIFECYCLE], FACTS)
    delete_task = catalog.command(DELETE_TASK)
    await install(database.owner_url, delete_task)
    runner: Runner = runner_for(db) if kind == "compiled" else Interpreting(executor_for(db))
    await seed(runner, "t1", "small")
    await seed(runner, "t2", "large")
    for n in range(MAX_STEPS):
        await ok(runner, "AddStep", org="acme", task_id="t1", step_id=f"s1-{n}", label="x")
    for n in range(MAX_STEPS + 1):
        await ok(runner, "AddStep", org="acme", task_id="t2", step_id=f"s2-{n}", label="x")
    too_many = await runner.run(delete_task, ALICE, {"org": "acme", "task_id": "t2"})
    assert isinstance(too_many, CommandOutcome), too_many
    assert (too_many.name, too_many.data) == ("TooManySteps", {"maximum": MAX_STEPS})
    deleted = await runner.run(delete_task, ALICE, {"org": "acme", "task_id": "t1"})
    assert isinstance(deleted, CommandOutcome) and deleted.name == "Deleted", deleted
    assert await count(db, "SELECT count(*) FROM cmd_step WHERE task_id = 't1'") == 0
    assert await count(db, "SELECT count(*) FROM cmd_step WHERE task_id = 't2'") == MAX_STEPS + 1


@dataclass(frozen=True)
class Nicknamed:
    id: str
    nickname: Any
    org: str = "acme"
    admin: bool = False


async def test_a_set_value_registration_cannot_type_is_checked_when_it_runs(
    db: Database, database: ProvisionedDatabase,
) -> None:
    """A `Set` whose value registration cannot type (a fact declared `Any`)
    is checked against the field when the command runs: a value the field
    cannot hold answers ``invalid_input`` naming the binding, the field and
    the value, and writes nothing; a value it can hold is written."""
    catalog = Catalog([PROJECT, TASK, STEP], [LIFECYCLE], {**FACTS, "nickname": Any})
    nickname = catalog.command(Command(
        "TitleByNickname", ORG, Input("task_id", str),
        Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing"),
               taken={"by_title": Outcome("TitleTaken")}),
        Set("task", "title", Fact("nickname"), overwrite=True),
        Return("Renamed"),
    ))
    await install(database.owner_url, nickname)
    runner = runner_for(db)
    await seed(runner)
    refused = await runner.run(nickname, Nicknamed("n", 5), {"org": "acme", "task_id": "t1"})
    assert isinstance(refused, MutationError)
    assert (refused.code, refused.message) == (INVALID_INPUT, "set task.title: 5 is not a str")
    row = await task_row(db, "t1")
    assert row is not None and (row["title"], row["version"]) == ("first", 1)
    renamed = await runner.run(nickname, Nicknamed("n", "nick"), {"org": "acme", "task_id": "t1"})
    assert isinstance(renamed, CommandOutcome) and renamed.name == "Renamed", renamed
    row = await task_row(db, "t1")
    assert row is not None and (row["title"], row["version"]) == ("nick", 2)


@pytest.mark.parametrize("kind", RUNNERS)
async def test_a_return_field_reads_the_acting_principal(
    db: Database, database: ProvisionedDatabase, kind: str,
) -> None:
    """A return field may read a fact of the principal the command ran as
    (its value in the outcome is that principal's; the interpreter as the
    compiled function)."""
    locked_by = CATALOG.command(Command(
        "LockedBy", ORG, Input("task_id", str),
        Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing")),
        Set("task", "locked", Const(True), overwrite=True),
        Return("Locked", by=Fact("id"), revision=Field("task", "version")),
    ))
    await install(database.owner_url, locked_by)
    runner: Runner = runner_for(db) if kind == "compiled" else Interpreting(executor_for(db))
    await seed(runner)
    outcome = await runner.run(locked_by, ROOT, {"org": "acme", "task_id": "t1"})
    assert isinstance(outcome, CommandOutcome), outcome
    assert (outcome.name, outcome.data) == ("Locked", {"by": "root", "revision": 2})


@pytest.mark.parametrize("kind", RUNNERS)
async def test_every_requirement_is_checked_after_one_that_holds(
    db: Database, database: ProvisionedDatabase, kind: str,
) -> None:
    """Requirements are checked in their declared order, each of them: the
    first that fails answers its outcome and nothing is written, whatever
    requirements held before it (the interpreter as the compiled function)."""
    guarded = CATALOG.command(Command(
        "RenameQueued", ORG, Input("task_id", str), Input("title", str),
        Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing"),
               taken={"by_title": Outcome("TitleTaken")}),
        Require("Unlocked", Not(Field("task", "locked")), else_=Outcome("Locked")),
        Require("Queued", Eq(Field("task", "state"), Const("queued")),
                else_=Outcome("NotQueued")),
        Set("task", "title", Var("title"), overwrite=True),
        Return("Renamed"),
    ))
    await install(database.owner_url, guarded)
    runner: Runner = runner_for(db) if kind == "compiled" else Interpreting(executor_for(db))
    await seed(runner, "t1", "a")
    await seed(runner, "t2", "b")
    await ok(runner, "StartTask", request_key="s", org="acme", task_id="t2",
             expected_revision=1)
    refused = await runner.run(guarded, ALICE, {"org": "acme", "task_id": "t2", "title": "c"})
    assert isinstance(refused, CommandOutcome) and refused.name == "NotQueued", refused
    row = await task_row(db, "t2")
    assert row is not None and row["title"] == "b"
    renamed = await runner.run(guarded, ALICE, {"org": "acme", "task_id": "t1", "title": "c"})
    assert isinstance(renamed, CommandOutcome) and renamed.name == "Renamed", renamed


async def test_relationship_proof_reads_the_target(db: Database) -> None:
    """A create whose required relationship has no target answers the
    proof's absence outcome and writes nothing."""
    runner = runner_for(db)
    missing = await run(runner, "CreateTask", request_key="k", org="acme", task_id="t1",
                        project_id="nope", title="x")
    assert missing.name == "ProjectMissing"
    assert await task_row(db, "t1") is None
    assert (await run(runner, "AddStep", org="acme", task_id="t1", step_id="s",
                      label="x")).name == "TaskMissing"


async def test_row_policy_checks_both_rows_and_affordance_equals_gate(db: Database) -> None:
    """An update must satisfy the row policy for the current and the proposed
    row; a missing or mistyped fact denies; the affordance is the same
    function: it says denied exactly when the command answers Refused."""
    runner = runner_for(db)
    await seed(runner)
    proposed = await run(runner, "LockTask", org="acme", task_id="t1", locked=True)
    assert (proposed.name, proposed.data) == (
        REFUSED, {"reason": "task.update_denied", "action": "update"})
    await ok(runner, "LockTask", ROOT, org="acme", task_id="t1", locked=True)
    async with db.pool.acquire() as conn:
        task = await Task.Store.load(conn, ["acme", "t1"])
    assert task is not None
    for principal in (ALICE, ROOT, Principal("typo", admin="yes"), Principal("none", org=None)):
        offered = affordances(task, principal)["update"]  # type: ignore[index]
        outcome = await run(runner, "RenameTask", principal, org="acme", task_id="t1",
                            title=f"by-{principal.id}")
        if offered.allowed:
            assert outcome.name == "Renamed", principal
        else:
            assert offered.reason is not None
            assert (outcome.name, outcome.data["reason"]) == (REFUSED, offered.reason.code)
    row = await task_row(db, "t1")
    assert row is not None and row["title"] == "by-root"


async def test_cross_aggregate_command_takes_all_locks_in_one_order(db: Database) -> None:
    """Commands writing the same two tasks in opposite binding order never
    deadlock (the union of locks in one fixed order) and each commits both
    rows or neither."""
    runner = runner_for(db)
    await seed(runner, "a", "A")
    await seed(runner, "b", "B")
    outcomes = await asyncio.gather(*(
        run(runner, "LockPair", ROOT, org="acme", first=x, second=y)
        for x, y in [("a", "b"), ("b", "a")] * 10
    ))
    assert all(isinstance(o, CommandOutcome) and o.name == "Locked" for o in outcomes), outcomes
    rows = [await task_row(db, k) for k in ("a", "b")]
    assert all(r is not None and r["locked"] and r["version"] == 21 for r in rows)
    await seed(runner, "c", "C")
    half = await run(runner, "LockPair", ROOT, org="acme", first="c", second="missing")
    assert half.name == "SecondMissing"
    row = await task_row(db, "c")
    assert row is not None and not row["locked"]


@contextlib.asynccontextmanager
async def holding(db: Database, store_type: str, key: object) -> AsyncIterator[None]:
    conn = await db.connect_dedicated()
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", aggregate_lock_key(store_type, key))
        yield
    finally:
        await conn.close()


async def test_different_conflict_keys_never_contend(db: Database) -> None:
    """A command contends only on its conflict key: with task a's lock held
    elsewhere, a command on task b commits and one on a times out (retryable)."""
    runner = runner_for(db)
    await seed(runner, "a", "A")
    await seed(runner, "b", "B")
    short = CommandRunner(executor_for(db, lock_timeout=timedelta(milliseconds=200)))
    async with holding(db, Task.Store.store_type, ["acme", "a"]):
        assert (await run(short, "RenameTask", org="acme", task_id="b", title="B2")).ok
        blocked = await run(short, "RenameTask", org="acme", task_id="a", title="A2")
        assert isinstance(blocked, MutationError)
        assert (blocked.code, blocked.retryable) == ("lock_timeout", True)


async def test_a_binding_outside_its_partition_is_absent(db: Database) -> None:
    """A row read under another partition route is absent there."""
    runner = runner_for(db)
    await seed(runner)
    assert (await run(runner, "RenameTask", EVE, org="umbrella", task_id="t1",
                      title="x")).name == "Missing"


async def test_impacts_are_staged_with_the_effect_and_only_then(db: Database) -> None:
    """A committed command impacts its entity's nouns (with the declared
    cause); a zero-mutation outcome and a replay impact nothing."""
    runner = runner_for(db)
    await seed(runner, "t1", "a")
    await seed(runner, "t2", "b")
    async with listen_impacts(db) as probe:
        await ok(runner, "RenameTask", org="acme", task_id="t1", title="c")
        [impact] = await probe.next()
        assert (impact.noun, impact.key) == ("cmd_task", ("acme", "t1"))
        assert impact.cause is not None and impact.cause.name == "task.renamed"
        assert impact.cause.data == {"title": "c"}
        assert (await run(runner, "RenameTask", org="acme", task_id="t1",
                          title="b")).name == "TitleTaken"
        await run(runner, "CreateTask", request_key="t-t1", org="acme", task_id="t1",
                  project_id="p1", title="a")  # a replay
        await probe.assert_quiet()


async def test_a_command_runs_inside_a_handler_transaction(db: Database) -> None:
    """`run_in` runs a command in the transaction a handler holds: it commits
    with the handler, and a handler that fails afterwards rolls it back."""
    runner = runner_for(db)
    await seed(runner)
    executor = executor_for(db)

    async def rename_then(cx: Mutation[Any], fail: bool) -> CommandOutcome:
        outcome = await run_in(cx, C["RenameTask"], {"org": "acme", "task_id": "t1",
                                                     "title": "inside"})
        if fail:
            raise RuntimeError("the handler fails after the command")
        return outcome

    with pytest.raises(RuntimeError):
        await executor.execute(ALICE, rename_then, True)
    row = await task_row(db, "t1")
    assert row is not None and (row["title"], row["version"]) == ("first", 1)
    outcome = await executor.execute(ALICE, rename_then, False)
    assert isinstance(outcome, CommandOutcome) and outcome.name == "Renamed"
    row = await task_row(db, "t1")
    assert row is not None and (row["title"], row["version"]) == ("inside", 2)


async def test_a_create_satisfies_its_row_policy(db: Database) -> None:
    """A create whose proposed row the create policy denies is Refused with
    the policy's reason and the action ``create``, and writes nothing."""
    runner = runner_for(db)
    refused = await run(runner, "CreateProject", EVE, request_key="k", org="acme",
                        project_id="p", name="P")
    assert (refused.name, refused.data) == (
        REFUSED, {"reason": "project.other_org", "action": "create"})
    assert await count(db, "SELECT count(*) FROM cmd_project") == 0



async def test_concurrent_renames_onto_one_title_one_wins(db: Database) -> None:
    """Twenty tasks renamed onto one title at once: one is Renamed, the others
    TitleTaken and unchanged; the winner's old title is free again."""
    runner = runner_for(db)
    for n in range(20):
        await seed(runner, f"t{n}", f"old-{n}")
    outcomes = await asyncio.gather(*(
        run(runner, "RenameTask", org="acme", task_id=f"t{n}", title="new") for n in range(20)
    ))
    names = sorted(o.name for o in outcomes)
    assert names == ["Renamed"] + ["TitleTaken"] * 19, names
    [winner] = [n for n, o in enumerate(outcomes) if o.name == "Renamed"]
    rows = await db.pool.fetch("SELECT id, title, version FROM cmd_task ORDER BY id")
    assert sum(r["title"] == "new" for r in rows) == 1
    assert all(r["version"] == (2 if r["id"] == f"t{winner}" else 1) for r in rows)
    await ok(runner, "CreateTask", request_key="again", org="acme", task_id="t-again",
             project_id="p1", title=f"old-{winner}")


async def test_a_swap_moves_both_occupancies_in_one_commit(db: Database) -> None:
    """Two tasks of one partition swap titles in one command: each takes the
    value the other frees in the same commit, and no value is held twice."""
    runner = runner_for(db)
    await seed(runner, "a", "left")
    await seed(runner, "b", "right")
    await ok(runner, "SwapTitles", org="acme", first="a", second="b")
    rows = {r["id"]: r["title"] for r in await db.pool.fetch("SELECT id, title FROM cmd_task")}
    assert rows == {"a": "right", "b": "left"}
    held = await db.pool.fetch("SELECT value, owner FROM service_engine.command_occupancy")
    assert sorted((r["value"], r["owner"]) for r in held) == [
        ('["left"]', '["acme","b"]'), ('["right"]', '["acme","a"]')]
