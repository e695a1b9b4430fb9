"""The operator CLI, ``python -m service_engine``, run as a subprocess against
real Postgres, a real pod and a real nats-server: each command's ``--json``
answer and its scriptable exit code."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest

from service_engine import Database, connect_pool
from service_engine.cli import ExitCode
from service_engine.db import engine_migrations, service_migrations
from service_engine.embedded import (
    APP_ROLE,
    OWNER_ROLE,
    EmbeddedNats,
    EmbeddedPostgres,
    ProvisionedDatabase,
    Roles,
    drop_database,
    free_port,
)
from service_engine.graphql import graphql_app
from service_engine.integration import DeadLetter, DeadLetters, DeadLetterSource

from ..conftest import SAMPLE_MIGRATIONS
from .test_graphql_app import SCHEMA, resolve_me, running_engine, serving

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

CLI_TIMEOUT = 60.0


async def cli(*args: str, **env: str) -> tuple[int, dict[str, Any]]:
    """Run ``python -m service_engine <args> --json``; (exit code, its JSON)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("SERVICE_ENGINE_") and k not in ("DATABASE_URL", "NATS_URL",
                                                                  "OWNER_DATABASE_URL")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service_engine", *args, "--json",
        env={**base, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT)
    assert process.returncode is not None
    try:
        answer: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(f"not one JSON object: {out!r} (stderr {err.decode()!r})") from None
    return process.returncode, answer


@contextlib.asynccontextmanager
async def empty_database(pg: EmbeddedPostgres) -> AsyncIterator[ProvisionedDatabase]:
    """A database owned by the owner role with nothing migrated."""
    name = f"t_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(pg.admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" OWNER "{OWNER_ROLE}"')
        await admin.execute(f'REVOKE ALL ON DATABASE "{name}" FROM PUBLIC')
        await admin.execute(f'GRANT CONNECT ON DATABASE "{name}" TO "{APP_ROLE}"')
    finally:
        await admin.close()
    roles = Roles()
    try:
        yield ProvisionedDatabase(
            name, pg.url(roles.app, roles.app_password, name),
            pg.url(roles.owner, roles.owner_password, name),
        )
    finally:
        await drop_database(pg, name)


async def test_migrate_runs_as_the_owner_and_is_idempotent(pg_server: EmbeddedPostgres) -> None:
    """migrate applies the engine's and the service's migrations as the owner
    and grants the app role; a second run applies nothing; the app role is
    refused (exit 1, not_owner) and changes nothing."""
    wanted = [m.version for m in [*engine_migrations(), *service_migrations(SAMPLE_MIGRATIONS)]]
    async with empty_database(pg_server) as database:
        code, answer = await cli("migrate", "--owner-url", database.app_url,
                                 "--service-migrations", str(SAMPLE_MIGRATIONS))
        assert (code, answer["ok"], answer["error"]["code"]) == (ExitCode.NO, False, "not_owner")
        assert answer["role"] == APP_ROLE

        code, answer = await cli("migrate", "--service-migrations", str(SAMPLE_MIGRATIONS),
                                 "--grant", APP_ROLE, OWNER_DATABASE_URL=database.owner_url)
        assert code == ExitCode.OK, answer
        assert answer["role"] == OWNER_ROLE and answer["applied"] == wanted
        assert answer["granted"] == APP_ROLE

        code, answer = await cli("migrate", "--owner-url", database.owner_url,
                                 "--service-migrations", str(SAMPLE_MIGRATIONS))
        assert (code, answer["applied"], answer["known"]) == (ExitCode.OK, [], wanted)

        # The app role was granted what the engine needs, nothing more.
        app = await asyncpg.connect(database.app_url)
        try:
            assert await app.fetchval("SELECT count(*) FROM service_engine.dead_letter") == 0
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await app.execute("DELETE FROM service_engine.schema_migrations")
        finally:
            await app.close()


