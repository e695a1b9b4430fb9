"""graphql-transport-ws as pure decisions: what a message asks for, which
close ends a socket, and the bytes of a server's text frame. No I/O.

The decisions, close codes and reasons are Strawberry's handler's
(``graphql_transport_ws/handlers.py``), so a client cannot tell the two
apart, except where that handler dropped the socket without a close frame:
JSON that is not an object or has an ``id`` / ``payload`` of the wrong type
(or nests past the recursion limit) closes 4400; a ``connection_init``
whose admission raised closes 4500; any other failure closes 1011.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "DUPLICATE_CLOSE_CODE", "FORBIDDEN", "INIT_TIMEOUT", "INVALID_INIT_PAYLOAD", "INVALID_JSON",
    "MAX_CLOSE_REASON_BYTES", "NOT_TEXT", "PARSE_FAILED", "SUBPROTOCOL_NOT_ACCEPTABLE",
    "TOO_MANY_INITS", "UNAUTHORIZED", "Admit", "Close", "Complete", "Ignore", "InitState", "Ping",
    "Pong", "Refuse", "Subscribe", "decode", "duplicate", "fit_close_reason", "message_too_big",
    "on_init", "on_message", "on_subscribe", "text_frame", "too_many_subscriptions",
]


@dataclass(frozen=True, slots=True)
class Close:
    """End the socket with this close frame."""

    code: int
    reason: str


INVALID_JSON: Final = Close(4400, "WebSocket message must be valid JSON")
NOT_TEXT: Final = Close(4400, "WebSocket message type must be text")
PARSE_FAILED: Final = Close(4400, "Failed to parse message")
INVALID_INIT_PAYLOAD: Final = Close(4400, "Invalid connection init payload")
INIT_TIMEOUT: Final = Close(4408, "Connection initialisation timeout")
UNAUTHORIZED: Final = Close(4401, "Unauthorized")
FORBIDDEN: Final = Close(4403, "Forbidden")
SUBPROTOCOL_NOT_ACCEPTABLE: Final = Close(4406, "Subprotocol not acceptable")
TOO_MANY_INITS: Final = Close(4429, "Too many initialisation requests")
DUPLICATE_CLOSE_CODE: Final = 4409

MESSAGE_TOO_BIG_CLOSE_CODE: Final = 1009
_MESSAGE_TOO_BIG: Final = "message_too_big"  # EdgeRefusal.MESSAGE_TOO_BIG
_TOO_MANY_SUBSCRIPTIONS: Final = "too_many_subscriptions"  # EdgeRefusal.TOO_MANY_SUBSCRIPTIONS


MAX_CLOSE_REASON_BYTES: Final = 123
"""RFC 6455: a close frame's payload (the 2-byte code and the reason) is at most 125 bytes."""


def fit_close_reason(reason: str) -> str:
    """``reason`` cut to fit a close frame (at a character boundary)."""
    raw = reason.encode()
    if len(raw) <= MAX_CLOSE_REASON_BYTES:
        return reason
    return raw[:MAX_CLOSE_REASON_BYTES].decode("utf-8", errors="ignore")


def message_too_big(limit: int) -> Close:
    """The typed close of a message past ``ws_max_message_bytes``."""
    return Close(MESSAGE_TOO_BIG_CLOSE_CODE,
                 f"{_MESSAGE_TOO_BIG}: over ws_max_message_bytes ({limit})")


def duplicate(operation_id: object) -> Close:
    """A ``subscribe`` reusing the id of an operation still running."""
    return Close(DUPLICATE_CLOSE_CODE, f"Subscriber for {operation_id} already exists")


def unknown_type(message_type: object) -> Close:
    return Close(4400, f"Unknown message type: {message_type}")


@dataclass(frozen=True, slots=True)
class Ping:
    """Answer ``{"type": "pong"}``."""


@dataclass(frozen=True, slots=True)
class Pong:
    """Nothing to do (a client's answer to a ping the server never sends)."""


@dataclass(frozen=True, slots=True)
class Ignore:
    """Nothing to do (an init after the timeout already closed the socket)."""


