"""Hostile input at the edge: each refused at its `EngineConfig` bound with
its typed `EdgeRefusal`, while a live subscriber on the same pod keeps
receiving its deltas, in order, with no gap.

A real engine and uvicorn on a free port; HTTP over raw sockets where the
test needs to control the body's framing, a real `websockets` client
speaking graphql-transport-ws. The toy subscription streams the revisions
the test publishes: it proves the edge, not a projector.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import pytest
import strawberry
from websockets.asyncio.client import ClientConnection

from service_engine import Database
from service_engine.graphql import PASSPORT_HEADER, GraphQLContext, graphql_app
from service_engine.server.app import (
    MESSAGE_TOO_BIG_CLOSE_CODE,
    TRY_AGAIN_LATER_CLOSE_CODE,
    EdgeRefusal,
)

from ..support.harness import wait_until
from .test_graphql_app import (
    ALICE,
    BOUND,
    Me,
    closed,
    initialise,
    receive,
    resolve_me,
    running_engine,
    send,
    serving,
    ws_connect,
)


class Feed:
    """Revisions the test publishes, fanned out to every live subscriber."""

    def __init__(self) -> None:
        self.queues: list[asyncio.Queue[int]] = []

    async def stream(self) -> AsyncGenerator[int, None]:
        queue: asyncio.Queue[int] = asyncio.Queue()
        self.queues.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self.queues.remove(queue)

    def publish(self, revision: int) -> None:
        for queue in self.queues:
            queue.put_nowait(revision)


FEED = Feed()
Info = strawberry.Info[GraphQLContext[Me], None]


@strawberry.type
class Node:
    name: str

    @strawberry.field
    def child(self) -> Node:
        return Node(name=self.name + "'")


@strawberry.type
class EdgeQuery:
    @strawberry.field
    def node(self) -> Node:
        return Node(name="root")

    @strawberry.field
    def whoami(self, info: Info) -> str:
        return str(info.context.principal.sub)


@strawberry.type
class EdgeSubscription:
    @strawberry.subscription
    async def ticks(self, info: Info) -> AsyncGenerator[int, None]:
        info.context.principal  # noqa: B018 - a live subscription needs a principal
        async for revision in FEED.stream():
            yield revision


SCHEMA = strawberry.Schema(query=EdgeQuery, subscription=EdgeSubscription)
HEADERS = {PASSPORT_HEADER: ALICE.to_header()}


@contextlib.asynccontextmanager
async def pod(db: Database, **config: Any) -> AsyncIterator[str]:
    async with (
        running_engine(db, **config) as engine,
        serving(graphql_app(engine, SCHEMA, resolve_me)) as addr,
    ):
        yield addr


class LiveSubscriber:
    """One socket holding a live ``ticks`` subscription; `tick` publishes the
    next revision and waits for it to arrive."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.received: list[int] = []
        self.published = 0
        self._arrived = asyncio.Condition()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        before = len(FEED.queues)
        await initialise(self.ws)
        await send(self.ws, {"id": "live", "type": "subscribe",
                             "payload": {"query": "subscription { ticks }"}})
        await wait_until(lambda: len(FEED.queues) > before, what="the live subscription attached")
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            message = json.loads(await self.ws.recv())
            assert message["id"] == "live" and message["type"] == "next", message
            async with self._arrived:
                self.received.append(message["payload"]["data"]["ticks"])
                self._arrived.notify_all()

    async def tick(self) -> None:
        self.published += 1
        FEED.publish(self.published)
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.received) >= self.published), BOUND
            )

    def assert_in_order(self) -> None:
        assert self.received == list(range(1, self.published + 1))

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


@contextlib.asynccontextmanager
async def live_subscriber(addr: str) -> AsyncIterator[LiveSubscriber]:
    async with ws_connect(addr, ALICE.to_header()) as ws:
        subscriber = LiveSubscriber(ws)
        await subscriber.start()
        try:
            await subscriber.tick()
            yield subscriber
            await subscriber.tick()
            subscriber.assert_in_order()
        finally:
            await subscriber.stop()


# -- raw HTTP: the test owns the body's framing --------------------------------


async def _response_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await asyncio.wait_for(reader.readline(), BOUND)
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await asyncio.wait_for(reader.readline(), BOUND)) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _response_json(reader: asyncio.StreamReader, headers: dict[str, str]) -> Any:
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), BOUND)
    return json.loads(body)


