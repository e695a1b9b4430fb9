"""The engine's own graphql-transport-ws socket: a protocol object on the
connection, not an ASGI app.

`WireEndpoint.protocol_class` is passed as uvicorn's documented ``ws``
protocol option (``host.http_config``): on every upgrade uvicorn's HTTP
protocol builds one (keywords ``config``, ``server_state``, ``app_state``),
sets it on the transport and feeds it the upgrade's bytes. The socket
reads them (`wire_admission.read_upgrade`: uvicorn already parsed them)
and answers through websockets' Sans-I/O `ServerProtocol`, which then
parses the frames; an upgrade on another path is handed to uvicorn's own
websockets-sansio protocol. From then on: frames in, each message's step
decided by the pure `service_engine.server.wire_protocol` (Strawberry's
handler's decisions, close codes and reasons, with the engine's
overrides), frames out.

`WireSocket` is the I/O adapter: it owns the transport and the websockets
connection, and dispatches each step to its units, objects of their own
holding their own state: handshake and admission
(`wire_admission.SocketAdmission`, dropped once the socket is admitted),
deadlines and keepalive (`wire_deadlines.SocketDeadlines`), operations
(`wire_operations.SocketOperations`, made at the first ``subscribe``), the
writer with its flow control (`wire_writer.SocketWriter`). A unit that
needs the socket names what it needs in a `typing.Protocol` (``Host``).
An idle session is this object, its writer, its deadlines, its
operations, its websockets connection, its transport and its soonest
deadline in the endpoint's `DeadlineWheel`: no task, scope or timer
handle of its own. ASGI middleware does not see this socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast
from urllib.parse import unquote

import uvicorn
from uvicorn.server import ServerState
from websockets.exceptions import InvalidState, PayloadTooBig
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Close as CloseFrame
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from . import wire_protocol as wp
from .app import (
    SESSION_MAX_AGE_CLOSE_CODE,
    SESSION_MAX_AGE_CLOSE_REASON,
    GraphQLContext,
    _EngineGraphQL,
)
from .live_op import LiveOp
from .live_ops import LiveOps
from .wire_admission import GATE_HOLDING, GATE_NONE, AttachGate, SocketAdmission, WireRequest
from .wire_deadlines import CLOSE, INIT, MAX_AGE, PING, PONG, TURN, DeadlineWheel, SocketDeadlines
from .wire_operations import Drains, Operation, SocketOperations
from .wire_writer import SocketWriter

__all__ = ["WireEndpoint", "WireRequest", "WireSocket"]

_log = logging.getLogger(__name__)


class WireEndpoint:
    """One app's graphql-transport-ws endpoint as the wire serves it: the
    view's bounds and hooks, looked up once."""

    def __init__(self, view: _EngineGraphQL) -> None:
        self.view = view
        self.config = view.config
        self.path = view.ws_path
        self.schema = view.schema
        self.limit = view.config.ws_max_message_bytes
        self.max_operations = view.config.ws_max_subscriptions_per_socket
        self.init_timeout = view.connection_init_wait_timeout.total_seconds()
        self.max_age = view.session_max_age.total_seconds()
        self.encode_json = view.encode_json
        self.live_ops: LiveOps = view.live_ops
        self.pong = _encoded(view.encode_json({"type": "pong"}))
        self.ack = _encoded(view.encode_json({"type": "connection_ack"}))
        self.max_attaching = view.config.ws_max_attaching
        self._drains: Drains | None = None
        self._deadlines: DeadlineWheel | None = None
        self._gate: AttachGate[WireSocket] | None = None

    def gate(self, loop: asyncio.AbstractEventLoop) -> AttachGate[WireSocket]:
        """The sockets of ``loop`` whose ``connection_init`` is worked on, or waits."""
        gate = self._gate
        if gate is None or gate.loop is not loop:
            gate = self._gate = AttachGate[WireSocket](loop, self.max_attaching)
        return gate

    def deadlines(self, loop: asyncio.AbstractEventLoop) -> DeadlineWheel:
        """The sockets of ``loop`` by their soonest deadline."""
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self._deadlines = DeadlineWheel(loop)
        return deadlines

    def drains(self, loop: asyncio.AbstractEventLoop) -> Drains:
        """The sockets of ``loop`` waiting for their live operations' drain."""
        drains = self._drains
        if drains is None or drains.loop is not loop:
            drains = self._drains = Drains(loop)
        return drains

    def serves(self, target: str) -> bool:
        """Whether an upgrade to ``target`` (a path and its query) is for this endpoint."""
        return unquote(target.partition("?")[0]) == self.path

    def protocol_class(self) -> type[WireSocket]:
        """The protocol class uvicorn builds on every WebSocket upgrade
        (``uvicorn.Config(ws=...)``), serving this endpoint."""
        return type("EndpointSocket", (WireSocket,), {"_endpoint": self, "__slots__": ()})


