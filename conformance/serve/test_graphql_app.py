"""The GraphQL app over real sockets: uvicorn on a free port, a real engine,
httpx for HTTP and a real `websockets` client speaking graphql-transport-ws.

A toy schema stands in for the service's slices: it proves the kit (the
passport, the principal per request and per socket, the session bound, the
routes), not any slice.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
import strawberry
import uvicorn
from graphql import DocumentNode, ValidationContext, ValidationRule, print_ast
from starlette.types import ASGIApp
from strawberry.extensions import AddValidationRules, SchemaExtension
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from service_engine import Database, Engine, EngineConfig
from service_engine.graphql import (
    CONNECTION_REFUSED_CLOSE_CODE,
    PASSPORT_HEADER,
    SESSION_MAX_AGE_CLOSE_CODE,
    SESSION_MAX_AGE_CLOSE_REASON,
    GraphQLContext,
    LanesPaused,
    Passport,
    PassportRefused,
    SliceFragment,
    compose_service,
    graphql_app,
    subscription_union,
)
from service_engine.impacts.model import Cause
from service_engine.render.deltas import Reset, Upsert
from service_engine.server.host import bind_listener, http_config

from ..support.harness import engine_running, wait_until

BOUND = 5.0
PROTOCOL = Subprotocol("graphql-transport-ws")

# -- the toy service -----------------------------------------------------------


@dataclass(frozen=True)
class Me:
    """The toy service's principal."""

    sub: str
    org: str | None
    roles: tuple[str, ...]


def resolve_me(passport: Passport) -> Me:
    if passport.has_role("banned"):
        raise PassportRefused("this subject is banned from the toy service")
    return Me(passport.sub, passport.org, passport.roles)


Info = strawberry.Info[GraphQLContext[Me], None]


@strawberry.type
class WhoAmI:
    sub: str
    org: str | None
    roles: list[str]


@strawberry.type
class Card:
    title: str


CARDS = subscription_union("Cards", Card)


@strawberry.type
class ToyQuery:
    @strawberry.field
    def whoami(self, info: Info) -> WhoAmI:
        me = info.context.principal
        return WhoAmI(sub=me.sub, org=me.org, roles=list(me.roles))

    @strawberry.field
    def pod(self, info: Info) -> str:
        return info.context.engine.config.pod_id


async def _cards_deltas() -> AsyncGenerator[Any, None]:
    yield Reset(1, {'"c1"': Card(title="first")})
    yield Upsert(2, '"c1"', Card(title="renamed"), Cause("card.renamed", {"by": "toy"}))


async def _cards_notices() -> AsyncGenerator[Any, None]:
    yield LanesPaused(lanes=["presence"])


@strawberry.type
class ToySubscription:
    @strawberry.subscription
    async def count(self, info: Info, up_to: int) -> AsyncGenerator[int, None]:
        info.context.principal  # noqa: B018 - a subscription needs a principal
        for i in range(up_to):
            yield i

    @strawberry.subscription
    async def whoami_live(self, info: Info) -> AsyncGenerator[str, None]:
        yield info.context.principal.sub
        await asyncio.Event().wait()  # stays open until the socket ends

    @strawberry.subscription
    async def cards(self, info: Info) -> AsyncGenerator[CARDS.type, None]:  # type: ignore[name-defined]
        async for message in CARDS.subscribe(_cards_deltas(), _cards_notices()):
            yield message


TOY = compose_service(
    [SliceFragment("toy", query=ToyQuery, subscription=ToySubscription, types=(Card, *CARDS.types))]
)
SCHEMA = TOY.schema()

ALICE = Passport(sub="alice", org="acme", roles=("member",))
BANNED = Passport(sub="mallory", roles=("banned",))


# -- real servers ----------------------------------------------------------------


class _Server(uvicorn.Server):
    # The test process keeps its own signal handlers.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port as a pod serves it
    (`host.http_config` of the app's engine config: its subscription socket
    on the engine's own protocol class); yield ``host:port``."""
    sock = bind_listener("127.0.0.1:0")
    port = sock.getsockname()[1]
    view = getattr(getattr(app, "state", None), "graphql_view", None)
    config = view.config if view is not None else EngineConfig()
    server = _Server(http_config(app, config))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or task.done(), what="uvicorn started")
        assert server.started, "uvicorn did not start"
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, BOUND * 2)
        sock.close()


