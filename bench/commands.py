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

    python bench/commands.py --cpu [--calls 400] [--rounds 5]

measures CPU per call instead (fsync off: CPU, not the disk): the sample's
``CreateTask`` (a key, a read, a create with a unique title),
``RenameTask`` (a unique title) and ``StartTask`` (a key, a transition)
one after another on one connection, through `CommandRunner` (the compiled
function: BEGIN, the call, COMMIT) and through the interpreter
(`runner.interpret`, the oracle) in the same pipeline, alternating in
rounds: the service's CPU (this process), Postgres's (the postmaster and
every backend, from ``/proc``) and the wall time per call, with the load
average (CPU time is what other processes disturb least).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.support.sample_commands import (  # noqa: E402
    ALICE,
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
from service_engine.commands.runner import interpret  # noqa: E402
from service_engine.db import Database, connect_pool, service_migrations  # noqa: E402
from service_engine.embedded import EmbeddedPostgres, provision_database  # noqa: E402
from service_engine.pipeline import Mutation, MutationExecutor, Success  # noqa: E402

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


def cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid`` ran (user and system; 0 once it is gone): the
    scheduler's nanosecond count, not ``stat``'s clock ticks, which at
    100 Hz are as coarse as the differences measured."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += tree(int(child))
    return out


def postgres_cpu(postmaster: int) -> float:
    """CPU seconds of the postmaster and every process under it."""
    return sum(cpu_seconds(pid) for pid in tree(postmaster))


class Sides:
    """Runs one sample command through either side."""

    def __init__(self, executor: MutationExecutor) -> None:
        self.executor = executor
        self.runner = CommandRunner(executor)

    async def call(self, side: str, name: str, inputs: dict[str, Any]) -> None:
        command = COMMANDS[name]
        if side == "compiled":
            outcome: Any = await self.runner.run(command, ALICE, inputs)
        else:
            async def handler(cx: Any) -> CommandOutcome:
                return await interpret(cx, command, inputs, principal=cx.principal)

            outcome = await self.executor.execute(ALICE, handler)
        if not (isinstance(outcome, CommandOutcome) and outcome.ok):
            raise RuntimeError(f"{side} {name}: {outcome}")


async def measure_cpu(sides: Sides, postmaster: int, side: str, name: str,
                  calls: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(service CPU ms, Postgres CPU ms, wall ms) per call of ``name``."""
    cpu0, pg0, wall0 = time.process_time(), postgres_cpu(postmaster), time.perf_counter()
    for inputs in calls:
        await sides.call(side, name, inputs)
    cpu1, pg1, wall1 = time.process_time(), postgres_cpu(postmaster), time.perf_counter()
    n = len(calls)
    return (cpu1 - cpu0) * 1000 / n, (pg1 - pg0) * 1000 / n, (wall1 - wall0) * 1000 / n


async def main_cpu(calls: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-commands-cpu-") as tmp:
        data = Path(tmp)
        pg = EmbeddedPostgres(data, durable=False)
        await asyncio.to_thread(pg.start)
        try:
            provisioned = await provision_database(
                pg, "bench", extra_migrations=service_migrations(REPO / "conformance/migrations"),
                owner_setup=lambda conn: install_commands(conn, COMMANDS.values()),
            )
            postmaster = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
            db = await connect_pool(provisioned.app_url, min_size=1, max_size=1)
            try:
                sides = Sides(executor_for(db))
                await sides.call("compiled", "CreateProject", {
                    "request_key": "p", "org": "acme", "project_id": "p", "name": "P"})
                totals: dict[tuple[str, str], list[float]] = {}
                plan: dict[str, list[dict[str, Any]]]
                for r in range(rounds + 1):  # the first round warms up
                    for side in ("interpreted", "compiled"):
                        tag = f"{side[0]}{r}"
                        ids = [f"{tag}-t{i}" for i in range(calls)]
                        plan = {
                            "CreateTask": [{"request_key": f"c-{t}", "org": "acme",
                                            "task_id": t, "project_id": "p", "title": t}
                                           for t in ids],
                            "RenameTask": [{"org": "acme", "task_id": t, "title": f"{t}-b"}
                                           for t in ids],
                            "StartTask": [{"request_key": f"s-{t}", "org": "acme",
                                           "task_id": t, "expected_revision": 2} for t in ids],
                        }
                        for name, inputs in plan.items():
                            got = await measure_cpu(sides, postmaster, side, name, inputs)
                            if r:
                                cell = totals.setdefault((name, side), [0.0, 0.0, 0.0])
                                for i in range(3):
                                    cell[i] += got[i] / rounds
            finally:
                await db.aclose()
        finally:
            await asyncio.to_thread(pg.stop)
    print(f"per call, {calls} calls x {rounds} rounds per cell, one connection, fsync off; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'command':12}{'side':13}{'service ms':>12}{'postgres ms':>13}{'total ms':>10}"
          f"{'wall ms':>10}")
    for (name, side), (cpu, pgcpu, wall) in totals.items():
        print(f"{name:12}{side:13}{cpu:12.3f}{pgcpu:13.3f}{cpu + pgcpu:10.3f}{wall:10.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU per call, compiled against the interpreter")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.cpu:
        asyncio.run(main_cpu(args.calls, args.rounds))
    else:
        asyncio.run(main(args.seconds, [int(n) for n in args.clients.split(",")]))
