"""The engine's own graphql-transport-ws socket (`service_engine.server.wire`),
served as uvicorn's ``ws`` protocol class: every client script gets the
messages and closes Strawberry's handler behind ASGI answered before the
ASGI socket was retired (recorded in ``wire_transcripts.json`` from both
paths side by side, where they agreed), who serves which path,
WebSocket-level pings both ways, flow control under a reader that stops,
the server's shutdown.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from service_engine import Database
from service_engine.graphql import PASSPORT_HEADER, graphql_app
from service_engine.server.host import _Server, bind_listener, http_config
from service_engine.server.live_op import LiveOp
from service_engine.server.wire import WireSocket

from ..support.harness import wait_until
from .test_graphql_app import (
    ALICE,
    BANNED,
    BOUND,
    PROTOCOL,
    SCHEMA,
    closed,
    initialise,
    receive,
    resolve_me,
    running_engine,
    send,
)

INIT = {"type": "connection_init"}


@dataclass
class Served:
    addr: str
    server: uvicorn.Server


@contextlib.asynccontextmanager
async def serve(app: Any, **uvicorn_options: Any) -> AsyncIterator[Served]:
    """``app`` on a free port as a pod serves it."""
    view = app.state.graphql_view
    config = http_config(app, view.config)
    for name, value in uvicorn_options.items():
        setattr(config, name, value)
    sock = bind_listener("127.0.0.1:0")
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or task.done(), what="uvicorn started")
        assert server.started
        yield Served(f"127.0.0.1:{sock.getsockname()[1]}", server)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, BOUND * 2)
        sock.close()


@contextlib.asynccontextmanager
async def serving(db: Database, **config: Any) -> AsyncIterator[str]:
    """One engine and app on a free port; its ``host:port``."""
    async with running_engine(db, **config) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        async with serve(app) as served:
            yield served.addr


TRANSCRIPTS: dict[str, Any] = json.loads(
    (Path(__file__).with_name("wire_transcripts.json")).read_text())
"""Per script, the messages and close both paths answered on 6265370 (the
ASGI socket and the wire side by side): JSON, so tuples are lists."""


Step = dict[str, Any] | str | bytes

DROPPED = (-1, "dropped without a close frame")


async def transcript(
    addr: str, steps: list[Step], *, expect: int, passport: str | None = ALICE.to_header(),
    subprotocols: list[Any] | None = None,
) -> tuple[list[Any], tuple[int, str] | None]:
    """Send ``steps``, read ``expect`` messages (or up to the close); the
    messages and the close (code, reason), None if still open."""
    headers = {PASSPORT_HEADER: passport} if passport is not None else {}
    received: list[Any] = []
    async with connect(
        f"ws://{addr}/graphql/ws",
        subprotocols=[PROTOCOL] if subprotocols is None else (subprotocols or None),
        additional_headers=headers, open_timeout=BOUND,
    ) as ws:
        try:
            for step in steps:
                await ws.send(json.dumps(step) if isinstance(step, dict) else step)
            while len(received) < expect:
                received.append(json.loads(await asyncio.wait_for(ws.recv(), BOUND)))
            # Still open? A ping is answered by an open socket only.
            await ws.send(json.dumps({"type": "ping"}))
            received.append(json.loads(await asyncio.wait_for(ws.recv(), BOUND)))
        except ConnectionClosed as exc:
            if exc.rcvd is None:
                return received, DROPPED
            return received, (exc.rcvd.code, exc.rcvd.reason)
    return received, None


WHOAMI = {"id": "q", "type": "subscribe", "payload": {"query": "{ whoami { sub } }"}}

SCRIPTS: dict[str, tuple[list[Step], int]] = {
    # name: (what the client sends, how many messages it reads before the end)
    "init_then_ping": ([INIT, {"type": "ping"}], 2),
    "pong_is_ignored": ([INIT, {"type": "pong"}, {"type": "ping"}], 2),
    "subscribe_before_ack": ([WHOAMI], 0),
    "repeated_init": ([INIT, INIT], 1),
    "init_payload_not_an_object": ([{"type": "connection_init", "payload": "x"}], 0),
    "init_payload_null": ([{"type": "connection_init", "payload": None}], 0),
    "not_json": ([INIT, "{not json"], 1),
    "not_an_object": ([INIT, "[1, 2]"], 1),
    "binary": ([INIT, b"\x00\x01"], 1),
    "unknown_type": ([INIT, {"type": "what"}], 1),
    "no_type": ([INIT, {"id": "1"}], 1),
    "subscribe_without_id": ([INIT, {"type": "subscribe", "payload": {"query": "{ pod }"}}], 1),
    "subscribe_without_query": ([INIT, {"id": "1", "type": "subscribe", "payload": {}}], 1),
    "complete_without_id": ([INIT, {"type": "complete"}], 1),
    "complete_of_nothing": ([INIT, {"id": "x", "type": "complete"}, {"type": "ping"}], 2),
    "query": ([INIT, WHOAMI], 3),
    "variables_and_operation_name": ([INIT, {"id": "v", "type": "subscribe", "payload": {
        "query": "subscription Q($n: Int!) { count(upTo: $n) } query P { pod }",
        "variables": {"n": 2}, "operationName": "Q"}}], 4),
    "variables_that_fail": ([INIT, {"id": "v", "type": "subscribe", "payload": {
        "query": "subscription Q($n: Int!) { count(upTo: $n) }", "variables": {"n": "x"}}}], 2),
    "validation_error": ([INIT, {"id": "e", "type": "subscribe",
                                 "payload": {"query": "{ nope }"}}], 2),
    "syntax_error": ([INIT, {"id": "s", "type": "subscribe",
                             "payload": {"query": "{ whoami"}}], 1),
    "unknown_operation_name": ([INIT, {"id": "n", "type": "subscribe", "payload": {
        "query": "query A { pod } query B { pod }", "operationName": "C"}}], 1),
    "subscription_streams": ([INIT, {"id": "c", "type": "subscribe", "payload": {
        "query": "subscription { count(upTo: 3) }"}}], 5),
    "typed_live_union": ([INIT, {"id": "u", "type": "subscribe", "payload": {"query": """
        subscription { cards { __typename
            ... on CardsReset { revision keys views { title } }
            ... on CardsUpsert { revision key view { title } cause { name data } }
            ... on LanesPaused { lanes } } }"""}}], 5),
    "completed_live_then_ping": ([INIT, {"id": "w", "type": "subscribe", "payload": {
        "query": "subscription { whoamiLive }"}}], 2),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
async def test_the_wire_answers_every_script_as_the_asgi_socket_did(
    db: Database, script: str
) -> None:
    """The same client script gets the same messages, in order, and the
    same close (code and reason) as Strawberry's handler behind ASGI gave:
    ack, pong, 4400 / 4401 / 4429 refusals with their reasons, queries,
    variables, validation and syntax errors, streamed subscriptions, the
    typed live union. (A JSON message that is not an object dropped the
    ASGI socket; the wire closes it 4400.)"""
    steps, expect = SCRIPTS[script]
    async with serving(db) as addr:
        received, close = await transcript(addr, steps, expect=expect)
    assert json.loads(json.dumps([received, close])) == TRANSCRIPTS[script]


async def test_refusals_at_the_upgrade_and_the_init_are_as_they_were(db: Database) -> None:
    """No passport (4403 passport_missing), a refused passport (4403
    passport_refused), no graphql-transport-ws subprotocol (accepted, closed
    4406), a duplicate operation id (4409), the socket's subscription bound
    (a typed error, the socket stays): as both paths answered them."""
    async with serving(db, ws_max_subscriptions_per_socket=1) as addr:
        results: list[Any] = [
            await transcript(addr, [INIT], expect=0, passport=None),
            await transcript(addr, [INIT], expect=0, passport=BANNED.to_header()),
            await transcript(addr, [INIT], expect=0, subprotocols=[]),
            await _duplicate(addr),
            await _past_the_bound(addr),
        ]
    assert json.loads(json.dumps(results)) == TRANSCRIPTS["_refusals"]
    no_passport, banned, no_protocol, duplicate, bound = results
    assert no_passport[1][0] == 4403 and no_passport[1][1].startswith("passport_missing")
    assert banned[1][0] == 4403 and banned[1][1].startswith("passport_refused")
    assert no_protocol == ([], (4406, "Subprotocol not acceptable"))
    assert duplicate == (4409, "Subscriber for w already exists")
    assert bound["type"] == "error"
    assert bound["payload"][0]["extensions"]["code"] == "too_many_subscriptions"


async def _duplicate(addr: str) -> tuple[int, str]:
    async with _socket(addr) as ws:
        live = {"id": "w", "type": "subscribe", "payload": {"query": "subscription { whoamiLive }"}}
        await send(ws, live)
        assert (await receive(ws))["type"] == "next"
        await send(ws, live)
        close = await closed(ws)
        assert close.rcvd is not None
        return close.rcvd.code, close.rcvd.reason


async def _past_the_bound(addr: str) -> dict[str, Any]:
    async with _socket(addr) as ws:
        await send(ws, {"id": "a", "type": "subscribe",
                        "payload": {"query": "subscription { whoamiLive }"}})
        assert (await receive(ws))["type"] == "next"
        await send(ws, {"id": "b", "type": "subscribe",
                        "payload": {"query": "subscription { whoamiLive }"}})
        refused = await receive(ws)
        # The socket stays: it still answers.
        await send(ws, {"type": "ping"})
        assert await receive(ws) == {"type": "pong"}
        return refused


@contextlib.asynccontextmanager
async def _socket(addr: str) -> AsyncIterator[ClientConnection]:
    async with connect(f"ws://{addr}/graphql/ws", subprotocols=[PROTOCOL],
                       additional_headers={PASSPORT_HEADER: ALICE.to_header()},
                       open_timeout=BOUND) as ws:
        await initialise(ws)
        yield ws


async def test_the_ws_path_is_a_wire_socket_and_every_other_upgrade_stays_asgi(
    db: Database,
) -> None:
    """The app's ws path is served by a `WireSocket` (no ASGI task for it);
    another WebSocket route of the same app still goes through ASGI (the
    wire hands that connection to uvicorn's own WebSocket protocol)."""

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    async with running_engine(db) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me, routes=[WebSocketRoute("/echo", echo)])
        async with serve(app) as served, _socket(served.addr) as ws:
            await send(ws, {"type": "ping"})
            assert await receive(ws) == {"type": "pong"}
            connections = served.server.server_state.connections
            assert all(isinstance(c, WireSocket) for c in connections), connections
            assert not served.server.server_state.tasks
            async with connect(f"ws://{served.addr}/echo", open_timeout=BOUND) as other:
                await other.send("hello")
                assert await asyncio.wait_for(other.recv(), BOUND) == "hello"
            await send(ws, {"type": "ping"})
            assert await receive(ws) == {"type": "pong"}


