"""A lean WebSocket client for the benchmarks' subscribers: websockets'
own protocol (``websockets.client.ClientProtocol``: the handshake, framing,
masking, ping answers, the closing handshake) driven straight from an
asyncio ``Protocol``, each text message handed to a callback as it is parsed.

The ``websockets`` asyncio client puts every message through its assembler,
a queue and a future before the reader's ``async for`` sees it: ~39 µs of
the bench's CPU per delivery at 1,000 subscribers, more than the service's
own ~26 µs, on the same two cores. The bytes on the wire are the same (no
per-message deflate offered, as ``compression=None`` asked before).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

OPEN_TIMEOUT = 120
"""Seconds a connection and its handshake may take (a 10,000-socket burst)."""


class LeanSocket(asyncio.Protocol):
    """One client connection; `connect` opens it. Text messages go to
    ``on_text`` once it is set, to `recv` before."""

    def __init__(self, uri: str, headers: dict[str, str], subprotocol: Subprotocol) -> None:
        loop = asyncio.get_running_loop()
        self._protocol = ClientProtocol(parse_uri(uri), subprotocols=[subprotocol], max_size=None)
        self._request = self._protocol.connect()
        for name, value in headers.items():
            self._request.headers[name] = value
        self._transport: asyncio.Transport | None = None
        self._opened: asyncio.Future[None] = loop.create_future()
        self._closed: asyncio.Future[None] = loop.create_future()
        self._pending: deque[str] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._fragments: list[bytes] | None = None
        self.on_text: Callable[[str], None] | None = None

    @classmethod
    async def connect(cls, addr: str, path: str, headers: dict[str, str],
                      subprotocol: Subprotocol) -> LeanSocket:
        """Connected and through the handshake, within ``OPEN_TIMEOUT``."""
        host, port = addr.rsplit(":", 1)
        socket = cls(f"ws://{addr}{path}", headers, subprotocol)
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.create_connection(lambda: socket, host, int(port)),
                               OPEN_TIMEOUT)
        await asyncio.wait_for(asyncio.shield(socket._opened), OPEN_TIMEOUT)
        return socket

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._protocol.send_request(self._request)
        self._flush()

    def data_received(self, data: bytes) -> None:
        protocol = self._protocol
        protocol.receive_data(data)
        for event in protocol.events_received():
            if isinstance(event, Frame):
                self._frame(event)
            elif isinstance(event, Response) and not self._opened.done():
                if protocol.handshake_exc is not None:
                    self._opened.set_exception(protocol.handshake_exc)
                else:
                    self._opened.set_result(None)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._protocol.receive_eof()
        if not self._opened.done():
            self._opened.set_exception(ConnectionError("closed before the handshake"))
        if not self._closed.done():
            self._closed.set_result(None)
        self._wake()

    # -- messages -----------------------------------------------------------------------

    def _frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.TEXT or frame.opcode is Opcode.CONT:
            if self._fragments is not None or not frame.fin:
                self._fragments = (self._fragments or []) + [frame.data]
                if not frame.fin:
                    return
                data, self._fragments = b"".join(self._fragments), None
            else:
                data = frame.data
            text = data.decode()
            if self.on_text is not None:
                self.on_text(text)
            else:
                self._pending.append(text)
                self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _flush(self) -> None:
        transport = self._transport
        if transport is None:
            return
        for data in self._protocol.data_to_send():
            if data:
                transport.write(data)
            elif transport.can_write_eof():
                transport.write_eof()

    def send_text(self, text: str) -> None:
        self._protocol.send_text(text.encode())
        self._flush()

    async def recv(self) -> str:
        """The next text message (before ``on_text`` is set)."""
        while not self._pending:
            if self._closed.done():
                raise ConnectionError("closed")
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._pending.popleft()

    async def close(self) -> None:
        """The closing handshake (1000), then the connection closed."""
        if self._closed.done() or self._transport is None:
            return
        try:
            self._protocol.send_close(1000)  # refused once the server began closing
            self._flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._closed), 10)
        finally:
            self._transport.close()
