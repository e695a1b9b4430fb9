"""A stopping pod is not held open by a peer that stopped reading."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
from typing import Any

import pytest

from service_engine.config import EngineConfig
from service_engine.server.host import _Server, http_config

from ..support.harness import wait_until


@pytest.mark.timeout(60)
def test_shutdown_ends_past_its_grace_with_a_socket_whose_peer_stopped_reading() -> None:
    """A WebSocket whose client stopped reading (its send buffer full) would
    keep uvicorn's graceful shutdown waiting forever for the bytes to drain;
    past the grace the pod cancels the connection's task, aborts its
    transport and its serve loop returns."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        while True:
            await send({"type": "websocket.send", "text": "x" * 65_536})

    async def scenario() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = _Server(http_config(app, EngineConfig(), shutdown_grace=1))
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        client = None
        try:
            await wait_until(lambda: bool(server.started), what="the server started")
            client = socket.create_connection(("127.0.0.1", port))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            key = base64.b64encode(os.urandom(16)).decode()
            client.sendall(
                f"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
            )

            def blocked() -> bool:
                # The client reads nothing: the server's own buffer fills.
                return any(
                    getattr(c, "transport", None) is not None
                    and c.transport.get_write_buffer_size() > 0
                    for c in server.server_state.connections
                )

            await wait_until(blocked, timeout=20, what="the server's send buffer filled")
            server.should_exit = True
            async with asyncio.timeout(15):
                await serving
            # Nothing of the connection is left open behind the server.
            await wait_until(lambda: not server.server_state.connections,
                             what="the stalled connection closed")
        finally:
            if client is not None:
                client.close()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            sock.close()

    asyncio.run(scenario())