def engine_config(**overrides: Any) -> EngineConfig:
    return EngineConfig(
        service="graphql-test",
        beat_interval=timedelta(milliseconds=50),
        lease=timedelta(seconds=1),
        **overrides,
    )


@contextlib.asynccontextmanager
async def running_engine(db: Database, **overrides: Any) -> AsyncIterator[Engine]:
    async with engine_running(engine_config(**overrides), db, bound=BOUND * 2) as engine:
        yield engine


@contextlib.asynccontextmanager
async def service(db: Database, *, app_options: dict[str, Any] | None = None,
                  **config: Any) -> AsyncIterator[tuple[Engine, str]]:
    async with running_engine(db, **config) as engine:
        app = graphql_app(engine, SCHEMA, resolve_me, **(app_options or {}))
        async with serving(app) as addr:
            yield engine, addr


# -- graphql-transport-ws client helpers ---------------------------------------


def ws_connect(addr: str, passport: str | None = None) -> Any:
    headers = {PASSPORT_HEADER: passport} if passport is not None else {}
    return connect(
        f"ws://{addr}/graphql/ws", subprotocols=[PROTOCOL], additional_headers=headers,
        open_timeout=BOUND,
    )


async def send(ws: ClientConnection, message: dict[str, Any]) -> None:
    await ws.send(json.dumps(message))


async def receive(ws: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), BOUND))
    return message


async def initialise(ws: ClientConnection, payload: dict[str, Any] | None = None) -> None:
    init: dict[str, Any] = {"type": "connection_init"}
    if payload is not None:
        init["payload"] = payload
    await send(ws, init)
    assert await receive(ws) == {"type": "connection_ack"}


async def closed(ws: ClientConnection) -> ConnectionClosed:
    """Wait (bounded) for the server to close ``ws``; return the close."""
    with pytest.raises(ConnectionClosed) as ended:
        while True:
            await asyncio.wait_for(ws.recv(), BOUND)
    return ended.value


async def subscribe(ws: ClientConnection, op_id: str, query: str) -> list[dict[str, Any]]:
    """Run one operation to completion; return its ``next`` payloads."""
    await send(ws, {"id": op_id, "type": "subscribe", "payload": {"query": query}})
    payloads: list[dict[str, Any]] = []
    while True:
        message = await receive(ws)
        assert message["id"] == op_id, message
        if message["type"] == "complete":
            return payloads
        assert message["type"] == "next", message
        payloads.append(message["payload"])


# -- HTTP ----------------------------------------------------------------------


async def test_post_query_answers_as_the_passport_principal(db: Database) -> None:
    """A POSTed query answers as the principal of the X-Passport header (either encoding),
    with the engine in the context."""
    async with service(db) as (engine, addr), httpx.AsyncClient(base_url=f"http://{addr}") as http:
        query = {"query": "{ whoami { sub org roles } pod }"}
        for header in (ALICE.to_header(), json.dumps(ALICE.to_json())):
            response = await http.post("/graphql", json=query, headers={PASSPORT_HEADER: header})
            assert response.status_code == 200
            assert response.json() == {"data": {
                "whoami": {"sub": "alice", "org": "acme", "roles": ["member"]},
                "pod": engine.config.pod_id,  # the context exposes the engine
            }}


