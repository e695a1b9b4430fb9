"""In-process support for the reference service's slice tests: a database
with the engine's and the example service's migrations, an engine running
some of the service's slices, and that engine served over HTTP and
graphql-transport-ws on a free port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
from websockets.asyncio.client import connect

from example_service.graphql import build_app
from example_service.kernel import Principal
from example_service.register import register
from example_service.slices import commands, compose
from service_engine import (
    Database,
    Engine,
    EngineConfig,
    MutationExecutor,
    ReadinessHandle,
    connect_pool,
)
from service_engine.blobs import BlobStoreConfig
from service_engine.commands import install_commands
from service_engine.db import service_migrations
from service_engine.embedded import EmbeddedPostgres, ProvisionedDatabase, provision_database
from service_engine.errors import WorkerStopped
from service_engine.graphql import PASSPORT_HEADER, ComposedService, Passport
from service_engine.integration import Nats
from service_engine.server import bind_listener, run_with_listener

from ..blackbox.harness import EXAMPLE_MIGRATIONS, PROTOCOL, GqlSocket, GraphQLFailed
from .database_pool import pool_for
from .harness import fast_engine_config, wait_until

EXAMPLE_TEMPLATE = "example_inprocess_template"
"""Built on first use (by the ``store`` fixture or `example_database`)."""
BOUND = 10.0


_built: set[tuple[int, str]] = set()
"""The servers (by identity and data folder) whose example template exists."""


async def ensure_example_template(pg: EmbeddedPostgres) -> str:
    """The template with the engine's and the example service's migrations."""
    if (id(pg), str(pg.data_dir)) in _built:
        return EXAMPLE_TEMPLATE
    admin = await asyncpg.connect(pg.admin_url)
    try:
        exists = await admin.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = $1", EXAMPLE_TEMPLATE
        )
    finally:
        await admin.close()
    if not exists:
        await provision_database(
            pg, EXAMPLE_TEMPLATE, is_template=True,
            extra_migrations=service_migrations(EXAMPLE_MIGRATIONS),
            owner_setup=lambda conn: install_commands(conn, commands()),
        )
    _built.add((id(pg), str(pg.data_dir)))
    return EXAMPLE_TEMPLATE


@contextlib.asynccontextmanager
async def example_database(pg: EmbeddedPostgres) -> AsyncIterator[ProvisionedDatabase]:
    """A database as fresh as a new copy of the example template."""
    template = await ensure_example_template(pg)
    async with pool_for(pg, template, "ex").database() as provisioned:
        yield provisioned


def example_config(**overrides: Any) -> EngineConfig:
    """Small bounds, so scheduled messages and redeliveries happen within a test."""
    return fast_engine_config(
        overrides.pop("service", "example"),
        **{"lock_timeout": timedelta(milliseconds=500), **overrides},
    )


def person(sub: str, org: str | None = "acme", *roles: str) -> Principal:
    return Principal(id=sub, actor=sub, org=org, roles=frozenset(roles))


@dataclass
class Running:
    """An engine running the composed slices, its GraphQL app served on a free port."""

    engine: Engine
    db: Database
    service: ComposedService
    readiness: ReadinessHandle
    addr: str
    http: httpx.AsyncClient

    @property
    def executor(self) -> MutationExecutor:
        return self.engine.mutation_executor()

    async def post(self, query: str, variables: dict[str, Any] | None = None,
                   passport: Passport | None = None) -> dict[str, Any]:
        """POST ``query``; the whole response body."""
        headers = {PASSPORT_HEADER: passport.to_header()} if passport is not None else {}
        body: dict[str, Any] = {"query": query}
        if variables is not None:
            body["variables"] = variables
        response = await self.http.post("/graphql", json=body, headers=headers)
        assert response.status_code == 200, (response.status_code, response.text)
        answer: dict[str, Any] = response.json()
        return answer

    async def gql(self, query: str, variables: dict[str, Any] | None = None,
                  passport: Passport | None = None) -> dict[str, Any]:
        """POST ``query``; its ``data``, failing the test on any error."""
        answer = await self.post(query, variables, passport)
        if answer.get("errors"):
            raise GraphQLFailed(str(answer["errors"]))
        data: dict[str, Any] = answer["data"]
        return data

    @contextlib.asynccontextmanager
    async def socket(self, passport: Passport) -> AsyncIterator[GqlSocket]:
        """A graphql-transport-ws socket, initialised, the passport on the upgrade."""
        async with connect(
            f"ws://{self.addr}/graphql/ws", subprotocols=[PROTOCOL],
            additional_headers={PASSPORT_HEADER: passport.to_header()},
            open_timeout=BOUND, close_timeout=2,
        ) as ws:
            socket = GqlSocket(ws, 0.0, 0.0)
            await socket.init()
            yield socket


@contextlib.asynccontextmanager
async def serving_engine(engine: Engine, app: Any) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """``app`` served with ``engine`` running (`run_with_listener` on a free
    loopback port) until the block ends: its address and an HTTP client,
    once readiness is UP; the engine is shut down on the way out."""
    sock = bind_listener("127.0.0.1:0")
    task = asyncio.create_task(run_with_listener(engine, app, sock, handle_signals=False))
    addr = f"127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with httpx.AsyncClient(base_url=f"http://{addr}", timeout=BOUND) as http:

            async def up() -> bool:
                if task.done():
                    task.result()  # a failed start fails the test with its cause
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(up, timeout=BOUND, what="engine readiness UP")
            yield addr, http
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, BOUND)
        sock.close()


@contextlib.asynccontextmanager
async def running(
    store: ProvisionedDatabase,
    slices: Iterable[str],
    *,
    nats: Nats | None = None,
    config: EngineConfig | None = None,
    blob_store: BlobStoreConfig | None = None,
) -> AsyncIterator[Running]:
    """An engine over ``store`` running the slices ``slices`` and serving
    their GraphQL, until the block ends."""
    db = await connect_pool(store.app_url, max_size=20)
    try:
        readiness = ReadinessHandle()
        engine = await Engine.boot(config or example_config(), db, nats, readiness)
        if blob_store is not None:
            engine.use_blob_store(blob_store)
        service = compose(tuple(slices))
        register(engine, service)
        app = build_app(engine, service)
        async with serving_engine(engine, app) as (addr, http):
            yield Running(engine, db, service, readiness, addr, http)
    finally:
        await db.aclose()