async def test_websocket_pings_are_answered_and_keepalive_closes_a_silent_peer(
    db: Database,
) -> None:
    """A client's WebSocket ping gets its pong; the server's keepalive pings
    (uvicorn's ws_ping_interval / ws_ping_timeout) keep an answering client
    open and close one that never answers with 1011."""
    async with running_engine(db) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        async with serve(app, ws_ping_interval=0.1, ws_ping_timeout=0.3) as served:
            async with _socket(served.addr) as ws:
                pong = await ws.ping()
                await asyncio.wait_for(pong, BOUND)
                # Several keepalive rounds later the answering client is open.
                connections: set[Any] = served.server.server_state.connections
                (wire,) = [c for c in connections if isinstance(c, WireSocket)]
                first = wire.deadlines.ping_sent_at
                await wait_until(lambda: wire.deadlines.ping_sent_at - first >= 0.25,
                                 what="three more keepalive pings answered")
                await send(ws, {"type": "ping"})
                assert await receive(ws) == {"type": "pong"}
            raw = await _raw_upgrade(served.addr)
            try:
                frames = await asyncio.wait_for(_read_until_close(raw), BOUND)
            finally:
                raw.close()
            assert 0x9 in [opcode for opcode, _ in frames]  # a ping came
            code = struct.unpack("!H", frames[-1][1][:2])[0]
            assert code == 1011