async def test_migrate_refuses_a_service_migration_in_the_reserved_range(
    pg_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    """migrate refuses a service migration numbered in the engine's reserved range, with a
    typed error and a non-zero exit."""
    (tmp_path / "0005_mine.sql").write_text("SELECT 1;")
    async with empty_database(pg_server) as database:
        code, answer = await cli("migrate", "--owner-url", database.owner_url,
                                 "--service-migrations", str(tmp_path))
        assert (code, answer["error"]["code"]) == (ExitCode.NO, "migration_refused")
        assert "reserved range" in answer["error"]["message"]


async def test_an_unreachable_database_exits_4() -> None:
    """An unreachable database exits UNAVAILABLE (database_unreachable); a database URL the
    engine refuses exits NO (database_url_refused)."""
    url = f"postgresql://nobody:x@127.0.0.1:{free_port()}/none"
    code, answer = await cli("outbox", "status", DATABASE_URL=url)
    assert (code, answer["error"]["code"]) == (ExitCode.UNAVAILABLE, "database_unreachable")
    code, answer = await cli("outbox", "status",
                             DATABASE_URL="postgresql://u:p@db.example.com/x")
    assert (code, answer["error"]["code"]) == (ExitCode.NO, "database_url_refused")


async def test_check_config_names_every_problem_without_booting(tmp_path: Path) -> None:
    """A valid file answers every bound; an invalid one lists each violated
    relation, each misspelt variable and the database URL's TLS rule."""
    good = tmp_path / "good.env"
    good.write_text("# pod settings\nSERVICE_ENGINE_ACK_WAIT=45\nexport SERVICE_ENGINE_SERVICE='orders'\n"
                    "SERVICE_ENGINE_WS_MAX_SOCKETS=500\n")
    code, answer = await cli("check-config", "--env-file", str(good))
    assert code == ExitCode.OK, answer
    assert answer["config"]["ack_wait"] == 45.0 and answer["config"]["service"] == "orders"
    assert answer["config"]["ws_max_sockets"] == 500 and answer["problems"] == []

    bad = tmp_path / "bad.env"
    bad.write_text("SERVICE_ENGINE_LOCK_TIMEOUT=40\nSERVICE_ENGINE_LEASE=0.5\n"
                   "SERVICE_ENGINE_ACK_WIAT=30\nDATABASE_URL=postgresql://u:p@db.example.com/x\n")
    code, answer = await cli("check-config", "--env-file", str(bad))
    assert (code, answer["ok"]) == (ExitCode.NO, False)
    problems = answer["problems"]
    assert "SERVICE_ENGINE_ACK_WIAT: no EngineConfig field reads this variable" in problems
    assert "violated: lock_timeout < ack_wait" in problems
    assert "violated: lease > beat_interval" in problems
    assert any(p.startswith("DATABASE_URL: ") and "sslmode" in p for p in problems)

    # From the environment, the same check.
    code, answer = await cli("check-config", SERVICE_ENGINE_WINDOW_CAPACITY="0")
    assert (code, answer["problems"]) == (ExitCode.NO, ["violated: window_capacity > 0"])


async def test_ready_reads_a_running_pod(db: Database) -> None:
    """ready exits 0 while the pod is UP, 1 with its reasons while DOWN, 4
    when nothing answers."""
    async with running_engine(db) as engine, serving(graphql_app(engine, SCHEMA, resolve_me)) as addr:
        code, answer = await cli("ready", "--url", f"http://{addr}/readyz")
        assert (code, answer["status"], answer["reasons"]) == (ExitCode.OK, "UP", [])
        engine.readiness.set_down("test", "held down by the test")
        code, answer = await cli("ready", SERVICE_ENGINE_HTTP_ADDR=addr)
        assert (code, answer["status"]) == (ExitCode.NO, "DOWN")
        assert {"reason": "test", "detail": "held down by the test"} in answer["reasons"]
    code, answer = await cli("ready", "--url", f"http://127.0.0.1:{free_port()}/readyz",
                             "--timeout", "2")
    assert (code, answer["error"]["code"]) == (ExitCode.UNAVAILABLE, "pod_unreachable")


def _poison(subject: str, body: bytes) -> DeadLetter:
    return DeadLetter.for_message(
        uuid.uuid4(), DeadLetterSource.REACTION, "orders.on_payment", reason="poison",
        detail="ValueError: not an order", subject=subject, payload=body,
        headers={"Br-Producer": "payments"}, message_id=uuid.uuid4(), attempts=5,
    )


async def test_dead_letters_list_by_source_show_and_discard(database: ProvisionedDatabase) -> None:
    """dead-letters list (optionally by source), show and discard operate on the stored dead
    letters and say which are retryable."""
    db = await connect_pool(database.app_url)
    try:
        letters = DeadLetters(db)
        poison = _poison("integration.evt.payments.settled", b'{"order": 7}')
        stuck = DeadLetter.for_work(DeadLetterSource.CRON, "nightly", reason="budget spent",
                                    key="2026-12-01")
        for letter in (poison, stuck):
            await letters.record_work(letter)
    finally:
        await db.aclose()
    env = {"DATABASE_URL": database.app_url}

    code, answer = await cli("dead-letters", "list", **env)
    assert code == ExitCode.OK
    assert {(d["id"], d["source"], d["retryable"]) for d in answer["dead_letters"]} == {
        (str(poison.id), "Reaction", True), (str(stuck.id), "Cron", False)}
    code, answer = await cli("dead-letters", "list", "--source", "cron", **env)
    assert [d["id"] for d in answer["dead_letters"]] == [str(stuck.id)]

    code, answer = await cli("dead-letters", "show", str(poison.id), **env)
    assert code == ExitCode.OK
    shown = answer["dead_letter"]
    assert shown["payload"] == {"text": '{"order": 7}'}
    assert shown["detail"] == "ValueError: not an order"
    assert shown["headers"] == {"Br-Producer": "payments"} and shown["attempts"] == 5

    missing = str(uuid.uuid4())
    code, answer = await cli("dead-letters", "show", missing, **env)
    assert (code, answer["error"]["code"]) == (ExitCode.NOT_FOUND, "dead_letter_not_found")
    code, answer = await cli("dead-letters", "show", "not-a-uuid", **env)
    assert code == ExitCode.USAGE

    code, answer = await cli("dead-letters", "discard", str(stuck.id), **env)
    assert (code, answer["deleted"]) == (ExitCode.OK, True)
    code, answer = await cli("dead-letters", "discard", str(stuck.id), **env)
    assert code == ExitCode.NOT_FOUND
    code, answer = await cli("dead-letters", "list", **env)
    assert [d["id"] for d in answer["dead_letters"]] == [str(poison.id)]


async def test_dead_letters_retry_republishes_and_deletes_once_acked(
    database: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """retry republishes the dead message under its original logical id; the
    row goes only once JetStream acknowledged it. Work that is not a message
    is refused (exit 1); an unreachable broker exits 4 and keeps the row."""
    subject = f"integration.evt.payments.{secrets.token_hex(4)}"
    poison = _poison(subject, b'{"order": 8}')
    stuck = DeadLetter.for_work(DeadLetterSource.MIRROR, "catalog", reason="stuck")
    db = await connect_pool(database.app_url)
    try:
        for letter in (poison, stuck):
            await DeadLetters(db).record_work(letter)
        env = {"DATABASE_URL": database.app_url}

        code, answer = await cli("dead-letters", "retry", str(poison.id), "--connect-timeout", "2",
                                 NATS_URL=f"nats://127.0.0.1:{free_port()}", **env)
        assert (code, answer["error"]["code"]) == (ExitCode.UNAVAILABLE, "nats_unreachable")
        assert await DeadLetters(db).get(poison.id) is not None

        code, answer = await cli("dead-letters", "retry", str(stuck.id),
                                 NATS_URL=nats_server.url, **env)
        assert (code, answer["error"]["code"]) == (ExitCode.NO, "not_retryable")

        code, answer = await cli("dead-letters", "retry", str(poison.id),
                                 NATS_URL=nats_server.url, **env)
        assert (code, answer["outcome"], answer["deleted"]) == (ExitCode.OK, "Acked", True), answer
        assert await DeadLetters(db).get(poison.id) is None
    finally:
        await db.aclose()
    client = await nats.connect(nats_server.url)
    try:
        stored = await client.jetstream().get_last_msg("INTEGRATION_EVT", subject)
        assert stored.data == b'{"order": 8}'
        assert stored.headers is not None
        assert stored.headers["Br-Message-Id"] == str(poison.message_id)
    finally:
        await client.close()


async def test_outbox_status_counts_the_backlog_and_its_oldest_age(
    database: ProvisionedDatabase, db: Database
) -> None:
    """outbox status counts pending, failed and published rows and reports the oldest
    pending row's age."""
    async with db.pool.acquire() as conn:
        for status, age in (("PENDING", 120), ("PENDING", 5), ("FAILED", 30), ("PUBLISHED", 60)):
            await conn.execute(
                """INSERT INTO service_engine.integration_outbox
                       (message_id, subject, payload, status, created_at)
                   VALUES ($1, 'integration.evt.x', '{}'::jsonb, $2, now() - make_interval(secs => $3))""",
                uuid.uuid4(), status, float(age),
            )
    code, answer = await cli("outbox", "status", DATABASE_URL=database.app_url)
    assert code == ExitCode.OK
    assert (answer["pending"], answer["failed"], answer["published"]) == (2, 1, 1)
    assert 120 <= answer["oldest_pending_age_seconds"] < 180
