"""The sample's declared commands compiled, against the interpreter and
under concurrency (real Postgres).

Every command of the sample (`sample_commands`: restrict and cascade
deletes, a read proving a relationship, workflow transitions, row policies)
compiles; its functions answer random calls as the interpreter does, keep
the layer's invariants under random interleavings of concurrent keyed
calls and retries, and take three round trips whatever they declare.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_engine.commands import INVALID_INPUT, CheckedCommand, CommandConfig, CommandOutcome
from service_engine.commands.compile import PRELUDE, compile_command, run_compiled
from service_engine.commands.plan import InvalidInput
from service_engine.commands.runner import interpret
from service_engine.db import connect_pool
from service_engine.embedded import ProvisionedDatabase
from service_engine.impacts.model import canonical_json
from service_engine.pipeline import MutationError, MutationExecutor

from ..support.harness import Statements
from ..support.sample_commands import ALICE, COMMANDS, executor_for
from ..support.sample_commands import Principal as SamplePrincipal
from . import test_commands_properties as properties
from .test_commands_compiled import (
    RETENTION,
    _answer,
    _compiled,
    _normal,
    _unsealed,
)


async def test_a_compiled_command_takes_begin_the_call_and_commit(
    database: ProvisionedDatabase, logged: tuple[Any, Statements],
) -> None:
    """A compiled command's run is three round trips whatever it declares
    (idempotency key, reads, unique claims, a transition): BEGIN, the one
    call, the impacts' NOTIFY with COMMIT; it answers as the interpreter."""
    db, statements = logged
    tables = {"Project": "cmd_project", "Task": "cmd_task"}
    compiled = {name: compile_command(COMMANDS[name], tables)
                for name in ("CreateProject", "CreateTask", "RenameTask", "StartTask")}
    owner = await asyncpg.connect(database.owner_url)
    try:
        await owner.execute(PRELUDE)
        for c in compiled.values():
            await owner.execute(c.ddl)
    finally:
        await owner.close()
    executor = executor_for(db)

    async def sent(name: str, inputs: dict[str, Any]) -> list[str]:
        outcome = await _compiled(executor, compiled[name], ALICE, inputs)
        assert isinstance(outcome, CommandOutcome) and outcome.ok, outcome
        return statements.take_own()

    await sent("CreateProject", {"request_key": "k0", "org": "acme", "project_id": "p",
                                 "name": "P"})
    await sent("CreateTask", {"request_key": "k1", "org": "acme", "task_id": "t0",
                              "project_id": "p", "title": "warm"})
    runs = [
        await sent("CreateTask", {"request_key": "k2", "org": "acme", "task_id": "t1",
                                  "project_id": "p", "title": "a"}),
        await sent("RenameTask", {"org": "acme", "task_id": "t1", "title": "b"}),
        await sent("StartTask", {"request_key": "k3", "org": "acme", "task_id": "t1",
                                 "expected_revision": 2}),
    ]
    for run in runs:
        assert len(run) == 3, run
        assert run[0].startswith("BEGIN; SET LOCAL lock_timeout")
        assert run[1].startswith("SELECT service_engine.")
        assert "; COMMIT; " in run[2] and "pg_notify('service_engine_impacts'" in run[2]
    rows = await db.pool.fetch("SELECT title, state, version FROM cmd_task WHERE id = 't1'")
    assert [tuple(r) for r in rows] == [("b", "running", 3)]


SAMPLE_TABLES = {"Project": "cmd_project", "Task": "cmd_task", "Step": "cmd_step"}


SETUP: list[tuple[str, dict[str, Any]]] = [
    ("CreateProject", {"project_id": 0, "request_key": "s0"}),
    ("CreateProject", {"project_id": 1, "request_key": "s1"}),
    ("CreateTask", {"task_id": 0, "project_id": 0, "title": "s0", "request_key": "s2"}),
    ("CreateTask", {"task_id": 1, "project_id": 0, "title": "s1", "request_key": "s3"}),
    ("CreateTask", {"task_id": 2, "project_id": 1, "title": "s2", "request_key": "s4"}),
    ("AddStep", {"task_id": 0, "step_id": 0}),
    ("AddStep", {"task_id": 0, "step_id": 1}),
    ("AddStep", {"task_id": 1, "step_id": 2}),
]
"""Calls that give the random ones rows to work on (compared as well)."""


