"""``python -m notes``: the notes service on embedded Postgres and NATS
kept under ``.data/``, GraphiQL on http://127.0.0.1:8000/graphql."""

import asyncio
import contextlib
from pathlib import Path

from service_engine import Engine, EngineConfig, ReadinessHandle, connect_pool, open_nats
from service_engine.embedded import EmbeddedInfra
from service_engine.server import run_with

from . import MIGRATIONS, app


async def main() -> None:
    async with contextlib.AsyncExitStack() as stack:  # closed in reverse: the servers last
        infra = await EmbeddedInfra.start(Path(".data"), database="notes",
                                          extra_migrations=MIGRATIONS)
        stack.push_async_callback(infra.aclose)
        db = await connect_pool(infra.database.app_url)
        stack.push_async_callback(db.aclose)
        nats = await open_nats(infra.nats.url)
        stack.push_async_callback(nats.aclose)
        engine = await Engine.boot(EngineConfig(service="notes"), db, nats, ReadinessHandle())
        await run_with(engine, app(engine, passport_from_connection_params=True),
                       "127.0.0.1:8000")


if __name__ == "__main__":
    asyncio.run(main())
