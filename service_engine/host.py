"""Run an engine and its HTTP surface in one call (`run_with`, `run_with_listener`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp

from .engine import Engine
from .logs import configure_logging

__all__ = [
    "GC_THRESHOLDS",
    "bind_listener",
    "parse_addr",
    "run_with",
    "run_with_listener",
    "tune_gc",
]

_log = logging.getLogger(__name__)

GC_THRESHOLDS = (50_000, 20, 100)
"""The collector's thresholds on a tuned pod (Python's are 700, 10, 10): a
young collection every 50,000 net allocations instead of 700, and a full
one at most every 100 middle ones. A pod allocates in bursts (a render
frame, a socket's messages) whose objects mostly die young; each full
collection walks the whole live heap (every session's window), which is
what made the long delivery tails."""


def tune_gc() -> None:
    """Freeze what boot built (the schema, the registries, the modules: the
    collector never walks it again) and set `GC_THRESHOLDS`. Call once,
    after boot, before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class _Server(uvicorn.Server):
    # The host owns SIGINT/SIGTERM: uvicorn's handlers would re-raise the
    # signal after serving and kill the process before the engine and the
    # embedded servers it stands on are stopped.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; an empty host is 127.0.0.1) as a pair."""
    host, _, port = addr.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"an address is host:port, got {addr!r}")
    host = host.removeprefix("[").removesuffix("]")
    return (host or "127.0.0.1"), int(port)


def bind_listener(addr: str, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``addr`` (port 0: a free one), ready for
    `run_with_listener`; read the port back with ``getsockname()``.

    ``reuse_port`` sets SO_REUSEPORT: several processes of one user bind the
    same ``host:port`` and the kernel spreads new connections over those
    listening (N pods on one host behind one port, each its own engine)."""
    host, port = parse_addr(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections
    # only when the listener's proto says TCP. Without it every keep-alive
    # response waits out the client's delayed ACK (~40 ms a request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def run_with(
    engine: Engine, app: ASGIApp, addr: str, *, handle_signals: bool = True,
    reuse_port: bool = False,
) -> None:
    """Serve ``app`` on ``addr`` while ``engine.run()`` supervises its workers.

    Returns after SIGINT/SIGTERM (or `Engine.shutdown`) once both stopped;
    raises the engine's `WorkerStopped` if a worker died. ``reuse_port``:
    share ``addr`` with other pods of this host (see `bind_listener`).
    """
    sock = bind_listener(addr, reuse_port=reuse_port)
    try:
        await run_with_listener(engine, app, sock, handle_signals=handle_signals)
    finally:
        sock.close()


async def run_with_listener(
    engine: Engine, app: ASGIApp, sock: socket.socket, *, handle_signals: bool = True
) -> None:
    """`run_with` on a socket the caller already bound (a port chosen by the
    system, a socket handed over by a supervisor). The caller closes it."""
    configure_logging(engine.config.service, engine.config.pod_id)
    # The server's own frame bound backs the app's typed ws_max_message_bytes
    # refusal: nothing much larger is ever buffered.
    ws_max_size = engine.config.ws_max_message_bytes + 1
    server = _Server(uvicorn.Config(
        app, lifespan="off", log_level="warning", ws_max_size=ws_max_size,
        ws_per_message_deflate=engine.config.ws_per_message_deflate,
        # The cheapest frame write measured (bench/ws_frames.py: ~11 us a
        # frame against ~20 for "websockets" and "wsproto"), named rather
        # than left to "auto", which would pick wsproto without websockets.
        ws="websockets-sansio",
    ))
    if engine.config.gc_tuned:
        tune_gc()
    loop = asyncio.get_running_loop()

    def stop() -> None:
        engine.shutdown()
        server.should_exit = True

    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
    engine_task = asyncio.create_task(engine.run(), name="service_engine:run")
    server_task = asyncio.create_task(server.serve(sockets=[sock]), name="service_engine:http")
    try:
        await asyncio.wait({engine_task, server_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop()
        await asyncio.gather(engine_task, server_task, return_exceptions=True)
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    engine_task.result()
    server_task.result()
