"""CPU per declared command: its compiled function against the interpreter.

    python bench/commands_cpu.py [--calls 400] [--rounds 5]

Starts an embedded Postgres (fsync off: CPU, not the disk), provisions the
command sample (`conformance/support/sample_commands.py`) with its
functions installed, and runs the sample's ``CreateTask`` (an idempotency
key, a read, a create with a unique title), ``RenameTask`` (a mutate with
a unique title) and ``StartTask`` (a key, a revision-checked transition)
one after another on one connection, through `CommandRunner` (the compiled
function: BEGIN, the call, COMMIT) and through the interpreter
(`runner.interpret`, the oracle) inside the same pipeline, alternating in
rounds. Per command it prints the service's CPU (this process) and
Postgres's (every backend and the postmaster, from ``/proc``) per call,
and the wall time per call. CPU time is what the load of other processes
on the machine disturbs least; the load average is printed with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.support.sample_commands import ALICE, COMMANDS, executor_for  # noqa: E402
from service_engine.commands import CommandOutcome, CommandRunner, install_commands  # noqa: E402
from service_engine.commands.runner import interpret  # noqa: E402
from service_engine.db import connect_pool, service_migrations  # noqa: E402
from service_engine.embedded import EmbeddedPostgres, provision_database  # noqa: E402
from service_engine.pipeline import MutationExecutor  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


async def measure(sides: Sides, postmaster: int, side: str, name: str,
                  calls: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(service CPU ms, Postgres CPU ms, wall ms) per call of ``name``."""
    cpu0, pg0, wall0 = time.process_time(), postgres_cpu(postmaster), time.perf_counter()
    for inputs in calls:
        await sides.call(side, name, inputs)
    cpu1, pg1, wall1 = time.process_time(), postgres_cpu(postmaster), time.perf_counter()
    n = len(calls)
    return (cpu1 - cpu0) * 1000 / n, (pg1 - pg0) * 1000 / n, (wall1 - wall0) * 1000 / n


async def main(calls: int, rounds: int) -> None:
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
                            got = await measure(sides, postmaster, side, name, inputs)
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
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