@dataclass(frozen=True, slots=True)
class Admit:
    """Resolve the principal from ``payload`` (the init's payload), then
    acknowledge: the one init that would be acknowledged."""

    payload: dict[str, object]


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Start operation ``id``."""

    id: Any
    query: Any
    variables: Any
    operation_name: Any


@dataclass(frozen=True, slots=True)
class Refuse:
    """Send this ``error`` message for one ``subscribe``; the socket stays."""

    message: dict[str, object]


@dataclass(frozen=True, slots=True)
class Complete:
    """Stop operation ``id`` (if it still runs)."""

    id: Any


Step = Ping | Pong | Ignore | Admit | Subscribe | Refuse | Complete | Close

PING: Final = Ping()
PONG: Final = Pong()
IGNORE: Final = Ignore()


def decode(data: bytes, limit: int) -> Any:
    """A text message's JSON, or the `Close` refusing it: past ``limit``
    bytes (``ws_max_message_bytes``), not UTF-8 (1007, as uvicorn), not JSON."""
    if len(data) > limit:
        return message_too_big(limit)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return Close(1007, "")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        # (JSONDecodeError is a ValueError; nesting past the interpreter's
        # recursion limit is no JSON this server reads either.)
        return INVALID_JSON


@dataclass(slots=True)
class InitState:
    """Where a socket is in its ``connection_init`` handshake."""

    received: bool = False
    """An init was acknowledged (Strawberry's ``connection_init_received``)."""
    acknowledged: bool = False
    timed_out: bool = False


def on_init(state: InitState, message: Mapping[str, Any]) -> Step:
    """A ``connection_init``: `Admit` the one that would be acknowledged,
    or what Strawberry does with the others (after a timeout: nothing; a
    payload that is not an object: 4400; a repeat: 4429)."""
    payload = message.get("payload", {})
    if not state.received and not state.timed_out and isinstance(payload, dict):
        return Admit(payload)
    if state.timed_out:
        return IGNORE
    if not isinstance(payload, dict):
        return INVALID_INIT_PAYLOAD
    return TOO_MANY_INITS


def too_many_subscriptions(operation_id: object, limit: int) -> Refuse:
    """The typed ``error`` for a ``subscribe`` past ``ws_max_subscriptions_per_socket``."""
    return Refuse({
        "id": operation_id,
        "type": "error",
        "payload": [{
            "message": f"this socket already carries {limit} live operations "
                       "(ws_max_subscriptions_per_socket)",
            "extensions": {"code": _TOO_MANY_SUBSCRIPTIONS, "limit": limit},
        }],
    })


def on_subscribe(
    state: InitState, message: Mapping[str, Any], running: Container[Any], count: int,
    limit: int,
) -> Step:
    """A ``subscribe``, checked in the handler's order: before the ack
    4401, the bound (a typed `Refuse`), a running id 4409, then the payload."""
    if not state.acknowledged:
        return UNAUTHORIZED
    operation_id = message["id"]
    if operation_id in running:
        return duplicate(operation_id)
    if count >= limit:
        return too_many_subscriptions(operation_id, limit)
    payload = message["payload"]
    return Subscribe(
        operation_id, payload["query"], payload.get("variables"), payload.get("operationName")
    )


def on_message(
    state: InitState, message: Any, running: Container[Any], count: int, limit: int
) -> Step:
    """What one decoded client message asks for."""
    try:
        kind = message["type"]
        if kind == "connection_init":
            return on_init(state, message)
        if kind == "ping":
            return PING
        if kind == "pong":
            return PONG
        if kind == "subscribe":
            return on_subscribe(state, message, running, count, limit)
        if kind == "complete":
            return Complete(message["id"])
        return unknown_type(kind)
    except (KeyError, TypeError, AttributeError):
        # A missing field (Strawberry's KeyError), or a message, payload or
        # id of the wrong JSON type.
        return PARSE_FAILED


_FIN_TEXT: Final = 0x81
_SHORT: Final = struct.Struct("!BB")
_MEDIUM: Final = struct.Struct("!BBH")
_LONG: Final = struct.Struct("!BBQ")


def text_frame(payload: bytes) -> bytes:
    """A server's unmasked, unfragmented, uncompressed text frame (RFC 6455
    section 5.2) carrying ``payload``: the bytes websockets' ``send_text``
    writes on a socket without extensions."""
    size = len(payload)
    if size < 126:
        return _SHORT.pack(_FIN_TEXT, size) + payload
    if size < 65536:
        return _MEDIUM.pack(_FIN_TEXT, 126, size) + payload
    return _LONG.pack(_FIN_TEXT, 127, size) + payload
