"""Property tests of the command layer over random interleavings (real Postgres).

Hypothesis draws a program of commands with idempotency keys (creates,
revision-checked starts, renames, and retries of earlier commands, some
with other inputs under the same key), runs it in concurrent batches, and
checks what must hold whatever the interleaving:

* every answer for one (command, key) and inputs is the same outcome with
  the same sealed values; other inputs under a used key are refused;
* one idempotency record per key used;
* titles are unique per org and the occupancy rows are exactly the titles held;
* a task's revision counts exactly the first runs that changed it, and it
  is running exactly when a first run of StartTask succeeded on it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_engine.commands import IDEMPOTENCY_CONFLICT, CommandOutcome, CommandRunner
from service_engine.db import connect_pool
from service_engine.embedded import ProvisionedDatabase

from ..support.sample_commands import COMMANDS, Principal, executor_for

TASKS, TITLES, KEYS = 3, 3, 4

op = st.one_of(
    st.tuples(st.just("create"), st.integers(0, TASKS - 1), st.integers(0, TITLES - 1),
              st.integers(0, KEYS - 1)),
    st.tuples(st.just("start"), st.integers(0, TASKS - 1), st.integers(1, 3),
              st.integers(0, KEYS - 1)),
    st.tuples(st.just("rename"), st.integers(0, TASKS - 1), st.integers(0, TITLES - 1),
              st.integers(0, KEYS - 1)),
)
programs = st.lists(st.tuples(op, st.booleans()), min_size=1, max_size=14)
batches = st.lists(st.integers(1, 5), min_size=1, max_size=14)


def _call(org: str, step: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
    kind, task, arg, key = step
    task_id = f"{org}-t{task}"
    if kind == "create":
        return "CreateTask", {"request_key": f"c{key}", "org": org, "task_id": task_id,
                              "project_id": f"{org}-p", "title": f"title-{arg}"}
    if kind == "start":
        return "StartTask", {"request_key": f"s{key}", "org": org, "task_id": task_id,
                             "expected_revision": arg}
    return "RenameTask", {"org": org, "task_id": task_id, "title": f"title-{arg}"}


async def _program(url: str, steps: list[tuple[Any, ...]], sizes: list[int]) -> None:
    db = await connect_pool(url, max_size=8)
    try:
        org = f"o{secrets.token_hex(4)}"
        who = Principal(f"p-{org}", org=org)
        runner = CommandRunner(executor_for(db))
        await runner.run(COMMANDS["CreateProject"], who, {
            "request_key": "project", "org": org, "project_id": f"{org}-p", "name": "P"})
        calls = [_call(org, step) for step in steps]
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
        await _check(db, org, calls, outcomes)
    finally:
        await db.aclose()


async def _check(
    db: Any, org: str, calls: list[tuple[str, dict[str, Any]]], outcomes: list[CommandOutcome]
) -> None:
    by_key: dict[tuple[str, str], dict[str, list[CommandOutcome]]] = defaultdict(
        lambda: defaultdict(list)
    )
    changes: dict[str, int] = defaultdict(int)
    started: set[str] = set()
    for (name, inputs), outcome in zip(calls, outcomes, strict=True):
        if "request_key" in inputs:
            digest = repr(sorted((k, v) for k, v in inputs.items() if k != "request_key"))
            by_key[(name, inputs["request_key"])][digest].append(outcome)
        if outcome.ok and not outcome.replayed and name != "CreateTask":
            changes[inputs["task_id"]] += 1
            if name == "StartTask":
                started.add(inputs["task_id"])
    for groups in by_key.values():
        answered = {d: [o for o in os if o.name != IDEMPOTENCY_CONFLICT]
                    for d, os in groups.items()}
        # One input set owns the key; the others were refused, or ran before
        # nothing (never both).
        owners = [d for d, os in answered.items() if os]
        assert len(owners) == 1, groups
        first, *rest = answered[owners[0]]
        assert all(o == first and o.sealed == first.sealed for o in rest)
        assert sum(not o.replayed for o in answered[owners[0]]) == 1
    records = await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.command_idempotency WHERE scope = $1", f"p-{org}"
    )
    assert records == len(by_key) + 1  # and the project's
    rows = await db.pool.fetch("SELECT * FROM cmd_task WHERE org = $1", org)
    titles = [r["title"] for r in rows]
    assert len(titles) == len(set(titles))
    held = await db.pool.fetch(
        "SELECT value FROM service_engine.command_occupancy WHERE entity = 'Task'"
        " AND partition = $1", f'["{org}"]'
    )
    assert sorted(r["value"] for r in held) == sorted(f'["{t}"]' for t in titles)
    for row in rows:
        assert row["version"] == 1 + changes[row["id"]], (row, changes)
        assert (row["state"] == "running") == (row["id"] in started)


def test_random_interleavings_of_keyed_commands_keep_the_invariants(
    database: ProvisionedDatabase,
) -> None:
    """Whatever the interleaving of keyed commands and their retries, every
    key answers one outcome with one set of sealed values, uniqueness holds
    exactly, and revisions count exactly the first runs that changed a task."""

    @settings(max_examples=20, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(programs, batches)
    def interleave(program: list[tuple[tuple[Any, ...], bool]], sizes: list[int]) -> None:
        steps: list[tuple[Any, ...]] = []
        for step, retry in program:
            steps.append(step)
            if retry:
                steps.append(step)  # the same call again: a lost response retried
        asyncio.run(_program(database.app_url, steps, sizes))

    interleave()
