"""Install the registered commands' functions (the schema owner) and check
them at boot (the app role).

A command runs as one call of its generated function (`compile`), which
the app role may execute but never create: the schema owner installs them
when the service migrates (`install_commands`: ``service-engine migrate
--commands``, `provision_database(commands=...)`), and a pod checks at
boot that every command it registered has its function
(`assert_commands_installed`), so a missing one fails boot with the
command's name instead of failing its first call. A function is named by
the command and a digest of its text: installing a changed declaration
adds a new function beside the one running pods call.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..db.locks import named_lock_key
from ..db.types import Conn
from .checked import CheckedCommand
from .compile import compiled
from .errors import CommandNotInstalled
from .sql_expr import PRELUDE, SCHEMA

__all__ = ["assert_commands_installed", "install_commands", "missing_commands"]

_LOCK = named_lock_key("service_engine.commands", "install")


async def install_commands(conn: Conn, commands: Iterable[CheckedCommand]) -> list[str]:
    """Create the helper functions and every command's function on the
    schema owner's connection ``conn`` (idempotent: ``CREATE OR REPLACE``
    of functions named by their digest), in one transaction under one
    advisory lock; the functions' names."""
    functions = {compiled(c).name: compiled(c) for c in commands}
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK)
        # A function's body is resolved at its first call, not here: its
        # variables of a table's row type do not need the table yet (a
        # service's tables may be migrated after its commands are installed).
        await conn.execute("SET LOCAL check_function_bodies = off")
        await conn.execute(PRELUDE)
        for function in functions.values():
            await conn.execute(function.ddl)
    return sorted(functions)


async def missing_commands(conn: Conn, commands: Iterable[CheckedCommand]) -> list[CheckedCommand]:
    """The commands of ``commands`` whose function is not installed."""
    wanted = {compiled(c).name: c for c in commands}
    rows = await conn.fetch(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = $1 AND p.proname = ANY($2::text[])", SCHEMA, list(wanted),
    )
    present = {str(r["proname"]) for r in rows}
    return [c for name, c in sorted(wanted.items()) if name not in present]


async def assert_commands_installed(conn: Conn, commands: Iterable[CheckedCommand]) -> None:
    """Raise `CommandNotInstalled` naming every command of ``commands``
    whose function is missing, and how to install them."""
    missing = await missing_commands(conn, commands)
    if missing:
        names = ", ".join(f"{c.name} ({compiled(c).name})" for c in missing)
        raise CommandNotInstalled(
            f"commands without their database function: {names}; the schema owner installs "
            "the registered commands' functions when the service migrates (`service-engine "
            "migrate --commands MODULE:ATTR`, or `install_commands` on the owner's "
            "connection), then the pod boots"
        )