async def _raw_upgrade(addr: str, *, rcvbuf: int | None = None,
                       passport: str = ALICE.to_header()) -> socket.socket:
    host, port = addr.split(":")
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.connect((host, int(port)))
    raw.setblocking(False)
    key = base64.b64encode(os.urandom(16)).decode()
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(raw, (
        f"GET /graphql/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Protocol: graphql-transport-ws\r\n"
        f"{PASSPORT_HEADER}: {passport}\r\n\r\n").encode())
    return raw


async def _read_until_close(raw: socket.socket) -> list[tuple[int, bytes]]:
    """Read the upgrade answer, then server frames up to a close frame."""
    loop = asyncio.get_running_loop()
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += await loop.sock_recv(raw, 65536)
    head, _, buffer = buffer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    frames: list[tuple[int, bytes]] = []
    while True:
        while len(buffer) < 2 or len(buffer) < 2 + (buffer[1] & 0x7F):
            chunk = await loop.sock_recv(raw, 65536)
            if not chunk:
                return frames
            buffer += chunk
        opcode, size = buffer[0] & 0x0F, buffer[1] & 0x7F
        assert size < 126
        frames.append((opcode, buffer[2:2 + size]))
        buffer = buffer[2 + size:]
        if opcode == 0x8:
            return frames


