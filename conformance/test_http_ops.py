"""Planned HTTP operations and the lean POST path (`graphql/http_ops.py`):
the reference service answers every request of its HTTP surface byte for
byte as Strawberry's view answers it.

Two pods of the reference service, each over its own copy of the example
database (the same state), one whose planned operations never know a
document (every request goes through Strawberry's view), one as shipped,
receive the same requests in the same order; every document is sent at
least twice, so the second and later sends of a known document take the
planned path on the shipped pod."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from example_service.graphql import build_app
from example_service.register import register
from example_service.slices import compose
from service_engine import Engine, ReadinessHandle, connect_pool
from service_engine.embedded import EmbeddedPostgres
from service_engine.graphql import PASSPORT_HEADER, Passport
from service_engine.server.http_ops import HttpOps

from .example_support import (
    Running,
    example_config,
    example_database,
    running,
    serving_engine,
)

ADMIN = Passport(sub="root", org="acme", roles=("board:archive",))
ALICE = Passport(sub="alice", org="acme")
GLOBEX = Passport(sub="gina", org="globex")

BOARD_FIELDS = "id org title owner archived member affordances { action allowed reason }"

Request = tuple[str, dict[str, Any] | None, Passport | None]


def req(query: str, variables: dict[str, Any] | None = None,
        passport: Passport | None = ADMIN) -> Request:
    return query, variables, passport


CREATE = ("mutation($id: ID, $title: String!) { createBoard(id: $id, title: $title) "
          "{ success error { code message retryable action } board { " + BOARD_FIELDS + " } } }")
RENAME = ("mutation($id: ID!, $title: String!) { renameBoard(id: $id, title: $title) "
          "{ success error { code } } }")
RENAME_BOARD = ("mutation Rename($id: ID!, $title: String!) { renameBoard(id: $id, title: $title) "
                "{ __typename success error { __typename code message } board { id title } } }")
ARCHIVE = ("mutation($id: ID!) { archiveBoard(id: $id) { ...R } } "
           "fragment R on BoardResult { success error { ... on Refusal { code retryable } } }")
TWO = ('mutation { a: renameBoard(id: "b-1", title: "two-a") { success } '
       'b: renameBoard(id: "b-2", title: "two-a") { success e: error { code message } } }')
BOARDS = "query($n: Int) { boards(limit: $n) { " + BOARD_FIELDS + " } }"
BOARD = "query($id: ID!) { board(id: $id) { __typename id t: title archived } }"
ORG_BOARDS = "{ orgBoards { id title archived } other: orgBoard(id: \"b-1\") { title } }"
LEDGER_OPEN = ("mutation($name: String!) { openLedger(name: $name) { success error { code } "
               "ledger { id name balance postings closed recent { cents memo } } } }")
LEDGER_POST = ("mutation($name: String!, $cents: Int!) { postToLedger(name: $name, "
               "cents: $cents, memo: \"m\") { success error { code message } "
               "ledger { balance postings } } }")
LEDGERS = "query { ledgers { name balance closed owner } }"
NAMED = ("query A { boards { id } } query B { board(id: \"b-1\") { title } } "
         "mutation C { renameBoard(id: \"b-1\", title: \"named\") { success } }")
SKIP = "query($s: Boolean!) { boards { id title @skip(if: $s) archived @include(if: $s) } }"
TOO_MANY_ALIASES = "query { " + " ".join(f"a{i}: boards {{ id }}" for i in range(31)) + " }"
DEEP = "query { __schema { types { fields { type " + "{ ofType " * 12 + "{ name }" + " }" * 12 \
    + " } } } }"

SCRIPT: list[Request] = [
    req(CREATE, {"id": "b-1", "title": "alpha"}),
    req(CREATE, {"id": "b-2", "title": "beta"}),
    req(CREATE, {"id": "b-3", "title": "alpha"}),  # the title is taken: a refusal
    req(CREATE, {"id": "b-3", "title": "gamma"}),
    req(RENAME, {"id": "b-1", "title": "alpha-1"}),
    req(RENAME, {"id": "b-1", "title": "alpha-2"}),
    req(RENAME, {"id": "b-2", "title": "alpha-2"}),  # taken
    req(RENAME, {"id": "nope", "title": "x"}),  # not found
    req(RENAME, {"id": "b-1"}),  # a bad variable: missing
    req(RENAME, {"id": "b-1", "title": 7}),  # a bad variable: wrong type
    req(RENAME, {"id": "b-1", "title": "alpha-3"}, None),  # no passport
    req(RENAME, {"id": "b-1", "title": "alpha-3"}, GLOBEX),  # another org's board
    req(RENAME_BOARD, {"id": "b-1", "title": "alpha-4"}),
    req(RENAME_BOARD, {"id": "b-1", "title": "alpha-5"}),
    req(RENAME_BOARD, {"id": "b-2", "title": "alpha-5"}),
    req(ARCHIVE, {"id": "b-3"}, ALICE),  # the gate refuses
    req(ARCHIVE, {"id": "b-3"}, ALICE),
    req(ARCHIVE, {"id": "b-3"}),
    req(ARCHIVE, {"id": "b-3"}),  # already archived
    req(TWO),
    req(TWO),
    req(BOARDS, {"n": 2}),
    req(BOARDS, {"n": 10}),
    req(BOARDS, {"n": "ten"}),
    req(BOARDS, None, ALICE),
    req(BOARDS, None, None),
    req(BOARD, {"id": "b-1"}),
    req(BOARD, {"id": "b-1"}),
    req(BOARD, {"id": "missing"}),
    req(BOARD, {"id": "b-2"}, GLOBEX),
    req(ORG_BOARDS),
    req(ORG_BOARDS),
    req(LEDGER_OPEN, {"name": "cash"}),
    req(LEDGER_OPEN, {"name": "cash"}),  # exists
    req(LEDGER_POST, {"name": "cash", "cents": 500}),
    req(LEDGER_POST, {"name": "cash", "cents": 250}),
    req(LEDGER_POST, {"name": "cash", "cents": -10_000}),  # overdraws: a refusal
    req(LEDGERS),
    req(LEDGERS),
    req(SKIP, {"s": True}),
    req(SKIP, {"s": False}),
    req("query { boards { id nope } }"),
    req("query { boards { id nope } }"),
    req("query { boards { id "),
    req(TOO_MANY_ALIASES),
    req(TOO_MANY_ALIASES),
    req(DEEP),
    req(DEEP),
    req("{ __typename boards { __typename } }"),
    req("{ __typename boards { __typename } }"),
    req("subscription { boards { __typename } }"),
]

NAMED_SCRIPT: list[tuple[str, str | None, Passport | None]] = [
    (NAMED, "A", ADMIN), (NAMED, "A", ADMIN), (NAMED, "B", ADMIN), (NAMED, "B", ADMIN),
    (NAMED, "C", ADMIN), (NAMED, "C", ADMIN), (NAMED, "D", ADMIN), (NAMED, "D", ADMIN),
    (NAMED, None, ADMIN), (NAMED, None, ADMIN),
]


@pytest.fixture
async def pods(pg_server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
               ) -> AsyncIterator[tuple[Running, Running]]:
    built: list[HttpOps] = []
    init = HttpOps.__init__

    def recorded(self: HttpOps, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(HttpOps, "__init__", recorded)
    async with (
        example_database(pg_server) as off_store,
        example_database(pg_server) as on_store,
        running(off_store, ["board", "ledger"], config=example_config()) as off,
    ):
        # The first pod's planned operations know nothing: Strawberry's view answers all.
        (reference,) = built
        reference.enabled = False
        async with running(on_store, ["board", "ledger"], config=example_config()) as on:
            yield off, on


def _headers(passport: Passport | None, content_type: str = "application/json") -> dict[str, str]:
    headers = {"content-type": content_type}
    if passport is not None:
        headers[PASSPORT_HEADER] = passport.to_header()
    return headers


async def _answer(pod: Running, body: bytes, headers: dict[str, str] | list[tuple[str, str]],
                  method: str = "POST") -> tuple[int, str | None, bytes]:
    if method == "GET":
        response = await pod.http.get("/graphql", params=json.loads(body), headers=headers)
    else:
        response = await pod.http.post("/graphql", content=body, headers=headers)
    return response.status_code, response.headers.get("content-type"), response.content


async def test_every_http_document_answers_the_same_with_http_ops_on_and_off(
    pods: tuple[Running, Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queries and mutations with variables, aliases, fragments, __typename,
    refusals, resolver errors, a missing passport, bad variables, a named
    operation (and an unknown one), limits exceeded, validation and syntax
    errors, a subscription over HTTP: the same status, content type and
    bytes from the pod with planned operations as from the pod without,
    and the planned path served the known documents."""
    planned = 0
    execute = HttpOps.execute

    async def counting(self: HttpOps, *args: Any, **kwargs: Any) -> Any:
        nonlocal planned
        planned += 1
        return await execute(self, *args, **kwargs)

    monkeypatch.setattr(HttpOps, "execute", counting)
    off, on = pods
    for query, variables, passport in SCRIPT:
        body: dict[str, Any] = {"query": query}
        if variables is not None:
            body["variables"] = variables
        raw = json.dumps(body).encode()
        first = await _answer(off, raw, _headers(passport))
        second = await _answer(on, raw, _headers(passport))
        assert second == first, (query, variables)
    for query, name, passport in NAMED_SCRIPT:
        raw = json.dumps({"query": query, "operationName": name}).encode()
        assert await _answer(on, raw, _headers(passport)) == \
            await _answer(off, raw, _headers(passport)), name
    assert planned >= 25, planned


