"""The edge's checks on each operation (`service_engine.server.app.limited_schema`):
each document text parsed and validated once per app, every bound still
applied and every refusal still typed on every run."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest
import strawberry
from graphql import ValidationContext, ValidationRule
from starlette.responses import Response
from strawberry.extensions import AddValidationRules, SchemaExtension

from service_engine.config import EngineConfig
from service_engine.graphql.context import GraphQLContext
from service_engine.server import delivery
from service_engine.server.app import limited_schema


@strawberry.type
class Node:
    name: str = "n"

    @strawberry.field
    def child(self) -> Node:
        return Node()


@strawberry.type
class Query:
    @strawberry.field
    def node(self) -> Node:
        return Node()

    @strawberry.field
    def ping(self, word: str = "pong") -> str:
        return word


@strawberry.type
class Subscription:
    @strawberry.subscription
    async def count(self) -> AsyncGenerator[int, None]:
        yield 1


def _served(validated: list[str], **bounds: Any) -> strawberry.Schema:
    """The limited copy of a schema whose author's rule records each validation."""

    class Counted(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            validated.append(context.document.loc.source.body if context.document.loc else "")

    author = strawberry.Schema(query=Query, subscription=Subscription,
                               extensions=[lambda: AddValidationRules([Counted])])
    return limited_schema(author, EngineConfig(service="edge-test", **bounds))


def _codes(result: Any) -> list[object]:
    return [(error.extensions or {}).get("code") for error in result.errors or ()]


async def test_a_refused_document_is_refused_typed_on_every_run_and_validated_once() -> None:
    """A document past the depth, alias or introspection bound is refused with
    its typed code on every run, its validation run once; a document past the
    token bound (a parse error) is refused typed on every run too."""
    validated: list[str] = []
    served = _served(validated, query_max_depth=3, query_max_aliases=2,
                     query_max_tokens=60, graphql_introspection=False)
    cases = {
        "query_too_deep": "{ node { child { child { child { name } } } } }",
        "query_too_many_aliases": "{ a: ping b: ping c: ping }",
        "introspection_disabled": "{ __schema { queryType { name } } }",
        "query_too_many_tokens": "{ " + "ping " * 60 + "}",
    }
    for code, query in cases.items():
        for _ in range(3):
            result = await served.execute(query)
            assert result.data is None and code in _codes(result), (code, result.errors)
    # The three that parse were validated once each; the fourth never parses.
    assert sorted(validated) == sorted(q for c, q in cases.items() if c != "query_too_many_tokens")


async def test_a_valid_document_is_served_from_its_first_validation() -> None:
    """A valid document's later runs reuse its first parse and validation, with
    its variables and operation chosen per run."""
    validated: list[str] = []
    served = _served(validated)
    query = "query A($w: String!) { ping(word: $w) } query B { ping }"
    for word in ("one", "two"):
        result = await served.execute(query, variable_values={"w": word}, operation_name="A")
        assert result.data == {"ping": word}
    assert (await served.execute(query, operation_name="B")).data == {"ping": "pong"}
    assert validated == [query]


async def test_apps_under_different_bounds_keep_their_own_documents() -> None:
    """Two apps over one schema under different bounds decide a document each by
    its own bounds, whichever ran it first."""
    strict = _served([], query_max_depth=2)
    loose = _served([], query_max_depth=10)
    deep = "{ node { child { child { name } } } }"
    assert _codes(await loose.execute(deep)) == []
    assert _codes(await strict.execute(deep)) == ["query_too_deep"]
    assert (await loose.execute(deep)).data == {"node": {"child": {"child": {"name": "n"}}}}


async def test_a_subscription_over_http_is_refused_on_every_run() -> None:
    """A subscription sent over HTTP is refused (400, typed, pointed at the
    socket) on its first run and on every later run of the same text."""
    served = _served([])
    for _ in range(3):
        context: GraphQLContext[None] = GraphQLContext(None, None, Response())  # type: ignore[arg-type]
        result = await served.execute("subscription { count }", context_value=context)
        assert _codes(result) == ["subscription_over_http"]
        assert "graphql-transport-ws on /graphql/ws" in result.errors[0].message  # type: ignore[index]
        assert context.response.status_code == 400


async def test_the_documents_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An app keeps at most ``DOCUMENT_CACHE_SIZE`` texts, the least recently
    run dropped first: a dropped text is validated again when it returns."""
    monkeypatch.setattr(delivery, "DOCUMENT_CACHE_SIZE", 3)
    validated: list[str] = []
    served = _served(validated)
    texts = [f"query Q{i} {{ ping }}" for i in range(4)]
    for text in (texts[0], texts[1], texts[2], texts[0], texts[3]):  # Q1 is the oldest at Q3
        await served.execute(text)
    assert validated == [texts[0], texts[1], texts[2], texts[3]]
    await served.execute(texts[0])
    await served.execute(texts[1])
    assert validated[4:] == [texts[1]]


async def test_an_author_extension_sees_every_operation_parsed() -> None:
    """An author's ``on_parse`` and ``on_validate`` hooks run on every operation,
    a repeated text's document already parsed and its validation already known."""
    seen: list[tuple[bool, bool]] = []

    class Watch(SchemaExtension):
        def on_parse(self) -> Iterator[None]:
            yield
            seen.append((self.execution_context.graphql_document is not None, False))

        def on_validate(self) -> Iterator[None]:
            yield
            seen.append((True, self.execution_context.pre_execution_errors == []))

    served = limited_schema(strawberry.Schema(query=Query, extensions=[Watch]),
                            EngineConfig(service="edge-test"))
    for _ in range(2):
        assert (await served.execute("{ ping }")).data == {"ping": "pong"}
    assert seen == [(True, False), (True, True)] * 2
