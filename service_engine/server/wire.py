"""The engine's own graphql-transport-ws socket: a protocol object on the
connection, not an ASGI app.

`WireEndpoint.protocol_class` is the class passed as uvicorn's documented
``ws`` protocol option (``host.http_config``): on every WebSocket upgrade
uvicorn's HTTP protocol builds one (its keyword contract: ``config``,
``server_state``, ``app_state``), sets it on the transport and feeds it the
upgrade's bytes. The socket parses them with websockets' Sans-I/O
`ServerProtocol` (``receive_data`` / ``events_received`` /
``data_to_send``); an upgrade on another path is handed to uvicorn's own
websockets-sansio protocol, through ASGI (`WireSocket._hand_on`). From the
upgrade on, frames in, messages decided by
`service_engine.server.wire_protocol` (Strawberry's handler's decisions,
close codes and reasons, with the engine's overrides), frames out. A socket
holds no ASGI task, scope, Starlette ``WebSocket``, Strawberry handler or
receive-loop task: an idle session is this object, its websockets
connection, its transport, and its soonest deadline in the endpoint's
`_Deadlines` (no timer handle of its own).

Operations: a query or mutation, and a subscription that is not a
known-planned live operation, runs Strawberry's ``schema.stream`` in one
task per operation and sends ``next`` / ``error`` / ``complete`` as
Strawberry's handler does (`frames.open_sink` so a planned live field
still writes its own frames).

A live operation's frames: a delta the render pass puts into a caught-up
session (nothing queued for it, no drain pending on this socket, the
transport not paused) is written from the put itself (`WireSocket._fused`:
the plan's frame bytes for that delta, revision and id, built once for the
cohort); any other goes the ordinary way, woken and drained in one loop
callback (`_Drains`).

Flow control: while the transport's buffer is past its high-water mark
(``pause_writing``) an operation's send waits, and the render side's
backlog for the session collapses as it does for any slow subscriber;
``resume_writing`` lets them go on.

ASGI middleware does not see this socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import math
import random
import struct
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, cast
from urllib.parse import unquote

import uvicorn
from graphql import GraphQLError, GraphQLSyntaxError
from starlette.datastructures import Headers
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.schema.exceptions import CannotGetOperationTypeError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.types.execution import ExecutionResult, PreExecutionError
from strawberry.types.unset import UnsetType
from uvicorn.config import WS_PROTOCOLS
from uvicorn.importer import import_from_string
from uvicorn.server import ServerState
from websockets.datastructures import Headers as WsHeaders
from websockets.exceptions import InvalidState, PayloadTooBig
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Close as CloseFrame
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from . import frames
from . import wire_protocol as wp
from .app import (
    SESSION_MAX_AGE_CLOSE_CODE,
    SESSION_MAX_AGE_CLOSE_REASON,
    TRY_AGAIN_LATER_CLOSE_CODE,
    EdgeRefusal,
    GraphQLContext,
    HandshakeSlots,
    _EngineGraphQL,
    new_context,
    refusal_of,
)
from .live_ops import LiveOp, LiveOps

__all__ = ["WireEndpoint", "WireRequest", "WireSocket"]

_log = logging.getLogger(__name__)
_task_log = logging.getLogger("strawberry.ws.task")

_MAX_CLOSE_REASON_BYTES = 123
_CLOSE_TIMEOUT = 10.0
"""Seconds a sent close frame waits for the peer's echo (uvicorn's close_timeout)."""


class WireRequest:
    """What a resolver reads of the upgrade as ``info.context.request``: its
    headers (`starlette.datastructures.Headers`), path and client.

    The headers are kept as one bytes object (``name: value`` lines, names
    lowercased) and parsed when read: a socket holds one object, not a
    tuple and two bytes per header, for headers read once (the passport,
    at ``connection_init``)."""

    __slots__ = ("_headers", "client", "path")

    def __init__(self, headers: Iterable[tuple[str, str]], path: str,
                 client: tuple[str, int] | None) -> None:
        self._headers = b"\r\n".join(
            f"{key.lower()}: {value}".encode("latin-1") for key, value in headers
        )
        self.path = path
        self.client = client

    def _raw(self) -> list[tuple[bytes, bytes]]:
        if not self._headers:
            return []
        return [cast(tuple[bytes, bytes], tuple(line.split(b": ", 1)))
                for line in self._headers.split(b"\r\n")]

    @property
    def headers(self) -> Headers:
        return Headers(raw=self._raw())

    def upgrade(self) -> Request:
        """The upgrade request again, for websockets' ``accept`` (which
        reads only its headers)."""
        return Request(self.path, WsHeaders(
            [(name.decode("latin-1"), value.decode("latin-1")) for name, value in self._raw()]
        ))

    @property
    def scope(self) -> Mapping[str, Any]:
        return {"type": "websocket", "path": self.path, "headers": self._raw(),
                "client": self.client}


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
        self._drains: _Drains | None = None
        self._deadlines: _Deadlines | None = None
        self._gate: _AttachGate | None = None

    def gate(self, loop: asyncio.AbstractEventLoop) -> _AttachGate:
        """The sockets of ``loop`` whose ``connection_init`` is worked on, or waits."""
        gate = self._gate
        if gate is None or gate.loop is not loop:
            gate = self._gate = _AttachGate(loop, self.max_attaching)
        return gate

    def deadlines(self, loop: asyncio.AbstractEventLoop) -> _Deadlines:
        """The sockets of ``loop`` by their soonest deadline."""
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self._deadlines = _Deadlines(loop)
        return deadlines

    def drains(self, loop: asyncio.AbstractEventLoop) -> _Drains:
        """The sockets of ``loop`` waiting for their live operations' drain."""
        drains = self._drains
        if drains is None or drains.loop is not loop:
            drains = self._drains = _Drains(loop)
        return drains

    def serves(self, request: Request) -> bool:
        """Whether the upgrade ``request`` is for this endpoint."""
        return unquote(request.path.partition("?")[0]) == self.path

    def protocol_class(self) -> type[WireSocket]:
        """The protocol class uvicorn builds on every WebSocket upgrade
        (``uvicorn.Config(ws=...)``), serving this endpoint."""
        return type("EndpointSocket", (WireSocket,), {"endpoint": self, "__slots__": ()})