async def test_post_without_a_usable_passport_is_refused_typed(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A POST without a usable passport is refused with a typed code (missing, malformed,
    refused), logged without a traceback and below error level; a field that needs no
    principal still answers."""
    async with service(db) as (_, addr), httpx.AsyncClient(base_url=f"http://{addr}") as http:
        query = {"query": "{ whoami { sub } }"}
        cases = {
            "passport_missing": {},
            "passport_malformed": {PASSPORT_HEADER: "%%%"},
            "passport_refused": {PASSPORT_HEADER: BANNED.to_header()},
        }
        for code, headers in cases.items():
            body = (await http.post("/graphql", json=query, headers=headers)).json()
            assert body["data"] is None
            assert [e["extensions"]["code"] for e in body["errors"]] == [code]
        # A field that needs no principal answers without one (GraphiQL loads
        # the schema before the user sets a passport).
        body = (await http.post("/graphql", json={"query": "{ __schema { queryType { name } } }"})).json()
        assert body == {"data": {"__schema": {"queryType": {"name": "Query"}}}}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_get_queries_and_malformed_requests_answer_as_strawberrys_view(db: Database) -> None:
    """A GET query answers as its POST does; a mutation over GET, a body that is not JSON,
    not a JSON object or of another content type, and fields of the wrong JSON type are
    refused 400 naming what is wrong; a method other than GET and POST is 405."""
    async with service(db) as (_, addr), httpx.AsyncClient(base_url=f"http://{addr}") as http:
        headers = {PASSPORT_HEADER: ALICE.to_header()}
        query = "query Me($o: Boolean!) { whoami { sub org @include(if: $o) } }"
        got = await http.get("/graphql", params={"query": query, "variables": '{"o": true}'},
                             headers=headers)
        assert (got.status_code, got.headers["content-type"]) == (200, "application/json")
        assert got.content == b'{"data":{"whoami":{"sub":"alice","org":"acme"}}}'
        json_ = {**headers, "content-type": "application/json"}
        refused = {
            ("GET", "mutation { x }", None): "mutations are not allowed when using GET",
            ("GET", "{ pod }", '{"o":'): "Unable to parse request body as JSON",
            ("POST", None, b"{not json"): "Unable to parse request body as JSON",
            ("POST", None, b'"{ pod }"'): "The GraphQL request must be a JSON object.",
            ("POST", None, b'{"query": 1}'): "The GraphQL operation's `query` must be a string",
            ("POST", None, b'{"query": "{ pod }", "variables": []}'): "`variables` must be an object",
            ("POST", None, b"{}"): "No GraphQL query found in the request",
            ("POST", "text/plain", b'{"query": "{ pod }"}'): "Unsupported content type",
        }
        for (method, detail, body), reason in refused.items():
            if method == "GET":
                params = {"query": detail or "", **({"variables": body} if body else {})}
                response = await http.get("/graphql", params=params, headers=headers)
            else:
                sent = {**json_, "content-type": detail} if detail else json_
                response = await http.post("/graphql", content=body, headers=sent)
            assert response.status_code == 400, (method, body, response.text)
            assert reason in response.text, response.text
        assert (await http.put("/graphql", json={"query": "{ pod }"})).status_code == 405


async def test_subscriptions_are_not_served_over_http(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Over HTTP a subscription would outlive session_max_age unbounded: it
    is refused (400, typed ``subscription_over_http``) and pointed at the
    socket, whatever streaming Accept is sent, and nothing is logged at error."""
    async with service(db) as (_, addr), httpx.AsyncClient(base_url=f"http://{addr}") as http:
        headers = {PASSPORT_HEADER: ALICE.to_header()}
        for accept in ("application/json", "multipart/mixed;subscriptionSpec=1.0", "text/event-stream"):
            response = await http.post("/graphql", json={"query": "subscription { count(upTo: 2) }"},
                                       headers={**headers, "Accept": accept})
            assert response.status_code == 400
            assert "graphql-transport-ws on /graphql/ws" in response.text
            if accept == "application/json":
                (error,) = response.json()["errors"]
                assert error["extensions"] == {"code": "subscription_over_http"}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_graphiql_is_served_to_a_browser_with_subscriptions_on_the_ws_path(db: Database) -> None:
    """A browser GET of /graphql is served GraphiQL, wired to run subscriptions on the
    WebSocket path."""
    async with service(db) as (_, addr), httpx.AsyncClient(base_url=f"http://{addr}") as http:
        response = await http.get("/graphql", headers={"Accept": "text/html"})
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        assert "GraphiQL" in response.text
        assert 'httpUrlToWebSockeUrl(new URL("graphql/ws", fetchURL).toString())' in response.text


async def test_readyz_and_metrics_answer(db: Database) -> None:
    """/readyz answers 200 UP and 503 with the reasons when DOWN; /metrics exposes the
    engine's series labelled by service and pod."""
    async with service(db) as (engine, addr), httpx.AsyncClient(base_url=f"http://{addr}") as http:
        ready = await http.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "UP"})
        engine.metrics.add_impacts_committed(3)
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        series = [line for line in metrics.text.splitlines()
                  if line.startswith("service_engine_impacts_committed_total{")]
        assert len(series) == 1 and series[0].endswith(" 3.0")
        assert 'service="graphql-test"' in series[0] and f'pod="{engine.config.pod_id}"' in series[0]
        engine.readiness.set_down("test", "held down by the test")
        down = await http.get("/readyz")
        assert down.status_code == 503
        assert {"reason": "test", "detail": "held down by the test"} in down.json()["reasons"]


