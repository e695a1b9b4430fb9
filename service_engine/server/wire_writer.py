"""A socket's writer: its text frames, the flow control of its transport
and its close frame (a unit of `service_engine.server.wire.WireSocket`)."""

from __future__ import annotations

import asyncio

from websockets.exceptions import InvalidState
from websockets.server import ServerProtocol

from . import wire_protocol as wp

__all__ = ["SocketWriter"]


class SocketWriter:
    """Writes one socket's frames on its transport, fused into one
    ``transport.write`` where it can (through websockets' `ServerProtocol`
    once per-message deflate is negotiated: ``deflate``). While the
    transport's buffer is past its high-water mark (`pause`) `wait_writable`
    waits, until `resume` or the close; once `closed` nothing more is written."""

    __slots__ = ("closed", "conn", "deflate", "paused", "transport", "waiters")

    def __init__(self, transport: asyncio.Transport, conn: ServerProtocol) -> None:
        self.transport = transport
        self.conn = conn
        self.deflate = False
        self.paused = False
        self.closed = False
        self.waiters: list[asyncio.Future[None]] | None = None
        """The senders waiting for `resume` (`wait_writable`)."""

    @property
    def writable(self) -> bool:
        """The transport's buffer is under its high-water mark, and the socket open."""
        return not self.paused and not self.closed

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self.wake()

    def wake(self) -> None:
        """Wake every sender waiting in `wait_writable`."""
        waiters, self.waiters = self.waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    async def wait_writable(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait while paused (until `resume`, the close or the connection's loss)."""
        if self.paused and not self.closed:
            waiter = loop.create_future()
            if self.waiters is None:
                self.waiters = []
            self.waiters.append(waiter)
            await waiter

    def write(self, text: bytes) -> None:
        """Write one text message now (the transport buffers it)."""
        if self.closed:
            return
        if self.deflate:
            self.conn.send_text(text)
            self.flush()
        else:
            self.transport.write(wp.text_frame(text))

    def write_texts(self, texts: list[str]) -> None:
        """Write several text messages in one ``transport.write``."""
        if self.closed or not texts:
            return
        if self.deflate:
            for text in texts:
                self.conn.send_text(text.encode())
            self.flush()
            return
        frame = wp.text_frame
        if len(texts) == 1:
            self.transport.write(frame(texts[0].encode()))
            return
        self.transport.write(b"".join([frame(text.encode()) for text in texts]))

    def flush(self) -> None:
        """Write what websockets queued (a pong, a ping, a close, a deflated frame)."""
        output = self.conn.data_to_send()
        if output:
            self.transport.write(b"".join(output))

    def send_close(self, code: int, reason: str) -> bool:
        """Send a close frame (``reason`` cut to fit) and write nothing after
        it; False when websockets can no longer send one (the transport is
        closed instead)."""
        self.closed = True
        try:
            self.conn.send_close(code, wp.fit_close_reason(reason))
        except InvalidState:
            self.transport.close()
            return False
        self.flush()
        self.wake()
        return True
