"""Declared commands against the plain write pipeline, in one run.

    python bench/commands.py [--seconds 3] [--clients 1,8]

Starts a durable embedded Postgres (fsync on), provisions the engine and the
command sample's tables (`conformance/support/sample_commands.py`), creates 100
tasks per client, and measures commands/s on distinct keys, 1 and 8
concurrent clients, for:

* ``pipeline``: a hand-written handler through `MutationExecutor.ack` doing
  the same update (advisory lock, the store's FOR UPDATE, load, write with
  the revision bumped, one impact, commit);
* ``command``: the declared ``LockTask`` (the same update, plus the row
  policy on the current and proposed row);
* ``command+key``: the same with an idempotency key (a fresh key per call:
  one record looked up under its lock, one written with the effect);
* ``unique rename``: the declared ``RenameTask`` onto a fresh title (the
  occupancy row of the old title released and the new one claimed, each
  under its lock), against a hand-written rename through the pipeline with
  no uniqueness (``pipeline rename``).

The sides alternate in short slices so disk and scheduler drift hit all of
them alike; the ratio column is each against its pipeline baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.support.sample_commands import (  # noqa: E402
    CATALOG,
    COMMANDS,
    ROOT,
    Task,
    executor_for,
)
from service_engine.commands import (  # noqa: E402
    Command,
    CommandOutcome,
    CommandRunner,
    IdempotencyKey,
    Input,
    Mutate,
    Outcome,
    Return,
    Set,
    Var,
    install_commands,
)
from service_engine.db import Database, connect_pool, service_migrations  # noqa: E402
from service_engine.embedded import EmbeddedPostgres, provision_database  # noqa: E402
from service_engine.pipeline import Mutation, Success  # noqa: E402

TASKS_PER_CLIENT = 100
ADMIN = ROOT
SLICES = 6
Op = Callable[[str], Awaitable[None]]

LOCK_KEYED = CATALOG.command(Command(
    "LockTaskKeyed",
    Input("request_key", str), Input("org", str), Input("task_id", str), Input("locked", bool),
    IdempotencyKey("request_key"),
    Mutate("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing")),
    Set("task", "locked", Var("locked"), overwrite=True),
    Return("Locked"),
))
_counter = itertools.count()


async def _lock(cx: Mutation[Any], task_id: str, locked: bool) -> None:
    task = await cx.load(Task, ["acme", task_id])
    task.locked = locked
    task.version += 1
    await cx.save(task)
    cx.impact("cmd_task", ["acme", task_id])


async def _rename(cx: Mutation[Any], task_id: str, title: str) -> None:
    task = await cx.load(Task, ["acme", task_id])
    task.title = title
    task.version += 1
    await cx.save(task)
    cx.impact("cmd_task", ["acme", task_id])


def ops(db: Database) -> dict[str, Op]:
    executor = executor_for(db)
    runner = CommandRunner(executor)

    def expect(outcome: object) -> None:
        if not (outcome == Success() or (isinstance(outcome, CommandOutcome) and outcome.ok)):
            raise RuntimeError(f"command failed: {outcome}")

    async def pipeline(key: str) -> None:
        expect(await executor.ack(ADMIN, _lock, key, next(_counter) % 2 == 0))

    async def command(key: str) -> None:
        expect(await runner.run(COMMANDS["LockTask"], ADMIN, {
            "org": "acme", "task_id": key, "locked": next(_counter) % 2 == 0}))

    async def keyed(key: str) -> None:
        n = next(_counter)
        expect(await runner.run(LOCK_KEYED, ADMIN, {
            "request_key": f"k{n}", "org": "acme", "task_id": key, "locked": n % 2 == 0}))

    async def pipeline_rename(key: str) -> None:
        expect(await executor.ack(ADMIN, _rename, key, f"{key}-{next(_counter)}"))

    async def unique_rename(key: str) -> None:
        expect(await runner.run(COMMANDS["RenameTask"], ADMIN, {
            "org": "acme", "task_id": key, "title": f"{key}-{next(_counter)}"}))

    return {"pipeline": pipeline, "command": command, "command+key": keyed,
            "pipeline rename": pipeline_rename, "unique rename": unique_rename}


async def run_for(op: Op, keys: list[list[str]], seconds: float) -> tuple[int, float]:
    stop = time.perf_counter() + seconds
    done = 0

    async def client(mine: list[str]) -> None:
        nonlocal done
        for key in itertools.cycle(mine):
            if time.perf_counter() >= stop:
                return
            await op(key)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in keys))
    return done, time.perf_counter() - started


async def measure(table: dict[str, Op], keys: list[list[str]], seconds: float) -> dict[str, float]:
    totals = {name: [0, 0.0] for name in table}
    for op in table.values():
        await run_for(op, keys, 0.3)  # warm up (prepared statements, caches)
    for _ in range(SLICES):
        for name, op in table.items():
            done, took = await run_for(op, keys, seconds / SLICES)
            totals[name][0] += done
            totals[name][1] += took
    return {name: done / took for name, (done, took) in totals.items()}


async def main(seconds: float, clients: list[int]) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-commands-") as tmp:
        pg = EmbeddedPostgres(Path(tmp), durable=True)
        await asyncio.to_thread(pg.start)
        try:
            provisioned = await provision_database(
                pg, "bench", extra_migrations=service_migrations(REPO / "conformance/migrations"),
                owner_setup=lambda conn: install_commands(conn, [*COMMANDS.values(), LOCK_KEYED]),
            )
            db = await connect_pool(provisioned.app_url, min_size=10, max_size=10)
            try:
                runner = CommandRunner(executor_for(db))
                await runner.run(COMMANDS["CreateProject"], ADMIN, {
                    "request_key": "p", "org": "acme", "project_id": "p", "name": "P"})
                keys = [[f"c{c}-t{i}" for i in range(TASKS_PER_CLIENT)]
                        for c in range(max(clients))]
                for task_id in itertools.chain.from_iterable(keys):
                    outcome = await runner.run(COMMANDS["CreateTask"], ADMIN, {
                        "request_key": task_id, "org": "acme", "task_id": task_id,
                        "project_id": "p", "title": task_id})
                    assert isinstance(outcome, CommandOutcome) and outcome.ok, outcome
                table = ops(db)
                print(f"commands/s ({seconds:g}s per cell, durable Postgres, distinct keys)")
                print(f"{'':18}" + "".join(f"{f'{n} client(s)':>22}" for n in clients))
                rates = {n: await measure(table, keys[:n], seconds) for n in clients}
                baseline = {"pipeline": "pipeline", "command": "pipeline",
                            "command+key": "pipeline", "pipeline rename": "pipeline rename",
                            "unique rename": "pipeline rename"}
                for name in table:
                    cells = []
                    for n in clients:
                        rate = rates[n][name]
                        ratio = rate / rates[n][baseline[name]]
                        cells.append(f"{rate:10.0f} ({ratio:5.2f}x)")
                    print(f"{name:18}" + "".join(f"{c:>22}" for c in cells))
            finally:
                await db.aclose()
        finally:
            await asyncio.to_thread(pg.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,8")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, [int(n) for n in args.clients.split(",")]))
