"""A socket's handshake and admission (a unit of
`service_engine.server.wire.WireSocket`): the upgrade answered (or handed
to uvicorn's own protocol when on another path), ``ws_max_sockets``, the
``ws_max_handshakes`` slots, the origin, and the ``connection_init``
through the attach gate (``ws_max_attaching``) to the principal's
resolve and the ack."""

from __future__ import annotations

import asyncio
import functools
import http
import logging
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, cast

import uvicorn
from starlette.datastructures import Headers
from strawberry.exceptions import ConnectionRejectionError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.types.unset import UnsetType
from uvicorn.config import WS_PROTOCOLS
from uvicorn.importer import import_from_string
from uvicorn.server import ServerState
from websockets.datastructures import Headers as WsHeaders
from websockets.exceptions import (
    HeaderLineTooLong,
    RequestLineTooLong,
    SecurityError,
    TooManyHeaders,
)
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request, Response
from websockets.server import ServerProtocol

from . import wire_protocol as wp
from .app import (
    TRY_AGAIN_LATER_CLOSE_CODE,
    EdgeRefusal,
    GraphQLContext,
    HandshakeSlots,
    new_context,
)
from .wire_writer import SocketWriter

__all__ = ["GATE_HOLDING", "GATE_NONE", "GATE_WAITING", "TURN_AFTER_ACK", "AttachGate", "Host",
           "SocketAdmission", "Upgrade", "WireRequest", "accepting", "read_upgrade"]

_log = logging.getLogger(__name__)


class Upgrade(NamedTuple):
    """An upgrade request as uvicorn hands it to the ``ws`` protocol
    (`read_upgrade`): its method, its target and its header lines."""

    method: str
    path: str
    """The request target (the path and its query)."""
    block: bytes
    """The header lines, ``name: value`` each (names lowercased), joined by CRLF."""
    handshake: list[tuple[str, str]]
    """The headers websockets' ``ServerProtocol.accept`` reads (``Connection``,
    ``Upgrade``, ``Origin`` and the ``Sec-WebSocket-*`` ones), in order: the
    others (the passport among them) are read from `WireRequest`, not
    copied into websockets' headers."""


_HANDSHAKE_HEADERS = frozenset({b"connection", b"upgrade", b"origin"})


def read_upgrade(data: bytes) -> Upgrade:
    """The upgrade request uvicorn's HTTP protocol parsed and hands on, as
    bytes, to the ``ws`` protocol it builds: its request line, then one
    ``name: value`` line per header, names lowercased, then an empty line
    (uvicorn writes it from what httptools parsed, so it is read here, not
    parsed again by websockets). Raises ValueError for bytes not of that
    form, and websockets' own `RequestLineTooLong`, `HeaderLineTooLong` and
    `TooManyHeaders` past its bounds (``MAX_LINE_LENGTH`` bytes a line with
    its CRLF, ``MAX_NUM_HEADERS`` headers), as its parser would."""
    head, found, _ = data.partition(b"\r\n\r\n")
    if not found:
        raise ValueError("the request's head is not terminated")
    line, _, block = head.partition(b"\r\n")
    if len(line) + 2 > MAX_LINE_LENGTH:
        raise RequestLineTooLong(
            f"read {len(line) + 2} bytes, expected no more than {MAX_LINE_LENGTH} bytes")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise ValueError("the request line is not method, target and version")
    lines = block.split(b"\r\n") if block else []
    if len(lines) > MAX_NUM_HEADERS:
        raise TooManyHeaders(f"expected no more than {MAX_NUM_HEADERS} headers")
    lowered = False
    handshake: list[tuple[str, str]] = []
    for at, header in enumerate(lines):
        if len(header) + 2 > MAX_LINE_LENGTH:
            raise HeaderLineTooLong(
                f"read {len(header) + 2} bytes, expected no more than {MAX_LINE_LENGTH} bytes")
        name, colon, value = header.partition(b": ")
        if not colon or not name:
            raise ValueError(f"header line {at + 1} is not 'name: value'")
        if name.lower() != name:
            name = name.lower()
            lines[at] = name + header[len(name):]
            lowered = True
        if name in _HANDSHAKE_HEADERS or name.startswith(b"sec-websocket-"):
            handshake.append((name.decode("latin-1"), value.decode("latin-1")))
    if lowered:
        block = b"\r\n".join(lines)
    return Upgrade(parts[0].decode("ascii", "surrogateescape"),
                   parts[1].decode("ascii", "surrogateescape"), block, handshake)


