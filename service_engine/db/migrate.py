"""Ordered SQL migrations, recorded in ``service_engine.schema_migrations``.

The engine owns the reserved range ``1..ENGINE_RESERVED_MAX``; a service
numbers its own migrations above it. Files are named ``NNNN_name.sql``.
Migrations run as the schema owner (an operator's role), never as the app
role the engine serves under.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

from ..failures import MigrationAltered, MigrationError
from .locks import named_lock_key
from .types import Conn

ENGINE_RESERVED_MAX = 999
"""Engine migrations are numbered 1..999; a service's start at 1000."""

_FILE = re.compile(r"^(?P<version>\d+)_(?P<name>[A-Za-z0-9_]+)\.sql$")
_LOCK = named_lock_key("service_engine.migrate", "schema")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    source: str | None = None
    """The file it was read from (None for a migration built in code)."""

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(directory: Path) -> list[Migration]:
    """Read ``NNNN_name.sql`` files from ``directory`` in version order."""
    found: list[Migration] = []
    for path in sorted(directory.iterdir()):
        match = _FILE.match(path.name)
        if match is None:
            continue
        found.append(
            Migration(int(match["version"]), match["name"], path.read_text(), str(path))
        )
    _check_unique(found)
    return sorted(found, key=lambda m: m.version)


def engine_migrations() -> list[Migration]:
    """The engine's own migrations (shipped inside the package when installed)."""
    packaged = resources.files("service_engine") / "migrations"
    if packaged.is_dir():
        directory = Path(str(packaged))
    else:  # an editable checkout: the repository's top-level migrations/
        directory = Path(__file__).resolve().parents[2] / "migrations"
    migrations = load_migrations(directory)
    if not migrations:
        raise MigrationError(f"no engine migrations found in {directory}")
    for m in migrations:
        if m.version > ENGINE_RESERVED_MAX:
            raise MigrationError(f"engine migration {m.version} outside the reserved range")
    return migrations


def service_migrations(directory: Path) -> list[Migration]:
    """A service's migrations; each must be numbered above the reserved range."""
    migrations = load_migrations(directory)
    for m in migrations:
        if m.version <= ENGINE_RESERVED_MAX:
            raise MigrationError(
                f"service migration {m.version}_{m.name} is in the engine's reserved "
                f"range 1..{ENGINE_RESERVED_MAX}; number it above {ENGINE_RESERVED_MAX}"
            )
    return migrations


async def migrate(
    conn: Conn,
    migrations: Iterable[Migration],
    *,
    ignore_missing: bool = True,
) -> list[int]:
    """Apply the migrations not yet recorded, each in its own transaction.

    ``ignore_missing``: a database that already records migrations this code
    does not know (a newer build ran) still migrates and boots. An applied
    migration whose text changed is refused. Returns the versions applied.
    """
    wanted = sorted(migrations, key=lambda m: m.version)
    _check_unique(wanted)
    async with conn.transaction():
        # Concurrent migrators (two pods starting) serialise here.
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK)
        await conn.execute("CREATE SCHEMA IF NOT EXISTS service_engine")
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS service_engine.schema_migrations (
                   version    bigint PRIMARY KEY,
                   name       text        NOT NULL,
                   checksum   text        NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
    applied: list[int] = []
    for migration in wanted:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK)
            row = await conn.fetchrow(
                "SELECT checksum FROM service_engine.schema_migrations WHERE version = $1",
                migration.version,
            )
            if row is not None:
                if row["checksum"] != migration.checksum:
                    raise MigrationAltered(
                        migration.version, migration.name, migration.source,
                        row["checksum"], migration.checksum,
                    )
                continue
            try:
                await conn.execute(migration.sql)
            except asyncpg.PostgresError as exc:
                raise MigrationError(
                    f"migration {migration.version}_{migration.name} failed: {exc}"
                ) from exc
            await conn.execute(
                "INSERT INTO service_engine.schema_migrations (version, name, checksum)"
                " VALUES ($1, $2, $3)",
                migration.version, migration.name, migration.checksum,
            )
            applied.append(migration.version)
    if not ignore_missing:
        known = {m.version for m in wanted}
        recorded = await conn.fetch("SELECT version FROM service_engine.schema_migrations")
        unknown = sorted(r["version"] for r in recorded if r["version"] not in known)
        if unknown:
            raise MigrationError(f"database records migrations this code lacks: {unknown}")
    return applied


async def grant_engine_access(conn: Conn, app_role: str) -> None:
    """Grant the app role what the engine needs on its schema, nothing more.

    Run as the schema owner after migrating. Includes USAGE, SELECT on the
    engine schema's sequences; the app role gets no DDL rights.
    """
    role = _quote_ident(app_role)
    await conn.execute(f"GRANT USAGE ON SCHEMA service_engine TO {role}")
    await conn.execute(
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA service_engine TO {role}"
    )
    await conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA service_engine TO {role}")
    # The migration history is the owner's business.
    await conn.execute(
        f"REVOKE INSERT, UPDATE, DELETE ON service_engine.schema_migrations FROM {role}"
    )


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _check_unique(migrations: Sequence[Migration]) -> None:
    seen: set[int] = set()
    for m in migrations:
        if m.version in seen:
            raise MigrationError(f"two migrations share version {m.version}")
        seen.add(m.version)
