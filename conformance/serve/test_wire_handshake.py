"""The upgrade on the engine's own socket (`service_engine.server.wire`):
read once from what uvicorn hands on, validated and answered by websockets'
Sans-I/O `ServerProtocol.accept`, refused as websockets refuses it."""

from __future__ import annotations

import asyncio

from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS

from service_engine import Database
from service_engine.graphql import graphql_app

from ..support.harness import wait_until
from .test_graphql_app import BOUND, SCHEMA, resolve_me, running_engine
from .test_wire import serve


async def _answer_to(addr: str, head: str) -> tuple[bytes, bytes]:
    """Send the upgrade ``head`` raw; the answer's head and body, read up to
    the server's end of the connection."""
    host, port = addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode())
        answer = await asyncio.wait_for(reader.read(), BOUND)
    finally:
        writer.close()
    status, _, body = answer.partition(b"\r\n\r\n")
    return status, body


async def test_an_invalid_upgrade_gets_websockets_refusal_and_holds_no_socket(
    db: Database,
) -> None:
    """An upgrade to the ws path that is not a valid WebSocket handshake (a
    key that is not 16 bytes of base64, no version, version 8, more headers
    or a longer header line than websockets' bounds, a POST) is answered
    with websockets' own refusal (400 / 431 / 405 and its text) and
    closed; a valid one right after is served (101, its accept key and
    subprotocol), and the pod counts no socket for the refused ones."""
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    base = ("GET /graphql/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Protocol: graphql-transport-ws\r\n")
    async with running_engine(db) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me)
        view = app.state.graphql_view
        async with serve(app) as served:
            cases = [
                (base + "Sec-WebSocket-Key: c2hvcnQ=\r\nSec-WebSocket-Version: 13\r\n\r\n",
                 b"HTTP/1.1 400 Bad Request", b"Sec-WebSocket-Key"),
                (base + f"Sec-WebSocket-Key: {key}\r\n\r\n",
                 b"HTTP/1.1 400 Bad Request", b"Sec-WebSocket-Version"),
                (base + f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 8\r\n\r\n",
                 b"HTTP/1.1 400 Bad Request", b"Sec-WebSocket-Version"),
                (base + "".join(f"X-Extra-{i}: {i}\r\n" for i in range(MAX_NUM_HEADERS))
                 + f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n",
                 b"HTTP/1.1 431 Request Header Fields Too Large", b"headers"),
                (base + "X-Long: " + "a" * MAX_LINE_LENGTH
                 + f"\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n",
                 b"HTTP/1.1 431 Request Header Fields Too Large", b"bytes"),
                (base.replace("GET ", "POST ", 1)
                 + f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n",
                 b"HTTP/1.1 405 Method Not Allowed", b"Failed to open a WebSocket connection"),
            ]
            for request, status, text in cases:
                answer, body = await _answer_to(served.addr, request)
                assert answer.startswith(status), (request, answer)
                assert text in body, (request, body)
            assert view.open_sockets == 0
            host, port = served.addr.split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write((base + f"Sec-WebSocket-Key: {key}\r\n"
                              "Sec-WebSocket-Version: 13\r\n\r\n").encode())
                accepted = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
            finally:
                writer.close()
            lines = accepted.split(b"\r\n")
            assert lines[0] == b"HTTP/1.1 101 Switching Protocols"
            assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in lines
            assert b"Sec-WebSocket-Protocol: graphql-transport-ws" in lines
            assert b"server: uvicorn" in lines
            await wait_until(lambda: view.open_sockets == 0, what="the socket released")
