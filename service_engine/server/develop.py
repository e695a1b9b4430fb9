"""A service on a developer's machine in one call: embedded Postgres and
NATS kept under a data folder, the engine booted on them, its GraphQL app
served (`serve_embedded`).

For development only: the infrastructure is the embedded one
(`service_engine.embedded`, the ``embedded`` extra) and the passport is
also read from a socket's ``connection_init`` payload, so GraphiQL's
subscriptions work from its Headers tab.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path

from starlette.types import ASGIApp

from ..config import EngineConfig
from ..db import connect_pool, service_migrations
from ..db.migrate import Migration
from ..engine import Engine
from ..graphql.compose import ComposedService
from ..messaging.nats import open_nats
from ..readiness import ReadinessHandle
from .app import graphql_app
from .host import run_with

__all__ = ["serve_embedded"]


def serve_embedded(
    service: ComposedService | Callable[[Engine], ASGIApp],
    name: str,
    *,
    migrations: Path | Iterable[Migration] = (),
    data: Path = Path(".data"),
    addr: str = "127.0.0.1:8000",
    config: EngineConfig | None = None,
) -> None:
    """Serve ``service`` as the service ``name`` until Ctrl-C: Postgres and
    NATS started under ``data`` (kept between runs) with the engine's
    migrations and ``migrations`` (a folder of them, `service_migrations`,
    or the list) applied to the database ``name``; the engine booted on
    them (``config``, default ``EngineConfig(service=name)``); GraphiQL on
    ``http://<addr>/graphql``.

    ``service`` is the `ComposedService` (served by `graphql_app`, the
    passport also taken from a socket's ``connection_init``), or a function
    of the booted engine answering the app to serve. Everything started is
    stopped on the way out, the servers last.
    """
    from ..embedded import EmbeddedInfra

    listed = service_migrations(migrations) if isinstance(migrations, Path) else list(migrations)

    async def serve() -> None:
        async with contextlib.AsyncExitStack() as stack:  # closed in reverse: the servers last
            infra = await EmbeddedInfra.start(data, database=name, extra_migrations=listed)
            stack.push_async_callback(infra.aclose)
            db = await connect_pool(infra.database.app_url)
            stack.push_async_callback(db.aclose)
            nats = await open_nats(infra.nats.url)
            stack.push_async_callback(nats.aclose)
            engine = await Engine.boot(
                config or EngineConfig(service=name), db, nats, ReadinessHandle()
            )
            app = (
                graphql_app(engine, service, passport_from_connection_params=True)
                if isinstance(service, ComposedService) else service(engine)
            )
            await run_with(engine, app, addr)

    asyncio.run(serve())
