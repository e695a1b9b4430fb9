"""An idle socket on the wire holds no loop timer of its own
(`service_engine.server.wire`): its deadlines (the init timeout, the
session's max age, the keepalive ping and pong, the close echo) wait in the
endpoint's deadlines as one entry. What the socket does is unchanged: the
init timeout, keepalive and closes are the ones `test_wire.py` checks."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from service_engine import Database
from service_engine.graphql import graphql_app
from service_engine.server.wire import WireSocket

from ..support.harness import wait_until
from .test_graphql_app import (
    ALICE,
    BOUND,
    SCHEMA,
    closed,
    initialise,
    receive,
    resolve_me,
    running_engine,
    send,
    ws_connect,
)
from .test_wire import _socket, serve


def _timers(socket: WireSocket) -> list[asyncio.TimerHandle]:
    """The loop's pending (not cancelled) timer handles that call ``socket``."""
    loop: Any = asyncio.get_running_loop()
    return [handle for handle in loop._scheduled
            if not handle.cancelled() and getattr(handle._callback, "__self__", None) is socket]


def _waits(socket: WireSocket) -> int:
    """In how many steps of its endpoint's deadlines ``socket`` waits."""
    deadlines: Any = socket._endpoint.deadlines(asyncio.get_running_loop())
    return sum(socket in step.sockets for step in deadlines._steps.values())


def _wire(served: Any) -> WireSocket:
    (wire,) = [c for c in served.server.server_state.connections if isinstance(c, WireSocket)]
    return wire


async def test_an_idle_socket_holds_no_timer_and_still_keeps_alive(
    db: Database,
) -> None:
    """Initialised, subscribed and idle, with keepalive pings on: the socket
    has no pending loop timer of its own and waits in one step of its
    endpoint's deadlines; keepalive rounds go on, messages are answered,
    and once the socket is gone it waits nowhere."""
    async with running_engine(db) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        async with serve(app, ws_ping_interval=0.1, ws_ping_timeout=0.3) as served:
            async with _socket(served.addr) as ws:
                await send(ws, {"id": "live", "type": "subscribe",
                                "payload": {"query": "subscription { whoamiLive }"}})
                assert (await receive(ws))["type"] == "next"
                wire = _wire(served)
                assert _timers(wire) == [] and _waits(wire) == 1
                first = wire.deadlines.ping_sent_at
                await wait_until(lambda: wire.deadlines.ping_sent_at - first >= 0.25,
                                 what="three more keepalive pings answered")
                assert _timers(wire) == [] and _waits(wire) == 1
                await send(ws, {"type": "ping"})
                assert await receive(ws) == {"type": "pong"}
            await wait_until(lambda: not served.server.server_state.connections,
                             what="the socket gone")
            assert _timers(wire) == [] and _waits(wire) == 0


async def test_the_deadlines_still_close_at_the_init_timeout_and_the_max_age(
    db: Database,
) -> None:
    """The init timeout (4408) and the session's max age (1001) fire from the
    endpoint's deadlines, each at its own: a socket that never sends
    its init closes at the init timeout, an initialised one at its max age
    counted from the upgrade."""
    async with running_engine(db, session_max_age=timedelta(seconds=1.2),
                              session_ttl=timedelta(seconds=0.5)) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me,
                          connection_init_wait_timeout=timedelta(seconds=0.3))
        async with serve(app) as served:
            loop = asyncio.get_running_loop()
            # Each elapsed time is counted from before the upgrade is sent:
            # the server's bound starts at its handshake, which follows.
            started = loop.time()
            async with ws_connect(served.addr, ALICE.to_header()) as silent:
                close = await asyncio.wait_for(closed(silent), BOUND)
                elapsed = loop.time() - started
            assert close.rcvd is not None and close.rcvd.code == 4408
            assert 0.3 * 0.9 <= elapsed < 1.2, elapsed
            started = loop.time()
            async with ws_connect(served.addr, ALICE.to_header()) as ws:
                await initialise(ws)
                await send(ws, {"type": "ping"})
                assert await receive(ws) == {"type": "pong"}
                close = await asyncio.wait_for(closed(ws), BOUND)
                elapsed = loop.time() - started
            assert close.rcvd is not None
            assert (close.rcvd.code, close.rcvd.reason) == (1001, "session_max_age")
            assert 1.2 * 0.9 <= elapsed < 1.2 + 1.0, elapsed
