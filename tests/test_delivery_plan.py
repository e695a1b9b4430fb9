"""The delivery plan: a live subscription's payload rendered without GraphQL
execution, identical to what execution gives, and serialised once.

Every document here runs twice over the same events: through the schema as
served (the plan) and through a copy with ordinary graphql-core execution;
the frames the socket would carry must be the same bytes.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest
import strawberry
from graphql import FragmentDefinitionNode, OperationDefinitionNode, parse
from graphql.execution.values import get_variable_values
from strawberry.scalars import JSON

from service_engine.graphql.delivery_plan import Encoded, dumps, plan_operation
from service_engine.graphql.subscriptions import LanesPaused, subscription_union
from service_engine.impacts.model import Cause
from service_engine.render.deltas import Remove, Reset, Upsert
from service_engine.server import delivery


@strawberry.enum
class Kind(enum.Enum):
    TASK = "task"
    NOTE = "note"


@strawberry.type
class Owner:
    name: str
    score: float | None = None


@strawberry.type
class ThingView:
    id: strawberry.ID
    title: str
    archived: bool
    tags: list[str]
    kind: Kind
    owner: Owner | None
    meta: JSON | None = None

    @strawberry.field
    def shout(self) -> str:
        return self.title.upper()


THINGS = subscription_union("Things", ThingView)


@strawberry.type
class Query:
    ping: str = "pong"


@strawberry.type
class Subscription:
    @strawberry.subscription(graphql_type=THINGS.type)  # type: ignore[untyped-decorator]
    async def things(self, info: strawberry.Info, limit: int = 10) -> AsyncGenerator[Any, None]:
        async for message in THINGS.subscribe(_events(info.context["events"])):
            yield message


async def _events(items: list[Any]) -> AsyncGenerator[Any, None]:
    for item in items:
        yield item


SERVED = strawberry.Schema(query=Query, subscription=Subscription, types=THINGS.types)
SERVED.execution_context_class = delivery.live_executor_class(SERVED.execution_context_class)
ORDINARY = copy.copy(SERVED)
ORDINARY.execution_context_class = strawberry.Schema(
    query=Query, subscription=Subscription, types=THINGS.types
).execution_context_class

ALPHA = ThingView(id=strawberry.ID("t1"), title="Alpha \u00e9\"", archived=False,
                  tags=["a", "b"], kind=Kind.TASK, owner=Owner(name="ann", score=1.5),
                  meta=cast(Any, {"n": [1, 2], "s": "x"}))
BETA = ThingView(id=strawberry.ID("t2"), title="Beta", archived=True, tags=[],
                 kind=Kind.NOTE, owner=None)
CAUSE = Cause("thing.renamed", {"from": "a"})
EVENTS: list[Any] = [
    Reset(1, {'"t1"': ALPHA, '"t2"': BETA}),
    Upsert(2, '"t1"', ALPHA, CAUSE),
    Upsert(3, '"t2"', BETA),
    LanesPaused(lanes=["presence"]),
    Remove(4, '"t2"', CAUSE),
    Upsert(5, '"t1"', ALPHA, CAUSE),
]

FULL = """subscription { things {
  __typename
  ... on ThingsReset { revision keys views { id title archived tags kind owner { name score } meta } }
  ... on ThingsUpsert { revision key view { __typename id title archived tags kind owner { name score } meta } cause { name data } }
  ... on ThingsRemove { revision key cause { name } }
  ... on LanesPaused { lanes }
} }"""

ALIASED = """subscription { live: things(limit: 3) {
  kind: __typename
  ... on ThingsUpsert { rev: revision k: key v: view { t: title id: id } }
  ... on ThingsRemove { revision: key r2: revision }
  ... on ThingsReset { n: revision views { id } }
} }"""

FRAGMENTS = """
fragment V on ThingView { id title ...O }
fragment O on ThingView { owner { name } }
fragment M on ThingsMessage { __typename }
subscription Named { things { ...M ... on ThingsUpsert { revision view { ...V title } } ...R } }
fragment R on ThingsRemove { key revision }
"""

VARIABLES = """subscription($withTitle: Boolean!, $noKey: Boolean!, $limit: Int) { things(limit: $limit) {
  __typename
  ... on ThingsUpsert @include(if: true) { revision key @skip(if: $noKey) view { id title @include(if: $withTitle) } }
} }"""

RESOLVED = """subscription { things { ... on ThingsUpsert { revision view { shout } } } }"""


PLANNED: list[int] = []


async def frames(schema: strawberry.Schema, query: str, variables: dict[str, Any] | None,
                 events: list[Any]) -> list[str]:
    """The ``next`` frames the socket would send for ``events`` (how many the plan
    rendered is appended to ``PLANNED``)."""
    planned = 0
    stream = await schema.subscribe(query, variable_values=variables,
                                    context_value={"events": events})
    out: list[str] = []
    async for result in stream:
        planned += isinstance(result.data, Encoded)
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            payload["errors"] = [e.formatted for e in result.errors]
        message = {"id": "op-1", "type": "next", "payload": payload}
        frame = delivery.encode_frame(message)
        out.append(frame if frame is not None else dumps(message))
    PLANNED.append(planned)
    return out


DOCUMENTS: list[tuple[str, dict[str, Any] | None]] = [
    (FULL, None),
    (ALIASED, None),
    (FRAGMENTS, None),
    (VARIABLES, {"withTitle": True, "noKey": False, "limit": 2}),
    (VARIABLES, {"withTitle": False, "noKey": True}),
    (RESOLVED, None),
]
"""The documents every delivery path must serve byte for byte as executed."""


@pytest.mark.parametrize(("query", "variables"), DOCUMENTS)
async def test_planned_frames_are_the_executed_frames_byte_for_byte(
    query: str, variables: dict[str, Any] | None
) -> None:
    """Aliases, __typename, inline and named fragments, a fragment on the union, variables in
    @skip / @include, and a field with a resolver (which falls back): the served frames are
    the bytes ordinary execution gives."""
    PLANNED.clear()
    assert await frames(SERVED, query, variables, EVENTS) == await frames(
        ORDINARY, query, variables, EVENTS)
    # Served by the plan (every event) unless the document cannot be planned; never otherwise.
    assert [0 if query is RESOLVED else len(EVENTS), 0] == PLANNED


async def test_an_event_the_plan_refuses_falls_back_to_execution() -> None:
    """A null where the schema says non-null: the plan refuses that event and ordinary
    execution answers it (with its error), the same bytes as without the plan."""
    broken = ThingView(id=strawberry.ID("t3"), title=None, archived=False,  # type: ignore[arg-type]
                       tags=[], kind=Kind.TASK, owner=None)
    events = [Upsert(7, '"t3"', broken), Upsert(8, '"t1"', ALPHA)]
    PLANNED.clear()
    served = await frames(SERVED, FULL, None, events)
    assert served == await frames(ORDINARY, FULL, None, events)
    assert '"errors"' in served[0] and '"errors"' not in served[1]
    assert PLANNED[0] == 1  # the second event was planned


def _plan(query: str, variables: dict[str, Any] | None = None) -> Any:
    schema = SERVED._schema
    document = parse(query)
    operation = next(d for d in document.definitions if isinstance(d, OperationDefinitionNode))
    fragments = {d.name.value: d for d in document.definitions
                 if isinstance(d, FragmentDefinitionNode)}
    coerced = get_variable_values(schema, operation.variable_definitions or (), variables or {})
    return plan_operation(schema, operation, fragments, coerced)


def test_plan_renders_a_member_and_cuts_at_its_own_revision() -> None:
    """The plan gives the member's data; its encoding differs between two sessions' members of
    one shared view only in the revision (the nested view is serialised once)."""
    plan = _plan(FULL)
    assert plan is not None
    first = plan.encode(THINGS.message(Upsert(2, '"t1"', ALPHA, CAUSE)))
    later = first.with_revision(41)
    assert isinstance(first, Encoded) and len(first.chunks) == 2
    assert first.text().replace('"revision":2', '"revision":41') == later.text()
    assert first.value() == plan.data(THINGS.message(Upsert(2, '"t1"', ALPHA, CAUSE)))


def test_shared_members_are_serialised_once_per_plan() -> None:
    """Two sessions' Upserts of the same (or an equal) view and cause reuse one serialisation;
    a changed view is serialised anew; a Reset's per-session lists are never cached."""
    plan = _plan(FULL)
    shared = delivery.SharedPlan(parse(FULL).definitions[0], plan)  # type: ignore[arg-type]
    a = shared.encode(THINGS.message(Upsert(2, '"t1"', ALPHA, CAUSE)))
    b = shared.encode(THINGS.message(Upsert(9, '"t1"', ALPHA, CAUSE)))
    assert a.chunks is b.chunks and (a.revision, b.revision) == (2, 9)
    c = shared.encode(THINGS.message(Upsert(10, '"t1"', BETA, CAUSE)))
    assert c.chunks is not a.chunks
    # Another principal's projection of the same row: an equal, distinct view.
    twin = copy.deepcopy(BETA)
    d = shared.encode(THINGS.message(Upsert(11, '"t1"', twin, CAUSE)))
    assert d.chunks is c.chunks and d.revision == 11
    changed = copy.deepcopy(BETA)
    changed.title = "Beta 2"
    e = shared.encode(THINGS.message(Upsert(12, '"t1"', changed, CAUSE)))
    assert e.chunks is not c.chunks and '"Beta 2"' in e.text()
    r1 = shared.encode(THINGS.message(Reset(1, {'"t1"': ALPHA})))
    r2 = shared.encode(THINGS.message(Reset(1, {'"t1"': ALPHA})))
    assert r1.chunks is not r2.chunks and r1 == r2


