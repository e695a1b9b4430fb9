"""The reference service's boot: ``python -m example_service [--pods N]``
(`__main__`) runs `serve` once the process is on its allocator.

On embedded Postgres and NATS under ``.data/`` (`dev_infra`), or on
``DATABASE_URL`` and ``NATS_URL`` (provisioned by the operator); N pods
behind one port with ``--pods N`` (`service_engine.server.run_pods`). Its
variables: ``docs/operating/configuration.md``. SIGINT or SIGTERM stops the
engine, the HTTP server and then the embedded servers, in that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys

from service_engine import (
    Engine,
    EngineConfig,
    ReadinessHandle,
    connect_pool,
    open_nats,
)
from service_engine.errors import ConfigError, WorkerStopped
from service_engine.server import PodSlot, bind_listener, run_pods, run_with_listener

from .dev_infra import SERVICE, announce, data_dir, env, flag, infrastructure
from .graphql import build_app
from .kernel import ConfigurationError
from .props import open_props
from .register import register

_log = logging.getLogger("example_service")


def _listen(config: EngineConfig, *, reuse_port: bool = False) -> socket.socket:
    addr = env("HTTP_ADDR") or config.http_addr or "127.0.0.1:8000"
    try:  # bound first: a busy port fails before anything is started
        return bind_listener(addr, reuse_port=reuse_port)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot listen on {addr!r}: {exc}") from exc


def _signals_cancel_startup(on: bool) -> None:
    """Until the host owns SIGINT and SIGTERM, they cancel the start-up."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        if on and task is not None:
            loop.add_signal_handler(sig, task.cancel)
        else:
            loop.remove_signal_handler(sig)


async def main(pods: int = 1) -> None:
    config = EngineConfig.from_env(service=os.environ.get("SERVICE_ENGINE_SERVICE", SERVICE))
    slot = PodSlot.from_env()  # a child of run_pods: one of N pods
    pods = 1 if slot is not None else pods
    sock = slot.bind() if slot is not None else _listen(config, reuse_port=pods > 1)
    _signals_cancel_startup(True)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(sock.close)
        database_url, nats_url, embedded = await stack.enter_async_context(infrastructure())
        passport_in_params = flag("PASSPORT_FROM_CONNECTION_PARAMS", embedded)
        if pods > 1:
            shared = {"DATABASE_URL": database_url, "NATS_URL": nats_url,
                      "EXAMPLE_SERVICE_DATA": str(data_dir()), "EXAMPLE_SERVICE_EMBEDDED":
                      str(int(embedded)), "EXAMPLE_SERVICE_PASSPORT_FROM_CONNECTION_PARAMS":
                      str(int(passport_in_params))}
            _signals_cancel_startup(False)
            return await run_pods(pods, sock, [sys.executable, "-m", "example_service"],
                                  state_dir=data_dir() / "pods", env=shared,
                                  on_ready=lambda: announce(sock, passport_in_params, pods))
        db = await connect_pool(database_url)
        stack.push_async_callback(db.aclose)
        nats = await open_nats(nats_url, name=f"{config.service}-{config.pod_id}")
        stack.push_async_callback(nats.aclose)
        engine = await Engine.boot(config, db, nats, ReadinessHandle())
        if slot is None or slot.index == 0:  # one props store: the first pod's
            await open_props(engine, nats, data_dir() / "props", config.service, embedded)
        register(engine)
        if not embedded:  # Identity confirms the slices' scopes before the pod is UP
            engine.declare_contributed_scopes()
        app = build_app(engine, passport_from_connection_params=passport_in_params)
        _signals_cancel_startup(False)
        if slot is not None:
            return await slot.serve(engine, app, sock)
        announce(sock, passport_in_params)
        await run_with_listener(engine, app, sock)


def serve(allocator: str, argv: list[str] | None = None) -> int:
    """Run until stopped on ``allocator`` (what `run_on_allocator` chose);
    the process exit code."""
    logging.basicConfig(level=env("LOG_LEVEL", "INFO").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _log.info("Python's objects on %s", allocator)
    args = sys.argv[1:] if argv is None else argv
    pods = args[1] if args[:1] == ["--pods"] and len(args) == 2 else env("PODS", "1")
    try:
        if args not in ([], ["--pods", pods]) or not pods.isdigit() or int(pods) < 1:
            raise ConfigurationError(f"usage: [--pods N], N a positive integer (got {args})")
        asyncio.run(main(int(pods)))
    except (ConfigurationError, ConfigError, WorkerStopped) as exc:
        print(f"example_service: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    return 0

