"""An engine host with no slices: ``python -m service_engine``.

With ``DATABASE_URL`` and ``NATS_URL`` set it binds to that infrastructure;
without them it starts embedded Postgres and NATS under ``.data/`` (or
``SERVICE_ENGINE_DATA``), provisions them, and serves ``/readyz`` and
``/metrics`` on ``SERVICE_ENGINE_HTTP_ADDR`` (default 127.0.0.1:8000).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .config import EngineConfig
from .db.pool import connect_pool
from .engine import Engine
from .host import run_with
from .integration.nats import open_nats
from .metrics import PROMETHEUS_CONTENT_TYPE
from .readiness import ReadinessHandle, readiness_route


def _data_dir() -> Path:
    return Path(os.environ.get("SERVICE_ENGINE_DATA", ".data")).resolve()


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = EngineConfig.from_env(service=os.environ.get("SERVICE_ENGINE_SERVICE", "engine-host"))
    addr = config.http_addr or "127.0.0.1:8000"
    infra = None
    database_url = os.environ.get("DATABASE_URL")
    nats_url = os.environ.get("NATS_URL")
    if database_url is None or nats_url is None:
        from .embedded import EmbeddedInfra

        data_dir = _data_dir()
        logging.info("starting embedded Postgres and NATS under %s", data_dir)
        infra = await EmbeddedInfra.start(data_dir)
        database_url, nats_url = infra.database.app_url, infra.nats.url
    try:
        db = await connect_pool(database_url)
        nats = await open_nats(nats_url, publish_ack_timeout=config.publish_ack_timeout)
        try:
            readiness = ReadinessHandle()
            engine = await Engine.boot(config, db, nats, readiness)

            async def metrics(_request: Request) -> Response:
                return Response(engine.metrics.exposition(), media_type=PROMETHEUS_CONTENT_TYPE)

            app = Starlette(routes=[readiness_route(readiness), Route("/metrics", metrics)])
            logging.info("serving http://%s/readyz", addr)
            await run_with(engine, app, addr)
        finally:
            await nats.aclose()
            await db.aclose()
    finally:
        if infra is not None:
            await infra.aclose()
            logging.info("embedded servers stopped")


if __name__ == "__main__":
    asyncio.run(main())
