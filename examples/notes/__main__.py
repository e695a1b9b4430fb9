"""``python -m notes``: the notes service on embedded Postgres and NATS
kept under ``.data/``, GraphiQL on http://127.0.0.1:8000/graphql."""

import asyncio
from pathlib import Path

from service_engine import Engine, EngineConfig, ReadinessHandle, connect_pool, open_nats
from service_engine.embedded import EmbeddedInfra
from service_engine.server import run_with

from . import MIGRATIONS, app


async def main() -> None:
    infra = await EmbeddedInfra.start(Path(".data"), database="notes",
                                      extra_migrations=MIGRATIONS)
    try:
        db = await connect_pool(infra.database.app_url)
        nats = await open_nats(infra.nats.url)
        engine = await Engine.boot(EngineConfig(service="notes"), db, nats, ReadinessHandle())
        await run_with(engine, app(engine, passport_from_connection_params=True),
                       "127.0.0.1:8000")
    finally:
        await infra.aclose()


if __name__ == "__main__":
    asyncio.run(main())
