"""The wire's pure graphql-transport-ws decisions (`service_engine.server.wire_protocol`):
each message to its step, each refusal to Strawberry's close code and reason,
the server's text frame to websockets' bytes."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from websockets.frames import Frame, Opcode

from service_engine.server import wire_protocol as wp
from service_engine.server.app import EdgeRefusal


def _step(message: object, *, acknowledged: bool = True, received: bool = True,
          running: tuple[str, ...] = (), limit: int = 100) -> wp.Step:
    state = wp.InitState(received=received, acknowledged=acknowledged)
    return wp.on_message(state, message, set(running), len(running), limit)


def test_decode_refuses_past_the_bound_non_utf8_and_non_json() -> None:
    """Past ws_max_message_bytes: the typed 1009; invalid UTF-8: 1007; not JSON: 4400."""
    assert wp.decode(b'{"type":"ping"}', 64) == {"type": "ping"}
    too_big = wp.decode(b" " * 65, 64)
    assert isinstance(too_big, wp.Close) and too_big.code == 1009
    assert too_big.reason.startswith(EdgeRefusal.MESSAGE_TOO_BIG)
    assert wp.decode(b" " * 64, 64) is not too_big  # at the bound: read
    assert wp.decode(b"\xff\xfe", 64) == wp.Close(1007, "")
    assert wp.decode(b"{nope", 64) == wp.INVALID_JSON


def test_decode_refuses_json_nested_past_the_recursion_limit() -> None:
    """JSON nested deeper than the interpreter parses is refused 4400 like any
    message that is not JSON, never an exception out of the socket's handler."""
    deep = b"[" * 100_000 + b"]" * 100_000
    assert wp.decode(deep, len(deep)) == wp.INVALID_JSON


def test_the_close_reasons_are_strawberrys() -> None:
    """Every close reason the wire shares with Strawberry's handler is its wording."""
    text = inspect.getsource(BaseGraphQLTransportWSHandler)
    for close in (wp.INVALID_JSON, wp.NOT_TEXT, wp.PARSE_FAILED, wp.INVALID_INIT_PAYLOAD,
                  wp.INIT_TIMEOUT, wp.UNAUTHORIZED, wp.FORBIDDEN, wp.TOO_MANY_INITS):
        assert f'"{close.reason}"' in text, close
    assert "Subscriber for {message['id']} already exists" in text
    assert "Unknown message type: {message['type']}" in text


def test_connection_init_admits_once_then_refuses_as_strawberry() -> None:
    """The first init with an object payload (or none) is admitted; a repeat
    4429; a payload that is not an object 4400; after the timeout nothing."""
    fresh = wp.InitState()
    assert wp.on_init(fresh, {"type": "connection_init"}) == wp.Admit({})
    assert wp.on_init(fresh, {"type": "connection_init", "payload": {"a": 1}}) == wp.Admit({"a": 1})
    assert wp.on_init(fresh, {"type": "connection_init", "payload": "x"}) == wp.INVALID_INIT_PAYLOAD
    assert wp.on_init(fresh, {"type": "connection_init", "payload": None}) == wp.INVALID_INIT_PAYLOAD
    done = wp.InitState(received=True, acknowledged=True)
    assert wp.on_init(done, {"type": "connection_init"}) == wp.TOO_MANY_INITS
    assert wp.on_init(done, {"type": "connection_init", "payload": 1}) == wp.INVALID_INIT_PAYLOAD
    late = wp.InitState(timed_out=True)
    assert isinstance(wp.on_init(late, {"type": "connection_init"}), wp.Ignore)


@pytest.mark.parametrize(("message", "expected"), [
    ({"type": "ping"}, wp.Ping()),
    ({"type": "ping", "payload": {"x": 1}}, wp.Ping()),
    ({"type": "pong"}, wp.Pong()),
    ({"type": "complete", "id": "1"}, wp.Complete("1")),
    ({"type": "complete"}, wp.PARSE_FAILED),
    ({"type": "what"}, wp.Close(4400, "Unknown message type: what")),
    ({"id": "1"}, wp.PARSE_FAILED),
    ([1, 2], wp.PARSE_FAILED),
    ("text", wp.PARSE_FAILED),
    (7, wp.PARSE_FAILED),
    ({"type": "subscribe", "payload": {"query": "{ a }"}}, wp.PARSE_FAILED),
    ({"type": "subscribe", "id": "1", "payload": {}}, wp.PARSE_FAILED),
    ({"type": "subscribe", "id": "1", "payload": "x"}, wp.PARSE_FAILED),
    ({"type": "subscribe", "id": ["x"], "payload": {"query": "{ a }"}}, wp.PARSE_FAILED),
    ({"type": "subscribe", "id": "1", "payload": {"query": "{ a }", "variables": {"v": 1},
                                                  "operationName": "A"}},
     wp.Subscribe("1", "{ a }", {"v": 1}, "A")),
])
def test_each_message_to_its_step(message: object, expected: wp.Step) -> None:
    """A decoded message's step: ping / pong / complete / subscribe, and
    Strawberry's 4400 for a missing field, an unknown type, a wrong shape."""
    assert _step(message) == expected


def test_subscribe_checks_the_ack_the_id_and_the_bound_in_the_handlers_order() -> None:
    """Before the ack 4401 (even without an id); a running id 4409; past the
    socket's bound the typed refusal, checked before the payload."""
    subscribe = {"type": "subscribe", "id": "1", "payload": {"query": "{ a }"}}
    assert _step(subscribe, acknowledged=False) == wp.UNAUTHORIZED
    assert _step({"type": "subscribe"}, acknowledged=False) == wp.UNAUTHORIZED
    assert _step(subscribe, running=("1",)) == wp.Close(4409, "Subscriber for 1 already exists")
    refused = _step({"type": "subscribe", "id": "2"}, running=("1",), limit=1)
    assert isinstance(refused, wp.Refuse)
    assert refused.message["id"] == "2" and refused.message["type"] == "error"
    errors: Any = refused.message["payload"]
    assert len(errors) == 1
    assert errors[0]["extensions"] == {"code": EdgeRefusal.TOO_MANY_SUBSCRIPTIONS.value, "limit": 1}
    # The same id at the bound is the duplicate, not the bound.
    assert _step(subscribe, running=("1",), limit=1) == wp.duplicate("1")


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
def test_text_frame_is_websockets_own_bytes(size: int) -> None:
    """The wire's text frame is byte for byte websockets' unmasked text frame."""
    payload = json.dumps({"x": "y" * size}).encode()[:size]
    assert wp.text_frame(payload) == Frame(Opcode.TEXT, payload).serialize(mask=False)