def accepting(response: Response, default_headers: Iterable[tuple[bytes, bytes]],
              subprotocol: str | None) -> bytes:
    """The 101 written for websockets' accepting ``response`` (from
    ``ServerProtocol.accept``): its status line and headers but its Date,
    then the server's default headers (uvicorn's date and server), then the
    subprotocol chosen: the bytes uvicorn's own protocol writes."""
    lines = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}"]
    lines += [f"{name}: {value}" for name, value in response.headers.raw_items()
              if name.lower() != "date"]
    lines += [f"{name.decode('latin-1').lower()}: {value.decode('latin-1')}"
              for name, value in default_headers]
    if subprotocol:
        lines.append(f"Sec-WebSocket-Protocol: {subprotocol}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode()


class WireRequest:
    """What a resolver reads of the upgrade as ``info.context.request``: its
    headers (`starlette.datastructures.Headers`), path and client.

    The headers are kept as the one bytes object of the upgrade's header
    lines (`Upgrade.block`: ``name: value`` lines, names lowercased) and
    parsed when read: a socket holds one object, not a tuple and two bytes
    per header, for headers read once (the passport, at ``connection_init``)."""

    __slots__ = ("_headers", "client", "path")

    def __init__(self, block: bytes, path: str, client: tuple[str, int] | None) -> None:
        self._headers = block
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

    def get(self, name: str) -> str | None:
        """The value of the header ``name`` (its first, as ``headers.get``
        answers), found in the one bytes object without parsing the rest."""
        key = name.lower().encode("latin-1") + b": "
        blob = self._headers
        if blob.startswith(key):
            start = len(key)
        else:
            at = blob.find(b"\r\n" + key)
            if at < 0:
                return None
            start = at + 2 + len(key)
        end = blob.find(b"\r\n", start)
        return blob[start:end if end >= 0 else len(blob)].decode("latin-1")

    @property
    def scope(self) -> Mapping[str, Any]:
        return {"type": "websocket", "path": self.path, "headers": self._raw(),
                "client": self.client}


class Host(Protocol):
    """What a socket's admission needs of the socket (`wire.WireSocket`): its
    transport, websockets connection and writer, and the steps it takes for
    the admission: answer a refusal (`_respond`), write the 101 and start
    the keepalive (`_accept`), start the init timeout and max age
    (`_opened`), start the attach turn's bound (`_turn`), leave the gate,
    drop the admission once `SocketAdmission.done` (`_settle`)."""

    _endpoint: Any  # its `wire.WireEndpoint` (built on this module, not imported)
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    conn: ServerProtocol
    connections: set[Any]
    writer: SocketWriter
    admission: SocketAdmission | None
    context: GraphQLContext[Any] | None
    _counted: bool
    _lost: bool

    def close(self, code: int, reason: str) -> None: ...
    def _handle(self, data: bytes) -> None: ...
    def _ended(self) -> None: ...
    def _respond(self, response: Response) -> None: ...
    def _accept(self, answer: bytes) -> None: ...
    def _opened(self) -> None: ...
    def _turn(self, bound: float) -> None: ...
    def _leave_gate(self) -> None: ...
    def _settle(self) -> None: ...


S = TypeVar("S", bound=Host)


GATE_NONE, GATE_WAITING, GATE_HOLDING = 0, 1, 2
"""Where a socket is at the attach gate (`AttachGate`)."""


class AttachGate(Generic[S]):
    """The admission of one loop's sockets, holding no task per waiting one.

    At most ``limit`` sockets (``ws_max_attaching``) are being attached at
    once: a turn runs from ``connection_init`` to the first answer of the
    socket's first operation (`SocketAdmission.leave_gate`); the others wait in
    arrival order and `SocketAdmission.through_gate` starts the work when a turn
    comes. Upgrades waiting, unanswered, for a handshake slot wait in
    ``unanswered`` (`SocketAdmission.release_slot` answers the next)."""

    __slots__ = ("free", "loop", "unanswered", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.loop = loop
        self.free = limit
        self.waiting: deque[S] = deque()
        self.unanswered: deque[S] = deque()
        """Upgrades waiting, unanswered, for a handshake slot (``ws_max_handshakes``)."""

    def answer_next(self, slots: HandshakeSlots) -> None:
        """Give free handshake slots to the upgrades waiting longest."""
        unanswered = self.unanswered
        while unanswered and not slots.full():
            socket = unanswered.popleft()
            admission = socket.admission
            if admission is not None and admission.unanswered and not socket._lost:
                slots.take()
                try:
                    admission.slot_taken(socket)
                except Exception:
                    # Its failure is its own: the releasing socket goes on.
                    _log.exception("an upgrade could not be answered")
                    socket.transport.abort()

    def enter(self, socket: S) -> bool:
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
            admission = socket.admission
            if admission is not None and admission.gate is GATE_WAITING:
                admission.through_gate(socket)
                return
        self.free += 1


TURN_AFTER_ACK = 2.0
"""Seconds an acknowledged socket keeps its attach turn waiting for its
first operation's first answer (at most the init timeout): a socket that
sends nothing holds a turn this long, not the whole init timeout."""


@functools.cache
def _asgi_socket_class() -> Any:
    """uvicorn's websockets-sansio protocol class, as ``ws="websockets-sansio"`` names it."""
    return import_from_string(WS_PROTOCOLS["websockets-sansio"])


class SocketAdmission:
    """One socket's way in, from its upgrade's bytes to its ack and the end
    of its attach turn: the upgrade read and answered (`upgrade`), its
    handshake slot (`release_slot`), the ``connection_init`` through the
    attach gate (`admit`), and the messages that wait meanwhile (`queue`,
    `drain_inbox`). The socket is passed to each step (`Host`: what the
    admission needs of it); once admitted, nothing left of this (`done`),
    the socket drops it (its size differs from the long-lived units': the
    pools a burst of them fills are freed whole)."""

    __slots__ = ("admitting", "app_state", "config", "gate", "head", "inbox", "init",
                 "init_extended", "pending_init", "read_paused", "request", "server_state",
                 "slot", "subprotocol", "unanswered")

    def __init__(self, config: uvicorn.Config, server_state: ServerState,
                 app_state: dict[str, Any]) -> None:
        self.head: bytes | None = b""
        """Until the upgrade is read: its bytes read so far."""
        # The server's arguments (what another path's socket is handed: `_hand_on`).
        self.config, self.server_state, self.app_state = config, server_state, app_state
        self.init = wp.InitState()
        self.init_extended = False
        self.request: WireRequest | None = None
        self.subprotocol: str | None = None
        self.slot = False
        self.unanswered: bytes | None = None
        """While waiting unanswered for a handshake slot: its 101, as written."""
        self.gate = GATE_NONE
        self.pending_init: dict[str, object] | None = None
        self.admitting: asyncio.Task[None] | None = None
        self.inbox: list[bytes] | None = None
        self.read_paused = False

    @property
    def done(self) -> bool:
        """Acknowledged, its turn over, nothing waiting: the socket drops it."""
        return (self.init.acknowledged and self.gate is GATE_NONE and self.admitting is None
                and self.inbox is None and not self.slot and not self.read_paused)

    def upgrade(self, socket: Host, data: bytes) -> None:
        """The upgrade's bytes as uvicorn hands them (`read_upgrade`): answer
        it (`_answer`), refuse it, or hand it on when it is for another path."""
        head = self.head
        assert head is not None
        data = head + data if head else data
        if b"\r\n\r\n" not in data:
            self.head = data  # (uvicorn hands it whole)
            return
        self.head = None
        try:
            upgrade = read_upgrade(data)
        except (ValueError, SecurityError) as exc:
            # websockets' answers to a request its parser refuses.
            status = (http.HTTPStatus.REQUEST_URI_TOO_LONG if isinstance(exc, RequestLineTooLong)
                      else http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
                      if isinstance(exc, SecurityError) else http.HTTPStatus.BAD_REQUEST)
            socket._respond(socket.conn.reject(
                status, f"Failed to open a WebSocket connection: {exc}.\n"))
            return
        endpoint = socket._endpoint
        if not endpoint.serves(upgrade.path):
            self._hand_on(socket, data)
            return
        request = Request(upgrade.path, WsHeaders(upgrade.handshake), upgrade.method)
        # websockets validates the handshake and negotiates the extensions
        # (only now is it known whether this socket's frames are compressed).
        response = socket.conn.accept(request)
        if response.status_code != 101:
            # Not a valid upgrade (websockets' own refusal, as uvicorn sends it).
            socket._respond(response)
            return
        socket.writer.deflate = bool(socket.conn.extensions)
        # The path is the endpoint's, and the peer's host one string per
        # host: shared, not one copy per socket.
        client = socket.transport.get_extra_info("peername")
        if isinstance(client, tuple) and len(client) >= 2:
            client = (sys.intern(str(client[0])), int(client[1]))
        else:
            client = None
        self.request = WireRequest(upgrade.block, endpoint.path, client)
        self._answer(socket, request, response,
                     [*self.server_state.default_headers, *self.config.encoded_headers])

    def _hand_on(self, socket: Host, head: bytes) -> None:
        """An upgrade on another path: served through ASGI by uvicorn's own
        websockets-sansio protocol, handed the connection as uvicorn's HTTP
        protocol hands it (built with the same arguments, the transport set
        to it, the bytes read so far fed to it)."""
        socket.writer.closed = socket._lost = True
        socket.connections.discard(socket)
        other = _asgi_socket_class()(config=self.config, server_state=self.server_state,
                                     app_state=self.app_state)
        other.connection_made(socket.transport)
        socket.transport.set_protocol(other)
        other.data_received(head)

    def _answer(self, socket: Host, request: Request, response: Response,
                default_headers: list[tuple[bytes, bytes]]) -> None:
        endpoint = socket._endpoint
        view = endpoint.view
        if view.engine.shutting_down:
            # A pod that is shutting down takes no new session: 403.
            socket._respond(socket.conn.reject(403, ""))
            return
        offered: list[str] = []
        for header in request.headers.get_all("Sec-WebSocket-Protocol"):
            offered.extend(token.strip() for token in header.split(","))
        subprotocol = (GRAPHQL_TRANSPORT_WS_PROTOCOL
                       if GRAPHQL_TRANSPORT_WS_PROTOCOL in offered else None)
        # The 101 as it is written, built once: a burst that holds every
        # handshake slot waits with it alone (the parsed request and
        # websockets' response are not kept: thousands of sockets wait here).
        answer = accepting(response, default_headers, subprotocol)
        if view.open_sockets >= endpoint.config.ws_max_sockets:
            socket._accept(answer)
            socket.close(
                TRY_AGAIN_LATER_CLOSE_CODE,
                f"{EdgeRefusal.TOO_MANY_SOCKETS}: this pod holds ws_max_sockets "
                f"({endpoint.config.ws_max_sockets}); reconnect later",
            )
            return
        view.open_sockets += 1
        socket._counted = True
        self.subprotocol = subprotocol
        slots = view.handshakes
        gate = endpoint.gate(socket.loop)
        if not slots.full() and not gate.unanswered:
            slots.take()
            self.slot = True
            self._admitted(socket, answer)
            return
        # A burst holds every slot: wait for one, unanswered, holding the
        # answer's bytes. No task: it waits in the endpoint's queue
        # (`release_slot`).
        self.unanswered = answer
        gate.unanswered.append(socket)

    def slot_taken(self, socket: Host) -> None:
        """A handshake slot came for this unanswered socket (`AttachGate.answer_next`)."""
        self.slot = True
        answer, self.unanswered = self.unanswered, None
        assert answer is not None
        self._admitted(socket, answer)

    def _admitted(self, socket: Host, answer: bytes) -> None:
        view = socket._endpoint.view
        request, self.request = self.request, None  # the context's from now on
        assert request is not None
        if not view.origin_allowed(request):
            # uvicorn's answer to a close before the accept: 403, no body.
            socket._respond(socket.conn.reject(403, ""))
            socket._ended()
            return
        socket._accept(answer)
        socket.context = new_context(
            view.engine, cast(Any, request), cast(Any, socket), handshake_at=socket.loop.time()
        )
        if self.subprotocol is None:
            socket.close(wp.SUBPROTOCOL_NOT_ACCEPTABLE.code, wp.SUBPROTOCOL_NOT_ACCEPTABLE.reason)
            return
        socket._opened()
        if self.inbox:
            self.drain_inbox(socket)

    def queue(self, transport: asyncio.Transport, data: bytes) -> None:
        """A message that waits for the admission (reading paused meanwhile)."""
        if self.inbox is None:
            self.inbox = []
        self.inbox.append(data)
        if not self.read_paused:
            self.read_paused = True
            transport.pause_reading()

    def drain_inbox(self, socket: Host) -> None:
        """Handle the messages that waited, in order, while nothing holds them."""
        writer = socket.writer
        while (self.inbox and not writer.closed and self.admitting is None
               and self.gate is not GATE_WAITING):
            data = self.inbox.pop(0)
            socket._handle(data)
        if self.admitting is None and self.gate is not GATE_WAITING:
            self.inbox = None
        if self.read_paused and not self.inbox and not writer.closed:
            self.read_paused = False
            socket.transport.resume_reading()

    def closed(self, transport: asyncio.Transport) -> None:
        """The socket sent its close: what waited is dropped, reading resumes."""
        self.inbox = None
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()

    def admit(self, socket: Host, payload: dict[str, object]) -> None:
        """The ``connection_init`` to acknowledge: its turn at the attach
        gate now, or when it comes (`through_gate`); what follows waits."""
        if self.inbox is None:
            self.inbox = []  # what follows waits for the ack
        if socket._endpoint.gate(socket.loop).enter(socket):
            self.gate = GATE_HOLDING
            self.admitting = socket.loop.create_task(self._admit(socket, payload))
        else:
            # Its turn comes (`through_gate`); its init timeout has ended.
            self.gate = GATE_WAITING
            self.pending_init = payload

    def through_gate(self, socket: Host) -> None:
        """The attach gate's turn came for this waiting socket."""
        payload, self.pending_init = self.pending_init, None
        assert payload is not None
        self.gate = GATE_HOLDING
        self.admitting = socket.loop.create_task(self._admit(socket, payload))

    def leave_gate(self, gate: AttachGate[Any]) -> None:
        """The socket's turn at ``gate`` ends (or its wait there)."""
        was, self.gate = self.gate, GATE_NONE
        self.pending_init = None
        if was is GATE_HOLDING:
            gate.leave()

    async def _admit(self, socket: Host, payload: dict[str, object]) -> None:
        writer = socket.writer
        try:
            await self._admit_in_turn(socket, payload)
        finally:
            if not self.init.acknowledged or writer.closed or socket._lost:
                socket._leave_gate()
        if self.admitting is None and not writer.closed and not socket._lost:
            if self.gate is GATE_HOLDING:
                # The turn lasts until the socket's first operation answers
                # (a live one's Reset: its attach) or a bound passes.
                socket._turn(TURN_AFTER_ACK)
            self.drain_inbox(socket)
            socket._settle()

    async def _admit_in_turn(self, socket: Host, payload: dict[str, object]) -> None:
        context = socket.context
        assert context is not None
        endpoint, writer = socket._endpoint, socket.writer
        try:
            refused = await endpoint.view.admit(context, payload)
            if writer.closed:
                return
            if refused is not None:
                self.admitting = None
                socket.close(refused[0], refused[1])
                return
            self.init.received = True
            context.connection_params = payload
            try:
                ack = await endpoint.view.on_ws_connect(context)
            except ConnectionRejectionError:
                self.admitting = None
                socket.close(wp.FORBIDDEN.code, wp.FORBIDDEN.reason)
                return
            if writer.closed:
                return
            if isinstance(ack, UnsetType):
                writer.write(endpoint.ack)
            else:
                writer.write(endpoint.encode_json(
                    {"type": "connection_ack", "payload": ack}).encode())
            self.init.acknowledged = True
        except asyncio.CancelledError:
            return
        except Exception:
            _log.exception("connection_init failed")
            self.admitting = None
            socket.close(4500, "internal_error: connection_init failed")
            return
        self.admitting = None

    def end(self, socket: Host) -> None:
        """The socket's work is over: its admit task, its turn, its slot."""
        admitting, self.admitting = self.admitting, None
        if admitting is not None and admitting is not asyncio.current_task():
            admitting.cancel()
        if self.gate is not GATE_NONE:
            # Waiting (skipped when reached), or its admit task is gone.
            socket._leave_gate()
        self.release_slot(socket)

    def release_slot(self, socket: Host) -> None:
        if self.slot:
            self.slot = False
            slots = socket._endpoint.view.handshakes
            slots.release()
            socket._endpoint.gate(socket.loop).answer_next(slots)