class WireSocket(asyncio.Protocol):
    """One graphql-transport-ws socket on the wire (see the module
    docstring): the transport's callbacks, the frames, each message's step
    (`wire_protocol`) dispatched to its units, and its close."""

    __slots__ = ("_counted", "_fragments", "_lost", "admission", "conn", "connections",
                 "context", "deadlines", "loop", "operations", "transport", "writer")

    _endpoint: WireEndpoint
    """The endpoint served (set on the class `WireEndpoint.protocol_class` builds)."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState,
                 app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None
                 ) -> None:
        # uvicorn's keyword contract for a ``ws`` protocol class (its HTTP
        # protocol builds one on every upgrade, calls ``connection_made``,
        # sets it on the transport and feeds it the upgrade's bytes).
        self.loop = _loop or asyncio.get_running_loop()
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        extensions: list[Any] = []
        if config.ws_per_message_deflate:
            extensions.append(ServerPerMessageDeflateFactory(
                server_max_window_bits=12, client_max_window_bits=12,
                compress_settings={"memLevel": 5},
            ))
        # Open from the start: the upgrade is read from uvicorn's bytes and
        # answered through `ServerProtocol.accept` (`SocketAdmission.upgrade`),
        # websockets' parser reads frames only.
        self.conn = ServerProtocol(
            extensions=extensions, max_size=config.ws_max_size, state=OPEN,
            logger=logging.getLogger("uvicorn.error"),
        )
        self.connections: set[Any] = server_state.connections
        self.writer = SocketWriter(self.transport, self.conn)
        self.deadlines = SocketDeadlines(config)
        self.admission: SocketAdmission | None = SocketAdmission(config, server_state, app_state)
        """Until admitted (`_settle`)."""
        self.operations: SocketOperations | None = None
        """From the first ``subscribe`` until the socket's work ends."""
        self.context: GraphQLContext[Any] | None = None
        self._counted = False
        self._lost = False
        self._fragments: tuple[bool, list[bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.writer.transport = cast(asyncio.Transport, transport)
        self.connections.add(self)

    def data_received(self, data: bytes) -> None:
        admission = self.admission
        if admission is not None and admission.head is not None:
            admission.upgrade(self, data)
            return
        conn = self.conn
        conn.receive_data(data)
        if conn.parser_exc is not None:
            self._parser_failed(conn.parser_exc)
            return
        for event in conn.events_received():
            if self._lost:
                return  # handed on or gone
            self.handle_event(event)

    def handle_event(self, event: Any) -> None:
        """One event of the parser: a frame."""
        if not isinstance(event, Frame):
            return
        opcode = event.opcode
        payload = cast(bytes, event.data)
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            if event.fin:
                self._message(payload, opcode is Opcode.TEXT)
            else:
                self._fragments = (opcode is Opcode.TEXT, [payload])
        elif opcode is Opcode.CONT:
            fragments = self._fragments
            if fragments is None:
                return
            fragments[1].append(payload)
            if event.fin:
                self._fragments = None
                self._message(b"".join(fragments[1]), fragments[0])
        elif opcode is Opcode.PING:
            # websockets queued the pong.
            self.writer.flush()
        elif opcode is Opcode.PONG:
            self.deadlines.pong(bytes(event.data), self.loop.time())
        elif opcode is Opcode.CLOSE:
            self._peer_closed()

    def _parser_failed(self, exc: BaseException) -> None:
        if isinstance(exc, PayloadTooBig) and self.conn.close_sent is not None:
            # The engine's typed close instead of websockets' wording: the
            # frame past the bound was refused from its header, unread.
            self.conn.data_to_send()
            close = wp.message_too_big(self._endpoint.limit)
            frame = Frame(Opcode.CLOSE, CloseFrame(close.code, close.reason).serialize())
            self.transport.write(frame.serialize(mask=False))
        else:
            self.writer.flush()
        self._ended()
        self.writer.closed = True
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        deadlines = self.deadlines
        deadlines.stop_keepalive()
        deadlines.init_at = deadlines.max_age_at = deadlines.close_at = None
        self._arm()  # nothing pending: out of the deadlines, the socket released
        admission = self.admission
        if admission is not None and admission.admitting is not None:
            admission.admitting.cancel()
            admission.admitting = None
        self._ended()
        self.connections.discard(self)
        self.writer.wake()
        if exc is None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        self.writer.pause()
        if self.operations is not None:
            self.operations.pause()

    def resume_writing(self) -> None:
        self.writer.resume()
        if self.operations is not None:
            self.operations.resume()

    def shutdown(self) -> None:
        """uvicorn's server shutdown: stop the operations, close 1012."""
        self.deadlines.stop_keepalive()
        self._arm()
        writer = self.writer
        if writer.closed:
            self._close_now()
            return
        admission = self.admission
        if admission is not None and admission.unanswered is not None:
            # Still waiting for a handshake slot: 500, as uvicorn answers.
            admission.unanswered = None
            self._respond(self.conn.reject(500, "Internal Server Error"))
            self._ended()
            return
        self._ended()
        writer.closed = True
        with contextlib.suppress(InvalidState):
            self.conn.send_close(1012)
        writer.flush()
        self.transport.close()

    def _message(self, data: bytes, text: bool) -> None:
        if self.writer.closed:
            return
        if not text:
            data = _BINARY  # its content is never read: a 4400 in its turn
        admission = self.admission
        if admission is not None and (admission.inbox is not None or self.context is None):
            # An admit in flight (or the answer not sent yet): handled in
            # order after it, reading paused meanwhile.
            admission.queue(self.transport, data)
            return
        self._handle(data)

    def _handle(self, data: bytes) -> None:
        try:
            self._step(data)
        except Exception:
            # Never a socket left paused and unanswered: what cannot be
            # handled closes it (1011, as a server error does).
            _log.exception("a graphql-transport-ws message could not be handled")
            self.close(1011, "internal_error")

    def _step(self, data: bytes) -> None:
        if data is _BINARY:
            self._close_with(wp.NOT_TEXT)
            return
        endpoint = self._endpoint
        message = wp.decode(data, endpoint.limit)
        if isinstance(message, wp.Close):
            self._close_with(message)
            return
        admission = self.admission
        ops = self.operations.ops if self.operations is not None else _NO_OPS
        step = wp.on_message(admission.init if admission is not None else _ADMITTED, message,
                             ops, len(ops), endpoint.max_operations)
        if isinstance(step, wp.Ping):
            self.writer.write(endpoint.pong)
        elif isinstance(step, wp.Subscribe):
            if self.operations is None:
                self.operations = SocketOperations(self, self.writer)
            self.operations.subscribe(step)
        elif isinstance(step, wp.Complete):
            if self.operations is not None:
                self.operations.complete(step.id)
        elif isinstance(step, wp.Close):
            if isinstance(message, dict) and message.get("type") == "connection_init":
                self._init_received()
            self._close_with(step)
        elif isinstance(step, wp.Admit):
            self._init_received()
            assert admission is not None  # (an admitted socket's init is never admitted)
            admission.admit(self, step.payload)
        elif isinstance(step, wp.Refuse):
            self.writer.write(endpoint.encode_json(step.message).encode())
        elif isinstance(step, wp.Ignore):
            self._init_received()

    def _init_received(self) -> None:
        # The timeout ends at the init, not after the principal's resolve;
        # its handshake slot goes to the next socket.
        admission = self.admission
        if admission is not None:
            if self.deadlines.init_at is not None and not admission.init.timed_out:
                # Its step comes, and the socket finds the next deadline instead.
                self.deadlines.init_at = None
            admission.release_slot(self)

    # -- what the units ask of the socket

    def _respond(self, response: Response) -> None:
        """Answer the upgrade with ``response`` (a refusal) and close."""
        self.writer.closed = True
        self.transport.write(response.serialize())
        self.transport.close()

    def _accept(self, answer: bytes) -> None:
        """Write the 101 (`wire_admission.accepting`) and start the keepalive."""
        if self.transport.is_closing():
            return
        self.transport.write(answer)
        self.deadlines.start_keepalive(self.loop.time())
        self._arm()

    def _opened(self) -> None:
        """The session is open: its init timeout and max age run."""
        now = self.loop.time()
        self.deadlines.init_at = now + self._endpoint.init_timeout
        self.deadlines.max_age_at = now + self._endpoint.max_age
        self._arm()

    def _turn(self, bound: float) -> None:
        """Acknowledged: its attach turn ends at its first operation's first
        answer, or ``bound`` seconds on (at most the init timeout)."""
        self.deadlines.turn_at = self.loop.time() + min(self._endpoint.init_timeout, bound)
        self._arm()

    def answered(self) -> None:
        """An operation answered (a live one's first frames: attached): the
        socket's attach turn ends."""
        admission = self.admission
        if admission is not None and admission.gate is GATE_HOLDING:
            self._leave_gate()
            self._settle()

    def _leave_gate(self) -> None:
        admission = self.admission
        if admission is not None:
            admission.leave_gate(self._endpoint.gate(self.loop))
        self.deadlines.turn_at = None

    def _settle(self) -> None:
        """Admitted, nothing of the admission left: drop it."""
        admission = self.admission
        if admission is not None and admission.done:
            self.admission = None

    def _fused(self, live: LiveOp, delta: Any, revision: int) -> bool:
        # Called from inside the render pass (a put into a caught-up
        # session): write the frame now when nothing is ahead of it on this
        # socket (no drain pending, not paused, not closing, past the attach
        # gate, no per-message deflate); False leaves it to the wake and drain.
        # A failure here is this socket's alone: the frame is left to the
        # drain (which logs and ends what fails), never raised into the pass.
        writer, operations, admission = self.writer, self.operations, self.admission
        if (writer.paused or writer.closed or writer.deflate
                or (operations is not None and operations.woken is not None)
                or (admission is not None and admission.gate is not GATE_NONE)):
            return False
        try:
            data = live.frame_bytes(delta, revision)
            if data is None:
                return False
            self.transport.write(data)
        except Exception:
            return False
        return True

    # -- the deadlines

    def _arm(self) -> None:
        self.deadlines.arm(self, self._endpoint.deadlines(self.loop))

    def _on_timer(self) -> None:
        """Its step of the endpoint's `DeadlineWheel` came: run what is due."""
        for kind in self.deadlines.due(self.loop.time()):
            if kind == CLOSE:
                self.transport.close()
            elif kind == PONG:
                self._keepalive_timeout()
            elif kind == INIT:
                self._init_timed_out()
            elif kind == MAX_AGE:
                # The operations stop before the close frame: none sends after it.
                self._stop_operations()
                self.close(SESSION_MAX_AGE_CLOSE_CODE, SESSION_MAX_AGE_CLOSE_REASON)
            elif kind == PING:
                self._send_ping()
            elif kind == TURN:
                self._leave_gate()  # no operation answered within the bound
                self._settle()
        if not self._lost:
            self._arm()

    def _init_timed_out(self) -> None:
        admission = self.admission
        if admission is None or admission.init.received or self.writer.closed:
            return
        if not admission.init_extended and self._endpoint.view.handshakes.full():
            # A burst holds every handshake slot: one more period, never two.
            admission.init_extended = True
            self.deadlines.init_at = self.loop.time() + self._endpoint.init_timeout
            return
        admission.init.timed_out = True
        self._close_with(wp.INIT_TIMEOUT)

    def _send_ping(self) -> None:
        if self.writer.closed or self.transport.is_closing():
            return
        self.conn.send_ping(self.deadlines.ping(self.loop.time()))
        self.writer.flush()

    def _keepalive_timeout(self) -> None:
        self.deadlines.stop_keepalive()
        if self.writer.closed or self.transport.is_closing():
            return
        self._ended()
        self.conn.fail(1011, "keepalive ping timeout")
        self.writer.flush()
        self.writer.closed = True
        self.transport.close()

    # -- the close

    def close(self, code: int, reason: str) -> None:
        """Send a close frame and end the socket's work (the peer's echo,
        or a bound, closes the transport)."""
        if self.writer.closed or self._lost:
            return
        self._ended()
        if not self.writer.send_close(code, reason):
            return
        if self.admission is not None:
            self.admission.closed(self.transport)
        self.deadlines.close_at = self.loop.time() + _CLOSE_TIMEOUT
        self._arm()

    def _close_with(self, close: wp.Close) -> None:
        self.close(close.code, close.reason)

    def _close_now(self) -> None:
        """Our close frame went: close the transport now, not at the bound."""
        if self.deadlines.close_at is not None:
            self.deadlines.close_at = None
            self._arm()
        self.transport.close()

    def _peer_closed(self) -> None:
        if self.writer.closed:
            self._close_now()  # the peer echoed our close frame: done
            return
        self._ended()
        self.writer.closed = True
        self.writer.flush()  # websockets queued the echo
        self.transport.close()

    def _stop_operations(self) -> None:
        operations, self.operations = self.operations, None
        if operations is not None:
            operations.stop()

    def _ended(self) -> None:
        """The socket's work is over: its operations, timers, slot and count."""
        self._stop_operations()
        deadlines = self.deadlines
        if deadlines.init_at is not None or deadlines.max_age_at is not None:
            deadlines.init_at = deadlines.max_age_at = None
            self._arm()
        if self.admission is not None:
            self.admission.end(self)
        if self._counted:
            self._counted = False
            self._endpoint.view.open_sockets -= 1

    @property
    def writable(self) -> bool:
        """The transport's buffer is under its high-water mark, and the socket open."""
        return self.writer.writable


_BINARY = b"\0binary"
"""Stands for a binary message in the socket's queue (`WireSocket._message`)."""

_ADMITTED = wp.InitState(received=True, acknowledged=True)
"""The init state of every socket admitted (never written: an admitted
socket's handshake is over), its own `SocketAdmission`'s dropped."""

_NO_OPS: Mapping[Any, Operation | LiveOp] = MappingProxyType({})

_CLOSE_TIMEOUT = 10.0
"""Seconds a sent close frame waits for the peer's echo (uvicorn's close_timeout)."""


def _encoded(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data
