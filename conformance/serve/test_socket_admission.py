"""A burst of sockets is admitted, not timed out.

The init timeout (4408) counts from the answered upgrade to the arrival of
``connection_init``, never across the principal's resolve; upgrades past
``ws_max_handshakes`` answered-but-uninitialised sockets wait, unanswered,
for a slot instead of starting a timeout the pod cannot follow up.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from websockets.asyncio.client import connect

from service_engine import Database
from service_engine.graphql import PASSPORT_HEADER, Passport, graphql_app
from service_engine.server.wire import WireSocket

from ..support.harness import wait_until
from .test_graphql_app import (
    ALICE,
    BOUND,
    PROTOCOL,
    SCHEMA,
    Me,
    closed,
    initialise,
    resolve_me,
    running_engine,
    send,
    serving,
    subscribe,
    ws_connect,
)

INIT_TIMEOUT = timedelta(seconds=0.3)


async def test_a_resolve_slower_than_the_init_timeout_is_acknowledged(db: Database) -> None:
    """connection_init arrives in time but its principal's resolve outlasts the
    init timeout: the socket is acknowledged, not closed 4408."""

    async def slow(passport: Passport) -> Me:
        await asyncio.sleep(3 * INIT_TIMEOUT.total_seconds())
        return resolve_me(passport)

    async with (
        running_engine(db) as engine,
        serving(graphql_app(engine, SCHEMA, slow, connection_init_wait_timeout=INIT_TIMEOUT)) as addr,
        ws_connect(addr, ALICE.to_header()) as ws,
    ):
        await initialise(ws)
        assert await subscribe(ws, "1", "query { whoami { sub } }") == [
            {"data": {"whoami": {"sub": "alice"}}}
        ]


async def test_a_socket_that_never_initialises_is_closed_4408(db: Database) -> None:
    """A socket that sends no connection_init is closed with 4408 at the timeout."""
    async with (
        running_engine(db) as engine,
        serving(graphql_app(engine, SCHEMA, resolve_me,
                            connection_init_wait_timeout=INIT_TIMEOUT)) as addr,
        ws_connect(addr, ALICE.to_header()) as ws,
    ):
        close = await closed(ws)
        assert close.rcvd is not None and close.rcvd.code == 4408


async def test_upgrades_past_ws_max_handshakes_wait_for_a_slot(db: Database) -> None:
    """With ws_max_handshakes=1 a second upgrade stays unanswered while the
    first socket has not initialised, and is answered (and acknowledged) once
    it has; a socket that closes before its init frees its slot too."""
    async with (
        running_engine(db, ws_max_handshakes=1) as engine,
        serving(graphql_app(engine, SCHEMA, resolve_me)) as addr,
        ws_connect(addr, ALICE.to_header()) as first,
    ):
        second = asyncio.ensure_future(ws_connect(addr, ALICE.to_header()).__aenter__())
        done, _ = await asyncio.wait({second}, timeout=0.5)
        assert not done, "the second upgrade was answered while the first held the slot"
        await initialise(first)
        ws2 = await asyncio.wait_for(second, BOUND)
        try:
            third = asyncio.ensure_future(ws_connect(addr, ALICE.to_header()).__aenter__())
            done, _ = await asyncio.wait({third}, timeout=0.5)
            assert not done, "the third upgrade was answered while the second held the slot"
            await ws2.close()
            ws3 = await asyncio.wait_for(third, BOUND)
            await initialise(ws3)
            await send(ws3, {"type": "ping"})
            await ws3.close()
        finally:
            await ws2.close()


async def test_while_every_handshake_slot_is_taken_the_init_timeout_is_extended_once(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ws_max_handshakes=1 the answered socket holds every slot: it may
    send its init past one timeout period, and a socket that never sends one
    is closed 4408 after two periods, not one."""
    timeout = INIT_TIMEOUT.total_seconds()
    extended = asyncio.Event()
    timed_out = WireSocket._init_timed_out

    def observed(socket: WireSocket) -> None:
        timed_out(socket)
        admission = socket.admission
        if admission is not None and admission.init_extended and not socket.writer.closed:
            extended.set()

    monkeypatch.setattr(WireSocket, "_init_timed_out", observed)
    async with (
        running_engine(db, ws_max_handshakes=1) as engine,
        serving(graphql_app(engine, SCHEMA, resolve_me,
                            connection_init_wait_timeout=INIT_TIMEOUT)) as addr,
        ws_connect(addr, ALICE.to_header()) as first,
    ):
        # Its first period ran out while it held the only slot: extended, open.
        await asyncio.wait_for(extended.wait(), BOUND)
        await initialise(first)
        async with ws_connect(addr, ALICE.to_header()) as silent:
            started = asyncio.get_running_loop().time()
            close = await closed(silent)
            elapsed = asyncio.get_running_loop().time() - started
        assert close.rcvd is not None and close.rcvd.code == 4408
        assert elapsed >= 2 * timeout * 0.9, elapsed


async def test_closed_sockets_leave_no_task_slot_or_count_behind(db: Database) -> None:
    """Two hundred sockets opened at once, each with a live operation, then
    closed: the pod's socket count and handshake slots are back where they
    started and none of their tasks (receive loop, operation, timers' closers)
    is left on the loop."""
    many = 200
    async with running_engine(db, ws_max_handshakes=16) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        view = app.state.graphql_view
        async with serving(app) as addr:
            before = len(asyncio.all_tasks())

            async def live() -> Any:
                # Queued behind the handshake bound: a longer open timeout.
                ws = await connect(
                    f"ws://{addr}/graphql/ws", subprotocols=[PROTOCOL], open_timeout=60,
                    additional_headers={PASSPORT_HEADER: ALICE.to_header()},
                )
                await initialise(ws)
                await send(ws, {"id": "1", "type": "subscribe",
                                "payload": {"query": "subscription { whoamiLive }"}})
                assert json.loads(await asyncio.wait_for(ws.recv(), BOUND))["type"] == "next"
                return ws

            sockets = await asyncio.gather(*(live() for _ in range(many)))
            assert view.open_sockets == many
            await asyncio.gather(*(ws.close() for ws in sockets))
            await wait_until(lambda: view.open_sockets == 0, what="every socket closed on the pod")
            await wait_until(lambda: len(asyncio.all_tasks()) <= before,
                             what="no task of a closed socket left")
            assert view.handshakes.free == 16