def _sample_call(
    rnd: random.Random, org: str, name: str, fixed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Inputs for the sample command ``name`` in ``org`` (ids from small pools,
    or as ``fixed`` says)."""
    def pick(kind: str, n: int) -> str:
        return f"{org}-{kind}{rnd.randrange(n)}"

    values: dict[str, Any] = {
        "request_key": f"k{rnd.randrange(3)}", "org": org, "project_id": pick("p", 2),
        "name": "P", "task_id": pick("t", 3), "title": f"title-{rnd.randrange(3)}",
        "expected_revision": rnd.randint(1, 3), "locked": rnd.random() < 0.5,
        "first": pick("t", 3), "second": pick("t", 3), "step_id": pick("s", 4),
        "label": "L",
    }
    prefix = {"project_id": "p", "task_id": "t", "step_id": "s"}
    for k, v in (fixed or {}).items():
        values[k] = f"{org}-{prefix[k]}{v}" if k in prefix else v
    declared = {i.name for i in COMMANDS[name].inputs}
    return {k: v for k, v in values.items() if k in declared}


async def _sample_example(database: ProvisionedDatabase, seed: int) -> None:
    rnd = random.Random(seed)
    db = await connect_pool(database.app_url, max_size=4)
    try:
        suffix = secrets.token_hex(3)
        orgs = {"i": f"oi{suffix}", "c": f"oc{suffix}"}
        executor = executor_for(db, lock_timeout=timedelta(seconds=5))
        names = sorted(COMMANDS)
        for n in range(len(SETUP) + 30):
            fixed: dict[str, Any] | None = None
            if n < len(SETUP):
                name, fixed = SETUP[n]
            else:
                name = rnd.choice(names)
            draws = rnd.getstate()
            answers = {}
            for side, org in orgs.items():
                rnd.setstate(draws)  # the same draws on both sides
                who = SamplePrincipal(f"p-{side}{suffix}", org=rnd.choice([org, org, org, "zz"]),
                                      admin=rnd.random() < 0.3)
                inputs = _sample_call(rnd, org, name, fixed)
                staged: list[Any] = []
                call = _staging(executor, name, who, inputs, staged, compiled=side == "c")
                try:
                    result: Any = await call
                except Exception as exc:
                    result = exc
                answers[side] = (_answer(result, org), _normal(staged, org))
            assert answers["i"] == answers["c"], (name, seed)
        states = []
        for side, org in orgs.items():
            tables = []
            for table in ("cmd_project", "cmd_task", "cmd_step"):
                rows = await db.pool.fetch(
                    f"SELECT * FROM {table} WHERE org = $1 ORDER BY id", org)
                tables.append([_normal({k: v for k, v in dict(r).items()
                                        if k not in ("execution_id", "started_at")}, org)
                               for r in rows])
            occupied = await db.pool.fetch(
                "SELECT entity, value, owner FROM service_engine.command_occupancy"
                " WHERE partition = $1 ORDER BY entity, value", canonical_json([org]))
            records = await db.pool.fetch(
                "SELECT command, key, outcome, sealed FROM service_engine.command_idempotency"
                " WHERE scope = $1 ORDER BY command, key", f"p-{side}{suffix}")
            states.append((tables, [_normal(tuple(r), org) for r in occupied],
                           [_normal((r["command"], r["key"], {
                               **r["outcome"], "data": _unsealed(r["outcome"]["data"],
                                                                 r["sealed"])},
                               sorted(r["sealed"])), org) for r in records]))
        assert states[0] == states[1], seed
    finally:
        await db.aclose()


SAMPLE_COMPILED = {name: compile_command(c, SAMPLE_TABLES) for name, c in COMMANDS.items()}


async def _staging(
    executor: MutationExecutor, name: str, principal: Any, inputs: Any, staged: list[Any],
    *, compiled: bool,
) -> Any:
    """Run ``name`` through the interpreter (`run_in`) or its compiled
    function, keeping the impacts it staged (noun, key, cause) in ``staged``."""
    async def handler(cx: Any) -> CommandOutcome:
        if compiled:
            outcome = await run_compiled(cx, SAMPLE_COMPILED[name], cx.principal, inputs,
                                         RETENTION)
        else:
            outcome = await interpret(cx, COMMANDS[name], inputs, principal=cx.principal,
                                      config=CommandConfig(idempotency_retention=RETENTION))
        staged.extend((i.noun, i.key, None if i.cause is None else (i.cause.name, i.cause.data))
                      for i in cx._impacts)
        return outcome

    try:
        return await executor.execute(principal, handler)
    except InvalidInput as exc:
        return MutationError(INVALID_INPUT, str(exc))


@pytest.mark.slow
def test_the_samples_compiled_commands_equal_the_interpreter(
    database: ProvisionedDatabase,
) -> None:
    """Every command of the sample (restrict and cascade deletes, a read
    proving a relationship, workflow transitions, row policies of creates,
    updates and deletes) compiles, and random calls of them on two
    partitions answer, stage the same impacts (noun, key, cause) and leave
    the same rows through the compiled functions as through the
    interpreter."""
    async def install() -> None:
        owner = await asyncpg.connect(database.owner_url)
        try:
            await owner.execute(PRELUDE)
            for c in SAMPLE_COMPILED.values():
                await owner.execute(c.ddl)
        finally:
            await owner.close()

    asyncio.run(install())

    @settings(max_examples=15, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.integers(0, 2**32 - 1))
    def check(seed: int) -> None:
        asyncio.run(_sample_example(database, seed))

    check()


class _CompiledRunner:
    """`CommandRunner.run`'s signature over the compiled functions."""

    def __init__(self, executor: MutationExecutor) -> None:
        self.executor = executor

    async def run(self, command: CheckedCommand, principal: Any, inputs: Any) -> Any:
        return await _compiled(self.executor, SAMPLE_COMPILED[command.name], principal, inputs)


async def _interleaved(url: str, steps: list[tuple[Any, ...]], sizes: list[int]) -> None:
    db = await connect_pool(url, max_size=8)
    try:
        org = f"o{secrets.token_hex(4)}"
        who = SamplePrincipal(f"p-{org}", org=org)
        runner = _CompiledRunner(executor_for(db))
        await runner.run(COMMANDS["CreateProject"], who, {
            "request_key": "project", "org": org, "project_id": f"{org}-p", "name": "P"})
        calls = [properties._call(org, step) for step in steps]
        outcomes: list[Any] = []
        at = 0
        for size in sizes * len(calls):
            if at >= len(calls):
                break
            batch = calls[at:at + size]
            at += size
            outcomes += await asyncio.gather(
                *(runner.run(COMMANDS[name], who, inputs) for name, inputs in batch)
            )
        assert all(isinstance(o, CommandOutcome) for o in outcomes), outcomes
        await properties._check(db, org, calls, outcomes)
    finally:
        await db.aclose()


def test_compiled_commands_keep_the_invariants_under_random_interleavings(
    database: ProvisionedDatabase,
) -> None:
    """Concurrent batches of compiled keyed commands and their retries keep
    what the interpreter keeps: one outcome and one set of sealed values per
    key, titles unique exactly (the occupancy rows' own conflicts serialise
    two claims of one value), revisions counting exactly the first runs."""
    async def install() -> None:
        owner = await asyncpg.connect(database.owner_url)
        try:
            await owner.execute(PRELUDE)
            for c in SAMPLE_COMPILED.values():
                await owner.execute(c.ddl)
        finally:
            await owner.close()

    asyncio.run(install())

    @settings(max_examples=20, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(properties.programs, properties.batches)
    def interleave(program: list[tuple[tuple[Any, ...], bool]], sizes: list[int]) -> None:
        steps: list[tuple[Any, ...]] = []
        for step, retry in program:
            steps.append(step)
            if retry:
                steps.append(step)
        asyncio.run(_interleaved(database.app_url, steps, sizes))

    interleave()
