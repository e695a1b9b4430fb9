"""Run an engine and its HTTP surface in one call (`run_with`,
`run_with_listener`), or N pods of one host behind one port (`run_pods`,
each child a `PodSlot`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from ..config import EngineConfig
from ..engine import Engine
from ..failures import WorkerStopped
from ..logs import configure_logging
from .wire import WireEndpoint

__all__ = [
    "GC_THRESHOLDS", "HTTP_SHUTDOWN_GRACE", "LISTEN_BACKLOG", "POD_ADDR_ENV", "POD_INDEX_ENV",
    "POD_READY_FILE_ENV", "POD_STOP_GRACE", "PodSlot", "addr_text", "bind_listener", "http_config",
    "parse_addr", "raise_open_file_limit", "run_pods", "run_with", "run_with_listener", "tune_gc",
    "write_addr_file",
]

_log = logging.getLogger(__name__)

GC_THRESHOLDS = (1_000, 10, 100)
"""The collector's thresholds on a tuned pod (Python's are 700, 10, 10): a
full collection (every session's window: 100-150 ms at 1,000 sessions) at
most every 100 middle ones instead of 10. The young ones stay small, as a
collection costs ~1 µs an object it walks: at 1,000 / 10 a young one costs
~1 ms and a middle one ~5 ms (bench/README.md, "Tails")."""


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
    """The HTTP server's configuration for a pod of ``config``; a
    `graphql_app`'s socket is the engine's own (`service_engine.server.wire`),
    passed as uvicorn's documented ``ws`` protocol option."""
    ws: Any = "websockets-sansio"
    view = getattr(getattr(app, "state", None), "graphql_view", None)
    if view is not None:
        ws = WireEndpoint(view).protocol_class()
    return uvicorn.Config(
        app, lifespan="off", log_level="warning",
        # The server's own frame bound backs the app's typed
        # ws_max_message_bytes refusal: nothing much larger is ever buffered.
        ws_max_size=config.ws_max_message_bytes + 1,
        ws_per_message_deflate=config.ws_per_message_deflate,
        ws=ws,
        # The C parser (h11's pure-Python one was ~6% of a mutation).
        http="httptools",
        backlog=LISTEN_BACKLOG,
        timeout_graceful_shutdown=shutdown_grace,
    )


def raise_open_file_limit() -> None:
    """Raise the process's soft open-file limit to its hard one (each socket
    is a file; a soft limit of 1,024 would refuse sockets far below
    ``ws_max_sockets``). Where it cannot be raised it stays as it was."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, OSError, ValueError):
        _log.info("the open-file limit could not be raised")


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
    raise_open_file_limit()
    server = _Server(http_config(app, engine.config))
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


POD_INDEX_ENV = "SERVICE_ENGINE_POD_INDEX"
"""Set by `run_pods` on each child: the pod's index (0 to N-1)."""
POD_ADDR_ENV = "SERVICE_ENGINE_POD_ADDR"
"""Set by `run_pods` on each child: the ``host:port`` every pod binds."""
POD_READY_FILE_ENV = "SERVICE_ENGINE_POD_READY_FILE"
"""Set by `run_pods` on each child: the file the pod writes once it is UP."""
POD_STOP_GRACE = 30.0
"""Seconds a child pod has after SIGTERM to stop before it is killed."""


@dataclass(frozen=True, slots=True)
class PodSlot:
    """A child's place among the pods `run_pods` started on this host."""

    index: int
    addr: str
    ready_file: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PodSlot | None:
        """The slot `run_pods` gave this process, or None (a pod on its own)."""
        index = environ.get(POD_INDEX_ENV)
        if index is None:
            return None
        return cls(int(index), environ[POD_ADDR_ENV], Path(environ[POD_READY_FILE_ENV]))

    def bind(self) -> socket.socket:
        """The pods' one port, bound with SO_REUSEPORT beside the others."""
        return bind_listener(self.addr, reuse_port=True)

    async def serve(self, engine: Engine, app: ASGIApp, sock: socket.socket) -> None:
        """`run_with_listener` on `bind`'s socket, writing `ready_file` once
        the engine is UP (the parent waits for every pod's)."""
        # Listening at once: the kernel queues this pod's share of the
        # connections until the server accepts them.
        sock.listen(LISTEN_BACKLOG)
        announced = asyncio.create_task(self._announce(engine, sock))
        try:
            await run_with_listener(engine, app, sock)
        finally:
            announced.cancel()

    async def _announce(self, engine: Engine, sock: socket.socket) -> None:
        while not engine.readiness.is_up:  # noqa: ASYNC110 - readiness is polled, not awaited
            await asyncio.sleep(0.05)
        write_addr_file(self.ready_file, sock)
        _log.info("pod %s serving on %s", self.index, addr_text(sock))


def addr_text(sock: socket.socket) -> str:
    """A bound socket's address as ``host:port`` (``[v6]:port``)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def write_addr_file(target: Path, sock: socket.socket) -> None:
    """Write ``sock``'s `addr_text` to ``target`` at once: a reader never
    sees half a line."""
    partial = target.with_name(target.name + ".partial")
    partial.write_text(f"{addr_text(sock)}\n")
    partial.replace(target)


async def run_pods(
    pods: int, sock: socket.socket, command: Sequence[str], *, state_dir: Path,
    env: Mapping[str, str] | None = None, on_ready: Callable[[], None] | None = None,
    stop_grace: float = POD_STOP_GRACE,
) -> None:
    """Run ``pods`` child processes, each a whole pod, behind ``sock``'s one
    port: ``sock`` (bound with ``reuse_port``, never listening) holds the
    port while the kernel spreads connections over the pods' own listeners.
    Each child runs ``command`` with ``env`` over this environment and its
    `PodSlot` (`PodSlot.from_env`); ``SERVICE_ENGINE_POD_ID``, when set, gets
    the pod's index as a suffix. ``on_ready`` runs once every pod is UP
    (their ready files are in ``state_dir``).

    Returns after SIGINT or SIGTERM once every child stopped (SIGTERM, then
    a kill past ``stop_grace`` seconds); raises `WorkerStopped` naming the
    first pod that stopped on its own, after stopping the rest.
    """
    ready_files = _fresh_ready_files(state_dir, pods)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    children: list[asyncio.subprocess.Process] = []
    try:
        for i, ready_file in enumerate(ready_files):
            child_env = {**os.environ, **(env or {}), POD_INDEX_ENV: str(i),
                         POD_ADDR_ENV: addr_text(sock), POD_READY_FILE_ENV: str(ready_file)}
            if os.environ.get("SERVICE_ENGINE_POD_ID"):  # one identity per pod
                child_env["SERVICE_ENGINE_POD_ID"] = f"{os.environ['SERVICE_ENGINE_POD_ID']}-{i}"
            children.append(await asyncio.create_subprocess_exec(*command, env=child_env))
        exits = [asyncio.ensure_future(child.wait()) for child in children]
        stop = asyncio.ensure_future(stopping.wait())
        try:
            while not all(path.exists() for path in ready_files):
                if stopping.is_set() or any(done.done() for done in exits):
                    break
                await asyncio.sleep(0.1)
            else:
                if on_ready is not None:
                    on_ready()
            await asyncio.wait([*exits, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not stopping.is_set():
            stopped = next(i for i, done in enumerate(exits) if done.done())
            raise WorkerStopped(f"pod {stopped}", f"exit code {children[stopped].returncode}")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await _stop_pods(children, stop_grace)


def _fresh_ready_files(state_dir: Path, pods: int) -> list[Path]:
    state_dir.mkdir(parents=True, exist_ok=True)
    ready_files = [state_dir / f"pod-{i}.ready" for i in range(pods)]
    for path in ready_files:
        path.unlink(missing_ok=True)
    return ready_files


async def _stop_pods(children: list[asyncio.subprocess.Process], grace: float) -> None:
    """SIGTERM every running child, then wait; kill one past the grace."""
    for child in children:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
    for child in children:
        try:
            await asyncio.wait_for(asyncio.shield(child.wait()), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
