"""The upgrade as the socket reads it from uvicorn (`read_upgrade`), answers
it (`accepting`) and keeps its headers (`WireRequest`): one header found by
name in the one bytes object answers what Starlette's ``Headers.get``
answers over the same headers."""

from __future__ import annotations

import pytest
from websockets.datastructures import Headers as WsHeaders
from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request
from websockets.server import ServerProtocol

from service_engine.server.wire_admission import WireRequest, accepting, read_upgrade

HEADERS = [
    ("Host", "example.test"),
    ("X-Passport", '{"sub": "alice", "org": "acme"}'),
    ("Origin", "http://example.test"),
    ("X-Forwarded-For", "10.0.0.1"),
    ("x-forwarded-for", "10.0.0.2"),
    ("Sec-Fetch-Site", "same-origin"),
    ("X-Empty", ""),
    ("X-Colon", "a: b: c"),
]


def uvicorn_bytes(target: str, headers: list[tuple[str, str]], method: str = "GET") -> bytes:
    """The upgrade as uvicorn's HTTP protocol hands it to its ``ws`` protocol
    (``handle_websocket_upgrade``: names lowercased)."""
    out = [method.encode(), b" ", target.encode(), b" HTTP/1.1\r\n"]
    for name, value in headers:
        out += [name.lower().encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
    out.append(b"\r\n")
    return b"".join(out)


def block_of(headers: list[tuple[str, str]]) -> bytes:
    return read_upgrade(uvicorn_bytes("/graphql/ws", headers)).block


@pytest.mark.parametrize("name", [
    "host", "HOST", "x-passport", "X-Passport", "origin", "x-forwarded-for",
    "sec-fetch-site", "x-empty", "x-colon", "forwarded", "x-pass", "passport", "st",
])
def test_a_header_by_name_is_what_starlette_answers(name: str) -> None:
    """Any case; the first of a repeated header; an empty value; a value
    holding ``": "``; a name that is only a prefix or suffix of another's
    is not found."""
    request = WireRequest(block_of(HEADERS), "/graphql/ws", ("127.0.0.1", 5000))
    assert request.get(name) == request.headers.get(name)


def test_no_headers_finds_nothing() -> None:
    """An upgrade without headers finds none."""
    request = WireRequest(block_of([]), "/graphql/ws", None)
    assert request.get("host") is None
    assert list(request.headers.items()) == []


def test_the_upgrade_read_is_what_websockets_parses() -> None:
    """Method, target and every header (in order, repeated ones kept, values
    with ``": "`` or empty) are what websockets' own parser finds in the
    same bytes."""
    data = uvicorn_bytes("/graphql/ws?x=1", HEADERS)
    upgrade = read_upgrade(data)
    parser = ServerProtocol()
    parser.receive_data(data)
    (parsed,) = parser.events_received()
    assert isinstance(parsed, Request)
    assert (upgrade.method, upgrade.path) == (parsed.method, parsed.path)
    assert list(WireRequest(upgrade.block, "/", None).headers.items()) == [
        (name, value) for name, value in parsed.headers.raw_items()]


def test_the_handshake_headers_are_those_websockets_accept_reads() -> None:
    """Connection, Upgrade, Origin and every Sec-WebSocket-* header, in
    order and repeated ones kept; websockets accepts the handshake from
    them alone as it does from all the headers."""
    headers = [*HEADERS, ("Upgrade", "websocket"), ("Connection", "keep-alive, Upgrade"),
               ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Version", "13"),
               ("Sec-WebSocket-Protocol", "a"), ("Sec-WebSocket-Protocol", "graphql-transport-ws"),
               ("Sec-WebSocket-Extensions", "permessage-deflate")]
    upgrade = read_upgrade(uvicorn_bytes("/graphql/ws", headers))
    assert upgrade.handshake == [
        ("origin", "http://example.test"), ("upgrade", "websocket"),
        ("connection", "keep-alive, Upgrade"), ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"), ("sec-websocket-protocol", "a"),
        ("sec-websocket-protocol", "graphql-transport-ws"),
        ("sec-websocket-extensions", "permessage-deflate"),
    ]
    subset = ServerProtocol().accept(Request("/", WsHeaders(upgrade.handshake)))
    whole = ServerProtocol().accept(Request("/", WsHeaders(headers)))
    del subset.headers["Date"], whole.headers["Date"]
    assert subset.status_code == whole.status_code == 101
    assert subset.serialize() == whole.serialize()


def test_header_names_not_lowercased_are_lowercased() -> None:
    """Bytes whose names are not lowercased (not uvicorn's) are kept with
    lowercased names: `WireRequest` finds them by any case."""
    data = b"GET / HTTP/1.1\r\nHost: a\r\nX-Passport: p: q\r\nUpgrade: websocket\r\n\r\n"
    upgrade = read_upgrade(data)
    assert upgrade.block == b"host: a\r\nx-passport: p: q\r\nupgrade: websocket"
    assert upgrade.handshake == [("upgrade", "websocket")]
    assert WireRequest(upgrade.block, "/", None).get("X-PASSPORT") == "p: q"


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\nhost: a\r\n",  # no end of the head
    b"GET /\r\nhost: a\r\n\r\n",  # no version
    b" / HTTP/1.1\r\n\r\n",  # no method
    b"GET / HTTP/1.1\r\nhost a\r\n\r\n",  # no ": "
    b"GET / HTTP/1.1\r\n: a\r\n\r\n",  # no name
])
def test_bytes_not_an_upgrade_head_are_refused(data: bytes) -> None:
    """What is not a request line and ``name: value`` lines is a ValueError."""
    with pytest.raises(ValueError):
        read_upgrade(data)


