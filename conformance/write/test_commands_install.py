"""The schema owner installs the declared commands' functions; a pod checks
them before it runs (real Postgres).

A command runs as one call of its generated function, which the app role
may execute but never create: the owner installs every registered command
when the service migrates, and an engine refuses to run (readiness DOWN,
the missing commands named) until each of its registered commands has its
function.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from datetime import timedelta

import asyncpg
import pytest

from service_engine import Database, Engine, ReadinessHandle
from service_engine.commands import (
    CheckedCommand,
    Command,
    CommandNotInstalled,
    CommandOutcome,
    CommandRunner,
    Input,
    Outcome,
    Read,
    Return,
    Var,
    install_commands,
    missing_commands,
)
from service_engine.commands.compile import compiled
from service_engine.embedded import EmbeddedPostgres, ProvisionedDatabase
from service_engine.errors import WorkerStopped

from ..serve.test_cli import cli, empty_database
from ..support.harness import fast_engine_config, wait_until
from ..support.sample_commands import ALICE, ALL_COMMANDS, CATALOG, ORG, executor_for, install


def _probe() -> CheckedCommand:
    """A command of a declaration no database holds yet (a fresh name)."""
    return CATALOG.command(Command(
        f"Probe{secrets.token_hex(4)}", ORG, Input("task_id", str),
        Read("Task", (Var("org"), Var("task_id")), as_="task", else_=Outcome("Missing")),
        Return("Found"),
    ))


async def test_an_engine_runs_only_once_its_commands_are_installed(
    db: Database, database: ProvisionedDatabase,
) -> None:
    """An engine whose registered command has no function refuses to run:
    `run` raises `CommandNotInstalled` naming the command and how to install
    it, and readiness holds the pod DOWN under ``commands_not_installed``;
    once the owner installed it, an engine runs and the command answers."""
    probe = _probe()
    readiness = ReadinessHandle()
    engine = await Engine.boot(fast_engine_config("sample", lock_timeout=timedelta(seconds=1)), db, None, readiness)
    engine.register_commands(probe)
    with pytest.raises(CommandNotInstalled) as refused:
        await asyncio.wait_for(engine.run(), 10)
    message = str(refused.value)
    assert probe.name in message and "migrate --commands" in message
    assert readiness.holds("commands_not_installed") and not readiness.is_up

    await install(database.owner_url, probe)
    readiness = ReadinessHandle()
    engine = await Engine.boot(fast_engine_config("sample", lock_timeout=timedelta(seconds=1)), db, None, readiness)
    engine.register_commands(probe)
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: readiness.is_up or task.done(), what="the engine UP")
        if task.done():
            task.result()
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)
    outcome = await CommandRunner(executor_for(db)).run(
        probe, ALICE, {"org": "acme", "task_id": "nope"})
    assert isinstance(outcome, CommandOutcome) and outcome.name == "Missing", outcome


async def test_a_command_without_its_function_names_it_when_it_runs(db: Database) -> None:
    """Run without its function (an engine that skipped the boot check), a
    command raises `CommandNotInstalled` naming it, and writes nothing."""
    probe = _probe()
    with pytest.raises(CommandNotInstalled, match=probe.name):
        await CommandRunner(executor_for(db)).run(
            probe, ALICE, {"org": "acme", "task_id": "t1"})


async def test_the_app_role_cannot_install_a_command(database: ProvisionedDatabase) -> None:
    """Only the schema owner creates the functions: the app role's install
    is refused by Postgres and leaves the function missing."""
    probe = _probe()
    app = await asyncpg.connect(database.app_url)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await install_commands(app, [probe])
        assert await missing_commands(app, [probe]) == [probe]
    finally:
        await app.close()


@pytest.mark.slow
async def test_migrate_installs_the_declared_commands(pg_server: EmbeddedPostgres) -> None:
    """``service-engine migrate --commands MODULE:ATTR`` installs every
    command's function as the owner, idempotently; a reference naming no
    commands is refused and installs nothing."""
    async with empty_database(pg_server) as database:
        code, answer = await cli("migrate", "--owner-url", database.owner_url,
                                 "--commands", "conformance.support.sample_commands:CATALOG")
        assert (code, answer["ok"], answer["error"]["code"]) == (1, False, "migration_refused")
        for _ in range(2):
            code, answer = await cli(
                "migrate", "--owner-url", database.owner_url, "--commands",
                "conformance.support.sample_commands:ALL_COMMANDS")
            assert code == 0, answer
            assert answer["commands"] == sorted(compiled(c).name for c in ALL_COMMANDS)
        owner = await asyncpg.connect(database.owner_url)
        try:
            assert await missing_commands(owner, ALL_COMMANDS) == []
        finally:
            await owner.close()
