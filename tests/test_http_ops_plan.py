"""Planned HTTP operations (`service_engine.server.http_ops`): what is
planned, and that a known document's answer is the ordinary path's, byte for
byte (no I/O: a schema in memory, Strawberry's ``execute`` against the
planned execution)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
from typing import Any

import pytest
import strawberry
from graphql import parse

from service_engine.config import EngineConfig
from service_engine.graphql.delivery_plan import dumps
from service_engine.graphql.results import MutationResult
from service_engine.server.app import limited_schema
from service_engine.server.http_ops import MAX_KNOWN_DOCUMENT_CHARS, HttpOps, plan_http_operation


@strawberry.enum
class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@strawberry.type
class Tag:
    name: str
    colour: Colour


@strawberry.type
class Item:
    id: strawberry.ID
    title: str
    tags: list[Tag]
    note: str | None = None

    @strawberry.field
    def shout(self) -> str:
        return self.title.upper()


@strawberry.type
class ItemResult(MutationResult):
    item: Item | None = None
    count: int = 0


LOG: list[str] = []


@strawberry.input
class Filter:
    prefix: str
    limit: int = 10


class Boom(Exception):
    """A resolver's failure."""


@strawberry.type
class Query:
    @strawberry.field
    async def item(self, info: strawberry.Info, id: strawberry.ID) -> Item | None:
        if str(id) == "missing":
            return None
        if str(id) == "boom":
            raise Boom("the item exploded")
        return Item(id=id, title=f"t-{id}", tags=[Tag(name="a", colour=Colour.RED)])

    @strawberry.field
    def items(self, where: Filter) -> list[Item]:
        return [Item(id=strawberry.ID(f"{where.prefix}{i}"), title="x", tags=[])
                for i in range(where.limit)]

    @strawberry.field
    def strict(self) -> Item:
        return None  # type: ignore[return-value]  # a null in a non-null position

    @strawberry.field
    def bad_colour(self) -> Tag:
        return Tag(name="b", colour="green")  # type: ignore[arg-type]


@strawberry.type
class Mutation:
    @strawberry.mutation
    async def touch(self, info: strawberry.Info, id: strawberry.ID, step: int = 1) -> ItemResult:
        LOG.append(f"{id}:{step}")
        if str(id) == "refused":
            return ItemResult(success=False, error=None)
        if str(id) == "boom":
            raise Boom("no touching")
        return ItemResult(success=True, count=len(LOG),
                          item=Item(id=id, title="t", tags=[Tag(name="n", colour=Colour.BLUE)]))

    @strawberry.mutation
    def must(self, id: strawberry.ID) -> ItemResult:
        LOG.append(f"must:{id}")
        if str(id) == "boom":
            raise Boom("must failed")
        return ItemResult(success=True)


SCHEMA = strawberry.Schema(query=Query, mutation=Mutation)


def served() -> Any:
    return limited_schema(SCHEMA, EngineConfig())


async def both(query: str, variables: dict[str, Any] | None = None,
               name: str | None = None) -> tuple[str, str, bool]:
    """The ordinary answer (learning) and the planned one, as the view encodes them."""
    schema = served()
    ops = HttpOps(schema)
    LOG.clear()
    with ops.learning(query, name):
        ordinary = await schema.execute(query, variable_values=variables, operation_name=name)
    plan = ops.known(query, name)
    if plan is None:
        return _encode(ordinary), _encode(ordinary), False
    LOG.clear()
    again = await schema.execute(query, variable_values=variables, operation_name=name)
    LOG.clear()
    planned = await ops.execute(plan, query, variables, None)
    assert _encode(again) == _encode(ordinary)
    return _encode(ordinary), _encode(planned), True


def _encode(result: Any) -> str:
    out: dict[str, Any] = {"data": result.data}
    if result.errors:
        out["errors"] = [e.formatted for e in result.errors]
    return dumps(out)


DOCUMENTS: list[tuple[str, dict[str, Any] | None, str | None]] = [
    ('query($id: ID!) { item(id: $id) { __typename id title tags { name colour } note } }',
     {"id": "1"}, None),
    ('query { a: item(id: "1") { t: title ...F } b: item(id: "missing") { id } } '
     'fragment F on Item { tags { ... on Tag { colour __typename } } }', None, None),
    ('query { item(id: "1") { shout title } }', None, None),
    ('query { item(id: "boom") { id } other: item(id: "2") { id } }', None, None),
    ('query($w: Filter!) { items(where: $w) { id } }', {"w": {"prefix": "p", "limit": 2}}, None),
    ('query($w: Filter!) { items(where: $w) { id } }', {"w": {"prefix": 3}}, None),
    ('query($id: ID!) { item(id: $id) { id } }', {}, None),
    ('query { strict { id } }', None, None),
    ('query { badColour { name colour } }', None, None),
    ('query($s: Boolean!) { item(id: "1") { id title @skip(if: $s) } }', {"s": True}, None),
    ('query A { item(id: "1") { id } } query B { item(id: "2") { title } }', None, "B"),
    ('mutation($id: ID!) { touch(id: $id) { success error { code message } count '
     'item { id tags { colour } } } }', {"id": "i"}, None),
    ('mutation { first: touch(id: "a") { count } second: touch(id: "b", step: 2) { count } '
     'third: must(id: "c") { success } }', None, None),
    ('mutation { touch(id: "boom") { success } after: touch(id: "x") { count } }', None, None),
    ('mutation { must(id: "boom") { success } after: touch(id: "y") { count } }', None, None),
    ('mutation { touch(id: "refused") { success error { code } } }', None, None),
]