async def test_shutdown_closes_wire_sockets_1012_and_stops_their_operations(
    db: Database,
) -> None:
    """The server's shutdown closes every wire socket with 1012 (service
    restart) and stops its operations; the pod's socket count returns to 0."""
    async with running_engine(db) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        view = app.state.graphql_view
        async with serve(app) as served, _socket(served.addr) as ws:
            await send(ws, {"id": "w", "type": "subscribe",
                            "payload": {"query": "subscription { whoamiLive }"}})
            assert (await receive(ws))["type"] == "next"
            served.server.should_exit = True
            close = await closed(ws)
            assert close.rcvd is not None and close.rcvd.code == 1012
        assert view.open_sockets == 0


@pytest.mark.slow
async def test_a_reader_that_stops_pauses_its_operation_and_shutdown_aborts_it_past_the_grace(
    db: Database,
) -> None:
    """A client that stops reading while an operation streams: the wire's
    transport buffer stays bounded (the operation waits while writing is
    paused, it does not queue without end), and a stopping pod aborts the
    socket past its grace instead of waiting on it forever."""
    async with running_engine(db) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        async with serve(app, timeout_graceful_shutdown=1) as served:
            raw = await _raw_upgrade(served.addr, rcvbuf=4096)
            loop = asyncio.get_running_loop()
            try:
                # A client sends its first message once the upgrade is answered.
                answer = b""
                while b"\r\n\r\n" not in answer:
                    answer += await asyncio.wait_for(loop.sock_recv(raw, 1), BOUND)
                assert answer.startswith(b"HTTP/1.1 101"), answer
                await loop.sock_sendall(raw, _masked(json.dumps(INIT).encode()))
                await loop.sock_sendall(raw, _masked(json.dumps({
                    "id": "c", "type": "subscribe",
                    "payload": {"query": "subscription { count(upTo: 1000000) }"}}).encode()))

                def wire_socket() -> WireSocket | None:
                    for connection in served.server.server_state.connections:
                        if isinstance(connection, WireSocket):
                            return connection
                    return None

                await wait_until(lambda: (s := wire_socket()) is not None and not s.writable,
                                 what="the wire socket paused writing")
                socket_ = wire_socket()
                assert socket_ is not None
                assert socket_.writer.paused and not socket_.writer.closed  # paused, not closed
                buffered = socket_.transport.get_write_buffer_size()
                # Paused: the operation waits on the socket; the buffer does not grow.
                await wait_until(lambda: bool(socket_.writer.waiters),
                                 what="the operation waits for the socket to drain")
                assert socket_.transport.get_write_buffer_size() == buffered
                assert buffered < 1024 * 1024
                served.server.should_exit = True
                await wait_until(lambda: wire_socket() is None, timeout=BOUND * 2,
                                 what="the socket aborted past the grace")
            finally:
                raw.close()


