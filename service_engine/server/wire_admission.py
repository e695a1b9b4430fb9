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
from typing import Any, cast

import uvicorn
from starlette.datastructures import Headers
from strawberry.exceptions import ConnectionRejectionError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.types.unset import UnsetType
from uvicorn.config import WS_PROTOCOLS
from uvicorn.importer import import_from_string
from uvicorn.server import ServerState
from websockets.datastructures import Headers as WsHeaders
from websockets.http11 import Request, Response

from . import wire_protocol as wp
from .app import (
    TRY_AGAIN_LATER_CLOSE_CODE,
    EdgeRefusal,
    HandshakeSlots,
    new_context,
)
from .wire_state import GATE_HOLDING, GATE_NONE, GATE_WAITING, SocketState, close_args, encoded

__all__ = ["TURN_AFTER_ACK", "AttachGate", "SocketAdmission", "WireRequest"]

_log = logging.getLogger(__name__)


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
        self._headers = "\r\n".join(
            [f"{key.lower()}: {value}" for key, value in headers]
        ).encode("latin-1")
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


_SWITCHING = http.HTTPStatus.SWITCHING_PROTOCOLS.phrase
"""The reason phrase of a 101 (websockets' ``accept`` answers with it)."""

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
        # A burst holds every slot: wait for one, unanswered, holding the
        # upgrade's headers as `WireRequest`'s one bytes object and the
        # headers of websockets' accepting response as one string (the
        # response is rebuilt from them when the slot comes: the handshake
        # is validated and accepted once). Neither the parsed request (nor
        # websockets' parser that keeps it) nor the response: thousands of
        # sockets wait here in a burst, and their parsed headers (~70 small
        # blocks a socket) would be freed only after the sessions admitted
        # meanwhile had filled the heap around them.
        response = self.response
        assert response is not None
        self.response = None
        self._unanswered = "\r\n".join(
            f"{name}: {value}" for name, value in response.headers.raw_items())
        # No task: it waits in the endpoint's queue (`_release_slot`).
        self._endpoint.gate(self.loop).unanswered.append(self)

    def _slot_taken(self) -> None:
        """A handshake slot came for this unanswered socket (`AttachGate.answer_next`)."""
        self._slot = True
        headers, self._unanswered = self._unanswered, None
        assert headers is not None
        self.response = Response(101, _SWITCHING, WsHeaders(
            [cast(tuple[str, str], tuple(line.split(": ", 1))) for line in headers.split("\r\n")]
        ))
        self._admitted()

    def _admitted(self) -> None:
        view = self._endpoint.view
        assert self.request is not None
        if not view.origin_allowed(self.request):
            self._reject()
            self._ended()
            return
        self._accept(self.subprotocol)
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