@pytest.mark.parametrize("query", [
    "subscription { things { __typename } other: things { __typename } }",
    "subscription { things { ... on ThingsUpsert { view { shout } } } }",
    "subscription { things { ... on ThingsUpsert @deprecated { revision } } }",
    "subscription { things { ... on ThingsUpsert { view { title(x: 1) } } } }",
])
def test_shapes_the_plan_cannot_express_are_not_planned(query: str) -> None:
    """Two root fields, a resolver field, an unknown directive, an argument below the root:
    no plan (ordinary execution)."""
    assert _plan(query) is None


def test_plain_shapes_are_planned() -> None:
    """The documents a client writes (fields, aliases, fragments, variables) are planned."""
    for query, variables in ((FULL, None), (ALIASED, None), (FRAGMENTS, None),
                             (VARIABLES, {"withTitle": True, "noKey": False})):
        assert _plan(query, variables) is not None, query


async def test_http_documents_are_parsed_and_validated_once() -> None:
    """The served schema (limiters included) parses and validates a repeated document once;
    a document past a limiter is still refused every time."""
    from strawberry.extensions.parser_cache import _get_parse_cache
    from strawberry.extensions.validation_cache import _get_validate_cache

    from service_engine.config import EngineConfig
    from service_engine.server.app import limited_schema

    served = limited_schema(
        strawberry.Schema(query=Query), EngineConfig(service="delivery-test", query_max_depth=3))
    parse_cache: Any = _get_parse_cache(delivery.DOCUMENT_CACHE_SIZE)
    validate_cache: Any = _get_validate_cache(delivery.DOCUMENT_CACHE_SIZE)
    query = "query Once { ping alias: ping }"
    first = await served.execute(query, root_value=Query())
    parsed, validated = parse_cache.cache_info().hits, validate_cache.cache_info().hits
    again = await served.execute(query, root_value=Query())
    assert first.data == again.data == {"ping": "pong", "alias": "pong"}
    assert parse_cache.cache_info().hits == parsed + 1
    assert validate_cache.cache_info().hits == validated + 1
    for _ in range(2):
        refused = await served.execute("{ " + "ping " * 3 + "nope }")
        assert refused.errors