def _masked(payload: bytes) -> bytes:
    """A client's masked text frame."""
    mask = os.urandom(4)
    size = len(payload)
    head = bytes([0x81, 0x80 | size]) if size < 126 else struct.pack("!BBH", 0x81, 0xFE, size)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_closed_wire_sockets_leave_no_count_slot_or_connection(db: Database) -> None:
    """Sockets opened and closed on the wire (initialised or not, with live
    operations or not) leave the pod's socket count, handshake slots and the
    server's connections as they were."""
    async with running_engine(db, ws_max_handshakes=8) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        view = app.state.graphql_view
        async with serve(app) as served:

            async def one(i: int) -> None:
                async with connect(f"ws://{served.addr}/graphql/ws", subprotocols=[PROTOCOL],
                                   additional_headers={PASSPORT_HEADER: ALICE.to_header()},
                                   open_timeout=BOUND * 4) as ws:
                    if i % 3:
                        await initialise(ws)
                    if i % 3 == 2:
                        await send(ws, {"id": "w", "type": "subscribe",
                                        "payload": {"query": "subscription { whoamiLive }"}})
                        assert (await receive(ws))["type"] == "next"

            await asyncio.gather(*(one(i) for i in range(60)))
            await wait_until(lambda: not served.server.server_state.connections,
                             what="every connection gone")
            assert view.open_sockets == 0
            assert not view.handshakes.full()
            assert view.handshakes.free == 8


@pytest.fixture
async def example_store(pg_server: Any) -> AsyncIterator[Any]:
    from ..support.example_support import example_database

    async with example_database(pg_server) as provisioned:
        yield provisioned


async def _read_frames(raw: socket.socket, buffer: bytes) -> tuple[list[bytes], bytes]:
    """Whole server text frames read so far (at least one), and the rest
    (a keepalive ping is answered, not returned)."""
    loop = asyncio.get_running_loop()
    out: list[bytes] = []
    while not out:
        while True:
            if len(buffer) >= 2:
                size, start = buffer[1] & 0x7F, 2
                if size == 126 and len(buffer) >= 4:
                    size, start = struct.unpack("!H", buffer[2:4])[0], 4
                elif size == 127 and len(buffer) >= 10:
                    size, start = struct.unpack("!Q", buffer[2:10])[0], 10
                if (size < 126 or start > 2) and len(buffer) >= start + size:
                    opcode, payload = buffer[0], buffer[start:start + size]
                    buffer = buffer[start + size:]
                    if opcode == 0x89:  # the server's keepalive ping (a loaded run outlasts
                        # its interval): answered with a masked pong, as a client does
                        await loop.sock_sendall(raw, bytes([0x8A, 0x80 | size, 0, 0, 0, 0]) + payload)
                        continue
                    assert opcode == 0x81, bytes([opcode])
                    out.append(payload)
                    continue
            break
        if not out:
            chunk = await asyncio.wait_for(loop.sock_recv(raw, 65536), BOUND)
            assert chunk, "the server closed the socket"
            buffer += chunk
    return out, buffer