@pytest.mark.parametrize(("data", "refused"), [
    (b"GET /" + b"a" * MAX_LINE_LENGTH + b" HTTP/1.1\r\n\r\n", RequestLineTooLong),
    (b"GET / HTTP/1.1\r\nx: " + b"a" * MAX_LINE_LENGTH + b"\r\n\r\n", HeaderLineTooLong),
    (b"GET / HTTP/1.1\r\n" + b"x: y\r\n" * (MAX_NUM_HEADERS + 1) + b"\r\n", TooManyHeaders),
])
def test_an_upgrade_past_websockets_bounds_is_refused_as_its_parser_refuses_it(
    data: bytes, refused: type[Exception]
) -> None:
    """A request line or a header line longer than websockets' line bound,
    or more headers than its bound, raise websockets' own error, as its
    parser does for the same bytes; at the bounds it is read."""
    with pytest.raises(refused):
        read_upgrade(data)
    parser = ServerProtocol()
    parser.receive_data(data)
    assert isinstance(parser.handshake_exc, refused)
    at_bound = b"GET / HTTP/1.1\r\n" + b"x: y\r\n" * (MAX_NUM_HEADERS - 1) + (
        b"x: " + b"a" * (MAX_LINE_LENGTH - 5) + b"\r\n\r\n")
    assert len(read_upgrade(at_bound).block.split(b"\r\n")) == MAX_NUM_HEADERS


def test_the_101_is_websockets_answer_with_the_servers_headers() -> None:
    """The 101 written: websockets' accepting response without its Date,
    the server's default headers (lowercased names, as uvicorn writes them),
    the subprotocol; the same bytes ``Response.serialize`` gives for it."""
    data = uvicorn_bytes("/graphql/ws", [
        ("Host", "h"), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Protocol", "graphql-transport-ws"),
    ])
    upgrade = read_upgrade(data)
    response = ServerProtocol().accept(Request(upgrade.path, WsHeaders(upgrade.handshake)))
    assert response.status_code == 101
    defaults = [(b"date", b"Mon, 07 Dec 2026 21:00:00 GMT"), (b"server", b"uvicorn")]
    answer = accepting(response, defaults, "graphql-transport-ws")
    del response.headers["Date"]
    response.headers.update([("date", "Mon, 07 Dec 2026 21:00:00 GMT"), ("server", "uvicorn"),
                             ("Sec-WebSocket-Protocol", "graphql-transport-ws")])
    assert answer == response.serialize()
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in answer
    assert accepting(response, [], None).count(b"\r\n\r\n") == 1
