"""The engine's own graphql-transport-ws socket: a protocol object on the
connection, not an ASGI app.

`WireEndpoint.protocol_class` is passed as uvicorn's documented ``ws``
protocol option (``host.http_config``): on every upgrade uvicorn's HTTP
protocol builds one (keywords ``config``, ``server_state``, ``app_state``),
sets it on the transport and feeds it the upgrade's bytes. The socket
reads them (`wire_admission.read_upgrade`: uvicorn already parsed them)
and answers through websockets' Sans-I/O `ServerProtocol`, which then
parses the frames; an upgrade on
another path is handed to uvicorn's own websockets-sansio protocol. From
then on: frames in, each message's step decided by the pure
`service_engine.server.wire_protocol` (Strawberry's handler's decisions,
close codes and reasons, with the engine's overrides), frames out. Its jobs
are units of their own: handshake and admission (`wire_admission`),
deadlines and keepalive (`wire_deadlines`), operations (`wire_operations`),
the writer with its flow control (`wire_writer`). An idle session is this
object, its websockets connection, its transport and its soonest deadline
in the endpoint's `DeadlineWheel`: no task, scope or timer handle of its
own. ASGI middleware does not see this socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, cast
from urllib.parse import unquote

import uvicorn
from uvicorn.server import ServerState
from websockets.exceptions import InvalidState, PayloadTooBig
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Close as CloseFrame
from websockets.frames import Frame, Opcode
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from . import wire_protocol as wp
from .app import (
    GraphQLContext,
    _EngineGraphQL,
)
from .live_op import LiveOp
from .live_ops import LiveOps
from .wire_admission import AttachGate, SocketAdmission, WireRequest
from .wire_deadlines import DeadlineWheel, SocketDeadlines
from .wire_operations import Drains, Operation, SocketOperations
from .wire_state import GATE_HOLDING, GATE_NONE, GATE_WAITING, close_args, encoded
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
        self.pong = encoded(view.encode_json({"type": "pong"}))
        self.ack = encoded(view.encode_json({"type": "connection_ack"}))
        self.max_attaching = view.config.ws_max_attaching
        self._drains: Drains | None = None
        self._deadlines: DeadlineWheel | None = None
        self._gate: AttachGate | None = None

    def gate(self, loop: asyncio.AbstractEventLoop) -> AttachGate:
        """The sockets of ``loop`` whose ``connection_init`` is worked on, or waits."""
        gate = self._gate
        if gate is None or gate.loop is not loop:
            gate = self._gate = AttachGate(loop, self.max_attaching)
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
        return type("EndpointSocket", (WireSocket,), {"endpoint": self, "__slots__": ()})


class WireSocket(SocketAdmission, SocketDeadlines, SocketOperations, SocketWriter):
    """One graphql-transport-ws socket on the wire (see the module docstring):
    the transport's callbacks and each message's step; its jobs are its
    units' (`wire_admission`, `wire_deadlines`, `wire_operations`,
    `wire_writer`)."""

    __slots__ = ()

    endpoint: WireEndpoint
    """The endpoint served (set on the class `WireEndpoint.protocol_class` builds)."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState,
                 app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None
                 ) -> None:
        # uvicorn's keyword contract for a ``ws`` protocol class (its HTTP
        # protocol builds one on every upgrade, calls ``connection_made``,
        # sets it on the transport and feeds it the upgrade's bytes).
        self._endpoint = type(self).endpoint
        self.loop = _loop or asyncio.get_running_loop()
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        extensions: list[Any] = []
        if config.ws_per_message_deflate:
            extensions.append(ServerPerMessageDeflateFactory(
                server_max_window_bits=12, client_max_window_bits=12,
                compress_settings={"memLevel": 5},
            ))
        # Open from the start: the upgrade is read from uvicorn's bytes and
        # answered through `ServerProtocol.accept` (`SocketAdmission._upgrade`),
        # websockets' parser reads frames only.
        self.conn = ServerProtocol(
            extensions=extensions, max_size=config.ws_max_size, state=OPEN,
            logger=logging.getLogger("uvicorn.error"),
        )
        self.connections: set[Any] = server_state.connections
        self.ping_interval: float | None = config.ws_ping_interval
        self.ping_timeout: float | None = config.ws_ping_timeout
        self._deflate = False  # known once the upgrade is accepted
        self._headers_out: list[tuple[bytes, bytes]] | None = [
            *server_state.default_headers, *config.encoded_headers]
        self._counted = False
        self._init = wp.InitState()
        self._init_extended = False
        # The step of the endpoint's deadlines the socket waits in (`_arm`).
        self._due_step: int | None = None
        self._init_at: float | None = None
        self._max_age_at: float | None = None
        self._ping_at: float | None = None
        self._pong_at: float | None = None
        self._close_at: float | None = None
        self._ping_payload: bytes | None = None
        self._ping_sent_at = 0.0
        self._rtt = 0.0
        self._ops: dict[Any, Operation | LiveOp] = {}
        self._woken: list[LiveOp] | None = None
        self._fragments: list[bytes] | None = None
        self._text = True
        self._inbox: list[bytes] | None = None
        self._admitting: asyncio.Task[None] | None = None
        self._gate = GATE_NONE
        self._gate_at: float | None = None
        self._pending_init: dict[str, object] | None = None
        self._read_paused = False
        self._paused = False
        self._waiters: list[asyncio.Future[None]] | None = None
        self._slot = False
        self._unanswered = None
        self._closed = False
        self._lost = False
        self._upgraded = False
        # Until the upgrade is read: what another path's socket is handed
        # (`_hand_on`), the bytes read so far and the server's arguments.
        self._server: tuple[bytes, uvicorn.Config, ServerState, dict[str, Any]] | None = (
            b"", config, server_state, app_state)
        self.context: GraphQLContext[Any] | None = None
        self.subprotocol: str | None = None
        self.request: WireRequest | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if not self._upgraded:
            self._upgrade(data)
            return
        conn = self.conn
        conn.receive_data(data)
        if conn.parser_exc is not None:
            self._parser_failed(conn.parser_exc)
            return
        for event in conn.events_received():
            if self._lost:
                return  # handed on (`_hand_on`) or gone
            self.handle_event(event)

    def handle_event(self, event: Any) -> None:
        """One event of the parser: a frame."""
        if not isinstance(event, Frame):
            return
        opcode = event.opcode
        payload = cast(bytes, event.data)
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            self._text = opcode is Opcode.TEXT
            if event.fin:
                self._message(payload)
            else:
                self._fragments = [payload]
        elif opcode is Opcode.CONT:
            if self._fragments is None:
                return
            self._fragments.append(payload)
            if event.fin:
                data = b"".join(self._fragments)
                self._fragments = None
                self._message(data)
        elif opcode is Opcode.PING:
            # websockets queued the pong.
            self._flush()
        elif opcode is Opcode.PONG:
            self._pong(event)
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
            self._flush()
        self._ended()
        self._closed = True
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._stop_keepalive()
        self._init_at = self._max_age_at = self._close_at = None
        self._arm()  # nothing pending: out of the deadlines, the socket released
        admitting = self._admitting
        if admitting is not None:
            admitting.cancel()
            self._admitting = None
        self._ended()
        self.connections.discard(self)
        self._wake_writers()
        if exc is None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None

    def shutdown(self) -> None:
        """uvicorn's server shutdown: stop the operations, close 1012."""
        self._stop_keepalive()
        if self._closed:
            self._close_now()
            return
        if self._unanswered is not None:
            # Still waiting for a handshake slot: 500, as uvicorn answers.
            self._unanswered = None
            self._send_response_and_close(self.conn.reject(500, "Internal Server Error"))
            self._ended()
            return
        self._ended()
        self._closed = True
        with contextlib.suppress(InvalidState):
            self.conn.send_close(1012)
        self._flush()
        self.transport.close()

    def _message(self, data: bytes) -> None:
        if self._closed:
            return
        if not self._text:
            data = _BINARY  # its content is never read: a 4400 in its turn
        if self._inbox is not None or self.context is None:
            # An admit in flight (or the answer not sent yet): handled in
            # order after it, reading paused meanwhile.
            if self._inbox is None:
                self._inbox = []
            self._inbox.append(data)
            if not self._read_paused:
                self._read_paused = True
                self.transport.pause_reading()
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
            self.close(*close_args(wp.NOT_TEXT))
            return
        endpoint = self._endpoint
        message = wp.decode(data, endpoint.limit)
        if isinstance(message, wp.Close):
            self.close(*close_args(message))
            return
        step = wp.on_message(self._init, message, self._ops, len(self._ops),
                             endpoint.max_operations)
        if isinstance(step, wp.Ping):
            self._write(endpoint.pong)
        elif isinstance(step, wp.Subscribe):
            self._subscribe(step)
        elif isinstance(step, wp.Complete):
            self._complete(step.id)
        elif isinstance(step, wp.Close):
            if isinstance(message, dict) and message.get("type") == "connection_init":
                self._init_received_in_time()
            self.close(*close_args(step))
        elif isinstance(step, wp.Admit):
            self._init_received_in_time()
            if self._inbox is None:
                self._inbox = []  # what follows waits for the ack
            if endpoint.gate(self.loop).enter(self):
                self._gate = GATE_HOLDING
                self._admitting = self.loop.create_task(self._admit(step.payload))
            else:
                # Its turn comes (`_through_gate`); its init timeout has ended.
                self._gate = GATE_WAITING
                self._pending_init = step.payload
        elif isinstance(step, wp.Refuse):
            self._write(encoded(endpoint.encode_json(step.message)))
        elif isinstance(step, wp.Ignore):
            self._init_received_in_time()

    def _ended(self) -> None:
        """The socket's work is over: its operations, timers, slot and count."""
        self._stop_operations()
        if self._init_at is not None or self._max_age_at is not None:
            self._init_at = self._max_age_at = None
            self._arm()
        self._admitting_cancel_quiet()
        if self._gate is not GATE_NONE and self._admitting is None:
            # Waiting (skipped when reached), or its admit task is gone.
            self._leave_gate()
        self._release_slot()
        if self._counted:
            self._counted = False
            self._endpoint.view.open_sockets -= 1


_BINARY = b"\0binary"
"""Stands for a binary message in the socket's queue (`WireSocket._message`)."""
