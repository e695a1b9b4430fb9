"""A socket's handshake and admission: the upgrade answered (or handed to
uvicorn's own protocol when on another path), ``ws_max_sockets``, the
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
from typing import Any, NamedTuple, cast

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

from . import wire_protocol as wp
from .app import (
    TRY_AGAIN_LATER_CLOSE_CODE,
    EdgeRefusal,
    HandshakeSlots,
    new_context,
)
from .wire_state import GATE_HOLDING, GATE_NONE, GATE_WAITING, SocketState, close_args, encoded

__all__ = [
    "TURN_AFTER_ACK",
    "AttachGate",
    "SocketAdmission",
    "Upgrade",
    "WireRequest",
    "accepting",
    "read_upgrade",
]

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


class AttachGate:
    """The admission of one loop's sockets, holding no task per waiting one.

    At most ``limit`` sockets (``ws_max_attaching``) are being attached at
    once: a turn runs from ``connection_init`` to the first answer of the
    socket's first operation (`SocketAdmission._leave_gate`); the others wait in
    arrival order and `SocketAdmission._through_gate` starts the work when a turn
    comes. Upgrades waiting, unanswered, for a handshake slot wait in
    ``unanswered`` (`SocketAdmission._release_slot` answers the next)."""

    __slots__ = ("free", "loop", "unanswered", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.loop = loop
        self.free = limit
        self.waiting: deque[SocketState] = deque()
        self.unanswered: deque[SocketState] = deque()
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

    def enter(self, socket: SocketState) -> bool:
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
            if socket._gate is GATE_WAITING:
                socket._through_gate()
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


class SocketAdmission(SocketState):
    """The upgrade, the handshake slots and the attach gate, the ``connection_init``."""

    __slots__ = ()

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

    def _upgrade(self, data: bytes) -> None:
        """The upgrade's bytes as uvicorn hands them (`read_upgrade`): answer
        it (`_answer`), refuse it, or hand it on when it is for another path."""
        server = self._server
        assert server is not None
        data = server[0] + data if server[0] else data
        if b"\r\n\r\n" not in data:
            self._server = (data, *server[1:])  # (uvicorn hands it whole)
            return
        self._upgraded = True
        self._server = None
        try:
            upgrade = read_upgrade(data)
        except (ValueError, SecurityError) as exc:
            # websockets' answers to a request its parser refuses.
            status = (http.HTTPStatus.REQUEST_URI_TOO_LONG if isinstance(exc, RequestLineTooLong)
                      else http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
                      if isinstance(exc, SecurityError) else http.HTTPStatus.BAD_REQUEST)
            self._send_response_and_close(self.conn.reject(
                status, f"Failed to open a WebSocket connection: {exc}.\n"))
            return
        if not self._endpoint.serves(upgrade.path):
            self._hand_on(data, *server[1:])
            return
        request = Request(upgrade.path, WsHeaders(upgrade.handshake), upgrade.method)
        # websockets validates the handshake and negotiates the extensions
        # (only now is it known whether this socket's frames are compressed).
        response = self.conn.accept(request)
        if response.status_code != 101:
            # Not a valid upgrade (websockets' own refusal, as uvicorn sends it).
            self._send_response_and_close(response)
            return
        self._deflate = bool(self.conn.extensions)
        # The path is the endpoint's, and the peer's host one string per
        # host: shared, not one copy per socket.
        client = self.transport.get_extra_info("peername")
        if isinstance(client, tuple) and len(client) >= 2:
            client = (sys.intern(str(client[0])), int(client[1]))
        else:
            client = None
        self.request = WireRequest(upgrade.block, self._endpoint.path, client)
        self._answer(request, response)

    def _answer(self, request: Request, response: Response) -> None:
        view = self._endpoint.view
        if view.engine.shutting_down:
            # A pod that is shutting down takes no new session: 403.
            self._reject()
            return
        offered: list[str] = []
        for header in request.headers.get_all("Sec-WebSocket-Protocol"):
            offered.extend(token.strip() for token in header.split(","))
        subprotocol = (GRAPHQL_TRANSPORT_WS_PROTOCOL
                       if GRAPHQL_TRANSPORT_WS_PROTOCOL in offered else None)
        # The 101 as it is written, built once: a burst that holds every
        # handshake slot waits with it alone (the parsed request and
        # websockets' response are not kept: thousands of sockets wait here).
        answer = accepting(response, self._default_headers(), subprotocol)
        if view.open_sockets >= self._endpoint.config.ws_max_sockets:
            self._accept(answer)
            self.close(
                TRY_AGAIN_LATER_CLOSE_CODE,
                f"{EdgeRefusal.TOO_MANY_SOCKETS}: this pod holds ws_max_sockets "
                f"({self._endpoint.config.ws_max_sockets}); reconnect later",
            )
            return
        view.open_sockets += 1
        self._counted = True
        self.subprotocol = subprotocol
        slots = view.handshakes
        if not slots.full() and not self._endpoint.gate(self.loop).unanswered:
            slots.take()
            self._slot = True
            self._admitted(answer)
            return
        # A burst holds every slot: wait for one, unanswered, holding the
        # answer's bytes. No task: it waits in the endpoint's queue
        # (`_release_slot`).
        self._unanswered = answer
        self._endpoint.gate(self.loop).unanswered.append(self)

    def _slot_taken(self) -> None:
        """A handshake slot came for this unanswered socket (`AttachGate.answer_next`)."""
        self._slot = True
        answer, self._unanswered = self._unanswered, None
        assert answer is not None
        self._admitted(answer)

    def _admitted(self, answer: bytes) -> None:
        view = self._endpoint.view
        assert self.request is not None
        if not view.origin_allowed(self.request):
            self._reject()
            self._ended()
            return
        self._accept(answer)
        self.context = new_context(
            view.engine, cast(Any, self.request), cast(Any, self), handshake_at=self.loop.time()
        )
        if self.subprotocol is None:
            self.close(*close_args(wp.SUBPROTOCOL_NOT_ACCEPTABLE))
            return
        now = self.loop.time()
        self._init_at = now + self._endpoint.init_timeout
        self._max_age_at = now + self._endpoint.max_age
        self._arm()
        if self._inbox:
            self._drain_inbox()

    def _accept(self, answer: bytes) -> None:
        """Write the 101 (`accepting`) and start the keepalive."""
        if self.transport.is_closing():
            return
        self.transport.write(answer)
        self._start_keepalive()

    def _default_headers(self) -> list[tuple[bytes, bytes]]:
        headers, self._headers_out = self._headers_out, None
        return headers or []

    def _reject(self) -> None:
        # uvicorn's answer to a close before the accept: 403, no body.
        self._send_response_and_close(self.conn.reject(403, ""))

    def _send_response_and_close(self, response: Response) -> None:
        self._closed = True
        self.transport.write(response.serialize())
        self.transport.close()

    def _through_gate(self) -> None:
        """The attach gate's turn came for this waiting socket."""
        payload, self._pending_init = self._pending_init, None
        assert payload is not None
        self._gate = GATE_HOLDING
        self._admitting = self.loop.create_task(self._admit(payload))

    def _leave_gate(self) -> None:
        gate, self._gate = self._gate, GATE_NONE
        self._pending_init = None
        self._gate_at = None
        if gate is GATE_HOLDING:
            self._endpoint.gate(self.loop).leave()

    def _drain_inbox(self) -> None:
        while (self._inbox and not self._closed and self._admitting is None
               and self._gate is not GATE_WAITING):
            data = self._inbox.pop(0)
            self._handle(data)
        if self._admitting is None and self._gate is not GATE_WAITING:
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
            if self._gate is GATE_HOLDING:
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
                self.close(*close_args(wp.FORBIDDEN))
                return
            if self._closed:
                return
            if isinstance(ack, UnsetType):
                self._write(self._endpoint.ack)
            else:
                self._write(encoded(self._endpoint.encode_json(
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
