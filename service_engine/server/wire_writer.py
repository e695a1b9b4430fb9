"""A socket's writer: text frames, flow control and the close."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from strawberry.http.exceptions import WebSocketDisconnected
from websockets.exceptions import InvalidState

from . import wire_protocol as wp
from .live_op import LiveOp
from .wire_state import GATE_HOLDING, SocketState

__all__ = ["SocketWriter"]

_log = logging.getLogger(__name__)


_CLOSE_TIMEOUT = 10.0
"""Seconds a sent close frame waits for the peer's echo (uvicorn's close_timeout)."""


class SocketWriter(SocketState):
    """Writes and flow control: while the transport's buffer is past its
    high-water mark (``pause_writing``) an operation's send waits and the
    live operations take nothing (their sessions collapse, as any slow
    subscriber's do) until ``resume_writing``; the close handshake."""

    __slots__ = ()

    def pause_writing(self) -> None:
        self._paused = True
        for operation in self._ops.values():
            if isinstance(operation, LiveOp):
                operation.pause()

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers()
        for operation in list(self._ops.values()):
            if isinstance(operation, LiveOp):
                operation.resume()

    def _wake_writers(self) -> None:
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    async def send_json(self, message: Mapping[str, object]) -> None:
        """Send one message when the socket is writable (Strawberry's
        ``send_json``; raises `WebSocketDisconnected` once it is closed)."""
        if self._gate is GATE_HOLDING:
            self._leave_gate()  # an operation's first answer
        if self._paused and not self._closed:
            await self._writable()
        if self._closed:
            raise WebSocketDisconnected
        self._write(self._endpoint.encode_json(message).encode())

    async def _writable(self) -> None:
        waiter = self.loop.create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        await waiter

    def _write(self, text: bytes) -> None:
        """Write one text message now (the transport buffers it)."""
        if self._closed:
            return
        if self._deflate:
            self.conn.send_text(text)
            self._flush()
        else:
            self.transport.write(wp.text_frame(text))

    def write_texts(self, texts: list[str]) -> None:
        """Write several text messages in one ``transport.write``."""
        if self._closed or not texts:
            return
        if self._deflate:
            for text in texts:
                self.conn.send_text(text.encode())
            self._flush()
            return
        frame = wp.text_frame
        if len(texts) == 1:
            self.transport.write(frame(texts[0].encode()))
            return
        self.transport.write(b"".join([frame(text.encode()) for text in texts]))

    @property
    def writable(self) -> bool:
        """The transport's buffer is under its high-water mark."""
        return not self._paused and not self._closed

    def _flush(self) -> None:
        output = self.conn.data_to_send()
        if output:
            self.transport.write(b"".join(output))

    def close(self, code: int, reason: str) -> None:
        """Send a close frame and end the socket's work (the peer's echo,
        or a bound, closes the transport)."""
        if self._closed or self._lost:
            return
        self._ended()
        self._closed = True
        try:
            self.conn.send_close(code, wp.fit_close_reason(reason))
        except InvalidState:
            self.transport.close()
            return
        self._flush()
        self._inbox = None
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        self._wake_writers()
        self._close_at = self.loop.time() + _CLOSE_TIMEOUT
        self._arm()

    def _close_now(self) -> None:
        """Our close frame went: close the transport now, not at the bound."""
        if self._close_at is not None:
            self._close_at = None
            self._arm()
        self.transport.close()

    def _peer_closed(self) -> None:
        if self._closed:
            self._close_now()  # the peer echoed our close frame: done
            return
        self._ended()
        self._closed = True
        self._flush()  # websockets queued the echo
        self.transport.close()
