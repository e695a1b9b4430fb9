"""compose_service: slices merged into one schema, and refused loud when
two slices claim a member or the schema holds a root field nobody declared."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest
import strawberry
from strawberry.schema.config import StrawberryConfig

from service_engine import Query, WindowSpec
from service_engine.errors import EngineError
from service_engine.graphql import (
    DuplicateSchemaMember,
    Live,
    SliceFragment,
    UndeclaredSchemaMember,
    compose_service,
    subscription_union,
)
from service_engine.graphql.compose import ENGINE_OWNER, PLACEHOLDER_QUERY_FIELD


@strawberry.type
class Board:
    id: str
    title: str


BOARDS = subscription_union("Boards", Board)


@strawberry.type
class BoardQuery:
    @strawberry.field
    def board_count(self) -> int:
        return 2


@strawberry.type
class BoardMutation:
    @strawberry.mutation
    def rename_board(self, title: str) -> str:
        return title


@strawberry.type
class BoardSubscription:
    @BOARDS.field
    def boards(self) -> Live:
        return Live("boards", WindowSpec(Query(None)))


@strawberry.type
class Invite:
    code: str


@strawberry.type
class InviteQuery:
    @strawberry.field
    def invite_count(self) -> int:
        return 1


def board_slice(register: Any = None) -> SliceFragment:
    return SliceFragment(
        "board", query=BoardQuery, mutation=BoardMutation, subscription=BoardSubscription,
        types=(Board, *BOARDS.types), register=register,
    )


def invite_slice(register: Any = None) -> SliceFragment:
    return SliceFragment("invite", query=InviteQuery, types=(Invite,), register=register)


def test_slices_merge_into_one_schema_and_register_in_order() -> None:
    """Slices merge into one schema (their fields, the engine's lane notices in each union, no
    placeholder) and register in the order given."""
    calls: list[tuple[str, object]] = []
    engine = object()
    service = compose_service([
        board_slice(lambda e: calls.append(("board", e))),
        invite_slice(lambda e: calls.append(("invite", e))),
    ])
    schema = service.schema()
    sdl = schema.as_str()
    assert "boardCount: Int!" in sdl and "inviteCount: Int!" in sdl
    assert "renameBoard(title: String!): String!" in sdl
    assert "union BoardsMessage = BoardsReset | BoardsUpsert | BoardsRemove | LanesPaused | LanesResumed" in sdl
    assert PLACEHOLDER_QUERY_FIELD not in sdl
    assert service.slice_names == ("board", "invite")
    assert service.declared_fields("query") == ("boardCount", "inviteCount")
    service.register(engine)  # type: ignore[arg-type]
    assert calls == [("board", engine), ("invite", engine)]
    result = schema.execute_sync("{ boardCount inviteCount }")
    assert result.errors is None and result.data == {"boardCount": 2, "inviteCount": 1}


def test_a_service_with_no_slice_has_the_engine_query_only() -> None:
    """A service with no slice has only the engine's query field, no mutation or subscription, and
    registers nothing."""
    service = compose_service([])
    schema = service.schema()
    assert service.mutation is None and service.subscription is None
    assert service.owners[f"query field {PLACEHOLDER_QUERY_FIELD}"] == ENGINE_OWNER
    result = schema.execute_sync("{ engineVersion }")
    assert result.errors is None and isinstance(result.data, dict)
    assert isinstance(result.data["engineVersion"], str)
    service.register(object())  # type: ignore[arg-type]  # nothing to register; no error


def test_removing_a_slice_removes_exactly_its_members() -> None:
    """Removing a slice removes exactly its fields and types from the schema."""
    full = compose_service([board_slice(), invite_slice()]).schema().as_str()
    without = compose_service([board_slice()]).schema().as_str()
    assert "inviteCount" in full and "inviteCount" not in without
    assert "type Invite " not in without
    assert "boardCount" in without


def _fragment(name: str, **roots: Any) -> SliceFragment:
    return SliceFragment(name, **roots)


def test_two_slices_claiming_one_query_field_are_refused() -> None:
    """Two slices declaring one query field are refused with DuplicateSchemaMember naming the kind,
    the field and both owners."""
    @strawberry.type
    class OtherQuery:
        @strawberry.field
        def board_count(self) -> int:
            return 3

    with pytest.raises(DuplicateSchemaMember) as refused:
        compose_service([board_slice(), _fragment("other", query=OtherQuery)])
    assert refused.value.kind == "query field"
    assert refused.value.member == "boardCount"
    assert refused.value.owners == ("board", "other")
    assert isinstance(refused.value, EngineError)


def test_one_graphql_name_from_two_python_names_is_refused() -> None:
    """Two Python names mapping to one GraphQL field name are refused."""
    @strawberry.type
    class Renamed:
        @strawberry.field(name="boardCount")
        def how_many_boards(self) -> int:
            return 3

    with pytest.raises(DuplicateSchemaMember, match="boardCount"):
        compose_service([board_slice(), _fragment("other", query=Renamed)])


def test_two_slices_claiming_one_mutation_or_subscription_field_are_refused() -> None:
    """Two slices declaring one mutation or one subscription field are refused, naming it."""
    @strawberry.type
    class OtherMutation:
        @strawberry.mutation
        def rename_board(self) -> str:
            return ""

    @strawberry.type
    class OtherSubscription:
        @strawberry.subscription
        async def boards(self) -> AsyncGenerator[int, None]:
            yield 1

    with pytest.raises(DuplicateSchemaMember) as mutation:
        compose_service([board_slice(), _fragment("other", mutation=OtherMutation)])
    assert (mutation.value.kind, mutation.value.member) == ("mutation field", "renameBoard")
    with pytest.raises(DuplicateSchemaMember) as subscription:
        compose_service([board_slice(), _fragment("other", subscription=OtherSubscription)])
    assert (subscription.value.kind, subscription.value.member) == ("subscription field", "boards")


def test_two_slices_declaring_one_type_are_refused() -> None:
    """Two slices declaring one GraphQL type name are refused, naming the type and both owners."""
    @strawberry.type(name="Board")
    class AnotherBoard:
        id: str

    with pytest.raises(DuplicateSchemaMember) as refused:
        compose_service([board_slice(), SliceFragment("other", types=(AnotherBoard,))])
    assert (refused.value.kind, refused.value.member) == ("type", "Board")
    assert refused.value.owners == ("board", "other")


def test_one_projector_union_in_two_slices_is_refused() -> None:
    """One projector's subscription union declared by two slices is refused."""
    again = subscription_union("Boards", Board)
    with pytest.raises(DuplicateSchemaMember) as refused:
        compose_service([board_slice(), SliceFragment("other", types=again.types)])
    assert refused.value.member == "BoardsReset"


