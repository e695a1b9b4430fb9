"""Run an engine and its HTTP surface in one call (`run_with`, `run_with_listener`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import signal
import socket
from collections.abc import Generator
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request

from .config import EngineConfig
from .engine import Engine
from .graphql.wire import WireEndpoint, WireSocket
from .logs import configure_logging

__all__ = [
    "GC_THRESHOLDS",
    "HTTP_SHUTDOWN_GRACE",
    "LISTEN_BACKLOG",
    "LeanHttpProtocol",
    "LeanWebSocketProtocol",
    "bind_listener",
    "http_config",
    "parse_addr",
    "run_with",
    "run_with_listener",
    "tune_gc",
]

_log = logging.getLogger(__name__)

GC_THRESHOLDS = (1_000, 10, 100)
"""The collector's thresholds on a tuned pod (Python's are 700, 10, 10): a
full collection (the whole live heap, every session's window: 100-150 ms
of CPU at 1,000 sessions) at most every 100 middle ones instead of 10. The
young thresholds stay small because a collection's cost is the objects it
walks (~1 µs each, measured by `service_engine.loopwatch`), and the count
is of *net* allocations, i.e. young objects still alive: at 50,000 one young
collection took 41-53 ms of CPU, and every middle one (20 of those, ~1M
objects) would take a second. At 1,000 / 10 a young one costs ~1 ms and a
middle one ~5 ms (bench/README.md, "Tails")."""


def tune_gc() -> None:
    """Freeze what boot built (the schema, the registries, the modules: the
    collector never walks it again) and set `GC_THRESHOLDS`. Call once,
    after boot, before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


LISTEN_BACKLOG = 4096
"""The listener's accept queue (uvicorn's default is 2048; the kernel caps it
at ``net.core.somaxconn``): a burst of sockets waits there rather than
having its SYNs dropped and retried a second or more later."""


class _Inbox:
    """What uvicorn's protocol needs of its receive queue (``put_nowait``,
    ``get``, ``empty``), without `asyncio.Queue`'s three deques (~2.3 KB a
    socket): a socket holds at most a few undelivered messages."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    async def get(self) -> Any:
        while not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self._items.pop(0)


class _Writable:
    """What uvicorn's protocol needs of its ``writable`` event, without
    `asyncio.Event`'s deque (~0.8 KB a socket); waiters exist only while the
    transport's buffer is full."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = True
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter


class LeanHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, leaving no garbage at an upgrade: the
    HTTP protocol of a connection that became a WebSocket is dropped by the
    transport, but its parser holds its callbacks, bound methods of the
    protocol, so the protocol, its parser, pipeline and flow control
    (~0.8 KB) are a cycle that only a full collection frees, which a tuned
    pod runs rarely: 10,000 sockets opened at once left ~8 MB of it while
    they attached (`bench/session_bytes.py`). The upgrade drops the parser,
    as uvicorn's own ``connection_lost`` does, and the rest goes with the
    last reference."""

    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        self.parser = None  # type: ignore[assignment]
        self.cycle = None  # type: ignore[assignment]


class LeanWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, lighter per socket: a slim receive
    queue and writable flag, and the upgrade's request and response (their
    parsed headers, ~3 KB) dropped once the handshake is answered; the ASGI
    scope keeps the headers the app reads. The frames on the wire are the
    same.

    With ``wire`` (`http_config` passes the app's `WireEndpoint` when
    ``EngineConfig.graphql_wire`` is on), an upgrade on the GraphQL app's ws
    path is not handed to ASGI: a `WireSocket` answers it and takes the
    connection over (`service_engine.graphql.wire`); any other path goes
    through ASGI as before."""

    def __init__(self, *args: Any, wire: WireEndpoint | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = _Inbox()  # type: ignore[assignment]
        self.writable = _Writable()  # type: ignore[assignment]
        self._wire = wire
        self._taken: WireSocket | None = None

    def handle_events(self) -> None:
        # uvicorn's dispatch, plus the hand-over: an upgrade on the wire's
        # path is served by a WireSocket, which takes every later event.
        for event in self.conn.events_received():
            taken = self._taken
            if taken is not None:
                taken.handle_event(event)
            elif isinstance(event, Request):
                self.handle_connect(event)
            elif isinstance(event, Frame):
                opcode = event.opcode
                if opcode == Opcode.CONT:
                    self.handle_cont(event)
                elif opcode == Opcode.TEXT:
                    self.handle_text(event)
                elif opcode == Opcode.BINARY:
                    self.handle_bytes(event)
                elif opcode == Opcode.PING:
                    self.handle_ping()
                elif opcode == Opcode.PONG:
                    self.handle_pong(event)
                elif opcode == Opcode.CLOSE:
                    self.handle_close(event)

    def handle_connect(self, event: Request) -> None:
        wire = self._wire
        if wire is None or not wire.serves(event):
            super().handle_connect(event)
            return
        taken = self._taken = wire.take(self, event)
        # uvicorn sets this protocol on the transport after the request's
        # bytes are parsed; the socket takes it over on the next turn (until
        # then this one hands everything on). Nothing of this object stays.
        self.loop.call_soon(self._hand_over, taken)

    def _hand_over(self, taken: WireSocket) -> None:
        self.transport.set_protocol(taken)

    def data_received(self, data: bytes) -> None:
        taken = self._taken
        if taken is not None:
            taken.data_received(data)
            return
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        taken = self._taken
        if taken is not None:
            taken.connection_lost(exc)
            return
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        taken = self._taken
        if taken is not None:
            taken.pause_writing()
            return
        super().pause_writing()

    def resume_writing(self) -> None:
        taken = self._taken
        if taken is not None:
            taken.resume_writing()
            return
        super().resume_writing()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if self.handshake_complete and "response" in self.__dict__:
            del self.request, self.response


HTTP_SHUTDOWN_GRACE = 10
"""Seconds a stopping pod waits for its connections to finish (uvicorn's
``timeout_graceful_shutdown``) before it cancels their tasks and aborts
what is still open."""


class _Server(uvicorn.Server):
    # The host owns SIGINT/SIGTERM: uvicorn's handlers would re-raise the
    # signal after serving and kill the process before the engine and the
    # embedded servers it stands on are stopped.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        # A connection still open past the grace is one whose peer stopped
        # reading: closing its transport would wait forever for the unsent
        # bytes to drain (and the serve loop with it). Abort it instead.
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()


def http_config(
    app: ASGIApp, config: EngineConfig, *, shutdown_grace: int = HTTP_SHUTDOWN_GRACE
) -> uvicorn.Config:
    """The HTTP server's configuration for a pod of ``config``: ``app``'s
    subscription socket on the engine's own protocol handler when the app is
    `graphql_app`'s and ``config.graphql_wire`` is on."""
    ws: Any = LeanWebSocketProtocol
    view = getattr(getattr(app, "state", None), "graphql_wire", None)
    if config.graphql_wire and view is not None:
        # The app's subscription socket on the engine's own protocol handler.
        ws = functools.partial(LeanWebSocketProtocol, wire=WireEndpoint(view))
    return uvicorn.Config(
        app, lifespan="off", log_level="warning",
        # The server's own frame bound backs the app's typed
        # ws_max_message_bytes refusal: nothing much larger is ever buffered.
        ws_max_size=config.ws_max_message_bytes + 1,
        ws_per_message_deflate=config.ws_per_message_deflate,
        # The cheapest frame write measured (bench/ws_frames.py: ~11 us a
        # frame against ~20 for "websockets" and "wsproto"): websockets-sansio,
        # named rather than left to "auto" (which would pick wsproto without
        # websockets), lightened per socket (LeanWebSocketProtocol).
        ws=ws,
        # The C parser (h11's pure-Python one was ~6% of a mutation), leaving
        # no cycle behind an upgrade.
        http=LeanHttpProtocol,
        backlog=LISTEN_BACKLOG,
        timeout_graceful_shutdown=shutdown_grace,
    )


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
    server = _Server(http_config(app, engine.config))
    # Every HTTP and WebSocket connection passes through this set.
    engine.compact_on_release(server.server_state.connections)
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