# -- graphql-transport-ws -------------------------------------------------------


async def test_a_subscription_streams_over_graphql_transport_ws(db: Database) -> None:
    """A subscription streams over graphql-transport-ws: ping/pong, a typed union of Reset,
    an out-of-band notice and caused Upsert, and queries over the socket."""
    async with service(db) as (_, addr), ws_connect(addr, ALICE.to_header()) as ws:
        assert ws.subprotocol == PROTOCOL
        await initialise(ws)
        await send(ws, {"type": "ping"})
        assert await receive(ws) == {"type": "pong"}
        counted = await subscribe(ws, "1", "subscription { count(upTo: 3) }")
        assert counted == [{"data": {"count": i}} for i in range(3)]
        # The typed union over the socket: Reset, the out-of-band notice, Upsert.
        cards = await subscribe(ws, "2", """subscription { cards {
            __typename
            ... on CardsReset { revision keys views { title } }
            ... on CardsUpsert { revision key view { title } cause { name data } }
            ... on LanesPaused { lanes } } }""")
        messages = [p["data"]["cards"] for p in cards]
        assert {"__typename": "LanesPaused", "lanes": ["presence"]} in messages
        deltas = [m for m in messages if m["__typename"] != "LanesPaused"]
        assert deltas == [
            {"__typename": "CardsReset", "revision": 1, "keys": ['"c1"'], "views": [{"title": "first"}]},
            {"__typename": "CardsUpsert", "revision": 2, "key": '"c1"', "view": {"title": "renamed"},
             "cause": {"name": "card.renamed", "data": {"by": "toy"}}},
        ]
        # Queries run over the socket under the socket's principal.
        assert await subscribe(ws, "3", "query { whoami { sub } }") == [
            {"data": {"whoami": {"sub": "alice"}}}
        ]


async def test_connection_init_without_a_usable_passport_is_refused(db: Database) -> None:
    """connection_init without a usable passport closes the socket with the refusal code and
    the typed reason."""
    cases = {"passport_missing": None, "passport_malformed": "!!", "passport_refused": BANNED.to_header()}
    async with service(db) as (_, addr):
        for code, header in cases.items():
            async with ws_connect(addr, header) as ws:
                await send(ws, {"type": "connection_init"})
                close = await closed(ws)
                assert close.rcvd is not None
                assert close.rcvd.code == CONNECTION_REFUSED_CLOSE_CODE
                assert close.rcvd.reason.startswith(f"{code}: ")


async def test_the_principal_is_resolved_once_per_socket(db: Database) -> None:
    """The principal is resolved once per socket, not once per operation."""
    seen: list[str] = []

    def counting(passport: Passport) -> Me:
        seen.append(passport.sub)
        return resolve_me(passport)

    async with (
        running_engine(db) as engine,
        serving(graphql_app(engine, SCHEMA, counting)) as addr,
        ws_connect(addr, ALICE.to_header()) as ws,
    ):
        await initialise(ws)
        for op in ("1", "2", "3"):
            assert await subscribe(ws, op, "query { whoami { sub } }") == [
                {"data": {"whoami": {"sub": "alice"}}}
            ]
    assert seen == ["alice"]


async def test_the_connection_params_passport_is_opt_in_and_never_beats_the_header(db: Database) -> None:
    """A passport in connection_init's payload is honoured only when opted in, and never
    over the gateway's header."""
    payload = {"X-Passport": ALICE.to_header()}  # what GraphiQL's Headers tab sends
    async with service(db) as (_, addr), ws_connect(addr) as ws:
        await send(ws, {"type": "connection_init", "payload": payload})
        close = await closed(ws)
        assert close.rcvd is not None and close.rcvd.reason.startswith("passport_missing: ")
    async with service(db, app_options={"passport_from_connection_params": True}) as (_, addr):
        async with ws_connect(addr) as ws:
            await initialise(ws, payload)
            assert await subscribe(ws, "1", "query { whoami { sub } }") == [
                {"data": {"whoami": {"sub": "alice"}}}
            ]
        async with ws_connect(addr, "not-a-passport!") as ws:  # the gateway's header wins
            await send(ws, {"type": "connection_init", "payload": payload})
            close = await closed(ws)
            assert close.rcvd is not None and close.rcvd.reason.startswith("passport_malformed: ")