@pytest.mark.parametrize(("query", "variables", "name"), DOCUMENTS)
async def test_a_known_document_answers_byte_for_byte_as_strawberry(
    query: str, variables: dict[str, Any] | None, name: str | None
) -> None:
    """Variables, aliases, fragments, __typename, nulls, enums, resolver
    errors, non-null propagation, bad variables, a named operation, serial
    mutations: the planned execution's answer is the ordinary one."""
    ordinary, planned, known = await both(query, variables, name)
    assert known
    assert planned == ordinary


async def test_serial_mutation_fields_run_in_order_and_stop_at_a_non_null_failure() -> None:
    """A mutation's root fields run one after the other; a non-null field
    that raises nulls the data and the fields after it do not run."""
    schema = served()
    ops = HttpOps(schema)
    query = 'mutation { one: touch(id: "1") { count } bad: must(id: "boom") { success } ' \
            'two: touch(id: "2") { count } }'
    with ops.learning(query, None):
        await schema.execute(query)
    plan = ops.known(query, None)
    assert plan is not None
    LOG.clear()
    result = await ops.execute(plan, query, None, None)
    assert LOG == ["1:1", "must:boom"]
    assert result.data is None
    assert result.errors is not None and result.errors[0].path == ["bad"]


async def test_a_document_that_fails_validation_or_names_no_operation_stays_unknown() -> None:
    """Only a document that passed validation becomes known."""
    schema = served()
    ops = HttpOps(schema)
    for query, name in (("query { nope }", None), ("query A { item(id: 1) { id } }", "B"),
                        ("{ item(", None)):
        # The ordinary path's own refusal (an unknown operation raises).
        with ops.learning(query, name), contextlib.suppress(Exception):
            await schema.execute(query, operation_name=name)
        assert ops.known(query, name) is None
    assert ops.count == 0


def test_planned_roots_cover_plain_results_and_leave_resolvers_to_graphql() -> None:
    """A root field whose result has no resolver below it is rendered by
    plan; one selecting a resolver field, and every field of a document with
    directives, is completed by graphql-core."""
    gschema = SCHEMA._schema
    plan = plan_http_operation(gschema, parse(
        'query { a: item(id: "1") { id tags { name } } b: item(id: "1") { shout } }'), None)
    assert plan is not None and set(plan.renders) == {"a"}
    with_directive = plan_http_operation(gschema, parse(
        'query($s: Boolean!) { item(id: "1") { id @skip(if: $s) } }'), None)
    assert with_directive is not None and not with_directive.renders
    assert plan_http_operation(gschema, parse("query A { item(id: 1) { id } }"), "B") is None


async def test_a_schema_extension_acting_per_operation_keeps_the_ordinary_path() -> None:
    """HttpOps disabled learns nothing and knows nothing."""
    schema = served()
    ops = HttpOps(schema, enabled=False)
    query = 'query { item(id: "1") { id } }'
    with ops.learning(query, None):
        await schema.execute(query)
    assert ops.known(query, None) is None


def test_the_lru_is_bounded() -> None:
    """At most ``size`` documents are kept."""
    schema = served()
    ops = HttpOps(schema, size=2)

    async def learn(query: str) -> None:
        with ops.learning(query, None):
            await schema.execute(query)

    for i in range(4):
        asyncio.run(learn(f'query {{ item(id: "{i}") {{ id }} }}'))
    assert ops.count == 2
    assert ops.known('query { item(id: "3") { id } }', None) is not None
    assert ops.known('query { item(id: "0") { id } }', None) is None


async def test_a_document_past_the_text_bound_is_never_kept() -> None:
    """A document longer than MAX_KNOWN_DOCUMENT_CHARS stays ordinary."""
    schema = served()
    ops = HttpOps(schema)
    query = 'query { item(id: "1") { id } }' + " " * MAX_KNOWN_DOCUMENT_CHARS
    with ops.learning(query, None):
        await schema.execute(query)
    assert ops.known(query, None) is None


async def test_only_the_requests_own_document_is_learnt() -> None:
    """A GraphQL execution nested in the learning request's run (a resolver,
    or a task it spawned, executing another document) is not kept under the
    request's text: the known plan answers what the request asked."""
    schema = served()
    ops = HttpOps(schema)
    query = 'query { item(id: "1") { id title } }'

    async def nested() -> None:
        await schema.execute('mutation { touch(id: "9") { success } }')

    with ops.learning(query, None):
        first = await schema.execute(query)
        await asyncio.create_task(nested())
    plan = ops.known(query, None)
    assert plan is not None
    again = await ops.execute(plan, query, None, None)
    assert again.data == first.data
