"""A burst's ``connection_init``s are worked on in waves, never timed out.

At most ``ws_max_attaching`` sockets are being attached at once on the
engine's own socket: a turn runs from the arrival of ``connection_init``
(the principal's resolve, the acknowledgement) to the socket's first
operation's first answer (a live subscription's Reset: its attach), or a
bound (two seconds, at most the init timeout) after the acknowledgement;
the others wait their turn. The init timeout (4408) ended when their init
arrived, so a socket waiting its turn is acknowledged when the turn comes,
however long it waited, and a socket that closes while it waits takes
nobody's turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from service_engine import Database
from service_engine.graphql import Passport, graphql_app
from service_engine.server.wire import WireEndpoint

from ..support.harness import wait_until
from .test_graphql_app import (
    ALICE,
    BOUND,
    SCHEMA,
    Me,
    initialise,
    receive,
    resolve_me,
    running_engine,
    send,
    serving,
    ws_connect,
)

INIT_TIMEOUT = timedelta(seconds=0.3)


@contextlib.asynccontextmanager
async def gated(db: Database, resolve: Any, **app_options: Any) -> AsyncIterator[str]:
    """The test app served with an attach gate of one socket at a time."""
    async with (
        running_engine(db, ws_max_attaching=1) as engine,
        serving(graphql_app(engine, SCHEMA, resolve, **app_options)) as addr,
    ):
        yield addr


@pytest.fixture
def endpoints(monkeypatch: pytest.MonkeyPatch) -> list[WireEndpoint]:
    """Every `WireEndpoint` built while the test runs (its gate is read)."""
    built: list[WireEndpoint] = []
    init = WireEndpoint.__init__

    def recorded(endpoint: WireEndpoint, view: Any) -> None:
        init(endpoint, view)
        built.append(endpoint)

    monkeypatch.setattr(WireEndpoint, "__init__", recorded)
    return built


async def test_an_init_waiting_its_turn_is_acknowledged_not_closed_4408(db: Database) -> None:
    """With ws_max_attaching=1 and the first socket's resolve held, a second
    socket's init waits its turn for several init timeouts: it is neither
    closed 4408 nor resolved meanwhile (one resolve at a time), and is
    acknowledged, and serves operations, once the first resolve ends."""
    release = asyncio.Event()
    in_flight = 0
    most = 0
    resolved: list[str] = []

    async def held(passport: Passport) -> Me:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            if not resolved:
                resolved.append(passport.sub)
                await release.wait()
            else:
                resolved.append(passport.sub)
            return resolve_me(passport)
        finally:
            in_flight -= 1

    async with (
        gated(db, held, connection_init_wait_timeout=INIT_TIMEOUT) as addr,
        ws_connect(addr, ALICE.to_header()) as first,
        ws_connect(addr, ALICE.to_header()) as second,
    ):
        await send(first, {"type": "connection_init"})
        await wait_until(lambda: resolved == ["alice"], what="the first resolve started")
        await send(second, {"type": "connection_init"})
        # Three init timeouts pass with nothing sent to the waiting socket.
        waited = asyncio.ensure_future(second.recv())
        done, _ = await asyncio.wait({waited}, timeout=3 * INIT_TIMEOUT.total_seconds())
        assert not done, f"the waiting socket got {waited.result() if done else None!r}"
        assert resolved == ["alice"], "a second resolve ran while the gate was taken"
        release.set()
        assert await receive(first) == {"type": "connection_ack"}
        await send(first, {"id": "1", "type": "subscribe",
                           "payload": {"query": "query { whoami { sub } }"}})
        assert (await receive(first))["type"] == "next"
        assert json.loads(await asyncio.wait_for(waited, BOUND)) == {"type": "connection_ack"}
        await send(second, {"id": "1", "type": "subscribe",
                            "payload": {"query": "query { whoami { sub } }"}})
        assert (await receive(second))["payload"] == {"data": {"whoami": {"sub": "alice"}}}
        assert most == 1


async def test_a_socket_closed_while_waiting_takes_no_turn(
    db: Database, endpoints: list[WireEndpoint]
) -> None:
    """With ws_max_attaching=1: a socket that closes while its init waits is
    skipped (the next waiting socket is acknowledged), and once every socket
    closed the gate is whole again (its one turn free, nobody waiting)."""
    release = asyncio.Event()
    started: list[str] = []

    async def held(passport: Passport) -> Me:
        started.append(passport.sub)
        if len(started) == 1:
            await release.wait()
        return resolve_me(passport)

    async with gated(db, held) as addr:
        async with (
            ws_connect(addr, ALICE.to_header()) as first,
            ws_connect(addr, ALICE.to_header()) as third,
        ):
            await send(first, {"type": "connection_init"})
            await wait_until(lambda: len(started) == 1, what="the first resolve started")
            async with ws_connect(addr, ALICE.to_header()) as leaving:
                await send(leaving, {"type": "connection_init"})
                await send(third, {"type": "connection_init"})
                gate = endpoints[-1].gate(asyncio.get_running_loop())
                await wait_until(lambda: len(gate.waiting) == 2,
                                 what="two inits waiting their turn")
            release.set()
            assert await receive(first) == {"type": "connection_ack"}
            # Its turn lasts until its first operation answers.
            await send(first, {"id": "1", "type": "subscribe",
                               "payload": {"query": "query { whoami { sub } }"}})
            assert (await receive(first))["type"] == "next"
            assert await receive(third) == {"type": "connection_ack"}
            assert len(started) == 2, "the closed socket's init was resolved"
        await wait_until(lambda: gate.free == 1 and not gate.waiting,
                         what="the gate whole again")
        # And it still admits.
        async with ws_connect(addr, ALICE.to_header()) as after:
            await initialise(after)


async def test_an_upgrade_waiting_for_a_handshake_slot_holds_no_parsed_request_nor_task(
    db: Database, endpoints: list[WireEndpoint]
) -> None:
    """With ws_max_handshakes=1 an upgrade waiting for the slot is unanswered
    and holds neither a parsed request or response nor a task of its own
    (only its 101, as it will be written); one whose peer leaves while it waits is
    skipped; the next is answered once the slot frees and serves normally."""
    async with (
        running_engine(db, ws_max_handshakes=1) as engine,
        serving(graphql_app(engine, SCHEMA, resolve_me)) as addr,
        ws_connect(addr, ALICE.to_header()) as first,
    ):
        gate = endpoints[-1].gate(asyncio.get_running_loop())
        host, port = addr.rsplit(":", 1)
        _reader, leaving = await asyncio.open_connection(host, int(port))
        leaving.write(
            b"GET /graphql/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: graphql-transport-ws\r\n\r\n")
        await leaving.drain()
        await wait_until(lambda: len(gate.unanswered) == 1, what="the raw upgrade waiting")
        second = asyncio.ensure_future(ws_connect(addr, ALICE.to_header()).__aenter__())
        await wait_until(lambda: len(gate.unanswered) == 2, what="the second upgrade waiting")
        for socket in gate.unanswered:
            admission = socket.admission
            assert admission is not None and admission.admitting is None
            assert isinstance(admission.unanswered, bytes)
            assert admission.unanswered.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
        leaving.close()
        await wait_until(lambda: gate.unanswered[0]._lost, what="the raw upgrade's peer gone")
        assert not second.done()
        await initialise(first)
        ws2 = await asyncio.wait_for(second, BOUND)
        try:
            assert ws2.subprotocol == "graphql-transport-ws"
            await initialise(ws2)
            await send(ws2, {"id": "1", "type": "subscribe",
                             "payload": {"query": "query { whoami { sub } }"}})
            assert (await receive(ws2))["payload"] == {"data": {"whoami": {"sub": "alice"}}}
            assert not gate.unanswered
        finally:
            await ws2.close()


async def test_a_turn_ends_at_the_first_answer_or_the_bound(db: Database) -> None:
    """With ws_max_attaching=1: an acknowledged socket holds the turn until its
    first operation answers (a second socket's init is not resolved before),
    and one that sends no operation gives the turn up at its bound (here the
    init timeout, shorter than TURN_AFTER_ACK) after its acknowledgement."""
    resolved: list[float] = []

    async def noted(passport: Passport) -> Me:
        resolved.append(asyncio.get_running_loop().time())
        return resolve_me(passport)

    async with (
        gated(db, noted, connection_init_wait_timeout=INIT_TIMEOUT) as addr,
        ws_connect(addr, ALICE.to_header()) as first,
        ws_connect(addr, ALICE.to_header()) as second,
        ws_connect(addr, ALICE.to_header()) as idle,
    ):
        await initialise(first)
        await send(second, {"type": "connection_init"})
        waited = asyncio.ensure_future(second.recv())
        done, _ = await asyncio.wait({waited}, timeout=INIT_TIMEOUT.total_seconds() / 3)
        assert not done and len(resolved) == 1, "a second init ran during the first's turn"
        await send(first, {"id": "1", "type": "subscribe",
                           "payload": {"query": "query { whoami { sub } }"}})
        assert (await receive(first))["type"] == "next"
        assert json.loads(await asyncio.wait_for(waited, BOUND)) == {"type": "connection_ack"}
        # `second` sends nothing more: `idle`'s init waits out the bound.
        acked_at = asyncio.get_running_loop().time()
        await send(idle, {"type": "connection_init"})
        assert await receive(idle) == {"type": "connection_ack"}
        assert resolved[-1] - acked_at >= INIT_TIMEOUT.total_seconds() * 0.5
