"""What the reference service's boot reads of its environment
(``EXAMPLE_SERVICE_*``, ``DATABASE_URL`` and ``NATS_URL``) and its
development infrastructure: embedded Postgres and NATS under a data
folder, provisioned as an operator provisions the real ones (roles, the
engine's and the service's migrations, the integration streams, the
published-language buckets, the reply slice's lanes) with a development
roster as the twin would publish it. Never in production: there
the operator applied the migrations and declared the streams and buckets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from service_engine import service_migrations

from .kernel import ConfigurationError

if TYPE_CHECKING:
    from service_engine.embedded import EmbeddedInfra

SERVICE = "example"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
BUCKETS = ("PUBLISHED_example", "PUBLISHED_twin")
"""The gitops-declared key-value buckets: the service's published languages
and the twin's (which the service mirrors)."""
DEV_ROSTER = Path(__file__).resolve().parent / "dev_roster.json"
"""The roster seeded on embedded infrastructure, where no twin publishes one."""

PASSPORT = {"sub": "alice", "org": "acme", "roles": ["board:archive"]}
"""Printed at start-up for GraphiQL's Headers tab (the README shows it too)."""

_log = logging.getLogger("example_service")


def env(name: str, default: str = "") -> str:
    return os.environ.get(f"EXAMPLE_SERVICE_{name}", "").strip() or default


def flag(name: str, default: bool) -> bool:
    return env(name).lower() in {"1", "true", "yes", "on"} if env(name) else default


def data_dir() -> Path:
    return Path(env("DATA", ".data")).resolve()


def announce(sock: socket.socket, passport_in_params: bool, pods: int = 1) -> None:
    host, port = sock.getsockname()[:2]
    addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    header = json.dumps({"X-Passport": json.dumps(PASSPORT, separators=(",", ":"))})
    print(f"listening on http://{addr}" + (f" ({pods} pods)" if pods > 1 else ""),
          f"GraphiQL:  http://{addr}/graphql   (readiness: http://{addr}/readyz)",
          f"In GraphiQL's Headers tab, set a passport, e.g.:  {header}", sep="\n", flush=True)
    if not passport_in_params:
        print("Subscriptions take the passport from the X-Passport header of the upgrade.")
    if target := env("ADDR_FILE"):  # written whole: a reader never sees half a line
        Path(target + ".partial").write_text(f"{addr}\n")
        Path(target + ".partial").replace(target)


@contextlib.asynccontextmanager
async def infrastructure() -> AsyncIterator[tuple[str, str, bool]]:
    """The database and NATS URLs, and whether they are development servers."""
    database_url, nats_url = os.environ.get("DATABASE_URL"), os.environ.get("NATS_URL")
    if database_url is not None and nats_url is not None:
        yield database_url, nats_url, flag("EMBEDDED", False)  # set for run_pods' children
    elif database_url is not None or nats_url is not None:
        raise ConfigurationError("set both DATABASE_URL and NATS_URL to bind real "
                                 "infrastructure, or neither to run on embedded servers")
    else:
        infra = await start_embedded(data_dir())
        try:
            yield infra.database.app_url, infra.nats.url, True
        finally:
            await infra.aclose()
            _log.info("embedded servers stopped")




async def start_embedded(data_dir: Path) -> EmbeddedInfra:
    """Embedded Postgres and NATS under ``data_dir``, provisioned; the caller
    closes them (``aclose``)."""
    from service_engine.commands import install_commands
    from service_engine.embedded import (
        EmbeddedInfra,
        provision_lane_stream,
        provision_presence_bucket,
        seed_bucket,
    )

    from .slices import commands

    _log.info("starting embedded Postgres and NATS under %s", data_dir)
    # Start-up runs the servers' blocking starts in threads, which a
    # cancellation cannot stop: shielded, it completes, then what it
    # started is stopped, so a Ctrl-C never leaves an orphaned server.
    start = asyncio.ensure_future(EmbeddedInfra.start(
        data_dir, database=SERVICE, extra_migrations=service_migrations(MIGRATIONS),
        owner_setup=lambda conn: install_commands(conn, commands()),
        buckets=BUCKETS,
    ))
    try:
        infra = await asyncio.shield(start)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await (await start).aclose()
        raise
    try:
        roster = {k: json.dumps(v).encode() for k, v in json.loads(DEV_ROSTER.read_text()).items()}
        await seed_bucket(infra.nats.url, "PUBLISHED_twin", roster)
        await provision_lane_stream(infra.nats.url, SERVICE)
        await provision_presence_bucket(infra.nats.url, SERVICE)
    except BaseException:
        await infra.aclose()
        raise
    return infra
