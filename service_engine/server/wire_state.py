"""The state of one engine socket, shared by its units (`service_engine.server.wire`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.server import ServerState
from websockets.http11 import Response
from websockets.server import ServerProtocol

from . import wire_protocol as wp
from .app import (
    GraphQLContext,
)
from .live_op import LiveOp

_log = logging.getLogger(__name__)


class SocketState(asyncio.Protocol):
    """One socket's state, shared by the units of `wire.WireSocket` (its
    admission, deadlines, operations and writer, one module each); the
    methods one unit calls on another are declared here for the checker."""

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
        "subprotocol",
        "transport",
    )

    _endpoint: Any  # the socket's `wire.WireEndpoint` (the units import this state, not it)
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    conn: ServerProtocol
    connections: set[Any]
    ping_interval: float | None
    ping_timeout: float | None
    _deflate: bool
    _headers_out: list[tuple[bytes, bytes]] | None
    _counted: bool
    _init: wp.InitState
    _init_extended: bool
    _due_step: int | None
    _init_at: float | None
    _max_age_at: float | None
    _ping_at: float | None
    _pong_at: float | None
    _close_at: float | None
    _ping_payload: bytes | None
    _ping_sent_at: float
    _rtt: float
    _ops: dict[Any, Any]  # operation id -> `wire_operations.Operation` or `LiveOp`
    _woken: list[LiveOp] | None
    _fragments: list[bytes] | None
    _text: bool
    _inbox: list[bytes] | None
    _admitting: asyncio.Task[None] | None
    _gate: int
    _gate_at: float | None
    _pending_init: dict[str, object] | None
    _read_paused: bool
    _paused: bool
    _waiters: list[asyncio.Future[None]] | None
    _slot: bool
    _unanswered: bytes | None
    """While waiting unanswered for a handshake slot: its 101, as written."""
    _closed: bool
    _lost: bool
    _upgraded: bool
    _server: tuple[bytes, uvicorn.Config, ServerState, dict[str, Any]] | None
    context: GraphQLContext[Any] | None
    subprotocol: str | None
    request: Any  # the upgrade's `wire_admission.WireRequest`, once admitted

    if TYPE_CHECKING:
        def _arm(self) -> None: ...
        def close(self, code: int, reason: str) -> None: ...
        def _close_now(self) -> None: ...
        def _ended(self) -> None: ...
        def _flush(self) -> None: ...
        def _write(self, text: bytes) -> None: ...
        def write_texts(self, texts: list[str]) -> None: ...
        def _wake_writers(self) -> None: ...
        async def _writable(self) -> None: ...
        async def send_json(self, message: Mapping[str, object]) -> None: ...
        def _leave_gate(self) -> None: ...
        def _release_slot(self) -> None: ...
        def _drain_inbox(self) -> None: ...
        def _handle(self, data: bytes) -> None: ...
        def _send_response_and_close(self, response: Response) -> None: ...
        def _stop_operations(self) -> None: ...
        def _forget(self, operation_id: Any, operation: Any) -> None: ...
        def _stop_keepalive(self) -> None: ...
        def _start_keepalive(self) -> None: ...
        def _drain_live(self) -> None: ...
        def _on_timer(self) -> None: ...
        def _slot_taken(self) -> None: ...
        def _through_gate(self) -> None: ...


GATE_NONE, GATE_WAITING, GATE_HOLDING = 0, 1, 2
"""Where a socket is at the attach gate (`wire_admission.AttachGate`)."""


def encoded(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def close_args(close: wp.Close) -> tuple[int, str]:
    return close.code, close.reason