class _Drains:
    """The sockets whose live operations were woken since the loop last
    drained them: one loop callback drains them all, in wake order (a
    render pass's slice wakes many sockets; each then costs its drain and
    write, not a callback of its own)."""

    __slots__ = ("_sockets", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._sockets: list[WireSocket] | None = None

    def add(self, socket: WireSocket) -> None:
        sockets = self._sockets
        if sockets is None:
            self._sockets = [socket]
            self.loop.call_soon(self._run)
        else:
            sockets.append(socket)

    def _run(self) -> None:
        sockets, self._sockets = self._sockets, None
        for socket in sockets or ():
            try:
                socket._drain_live()
            except Exception:
                # One socket's failure is its own: the others still write.
                _log.exception("a socket's live operations failed to drain")


class _AttachGate:
    """The admission of one loop's sockets, holding no task per waiting one.

    At most ``limit`` sockets (``ws_max_attaching``) are being attached at
    once: a turn runs from ``connection_init`` to the first answer of the
    socket's first operation (`WireSocket._leave_gate`); the others wait in
    arrival order and `WireSocket._through_gate` starts the work when a turn
    comes. Upgrades waiting, unanswered, for a handshake slot wait in
    ``unanswered`` (`WireSocket._release_slot` answers the next)."""

    __slots__ = ("free", "loop", "unanswered", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.loop = loop
        self.free = limit
        self.waiting: deque[WireSocket] = deque()
        self.unanswered: deque[WireSocket] = deque()
        """Upgrades waiting, unanswered, for a handshake slot (``ws_max_handshakes``)."""

    def answer_next(self, slots: HandshakeSlots) -> None:
        """Give free handshake slots to the upgrades waiting longest."""
        unanswered = self.unanswered
        while unanswered and not slots.full():
            socket = unanswered.popleft()
            if socket._unanswered and not socket._lost:
                slots.take()
                try:
                    socket._slot_taken()
                except Exception:
                    # Its failure is its own: the releasing socket goes on.
                    _log.exception("an upgrade could not be answered")
                    socket.transport.abort()

    def enter(self, socket: WireSocket) -> bool:
        """Whether ``socket`` has a turn now; if not it waits for `leave`."""
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return True
        self.waiting.append(socket)
        return False

    def leave(self) -> None:
        """A turn ends: the next socket still waiting takes it."""
        waiting = self.waiting
        while waiting:
            socket = waiting.popleft()
            if socket._gate is _GATE_WAITING:
                socket._through_gate()
                return
        self.free += 1


_GATE_NONE, _GATE_WAITING, _GATE_HOLDING = 0, 1, 2

TURN_AFTER_ACK = 2.0
"""Seconds an acknowledged socket keeps its attach turn waiting for its
first operation's first answer (at most the init timeout): a socket that
sends nothing holds a turn this long, not the whole init timeout."""


TICK = 0.05
"""Seconds of one step of `_Deadlines`: a socket's deadline is met at most
this much late (the deadlines are seconds to hours; the sockets of one step
share its table, so a coarser step holds fewer bytes a socket)."""


class _Step:
    """The sockets waiting for one step, and the step (one int for all)."""

    __slots__ = ("sockets", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.sockets: dict[WireSocket, None] = {}


class _Deadlines:
    """The sockets of one loop by their soonest deadline (`WireSocket._arm`),
    in steps of `TICK`: one loop timer for the earliest step, not one timer
    handle (its callback and context) per socket. A step's sockets are called
    together once it is due; each then arms its next deadline."""

    __slots__ = ("_heap", "_steps", "_timer", "_timer_step", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._steps: dict[int, _Step] = {}
        self._heap: list[int] = []
        """The steps that have sockets (and some emptied since, skipped)."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_step = 0

    def add(self, socket: WireSocket, at: float) -> int:
        """Call ``socket._on_timer`` once ``at`` passed; the step to `remove` it from."""
        step = math.ceil(at / TICK)
        record = self._steps.get(step)
        if record is None:
            record = self._steps[step] = _Step(step)
            heapq.heappush(self._heap, step)
        record.sockets[socket] = None
        if self._timer is None or step < self._timer_step:
            self._arm(step)
        return record.step

    def remove(self, socket: WireSocket, step: int) -> None:
        record = self._steps.get(step)
        if record is not None:
            record.sockets.pop(socket, None)
            if not record.sockets:
                del self._steps[step]  # its heap entry is skipped when reached

    def _arm(self, step: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_step = step
        self._timer = self.loop.call_at(step * TICK, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.loop.time()
        heap, steps = self._heap, self._steps
        due: list[WireSocket] = []
        while heap and heap[0] * TICK <= now:
            record = steps.pop(heapq.heappop(heap), None)
            if record is not None:
                due.extend(record.sockets)
        for socket in due:
            try:
                socket._on_timer()
            except Exception:
                # One socket's failure is its own: the others' deadlines run.
                _log.exception("a socket's deadline failed")
        while heap and heap[0] not in steps:
            heapq.heappop(heap)
        if not heap:
            # Idle again: the tables at their idle size.
            self._heap, self._steps = [], {}
        elif self._timer is None or self._timer_step > heap[0]:
            # (A socket's re-arm above may have armed a later step.)
            self._arm(heap[0])


def _encoded(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


class _Operation:
    """One ordinary operation: its task, and whether its last message went."""

    __slots__ = ("completed", "id", "socket", "task")

    def __init__(self, socket: WireSocket, operation_id: Any) -> None:
        self.socket = socket
        self.id = operation_id
        self.completed = False
        self.task: asyncio.Task[None] | None = None

    async def send(self, message: dict[str, Any]) -> None:
        # Strawberry's Operation.send_operation_message.
        if self.completed:
            return
        if message["type"] in ("complete", "error"):
            self.completed = True
            self.socket._forget(self.id, self)
        await self.socket.send_json(message)

    def close(self) -> None:
        """Stop the operation (its task is cancelled; nothing more is sent)."""
        if self.task is not None:
            self.task.cancel()


class _OperationStreamClosed(Exception):
    """The operation closed the socket (a document the handler refuses with 4400)."""


class WireSocket(asyncio.Protocol):
    """One graphql-transport-ws socket on the wire (see the module docstring)."""

    __slots__ = (
        "_admitting",
        "_close_at",
        "_closed",
        "_counted",
        "_deflate",
        "_due_step",
        "_endpoint",
        "_fragments",
        "_gate",
        "_gate_at",
        "_headers_out",
        "_inbox",
        "_init",
        "_init_at",
        "_init_extended",
        "_lost",
        "_max_age_at",
        "_ops",
        "_paused",
        "_pending_init",
        "_ping_at",
        "_ping_payload",
        "_ping_sent_at",
        "_pong_at",
        "_read_paused",
        "_rtt",
        "_server",
        "_slot",
        "_text",
        "_unanswered",
        "_upgraded",
        "_waiters",
        "_woken",
        "conn",
        "connections",
        "context",
        "loop",
        "ping_interval",
        "ping_timeout",
        "request",
        "response",
        "subprotocol",
        "transport",
    )

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
        self.conn = ServerProtocol(
            extensions=extensions, max_size=config.ws_max_size,
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
        self._ops: dict[Any, _Operation | LiveOp] = {}
        self._woken: list[LiveOp] | None = None
        self._fragments: list[bytes] | None = None
        self._text = True
        self._inbox: list[bytes] | None = None
        self._admitting: asyncio.Task[None] | None = None
        self._gate = _GATE_NONE
        self._gate_at: float | None = None
        self._pending_init: dict[str, object] | None = None
        self._read_paused = False
        self._paused = False
        self._waiters: list[asyncio.Future[None]] | None = None
        self._slot = False
        self._unanswered = False
        self._closed = False
        self._lost = False
        self._upgraded = False
        # Until the upgrade is parsed: what another path's socket is handed
        # (`_hand_on`), the bytes read so far and the server's arguments.
        self._server: tuple[bytes, uvicorn.Config, ServerState, dict[str, Any]] | None = (
            b"", config, server_state, app_state)
        self.context: GraphQLContext[Any] | None = None
        self.subprotocol: str | None = None
        self.request: WireRequest | None = None
        self.response: Response | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connections.add(self)

    def _hand_on(self, head: bytes, config: uvicorn.Config, server_state: ServerState,
                 app_state: dict[str, Any]) -> None:
        """An upgrade on another path: served through ASGI by uvicorn's own
        websockets-sansio protocol, handed the connection as uvicorn's HTTP
        protocol hands it (built with the same arguments, the transport set
        to it, the bytes read so far fed to it)."""
        self._closed = self._lost = True
        self.connections.discard(self)
        other = _asgi_socket_class()(config=config, server_state=server_state,
                                     app_state=app_state)
        other.connection_made(self.transport)
        self.transport.set_protocol(other)
        other.data_received(head)

    def _upgrade(self, request: Request) -> None:
        """The upgrade request parsed: answer it (`_answer`) or refuse it."""
        self._upgraded = True
        server, self._server = self._server, None
        if not self._endpoint.serves(request):
            assert server is not None
            self._hand_on(*server)
            return
        # The path is the endpoint's, and the peer's host one string per
        # host: shared, not one copy per socket.
        client = self.transport.get_extra_info("peername")
        if isinstance(client, tuple) and len(client) >= 2:
            client = (sys.intern(str(client[0])), int(client[1]))
        else:
            client = None
        self.request = WireRequest(request.headers.raw_items(), self._endpoint.path, client)
        self.response = self.conn.accept(request)
        # websockets negotiates the extensions in accept: only now is it known
        # whether this socket's frames are compressed.
        self._deflate = bool(self.conn.extensions)
        self._answer(request)

    # -- the upgrade -----------------------------------------------------------

    def _answer(self, request: Request) -> None:
        response = self.response
        assert response is not None
        if response.status_code != 101:
            # Not a valid upgrade (websockets' own refusal, as uvicorn sends it).
            self._send_response_and_close(response)
            return
        view = self._endpoint.view
        if view.engine.shutting_down:
            # A pod that is shutting down takes no new session: 403.
            self._reject()
            return
        offered: list[str] = []
        for header in request.headers.get_all("Sec-WebSocket-Protocol"):
            offered.extend(token.strip() for token in header.split(","))
        if view.open_sockets >= self._endpoint.config.ws_max_sockets:
            protocol = (GRAPHQL_TRANSPORT_WS_PROTOCOL
                        if GRAPHQL_TRANSPORT_WS_PROTOCOL in offered else None)
            self._accept(protocol)
            self.close(
                TRY_AGAIN_LATER_CLOSE_CODE,
                f"{EdgeRefusal.TOO_MANY_SOCKETS}: this pod holds ws_max_sockets "
                f"({self._endpoint.config.ws_max_sockets}); reconnect later",
            )
            return
        view.open_sockets += 1
        self._counted = True
        self.subprotocol = (GRAPHQL_TRANSPORT_WS_PROTOCOL
                            if GRAPHQL_TRANSPORT_WS_PROTOCOL in offered else None)
        slots = view.handshakes
        if not slots.full() and not self._endpoint.gate(self.loop).unanswered:
            slots.take()
            self._slot = True
            self._admitted()
            return
        # A burst holds every slot: wait for one, unanswered, holding only
        # the upgrade's headers as `WireRequest`'s one bytes object: neither
        # the parsed request (nor websockets' parser that keeps it) nor the
        # response, rebuilt when the slot comes. Thousands of sockets wait
        # here in a burst; their parsed headers (~70 small blocks a socket)
        # would be freed only after the sessions admitted meanwhile had
        # filled the heap around them.
        self.response = None
        # Nor a task: it waits in the endpoint's queue (`_release_slot`).
        self._unanswered = True
        self._endpoint.gate(self.loop).unanswered.append(self)

    def _slot_taken(self) -> None:
        """A handshake slot came for this unanswered socket (`_AttachGate.answer_next`)."""
        self._slot = True
        self._unanswered = False
        assert self.request is not None
        response = self.response = self.conn.accept(self.request.upgrade())
        self._deflate = bool(self.conn.extensions)
        if response.status_code != 101:  # accepted once already: not expected
            self._release_slot()
            self._send_response_and_close(response)
            self._ended()
            return
        self._admitted()

    def _admitted(self) -> None:
        view = self._endpoint.view
        assert self.request is not None
        if not view.origin_allowed(self.request.headers):
            self._reject()
            self._ended()
            return
        self._accept(self.subprotocol)
        self.context = new_context(
            view.engine, cast(Any, self.request), cast(Any, self), handshake_at=self.loop.time()
        )
        if self.subprotocol is None:
            self.close(*_close_args(wp.SUBPROTOCOL_NOT_ACCEPTABLE))
            return
        now = self.loop.time()
        self._init_at = now + self._endpoint.init_timeout
        self._max_age_at = now + self._endpoint.max_age
        self._arm()
        if self._inbox:
            self._drain_inbox()

    def _accept(self, subprotocol: str | None) -> None:
        response = self.response
        assert response is not None
        self.response = None
        del response.headers["Date"]
        headers = [(name.decode("latin-1").lower(), value.decode("latin-1"))
                   for name, value in self._default_headers()]
        if subprotocol:
            headers.append(("Sec-WebSocket-Protocol", subprotocol))
        response.headers.update(headers)
        if self.transport.is_closing():
            return
        self.conn.send_response(response)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self._start_keepalive()

    def _default_headers(self) -> list[tuple[bytes, bytes]]:
        headers, self._headers_out = self._headers_out, None
        return headers or []

    def _reject(self) -> None:
        # uvicorn's answer to a close before the accept: 403, no body.
        self._send_response_and_close(self.conn.reject(403, ""))

    def _send_response_and_close(self, response: Response) -> None:
        self.response = None
        self._closed = True
        self.conn.send_response(response)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()

    # -- transport callbacks -----------------------------------------------------

    def data_received(self, data: bytes) -> None:
        server = self._server
        if server is not None:
            self._server = (server[0] + data, *server[1:])
        conn = self.conn
        conn.receive_data(data)
        if not self._upgraded and conn.handshake_exc is not None:
            # Not an upgrade websockets can parse: its own answer, if any.
            self._closed = True
            self._flush()
            self.transport.close()
            return
        if conn.parser_exc is not None:
            self._parser_failed(conn.parser_exc)
            return
        for event in conn.events_received():
            if self._lost:
                return  # handed on (`_hand_on`) or gone
            self.handle_event(event)

    def handle_event(self, event: Any) -> None:
        """One event of the parser: the upgrade, then frames."""
        if not isinstance(event, Frame):
            if isinstance(event, Request) and not self._upgraded:
                self._upgrade(event)
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
        if self.response is not None or self._unanswered:
            # Still waiting for a handshake slot: 500, as uvicorn answers.
            self._unanswered = False
            self._send_response_and_close(self.conn.reject(500, "Internal Server Error"))
            self._ended()
            return
        self._ended()
        self._closed = True
        with contextlib.suppress(InvalidState):
            self.conn.send_close(1012)
        self._flush()
        self.transport.close()

    # -- messages ----------------------------------------------------------------

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
            self.close(*_close_args(wp.NOT_TEXT))
            return
        endpoint = self._endpoint
        message = wp.decode(data, endpoint.limit)
        if isinstance(message, wp.Close):
            self.close(*_close_args(message))
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
            self.close(*_close_args(step))
        elif isinstance(step, wp.Admit):
            self._init_received_in_time()
            if self._inbox is None:
                self._inbox = []  # what follows waits for the ack
            if endpoint.gate(self.loop).enter(self):
                self._gate = _GATE_HOLDING
                self._admitting = self.loop.create_task(self._admit(step.payload))
            else:
                # Its turn comes (`_through_gate`); its init timeout has ended.
                self._gate = _GATE_WAITING
                self._pending_init = step.payload
        elif isinstance(step, wp.Refuse):
            self._write(_encoded(endpoint.encode_json(step.message)))
        elif isinstance(step, wp.Ignore):
            self._init_received_in_time()

    def _through_gate(self) -> None:
        """The attach gate's turn came for this waiting socket."""
        payload, self._pending_init = self._pending_init, None
        assert payload is not None
        self._gate = _GATE_HOLDING
        self._admitting = self.loop.create_task(self._admit(payload))

    def _leave_gate(self) -> None:
        gate, self._gate = self._gate, _GATE_NONE
        self._pending_init = None
        self._gate_at = None
        if gate is _GATE_HOLDING:
            self._endpoint.gate(self.loop).leave()

    def _drain_inbox(self) -> None:
        while (self._inbox and not self._closed and self._admitting is None
               and self._gate is not _GATE_WAITING):
            data = self._inbox.pop(0)
            self._handle(data)
        if self._admitting is None and self._gate is not _GATE_WAITING:
            self._inbox = None
        if self._read_paused and not self._inbox and not self._closed:
            self._read_paused = False
            self.transport.resume_reading()

    def _init_received_in_time(self) -> None:
        # The timeout ends at the init, not after the principal's resolve;
        # its handshake slot goes to the next socket.
        if self._init_at is not None and not self._init.timed_out:
            # Its step comes, and the socket finds the next deadline instead.
            self._init_at = None
        self._release_slot()

    async def _admit(self, payload: dict[str, object]) -> None:
        try:
            await self._admit_in_turn(payload)
        finally:
            if not self._init.acknowledged or self._closed or self._lost:
                self._leave_gate()
        if self._admitting is None and not self._closed and not self._lost:
            if self._gate is _GATE_HOLDING:
                # The turn lasts until the socket's first operation answers
                # (a live one's Reset: its attach) or a bound passes.
                self._gate_at = self.loop.time() + min(
                    self._endpoint.init_timeout, TURN_AFTER_ACK)
                self._arm()
            self._drain_inbox()

    async def _admit_in_turn(self, payload: dict[str, object]) -> None:
        context = self.context
        assert context is not None
        view = self._endpoint.view
        try:
            refused = await view.admit(context, payload)
            if self._closed:
                return
            if refused is not None:
                self._admitting = None
                self.close(refused[0], refused[1])
                return
            self._init.received = True
            context.connection_params = payload
            try:
                ack = await view.on_ws_connect(context)
            except ConnectionRejectionError:
                self._admitting = None
                self.close(*_close_args(wp.FORBIDDEN))
                return
            if self._closed:
                return
            if isinstance(ack, UnsetType):
                self._write(self._endpoint.ack)
            else:
                self._write(_encoded(self._endpoint.encode_json(
                    {"type": "connection_ack", "payload": ack})))
            self._init.acknowledged = True
        except asyncio.CancelledError:
            return
        except Exception:
            _log.exception("connection_init failed")
            self._admitting = None
            self.close(4500, "internal_error: connection_init failed")
            return
        self._admitting = None

    # -- timers ------------------------------------------------------------------
    #
    # A socket waits in the endpoint's `_Deadlines` for the soonest of its
    # deadlines (the init timeout, the session's max age, the keepalive ping
    # or its pong, the close echo's bound), met within `TICK`: no loop timer
    # handle per deadline, nor one per socket. A deadline cleared or moved
    # later leaves the socket where it waits (its step comes, it finds
    # nothing due, and waits for the next one).

    def _arm(self) -> None:
        soonest: float | None = None
        for at in (self._init_at, self._max_age_at, self._ping_at, self._pong_at,
                   self._close_at, self._gate_at):
            if at is not None and (soonest is None or at < soonest):
                soonest = at
        step = self._due_step
        if step is not None:
            if soonest is not None and step * TICK <= soonest:
                return
            # Nothing pending (the socket is released now), or due sooner.
            self._endpoint.deadlines(self.loop).remove(self, step)
            self._due_step = None
        if soonest is not None:
            self._due_step = self._endpoint.deadlines(self.loop).add(self, soonest)

    def _on_timer(self) -> None:
        self._due_step = None
        now = self.loop.time()
        # What was due when its step came, in deadline order; each runs
        # once, and only if no earlier one cleared or moved it.
        due = sorted((at, order) for order, at in enumerate(
            (self._close_at, self._pong_at, self._init_at, self._max_age_at, self._ping_at,
             self._gate_at))
            if at is not None and at <= now)
        for at, order in due:
            if order == 0 and self._close_at == at:
                self._close_at = None
                self.transport.close()
            elif order == 1 and self._pong_at == at:
                self._keepalive_timeout()
            elif order == 2 and self._init_at == at:
                self._init_timed_out()
            elif order == 3 and self._max_age_at == at:
                self._max_age_reached()
            elif order == 4 and self._ping_at == at:
                self._send_ping()
            elif order == 5 and self._gate_at == at:
                self._leave_gate()  # no operation answered within the bound
        if not self._lost:
            self._arm()

    def _init_timed_out(self) -> None:
        self._init_at = None
        if self._init.received or self._closed:
            return
        view = self._endpoint.view
        if not self._init_extended and view.handshakes.full():
            # A burst holds every handshake slot: one more period, never two.
            self._init_extended = True
            self._init_at = self.loop.time() + self._endpoint.init_timeout
            return
        self._init.timed_out = True
        self.close(*_close_args(wp.INIT_TIMEOUT))

    def _max_age_reached(self) -> None:
        self._max_age_at = None
        # The operations stop before the close frame: none sends after it.
        self._stop_operations()
        self.close(SESSION_MAX_AGE_CLOSE_CODE, SESSION_MAX_AGE_CLOSE_REASON)

    def _start_keepalive(self) -> None:
        if self.ping_interval is not None and self.ping_interval > 0:
            self._schedule_ping()

    def _schedule_ping(self) -> None:
        assert self.ping_interval is not None
        delay = max(0.0, self.ping_interval - self._rtt)
        self._ping_at = self.loop.time() + delay
        self._arm()

    def _send_ping(self) -> None:
        # uvicorn's keepalive: a random 4-byte ping, its pong within ping_timeout.
        self._ping_at = None
        if self._closed or self.transport.is_closing():
            return
        self._ping_payload = struct.pack("!I", random.getrandbits(32))
        self._ping_sent_at = self.loop.time()
        self.conn.send_ping(self._ping_payload)
        self._flush()
        if self.ping_timeout is not None:
            self._pong_at = self._ping_sent_at + self.ping_timeout
            self._arm()
        else:
            self._schedule_ping()

    def _pong(self, event: Frame) -> None:
        if self._ping_payload is None or bytes(event.data) != self._ping_payload:
            return
        self._rtt = self.loop.time() - self._ping_sent_at
        self._ping_payload = None
        if self._pong_at is not None:
            self._pong_at = None
            self._schedule_ping()

    def _keepalive_timeout(self) -> None:
        self._pong_at = None
        self._ping_payload = None
        if self._closed or self.transport.is_closing():
            return
        self._ended()
        self.conn.fail(1011, "keepalive ping timeout")
        self._flush()
        self._closed = True
        self.transport.close()

    def _stop_keepalive(self) -> None:
        self._ping_at = self._pong_at = None
        self._ping_payload = None
        self._arm()

    # -- operations --------------------------------------------------------------

    def _subscribe(self, step: wp.Subscribe) -> None:
        payload = {"query": step.query, "variables": step.variables,
                   "operationName": step.operation_name}
        live = self._endpoint.live_ops.open(step.id, payload, self.context)
        if live is not None:
            # A known-planned live document: no task, no Strawberry; its
            # frames are drained into this socket's writes (callback mode).
            self._ops[step.id] = live
            live.start(self._wake, self._live_done, self._fused)
            if self._paused:
                live.pause()
            return
        operation = _Operation(self, step.id)
        operation.task = self.loop.create_task(self._run(operation, step))
        operation.task.add_done_callback(_task_done)
        self._ops[step.id] = operation

    def _complete(self, operation_id: Any) -> None:
        try:
            operation = self._ops.pop(operation_id)
        except (KeyError, TypeError):
            return
        operation.close()

    def _forget(self, operation_id: Any, operation: _Operation | LiveOp) -> None:
        if self._ops.get(operation_id) is operation:
            del self._ops[operation_id]

    def _stop_operations(self) -> None:
        operations, self._ops = self._ops, {}
        for operation in operations.values():
            operation.close()
        self._woken = None

    # -- live operations (callback mode) ---------------------------------------------

    def _wake(self, live: LiveOp) -> None:
        # Called from inside the render pass (a put): only schedule. Every
        # op woken before the next turn drains into one transport.write, and
        # every socket woken before it in one loop callback (`_Drains`).
        woken = self._woken
        if woken is None:
            self._woken = [live]
            self._endpoint.drains(self.loop).add(self)
        else:
            woken.append(live)

    def _fused(self, live: LiveOp, delta: Any, revision: int) -> bool:
        # Called from inside the render pass (a put into a caught-up
        # session): write the frame now when nothing is ahead of it on this
        # socket (no drain pending, not paused, not closing, past the attach
        # gate, no per-message deflate); False leaves it to the wake and drain.
        # A failure here is this socket's alone: the frame is left to the
        # drain (which logs and ends what fails), never raised into the pass.
        if (self._woken is not None or self._paused or self._closed
                or self._gate is not _GATE_NONE or self._deflate):
            return False
        try:
            data = live.frame_bytes(delta, revision)
            if data is None:
                return False
            self.transport.write(data)
        except Exception:
            return False
        return True

    def _live_done(self, operation_id: str) -> None:
        # The session ended: the id is free before its complete is written.
        operation = self._ops.get(operation_id)
        if isinstance(operation, LiveOp):
            del self._ops[operation_id]

    def _drain_live(self) -> None:
        woken, self._woken = self._woken, None
        if not woken or self._closed:
            return
        if self._gate is _GATE_HOLDING:
            self._leave_gate()  # attached: its first frames go now
        if len(woken) == 1:
            # One op woken (one subscription per socket, the common case):
            # its drain's texts go straight to the transport.
            live = woken[0]
            try:
                more = live.drain(self.write_texts)
            except Exception:
                _log.exception("live operation %s failed to drain", live.id)
                self._forget(live.id, live)
                live.close()
                return
            if more and not self._paused:
                self._wake(live)
            return
        texts: list[str] = []
        write = texts.extend
        again: list[LiveOp] = []
        for live in woken:
            try:
                if live.drain(write):
                    again.append(live)
            except Exception:
                # One op's failure is its own: the others' frames are written.
                _log.exception("live operation %s failed to drain", live.id)
                self._forget(live.id, live)
                live.close()
        self.write_texts(texts)
        for live in again:
            if not self._paused:
                self._wake(live)

    async def _run(self, operation: _Operation, step: wp.Subscribe) -> None:
        # Strawberry's run_operation and _send_result_stream.
        endpoint = self._endpoint
        try:
            with contextlib.ExitStack() as scope:
                if endpoint.view.direct_frames:
                    # A planned live field writes its own frames (frames.py),
                    # and teaches LiveOps its document (live_ops.py).
                    scope.enter_context(frames.open_sink(
                        self.send_text, operation.id, endpoint.schema))
                    scope.enter_context(endpoint.live_ops.learning(
                        {"query": step.query, "operationName": step.operation_name}))
                source = await endpoint.schema.stream(
                    step.query,
                    variable_values=step.variables,
                    context_value=self.context,
                    root_value=None,
                    operation_name=step.operation_name,
                )
                async with contextlib.aclosing(source):
                    first = True
                    async for result in source:
                        if first and isinstance(result, PreExecutionError):
                            await self._pre_execution_error(operation, result)
                            return
                        if not isinstance(result, ExecutionResult):
                            await operation.send({
                                "id": operation.id, "type": "error",
                                "payload": [GraphQLError(
                                    "Incremental delivery is not supported over "
                                    "graphql-transport-ws").formatted],
                            })
                            return
                        await self._send_next(operation, result)
                        first = False
            await operation.send({"id": operation.id, "type": "complete"})
        except _OperationStreamClosed:
            return
        except WebSocketDisconnected:
            self._forget(operation.id, operation)
            return
        except Exception as error:
            _task_log.exception("Exception in worker task", exc_info=error)
            with contextlib.suppress(Exception):
                await operation.send({"id": operation.id, "type": "complete"})
            self._forget(operation.id, operation)
            raise

    async def _pre_execution_error(self, operation: _Operation, result: PreExecutionError
                                   ) -> None:
        assert result.errors
        reason = _pre_execution_close_reason(result.errors[0])
        if reason:
            self.close(4400, reason)
            self._forget(operation.id, operation)
            raise _OperationStreamClosed
        await operation.send({"id": operation.id, "type": "error",
                              "payload": [err.formatted for err in result.errors]})

    async def _send_next(self, operation: _Operation, result: ExecutionResult) -> None:
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            payload["errors"] = [err.formatted for err in result.errors]
        if result.extensions:
            payload["extensions"] = result.extensions
        await operation.send({"id": operation.id, "type": "next", "payload": payload})

    # -- sending -----------------------------------------------------------------

    async def send_json(self, message: Mapping[str, object]) -> None:
        """Send one message when the socket is writable (Strawberry's
        ``send_json``; raises `WebSocketDisconnected` once it is closed)."""
        if self._gate is _GATE_HOLDING:
            self._leave_gate()  # an operation's first answer
        if self._paused and not self._closed:
            await self._writable()
        if self._closed:
            raise WebSocketDisconnected
        data = self._endpoint.encode_json(message)
        if isinstance(data, bytes):
            self.conn.send_binary(data)
            self._flush()
        else:
            self._write(data.encode())

    async def send_text(self, text: str) -> None:
        """Send one whole message's text when the socket is writable (a
        direct frame, `frames.FrameSink`; raises as `send_json` does)."""
        if self._gate is _GATE_HOLDING:
            self._leave_gate()  # an operation's first answer
        if self._paused and not self._closed:
            await self._writable()
        if self._closed:
            raise WebSocketDisconnected
        self._write(text.encode())

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

    # -- closing -----------------------------------------------------------------

    def close(self, code: int, reason: str) -> None:
        """Send a close frame and end the socket's work (the peer's echo,
        or a bound, closes the transport)."""
        if self._closed or self._lost:
            return
        self._ended()
        self._closed = True
        raw = reason.encode()
        if len(raw) > _MAX_CLOSE_REASON_BYTES:
            reason = raw[:_MAX_CLOSE_REASON_BYTES].decode("utf-8", errors="ignore")
        try:
            self.conn.send_close(code, reason)
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

    def _ended(self) -> None:
        """The socket's work is over: its operations, timers, slot and count."""
        self._stop_operations()
        if self._init_at is not None or self._max_age_at is not None:
            self._init_at = self._max_age_at = None
            self._arm()
        self._admitting_cancel_quiet()
        if self._gate is not _GATE_NONE and self._admitting is None:
            # Waiting (skipped when reached), or its admit task is gone.
            self._leave_gate()
        self._release_slot()
        if self._counted:
            self._counted = False
            self._endpoint.view.open_sockets -= 1

    def _admitting_cancel_quiet(self) -> None:
        admitting = self._admitting
        if admitting is not None and admitting is not asyncio.current_task():
            admitting.cancel()
        self._admitting = None

    def _release_slot(self) -> None:
        if self._slot:
            self._slot = False
            slots = self._endpoint.view.handshakes
            slots.release()
            self._endpoint.gate(self.loop).answer_next(slots)


_BINARY = b"\0binary"
"""Stands for a binary message in the socket's queue (`WireSocket._message`)."""


def _close_args(close: wp.Close) -> tuple[int, str]:
    return close.code, close.reason


def _pre_execution_close_reason(error: GraphQLError) -> str | None:
    """The 4400 reason of an error before execution (graphql-transport-ws: a
    document that does not parse, or names no operation), or None when it
    is the operation's ``error`` message (a refusal of the limiters among
    them: the socket and its other operations stay up)."""
    if refusal_of(error) is not None:
        return None
    if isinstance(error, GraphQLSyntaxError):
        return error.message
    if isinstance(error.original_error, CannotGetOperationTypeError):
        return error.original_error.as_http_error_reason()
    return None


@functools.cache
def _asgi_socket_class() -> Any:
    """uvicorn's websockets-sansio protocol class, as ``ws="websockets-sansio"`` names it."""
    return import_from_string(WS_PROTOCOLS["websockets-sansio"])


def _task_done(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()