async def test_the_lean_post_leaves_other_requests_to_strawberrys_view(
    pods: tuple[Running, Running],
) -> None:
    """GET queries, a body past the limit, a body that is not JSON, a batch,
    another content type (or JSON's spelled otherwise, a similar media type,
    a second Content-Type header), a request with extensions, a streaming Accept:
    the same answers from both pods (the ordinary view's), a document known
    or not."""
    off, on = pods
    known = json.dumps({"query": BOARDS, "variables": {"n": 1}}).encode()
    for _ in range(2):
        assert await _answer(on, known, _headers(ADMIN)) == \
            await _answer(off, known, _headers(ADMIN))
    cases: list[tuple[bytes, dict[str, str] | list[tuple[str, str]], str]] = [
        (json.dumps({"query": BOARDS, "variables": json.dumps({"n": 1})}).encode(),
         _headers(ADMIN), "GET"),
        (json.dumps({"query": "query { boards { id } }"}).encode(), _headers(ADMIN), "GET"),
        (b"{not json", _headers(ADMIN), "POST"),
        (json.dumps([{"query": BOARDS}]).encode(), _headers(ADMIN), "POST"),
        (json.dumps({"query": BOARDS, "extensions": {"x": 1}}).encode(), _headers(ADMIN), "POST"),
        (json.dumps({"query": BOARDS, "variables": [1]}).encode(), _headers(ADMIN), "POST"),
        (json.dumps({"query": BOARDS, "operationName": 3}).encode(), _headers(ADMIN), "POST"),
        (json.dumps({"query": BOARDS}).encode(), _headers(ADMIN, "text/plain"), "POST"),
        (known, _headers(ADMIN, "APPLICATION/JSON"), "POST"),
        (known, _headers(ADMIN, "Application/Json; charset=UTF-8"), "POST"),
        (known, _headers(ADMIN, "application/json; charset=latin-1"), "POST"),
        (known, _headers(ADMIN, "application/jsonx"), "POST"),
        (known, [*_headers(ADMIN, "text/plain").items(), ("content-type", "application/json")],
         "POST"),
        (json.dumps({"query": BOARDS}).encode(),
         {**_headers(ADMIN), "accept": "multipart/mixed;subscriptionSpec=1.0"}, "POST"),
        (json.dumps({"query": BOARDS, "pad": "x" * 1_100_000}).encode(), _headers(ADMIN), "POST"),
        (json.dumps({"query": 'mutation { renameBoard(id: "b-9", title: "t") { success } }'})
         .encode(), _headers(ADMIN), "GET"),
    ]
    for body, headers, method in cases:
        assert await _answer(on, body, headers, method) == \
            await _answer(off, body, headers, method), (body[:80], headers, method)


async def test_middleware_the_service_adds_sees_every_post(pg_server: EmbeddedPostgres) -> None:
    """A service that adds its own middleware (``app.add_middleware``) has it
    run for every POST of the GraphQL path, a known document's too: the lean
    path steps aside, and the answers are the view's."""
    seen: list[str] = []

    class Counting:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append(scope["path"])
            await self.app(scope, receive, send)

    async with example_database(pg_server) as store:
        db = await connect_pool(store.app_url, max_size=5)
        try:
            engine = await Engine.boot(example_config(), db, None, ReadinessHandle())
            service = compose(("board",))
            register(engine, service)
            app = build_app(engine, service)
            app.add_middleware(Counting)
            async with serving_engine(engine, app) as (_addr, http):
                body = json.dumps({"query": BOARDS, "variables": {"n": 2}}).encode()
                answers = [
                    (await http.post("/graphql", content=body, headers=_headers(ADMIN))).content
                    for _ in range(3)
                ]
        finally:
            await db.aclose()
    assert seen.count("/graphql") == 3
    assert answers[0] == answers[1] == answers[2]