async def raw_live_subscription(raw: socket.socket, query: str) -> tuple[dict[str, Any], bytes]:
    """On a raw upgraded socket (`_raw_upgrade`): read the upgrade's answer,
    send ``connection_init`` and subscribe ``query`` as operation "live";
    its first message after the ack and the bytes read past it."""
    loop = asyncio.get_running_loop()
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += await loop.sock_recv(raw, 65536)
    buffer = buffer.partition(b"\r\n\r\n")[2]
    await loop.sock_sendall(raw, _masked(json.dumps(INIT).encode()))
    await loop.sock_sendall(raw, _masked(json.dumps({
        "id": "live", "type": "subscribe", "payload": {"query": query}}).encode()))
    got, buffer = await _read_frames(raw, buffer)
    assert json.loads(got[0]) == {"type": "connection_ack"}
    if len(got) == 1:
        more, buffer = await _read_frames(raw, buffer)
        got += more
    return json.loads(got[1]), buffer


def tiny_send_buffer(wire: WireSocket) -> None:
    """A tiny send buffer on the server's side of ``wire``: its transport
    pauses after a few frames."""
    server_sock = wire.transport.get_extra_info("socket")
    server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    wire.transport.set_write_buffer_limits(high=2048, low=512)


async def test_a_live_op_whose_reader_stops_is_paused_and_converges_when_it_reads_again(
    example_store: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A known-planned live subscription on the wire (a LiveOp in callback
    mode) whose client stops reading: once the transport pauses writing
    the op takes nothing more (its frames are not queued without end while
    writes go on), and when the client reads again it receives frames with
    contiguous revisions (or a Reset) ending at the latest state."""
    from ..blackbox.harness import ADMIN, BOARDS_SUBSCRIPTION, CREATE, RENAME
    from ..support.example_support import example_config, running

    sockets: list[WireSocket] = []
    real_init = WireSocket.__init__

    def spy(self: WireSocket, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        sockets.append(self)

    monkeypatch.setattr(WireSocket, "__init__", spy)
    async with running(example_store, ["board"], config=example_config()) as run, \
            run.socket(ADMIN) as first:
        # The document's first subscribe (through Strawberry) makes it known.
        await first.subscribe("learn", BOARDS_SUBSCRIPTION)
        await first.next("learn")
        created = await run.gql(CREATE, {"id": "b-flow", "title": "t-start"}, ADMIN)
        assert created["createBoard"]["success"], created
        await first.next("learn")
        raw = await _raw_upgrade(run.addr, rcvbuf=4096, passport=ADMIN.to_header())
        try:
            reset, buffer = await raw_live_subscription(raw, BOARDS_SUBSCRIPTION)
            wire = sockets[-1]
            assert reset["payload"]["data"]["boards"]["__typename"] == "BoardsReset"
            assert wire.operations is not None
            assert isinstance(wire.operations.ops.get("live"), LiveOp)
            tiny_send_buffer(wire)
            title = ""
            for n in range(400):
                title = f"t{n}-" + "x" * 190
                renamed = await run.gql(RENAME, {"id": "b-flow", "title": title}, ADMIN)
                assert renamed["renameBoard"]["success"], renamed
                if not wire.writable and n >= 20:
                    break
            assert not wire.writable, "the transport never paused"
            assert wire.writer.paused and not wire.writer.closed  # paused, not closed
            op = wire.operations.ops["live"]
            assert isinstance(op, LiveOp)
            held = wire.transport.get_write_buffer_size()
            # Paused: more writes commit and are rendered into the session; the
            # op takes none of them and queues nothing on the socket.
            for n in range(20):
                title = f"u{n}-" + "y" * 190
                await run.gql(RENAME, {"id": "b-flow", "title": title}, ADMIN)
            stream = op._stream
            assert stream is not None
            await wait_until(lambda: stream.pending() > 0, what="deltas waiting, untaken")
            assert wire.transport.get_write_buffer_size() == held
            # Reading again: contiguous revisions (or a Reset) up to the latest title.
            revision = reset["payload"]["data"]["boards"]["revision"]
            latest = ""
            while latest != title:
                frames, buffer = await _read_frames(raw, buffer)
                for frame in frames:
                    message = json.loads(frame)
                    assert message["id"] == "live" and message["type"] == "next", message
                    member = message["payload"]["data"]["boards"]
                    if member["__typename"] == "BoardsReset":
                        revision = member["revision"]
                        latest = next(v["title"] for v in member["views"] if v["id"] == "b-flow")
                        continue
                    assert member["revision"] == revision + 1, (member["revision"], revision)
                    revision = member["revision"]
                    if member["__typename"] == "BoardsUpsert" and member["key"] == '"b-flow"':
                        latest = member["view"]["title"]
        finally:
            raw.close()


async def test_origins_and_a_stopping_pod_are_refused_403(db: Database) -> None:
    """A cross-origin page not in allowed_origins is refused at the upgrade
    (HTTP 403) and an allowed or same-origin one is served; a pod shutting
    down refuses every upgrade with 403."""
    from websockets.exceptions import InvalidStatus
    from websockets.typing import Origin

    async with running_engine(db) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me, allowed_origins=["https://ok.example"])
        async with serve(app) as served:
            url = f"ws://{served.addr}/graphql/ws"
            headers = {PASSPORT_HEADER: ALICE.to_header()}
            with pytest.raises(InvalidStatus) as refused:
                async with connect(url, subprotocols=[PROTOCOL], additional_headers=headers,
                                   origin=Origin("https://evil.example"), open_timeout=BOUND):
                    pass
            assert refused.value.response.status_code == 403
            for origin in ("https://ok.example", f"http://{served.addr}"):
                async with connect(url, subprotocols=[PROTOCOL], additional_headers=headers,
                                   origin=Origin(origin), open_timeout=BOUND) as ws:
                    await initialise(ws)
        engine.shutdown()
        await wait_until(lambda: engine.shutting_down, what="the engine stopping")
        async with serve(app) as served:
            with pytest.raises(InvalidStatus) as refused:
                async with connect(f"ws://{served.addr}/graphql/ws", subprotocols=[PROTOCOL],
                                   open_timeout=BOUND):
                    pass
            assert refused.value.response.status_code == 403


async def _ack_frame_head(addr: str) -> tuple[bytes, int]:
    """Upgrade offering permessage-deflate, send connection_init; the answer's
    headers and the first byte of the first frame after it (its RSV1 bit set:
    the frame is compressed)."""
    host, port = addr.split(":")
    loop = asyncio.get_running_loop()
    raw = socket.socket()
    raw.setblocking(False)
    await loop.sock_connect(raw, (host, int(port)))
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        await loop.sock_sendall(raw, (
            f"GET /graphql/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: graphql-transport-ws\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
            f"{PASSPORT_HEADER}: {ALICE.to_header()}\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += await asyncio.wait_for(loop.sock_recv(raw, 65536), BOUND)
        head, _, buf = buf.partition(b"\r\n\r\n")
        payload = json.dumps(INIT).encode()
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        await loop.sock_sendall(raw, bytes([0x81, 0x80 | len(payload)]) + mask + masked)
        while not buf:
            buf += await asyncio.wait_for(loop.sock_recv(raw, 65536), BOUND)
        return head, buf[0]
    finally:
        raw.close()


async def test_per_message_deflate_compresses(db: Database) -> None:
    """With ws_per_message_deflate on, a client offering permessage-deflate gets it
    negotiated and compressed frames (RSV1 set)."""
    async with running_engine(db, ws_per_message_deflate=True) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        async with serve(app) as served:
            head, first = await _ack_frame_head(served.addr)
        assert b"sec-websocket-extensions: permessage-deflate" in head.lower(), head
        assert first == 0xC1, hex(first)
