"""The delivery plan: a live subscription's payload rendered without GraphQL
execution, identical to what execution gives, and serialised once.

Every document here runs twice over the same events: through the schema as
served (the plan) and through a copy with ordinary graphql-core execution;
the frames the socket would carry must be the same bytes.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import AsyncGenerator, Iterator
from typing import Any, cast

import pytest
import strawberry
from graphql import (
    DocumentNode,
    FragmentDefinitionNode,
    GraphQLSchema,
    OperationDefinitionNode,
    ValidationContext,
    ValidationRule,
    parse,
    print_ast,
)
from graphql.execution.values import get_variable_values
from strawberry.extensions import AddValidationRules, SchemaExtension
from strawberry.scalars import JSON

from service_engine.graphql.delivery_plan import Encoded, NotPlanned, dumps, plan_operation
from service_engine.graphql.subscriptions import LanesPaused, subscription_union
from service_engine.impacts.model import Cause
from service_engine.render.deltas import Remove, Reset, Upsert
from service_engine.server import delivery
from service_engine.server.live_op import next_frame, next_frame_head


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


_VALIDATED: list[GraphQLSchema] = []


class _SeeSchema(ValidationRule):
    """Records the graphql-core schema a document is validated against."""

    def __init__(self, context: ValidationContext) -> None:
        super().__init__(context)
        _VALIDATED[:] = [context.schema]


SERVED = strawberry.Schema(query=Query, subscription=Subscription, types=THINGS.types,
                           extensions=[lambda: AddValidationRules([_SeeSchema])])
SERVED.execute_sync("{ ping }")
(GRAPHQL_SCHEMA,) = _VALIDATED

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


async def executed(query: str, variables: dict[str, Any] | None, events: list[Any]) -> list[str]:
    """The ``next`` frames ordinary execution gives for ``events``."""
    stream = await SERVED.subscribe(query, variable_values=variables,
                                    context_value={"events": events})
    out: list[str] = []
    async for result in stream:
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            payload["errors"] = [e.formatted for e in result.errors]
        out.append(dumps({"id": "op-1", "type": "next", "payload": payload}))
    return out


async def planned(query: str, variables: dict[str, Any] | None, events: list[Any]) -> list[str]:
    """The ``next`` frames the socket writes for ``events``: the plan's where it renders
    the member, execution's where it refuses it (how many the plan rendered is appended to
    ``PLANNED``)."""
    plan = _plan(query, variables)
    if plan is None:
        PLANNED.append(0)
        return await executed(query, variables, events)
    head = next_frame_head("op-1")
    out: list[str] = []
    count = 0
    for event in events:
        try:
            out.append(next_frame(head, plan.encode(THINGS.message(event))))
            count += 1
        except NotPlanned:
            out.extend(await executed(query, variables, [event]))
    PLANNED.append(count)
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
    assert await planned(query, variables, EVENTS) == await executed(query, variables, EVENTS)
    # Served by the plan (every event) unless the document cannot be planned.
    assert [0 if query is RESOLVED else len(EVENTS)] == PLANNED


async def test_an_event_the_plan_refuses_falls_back_to_execution() -> None:
    """A null where the schema says non-null: the plan refuses that event and ordinary
    execution answers it (with its error), the same bytes as without the plan."""
    broken = ThingView(id=strawberry.ID("t3"), title=None, archived=False,  # type: ignore[arg-type]
                       tags=[], kind=Kind.TASK, owner=None)
    events = [Upsert(7, '"t3"', broken), Upsert(8, '"t1"', ALPHA)]
    PLANNED.clear()
    served = await planned(FULL, None, events)
    assert served == await executed(FULL, None, events)
    assert '"errors"' in served[0] and '"errors"' not in served[1]
    assert PLANNED[0] == 1  # the second event was planned


def _plan(query: str, variables: dict[str, Any] | None = None) -> Any:
    schema = GRAPHQL_SCHEMA
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
    """The schema the HTTP operation path executes (`limited_schema`, the limiters
    included) parses and validates a repeated document once: its second run reuses the
    first's parsed document (seen by an author's ``on_parse`` hook) and runs no validation
    rule (an author's rule counts its runs); a different document is still validated, and
    one past a limiter is still refused every time."""
    from service_engine.config import EngineConfig
    from service_engine.server.app import limited_schema

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

    author = strawberry.Schema(
        query=Query, extensions=[Parsed, lambda: AddValidationRules([Counted])])
    served = limited_schema(author, EngineConfig(service="delivery-test", query_max_depth=3))
    query = "query Once { ping alias: ping }"
    first = await served.execute(query, root_value=Query())
    again = await served.execute(query, root_value=Query())
    assert first.data == again.data == {"ping": "pong", "alias": "pong"}
    assert len(parsed) == 2 and parsed[0] is parsed[1]
    assert validated == [print_ast(parsed[0])]
    other = await served.execute("query Other { ping }", root_value=Query())
    assert other.data == {"ping": "pong"}
    assert len(validated) == 2 and "Other" in validated[1]
    for _ in range(2):
        refused = await served.execute("{ " + "ping " * 3 + "nope }")
        assert refused.errors
