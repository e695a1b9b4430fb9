"""Run an engine and its HTTP surface in one call (`run_with`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp

from .engine import Engine

_log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    # The host owns SIGINT/SIGTERM: uvicorn's handlers would re-raise the
    # signal after serving and kill the process before the engine and the
    # embedded servers it stands on are stopped.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return (host or "127.0.0.1"), int(port)


async def run_with(engine: Engine, app: ASGIApp, addr: str, *, handle_signals: bool = True) -> None:
    """Serve ``app`` on ``addr`` while ``engine.run()`` supervises its workers.

    Returns after SIGINT/SIGTERM (or `Engine.shutdown`) once both stopped;
    raises the engine's `WorkerStopped` if a worker died.
    """
    host, port = parse_addr(addr)
    server = _Server(
        uvicorn.Config(app, host=host, port=port, lifespan="off", log_level="warning")
    )
    loop = asyncio.get_running_loop()

    def stop() -> None:
        engine.shutdown()
        server.should_exit = True

    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
    engine_task = asyncio.create_task(engine.run(), name="service_engine:run")
    server_task = asyncio.create_task(server.serve(), name="service_engine:http")
    try:
        await asyncio.wait({engine_task, server_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop()
        await asyncio.gather(engine_task, server_task, return_exceptions=True)
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    engine_task.result()