async def test_the_socket_closes_at_session_max_age_from_the_handshake(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The bound counts from the upgrade, not from connection_init nor from a
    subscription: a client that delays its init still loses the socket at
    session_max_age after the handshake, with 1001 and the named reason,
    and reconnects with a fresh passport."""
    max_age, init_delay = 1.0, 0.6
    caplog.set_level(logging.ERROR)
    async with service(db, session_max_age=timedelta(seconds=max_age),
                       session_ttl=timedelta(seconds=0.5)) as (_, addr):
        started = time.monotonic()
        async with ws_connect(addr, ALICE.to_header()) as ws:
            # Nothing arrives while the client holds back its init.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ws.recv(), init_delay)
            await initialise(ws)
            await send(ws, {"id": "live", "type": "subscribe",
                            "payload": {"query": "subscription { whoamiLive }"}})
            assert await receive(ws) == {"id": "live", "type": "next",
                                         "payload": {"data": {"whoamiLive": "alice"}}}
            close = await closed(ws)
            elapsed = time.monotonic() - started
        assert close.rcvd is not None
        assert (close.rcvd.code, close.rcvd.reason) == (SESSION_MAX_AGE_CLOSE_CODE, SESSION_MAX_AGE_CLOSE_REASON)
        assert max_age <= elapsed < init_delay + max_age, elapsed
        # The client reconnects on a fresh upgrade with a fresh passport.
        fresh = Passport(sub="alice", org="acme", roles=("member", "editor"))
        async with ws_connect(addr, fresh.to_header()) as ws:
            await initialise(ws)
            assert await subscribe(ws, "1", "query { whoami { roles } }") == [
                {"data": {"whoami": {"roles": ["member", "editor"]}}}
            ]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


async def test_a_pod_shutting_down_refuses_the_upgrade(db: Database) -> None:
    """A pod shutting down refuses the WebSocket upgrade (403)."""
    async with service(db) as (engine, addr):
        engine.shutdown()
        with pytest.raises(InvalidStatus) as refused:
            async with ws_connect(addr, ALICE.to_header()):
                pass
        assert refused.value.response.status_code == 403


async def test_an_http_document_is_parsed_and_validated_once(db: Database) -> None:
    """On the HTTP operation path a document's second POST reuses its first parse (an
    author's ``on_parse`` hook sees the same document object) and runs no validation (an
    author's validation rule counts its runs); a different document is still validated."""
    parsed: list[DocumentNode] = []
    validated: list[str] = []

    class Parsed(SchemaExtension):
        def on_parse(self) -> Iterator[None]:
            yield
            document = self.execution_context.graphql_document
            if document is not None:
                parsed.append(document)

    class Counted(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            validated.append(print_ast(context.document))

    counted = copy.copy(SCHEMA)
    counted.extensions = (*SCHEMA.extensions, Parsed, lambda: AddValidationRules([Counted]))
    headers = {PASSPORT_HEADER: ALICE.to_header()}
    async with (
        running_engine(db) as engine,
        serving(graphql_app(engine, counted, resolve_me)) as addr,
        httpx.AsyncClient(base_url=f"http://{addr}") as http,
    ):
        for _ in range(2):
            response = await http.post("/graphql", json={"query": "query Me { whoami { sub } }"},
                                       headers=headers)
            assert response.json() == {"data": {"whoami": {"sub": "alice"}}}
        assert len(parsed) == 2 and parsed[0] is parsed[1]
        assert len(validated) == 1 and "Me" in validated[0]
        response = await http.post("/graphql", json={"query": "query Pod { pod }"},
                                   headers=headers)
        assert "errors" not in response.json()
        assert len(validated) == 2 and "Pod" in validated[1]
