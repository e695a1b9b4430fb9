"""``python -m example_service``: run the reference service.

With no configuration it starts embedded Postgres and NATS under ``.data/``
(or ``EXAMPLE_SERVICE_DATA``), provisions them (roles, the engine's and the
service's migrations, the integration streams, the published-language
buckets, and a development roster as the twin would publish it) and serves
http://127.0.0.1:8000/graphql. With ``DATABASE_URL`` and ``NATS_URL`` it binds
to that infrastructure and provisions nothing: the operator applied the
migrations and declared the streams and buckets.

Environment:

* ``EXAMPLE_SERVICE_HTTP_ADDR`` (else ``SERVICE_ENGINE_HTTP_ADDR``, else
  ``127.0.0.1:8000``): where to listen; port 0 picks a free port;
* ``EXAMPLE_SERVICE_ADDR_FILE``: once serving, the bound ``host:port`` is
  written there (it is also printed: ``listening on http://host:port``);
* ``EXAMPLE_SERVICE_PASSPORT_FROM_CONNECTION_PARAMS`` (``1``/``0``): accept
  the passport from the socket's ``connection_init`` payload, which is how
  GraphiQL in a browser sends it; on by default with embedded
  infrastructure only (a development machine), never behind a gateway;
* ``EXAMPLE_SERVICE_LOG_LEVEL`` (default ``INFO``);
* ``SERVICE_ENGINE_<FIELD>``: the engine's configuration (`EngineConfig`).

SIGINT (Ctrl-C) or SIGTERM stops the engine, the HTTP server and then the
embedded servers, in that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from service_engine import (
    ConfigError,
    Engine,
    EngineConfig,
    ReadinessHandle,
    bind_listener,
    connect_pool,
    open_nats,
    run_with_listener,
    service_migrations,
)

from .graphql import build_app
from .kernel import ConfigurationError
from .props import open_props
from .register import register

if TYPE_CHECKING:
    from service_engine.embedded import EmbeddedInfra

SERVICE = "example"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
DEFAULT_ADDR = "127.0.0.1:8000"
BUCKETS = ("PUBLISHED_example", "PUBLISHED_twin")
"""The gitops-declared key-value buckets: the service's published languages
and the twin's (which the service mirrors)."""
DEV_ROSTER = Path(__file__).resolve().parent / "dev_roster.json"
"""The roster seeded on embedded infrastructure, where no twin publishes one."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

EXAMPLE_PASSPORT = {"sub": "alice", "org": "acme", "roles": ["board:archive"]}
"""Printed at start-up for GraphiQL's Headers tab (the README shows it too)."""

_log = logging.getLogger("example_service")


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw in {"1", "true", "yes", "on"}


def _data_dir() -> Path:
    return Path(os.environ.get("EXAMPLE_SERVICE_DATA", ".data")).resolve()


def _listen(addr: str) -> socket.socket:
    try:
        return bind_listener(addr)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot listen on {addr!r}: {exc}") from exc


def _announce(sock: socket.socket, passport_in_params: bool) -> None:
    host, port = sock.getsockname()[:2]
    base = f"http://{host}:{port}"
    header = json.dumps({"X-Passport": json.dumps(EXAMPLE_PASSPORT, separators=(",", ":"))})
    lines = [
        f"listening on {base}",
        f"GraphiQL:  {base}/graphql   (readiness: {base}/readyz)",
        f"In GraphiQL's Headers tab, set a passport, e.g.:  {header}",
    ]
    if not passport_in_params:
        lines.append("Subscriptions take the passport from the X-Passport header of the upgrade.")
    print("\n".join(lines), flush=True)
    addr_file = os.environ.get("EXAMPLE_SERVICE_ADDR_FILE")
    if addr_file:
        target = Path(addr_file)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(f"{host}:{port}\n")
        partial.replace(target)  # a reader never sees half a line


async def _start_embedded(data_dir: Path) -> EmbeddedInfra:
    from service_engine.embedded import (
        EmbeddedInfra,
        provision_lane_stream,
        provision_presence_bucket,
        seed_bucket,
    )

    _log.info("starting embedded Postgres and NATS under %s", data_dir)
    # Start-up runs the servers' blocking starts in threads, which a
    # cancellation cannot stop: shielded, it completes, then what it
    # started is stopped, so a Ctrl-C never leaves an orphaned server.
    start = asyncio.ensure_future(EmbeddedInfra.start(
        data_dir, database=SERVICE, extra_migrations=service_migrations(MIGRATIONS),
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
        # The reply slice's lanes, declared the way an operator would.
        await provision_lane_stream(infra.nats.url, SERVICE)
        await provision_presence_bucket(infra.nats.url, SERVICE)
    except BaseException:
        await infra.aclose()
        raise
    return infra


async def main() -> None:
    config = EngineConfig.from_env(service=os.environ.get("SERVICE_ENGINE_SERVICE", SERVICE))
    database_url = os.environ.get("DATABASE_URL")
    nats_url = os.environ.get("NATS_URL")
    if (database_url is None) != (nats_url is None):
        raise ConfigurationError(
            "set both DATABASE_URL and NATS_URL to bind real infrastructure, "
            "or neither to run on embedded servers"
        )
    embedded = database_url is None
    passport_in_params = _flag("EXAMPLE_SERVICE_PASSPORT_FROM_CONNECTION_PARAMS", embedded)
    # Bound first: a busy port fails before anything is started.
    sock = _listen(os.environ.get("EXAMPLE_SERVICE_HTTP_ADDR") or config.http_addr or DEFAULT_ADDR)

    # Until the host owns the signals, SIGINT and SIGTERM cancel the
    # start-up, and the embedded servers started so far are stopped.
    loop = asyncio.get_running_loop()
    starting = asyncio.current_task()
    assert starting is not None
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, starting.cancel)
    infra = None
    try:
        if database_url is None or nats_url is None:
            infra = await _start_embedded(_data_dir())
            database_url, nats_url = infra.database.app_url, infra.nats.url
        db = await connect_pool(database_url)
        try:
            nats = await open_nats(nats_url, name=f"{config.service}-{config.pod_id}")
            try:
                engine = await Engine.boot(config, db, nats, ReadinessHandle())
                await open_props(engine, nats, _data_dir() / "props", config.service, embedded)
                register(engine)
                if infra is None:
                    # Identity confirms the slices' scopes before the pod is UP.
                    engine.declare_contributed_scopes()
                else:
                    _log.info("embedded development: no Identity, the scopes are not declared")
                app = build_app(engine, passport_from_connection_params=passport_in_params)
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
                _announce(sock, passport_in_params)
                await run_with_listener(engine, app, sock)
            finally:
                await nats.aclose()
        finally:
            await db.aclose()
    finally:
        sock.close()
        if infra is not None:
            await infra.aclose()
            _log.info("embedded servers stopped")


def run() -> int:
    """Run until stopped; the process exit code."""
    logging.basicConfig(
        level=os.environ.get("EXAMPLE_SERVICE_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(main())
    except (ConfigurationError, ConfigError) as exc:
        print(f"example_service: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(run())