async def post_chunked(addr: str, chunks: AsyncIterator[bytes]) -> tuple[int, Any, int]:
    """POST /graphql with a chunked body; (status, JSON body, bytes of body
    the client had sent when the response arrived)."""
    host, port = addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = 0

    async def write_body() -> None:
        nonlocal sent
        async for chunk in chunks:
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
            sent += len(chunk)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    head = (f"POST /graphql HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
            f"{PASSPORT_HEADER}: {ALICE.to_header()}\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(head.encode())
    writing = asyncio.create_task(write_body())
    try:
        status, headers = await _response_head(reader)
        at_response = sent
        body = await _response_json(reader, headers)
    finally:
        writing.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await writing
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return status, body, at_response


def _codes(body: Any) -> list[str]:
    return [e["extensions"]["code"] for e in body["errors"]]


MIB = 1024 * 1024


async def test_an_oversized_body_is_refused_413_before_it_is_read(db: Database) -> None:
    """A 300 MB body, declared or chunked, is answered 413
    request_body_too_large long before it could have been read whole; a
    chunked body within the bound is served; the live subscriber never
    misses a delta."""
    async with pod(db, http_max_body_bytes=MIB) as addr, live_subscriber(addr) as live:
        # Declared: refused from the header alone, with no body sent at all.
        host, port = addr.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write((f"POST /graphql HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {300 * MIB}\r\n\r\n").encode())
        await writer.drain()
        status, headers = await _response_head(reader)
        body = await _response_json(reader, headers)
        writer.close()
        assert status == 413 and _codes(body) == [EdgeRefusal.REQUEST_BODY_TOO_LARGE]
        assert body["errors"][0]["extensions"]["limit"] == MIB
        await live.tick()

        # Chunked: cut as soon as it crosses the bound.
        async def hostile() -> AsyncIterator[bytes]:
            chunk = b" " * (64 * 1024)
            for _ in range(300 * 16):  # 300 MB of whitespace
                yield chunk

        status, body, sent = await post_chunked(addr, hostile())
        assert status == 413 and _codes(body) == [EdgeRefusal.REQUEST_BODY_TOO_LARGE]
        assert sent < 64 * MIB, f"the refusal waited for {sent} bytes of a 300 MB body"
        await live.tick()

        # Within the bound, chunked or not, the request is served.
        async def fine() -> AsyncIterator[bytes]:
            query = json.dumps({"query": "{ whoami }"}).encode()
            yield query[:5]
            yield query[5:]

        status, body, _ = await post_chunked(addr, fine())
        assert (status, body) == (200, {"data": {"whoami": "alice"}})
        async with httpx.AsyncClient(base_url=f"http://{addr}") as http:
            response = await http.post("/graphql", json={"query": "{ whoami }"}, headers=HEADERS)
            assert response.json() == {"data": {"whoami": "alice"}}
        await live.tick()


async def test_query_limits_refuse_with_typed_codes_over_http_and_the_socket(db: Database) -> None:
    """Strawberry's limiters at the configured bounds: 5,000 aliases (too
    many tokens), 40 aliases under the token bound (too many aliases), a
    query nested past the depth bound; over the socket each is that
    operation's error and the socket stays up."""
    many = "{" + " ".join(f"a{i}: node {{ name }}" for i in range(5000)) + "}"
    aliased = "{" + " ".join(f"a{i}: whoami" for i in range(40)) + "}"
    deep = "{ node { " + "child { " * 20 + "name" + " }" * 20 + " } }"
    cases = {
        EdgeRefusal.QUERY_TOO_MANY_TOKENS: many,
        EdgeRefusal.QUERY_TOO_MANY_ALIASES: aliased,
        EdgeRefusal.QUERY_TOO_DEEP: deep,
    }
    async with (
        pod(db, query_max_tokens=2000, query_max_aliases=30, query_max_depth=12) as addr,
        live_subscriber(addr) as live,
        httpx.AsyncClient(base_url=f"http://{addr}") as http,
    ):
        for code, query in cases.items():
            response = await http.post("/graphql", json={"query": query}, headers=HEADERS)
            body = response.json()
            assert body["data"] is None and _codes(body) == [code], body
            await live.tick()
        # Within the bounds: served.
        within = "{ a: whoami b: whoami node { child { child { name } } } }"
        response = await http.post("/graphql", json={"query": within}, headers=HEADERS)
        assert response.json() == {"data": {"a": "alice", "b": "alice",
                                            "node": {"child": {"child": {"name": "root''"}}}}}
        async with ws_connect(addr, ALICE.to_header()) as ws:
            await initialise(ws)
            for n, (code, query) in enumerate(cases.items()):
                await send(ws, {"id": f"h{n}", "type": "subscribe", "payload": {"query": query}})
                message = await receive(ws)
                assert (message["id"], message["type"]) == (f"h{n}", "error"), message
                assert [e["extensions"]["code"] for e in message["payload"]] == [code]
                await live.tick()
            await send(ws, {"type": "ping"})
            assert await receive(ws) == {"type": "pong"}


async def test_introspection_can_be_switched_off(db: Database) -> None:
    """With graphql_introspection off a schema query is refused
    introspection_disabled; ordinary queries are served."""
    query = {"query": "{ __schema { queryType { name } } }"}
    async with pod(db) as addr, httpx.AsyncClient(base_url=f"http://{addr}") as http:
        on = await http.post("/graphql", json=query)
        assert on.json() == {"data": {"__schema": {"queryType": {"name": "EdgeQuery"}}}}
    async with (
        pod(db, graphql_introspection=False) as addr,
        live_subscriber(addr) as live,
        httpx.AsyncClient(base_url=f"http://{addr}") as http,
    ):
        off = (await http.post("/graphql", json=query)).json()
        assert off["data"] is None and set(_codes(off)) == {EdgeRefusal.INTROSPECTION_DISABLED}
        await live.tick()
        served = await http.post("/graphql", json={"query": "{ whoami }"}, headers=HEADERS)
        assert served.json() == {"data": {"whoami": "alice"}}


async def test_an_oversized_socket_message_closes_that_socket_1009(db: Database) -> None:
    """A message past ws_max_message_bytes closes its own socket with 1009
    message_too_big; a message within it is served; the subscriber on
    another socket is untouched."""
    async with pod(db, ws_max_message_bytes=64 * 1024) as addr, live_subscriber(addr) as live:
        async with ws_connect(addr, ALICE.to_header()) as ws:
            await initialise(ws)
            padded = {"id": "ok", "type": "subscribe",
                      "payload": {"query": "{ whoami }" + " " * (60 * 1024)}}
            await send(ws, padded)
            assert await receive(ws) == {"id": "ok", "type": "next",
                                         "payload": {"data": {"whoami": "alice"}}}
            assert (await receive(ws))["type"] == "complete"
            await send(ws, {"id": "big", "type": "subscribe",
                            "payload": {"query": "{ whoami }" + " " * (300 * 1024)}})
            close = await closed(ws)
            assert close.rcvd is not None
            assert close.rcvd.code == MESSAGE_TOO_BIG_CLOSE_CODE
            assert close.rcvd.reason.startswith(EdgeRefusal.MESSAGE_TOO_BIG)
        await live.tick()


async def test_subscriptions_past_the_socket_bound_get_an_error_and_the_socket_stays(db: Database) -> None:
    """The subscribe past ws_max_subscriptions_per_socket gets a
    graphql-transport-ws error too_many_subscriptions; the socket, its other
    subscriptions and the other socket's subscriber keep running; completing
    one frees its place."""
    async with (
        pod(db, ws_max_subscriptions_per_socket=3) as addr,
        live_subscriber(addr) as live,
        ws_connect(addr, ALICE.to_header()) as ws,
    ):
        await initialise(ws)
        before = len(FEED.queues)
        for op in ("s1", "s2", "s3"):
            await send(ws, {"id": op, "type": "subscribe", "payload": {"query": "subscription { ticks }"}})
        await wait_until(lambda: len(FEED.queues) == before + 3, what="three subscriptions live")
        await send(ws, {"id": "s4", "type": "subscribe", "payload": {"query": "subscription { ticks }"}})
        refused = await receive(ws)
        assert (refused["id"], refused["type"]) == ("s4", "error")
        assert [e["extensions"]["code"] for e in refused["payload"]] == [EdgeRefusal.TOO_MANY_SUBSCRIPTIONS]
        assert len(FEED.queues) == before + 3
        # The three still stream, and so does the other socket's subscriber.
        await live.tick()
        got = {}
        for _ in range(3):
            message = await receive(ws)
            got[message["id"]] = message["payload"]["data"]["ticks"]
        assert got == {"s1": live.published, "s2": live.published, "s3": live.published}
        # Completing one frees its place.
        await send(ws, {"id": "s1", "type": "complete"})
        await wait_until(lambda: len(FEED.queues) == before + 2, what="s1 completed")
        await send(ws, {"id": "s4", "type": "subscribe", "payload": {"query": "subscription { ticks }"}})
        await wait_until(lambda: len(FEED.queues) == before + 3, what="s4 admitted")
        await live.tick()
        got = {}
        for _ in range(3):
            message = await receive(ws)
            got[message["id"]] = message["payload"]["data"]["ticks"]
        assert got == {"s2": live.published, "s3": live.published, "s4": live.published}


async def test_sockets_past_the_pod_bound_are_closed_1013_and_existing_ones_untouched(db: Database) -> None:
    """With ws_max_sockets sockets open, the next upgrade is closed with 1013
    too_many_sockets; the open sockets keep streaming; once one closes a new
    upgrade is served."""
    async with pod(db, ws_max_sockets=2) as addr, live_subscriber(addr) as live:
        async with ws_connect(addr, ALICE.to_header()) as second:
            await initialise(second)
            async with ws_connect(addr, ALICE.to_header()) as third:
                close = await closed(third)
                assert close.rcvd is not None
                assert close.rcvd.code == TRY_AGAIN_LATER_CLOSE_CODE
                assert close.rcvd.reason.startswith(EdgeRefusal.TOO_MANY_SOCKETS)
            await live.tick()
            await send(second, {"type": "ping"})
            assert await receive(second) == {"type": "pong"}
        # The second socket closed: a new one is admitted.
        async def admitted() -> bool:
            try:
                async with ws_connect(addr, ALICE.to_header()) as fresh:
                    await initialise(fresh)
                    await send(fresh, {"id": "q", "type": "subscribe", "payload": {"query": "{ whoami }"}})
                    answered: bool = (await receive(fresh))["type"] == "next"
                    return answered
            except AssertionError:
                return False
            except Exception as exc:  # closed 1013 while the server still counts the old one
                if "1013" in str(exc):
                    return False
                raise

        await wait_until(admitted, what="a socket admitted after one closed")
        await live.tick()


@pytest.mark.parametrize("bound", [1])
async def test_the_subscriber_socket_itself_counts_toward_the_pod_bound(db: Database, bound: int) -> None:
    """The bound counts every open socket, the refused one is never counted."""
    async with pod(db, ws_max_sockets=bound) as addr, live_subscriber(addr) as live:
        for _ in range(3):
            async with ws_connect(addr, ALICE.to_header()) as extra:
                close = await closed(extra)
                assert close.rcvd is not None and close.rcvd.code == TRY_AGAIN_LATER_CLOSE_CODE
            await live.tick()


async def test_invalid_utf8_body_is_400(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """A JSON body that is not UTF-8, declared or chunked, on the lean POST
    path's content type and on another JSON spelling, is answered 400
    request_body_not_utf8, and nothing is logged at error; a UTF-8 body is
    served after it."""
    bad = b'{"query": "{ whoami }", "x": "\xff\xfe"}'
    async with pod(db) as addr, httpx.AsyncClient(base_url=f"http://{addr}") as http:
        with caplog.at_level(logging.WARNING):
            for content_type in ("application/json", "application/json; charset=utf-8",
                                 "application/graphql-response+json"):
                response = await http.post("/graphql", content=bad, headers={
                    **HEADERS, "content-type": content_type})
                assert response.status_code == 400, (content_type, response.text)
                assert _codes(response.json()) == [EdgeRefusal.REQUEST_BODY_NOT_UTF8]

            async def chunked() -> AsyncIterator[bytes]:
                yield bad[:10]
                yield bad[10:]

            status, body, _ = await post_chunked(addr, chunked())
            assert status == 400 and _codes(body) == [EdgeRefusal.REQUEST_BODY_NOT_UTF8]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records
        response = await http.post("/graphql", json={"query": "{ whoami }"}, headers=HEADERS)
        assert response.json() == {"data": {"whoami": "alice"}}


CHUNKS_PAST = 400
"""Half-bound chunks the client streams: 200 times the bound, past any
bytes the server would read and drop before it gives up on the client."""


async def test_chunked_body_past_the_bound_is_413(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A standard client (httpx) streaming a chunked body past
    ``http_max_body_bytes`` (it sends the whole body before it reads the
    answer) reads 413 request_body_too_large, not a dropped connection, and
    nothing is logged at error."""
    limit = 64 * 1024

    async def body() -> AsyncIterator[bytes]:
        yield b'{"query": "{ whoami }", "pad": "'
        for _ in range(CHUNKS_PAST):
            yield b" " * (limit // 2)
        yield b'"}'

    async with pod(db, http_max_body_bytes=limit) as addr, \
            httpx.AsyncClient(base_url=f"http://{addr}") as http:
        with caplog.at_level(logging.WARNING):
            response = await http.post("/graphql", content=body(), headers={
                **HEADERS, "content-type": "application/json"})
        assert response.status_code == 413, response.text
        assert _codes(response.json()) == [EdgeRefusal.REQUEST_BODY_TOO_LARGE]
        assert response.json()["errors"][0]["extensions"]["limit"] == limit
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records