def test_a_slice_may_not_declare_an_engine_type() -> None:
    """A slice declaring a type named as one of the engine's (LanesPaused, Refusal) is refused,
    naming the engine as owner."""
    for name in ("LanesPaused", "Refusal"):
        @strawberry.type(name=name)
        class Mine:
            lanes: list[str]

        with pytest.raises(DuplicateSchemaMember) as refused:
            compose_service([SliceFragment("mine", types=(Mine,))])
        assert (refused.value.member, refused.value.owners) == (name, (ENGINE_OWNER, "mine"))


def test_a_slice_listed_twice_is_refused() -> None:
    """A slice listed twice is refused."""
    with pytest.raises(DuplicateSchemaMember) as refused:
        compose_service([SliceFragment("board"), SliceFragment("board")])
    assert refused.value.kind == "slice"


def test_a_schema_with_an_undeclared_root_field_is_refused() -> None:
    """verify refuses a schema with a root field no slice declared, from the schema or its SDL; the
    composed schema passes."""
    service = compose_service([board_slice(), invite_slice()])

    @strawberry.type
    class HandBuiltQuery(BoardQuery, InviteQuery):
        @strawberry.field
        def backdoor(self) -> str:
            return "everything"

    schema = strawberry.Schema(
        query=HandBuiltQuery, mutation=service.mutation, subscription=service.subscription
    )
    with pytest.raises(UndeclaredSchemaMember) as refused:
        service.verify(schema)
    assert refused.value.root == "query"
    assert refused.value.fields == ("backdoor",)
    assert isinstance(refused.value, EngineError)
    # The same check over the SDL text alone.
    with pytest.raises(UndeclaredSchemaMember, match="backdoor"):
        service.verify_sdl(schema.as_str())
    service.verify(service.schema())  # the composed schema itself passes


def test_an_undeclared_mutation_field_is_refused() -> None:
    """verify refuses an undeclared mutation field, naming it."""
    service = compose_service([invite_slice()])

    @strawberry.type
    class Sneaky:
        @strawberry.mutation
        def drop_everything(self) -> bool:
            return True

    schema = strawberry.Schema(query=service.query, mutation=Sneaky)
    with pytest.raises(UndeclaredSchemaMember) as refused:
        service.verify(schema)
    assert refused.value.root == "mutation" and refused.value.fields == ("dropEverything",)


def test_verification_follows_the_schema_naming_config() -> None:
    """The composed schema follows the naming config it is built with (snake case without auto camel
    case)."""
    service = compose_service([board_slice()])
    schema = service.schema(config=StrawberryConfig(auto_camel_case=False))
    assert "board_count: Int!" in schema.as_str()


def test_fragments_refuse_what_is_not_a_strawberry_type() -> None:
    """A fragment refuses a root or type that is not a Strawberry type, a bad slice name, and
    composition refuses anything but fragments."""
    class Plain:
        pass

    with pytest.raises(TypeError, match="not a Strawberry type"):
        SliceFragment("bad", query=Plain)
    with pytest.raises(TypeError, match="not a named GraphQL type"):
        SliceFragment("bad", types=(Plain,))
    with pytest.raises(ValueError, match="slice name"):
        SliceFragment("Bad Name")
    with pytest.raises(TypeError, match="SliceFragments"):
        compose_service([BoardQuery])  # type: ignore[list-item]
