"""A slice declared as data: its listed projectors derive their query and
live fields, its listed handlers their mutation fields and the kit's
result types; the derived fields join the slice's own and are claimed
like them."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import pytest
import strawberry

from service_engine import Aggregate, CrudStore, Mutation, Projector, TableWindow, Unrestricted
from service_engine.errors import ConfigError
from service_engine.graphql import (
    DuplicateSchemaMember,
    MutationResult,
    OrgMember,
    SliceFragment,
    compose_service,
)
from service_engine.graphql.declared import result_type


@dataclass
class Memo(Aggregate):
    id: str
    org: str
    text: str


Memo.Store = CrudStore.of(Memo, "memo")


@strawberry.type
class MemoView:
    id: strawberry.ID
    text: str


class MemosView(Projector[Memo, MemoView, OrgMember, None]):
    """The memos of the caller's org."""

    NAME = "org_memos"
    WINDOW = TableWindow("memo", cohort="org")

    def project(self, memo: Memo, member: OrgMember) -> MemoView:
        return MemoView(id=strawberry.ID(memo.id), text=memo.text)


@dataclass(frozen=True)
class MemoQuery:
    limit: int
    newest_first: bool = True


class PagedMemos(Projector[Memo, MemoView, OrgMember, MemoQuery]):
    NAME = "paged_memos"
    WINDOW = TableWindow("memo", cohort="org")

    def project(self, memo: Memo, member: OrgMember) -> MemoView:
        return MemoView(id=strawberry.ID(memo.id), text=memo.text)


class Keyed:
    """A query that is no dataclass: its fields cannot be derived."""


class KeyedMemos(Projector[Memo, MemoView, OrgMember, Keyed]):
    NAME = "keyed_memos"
    WINDOW = TableWindow("memo", cohort="org")

    def project(self, memo: Memo, member: OrgMember) -> MemoView:
        return MemoView(id=strawberry.ID(memo.id), text=memo.text)


@strawberry.type
class MemoSubscription:
    @strawberry.subscription
    async def paged_memos(self) -> AsyncGenerator[int, None]:
        yield 1


async def write_memo(cx: Mutation[OrgMember], text: str, pinned: bool = False) -> strawberry.ID:
    """Write a memo."""
    return strawberry.ID(text)


async def count_memos(cx: Mutation[OrgMember]) -> int:
    return 0


async def forget_memos(cx: Mutation[OrgMember], id: strawberry.ID) -> None:
    return None


@strawberry.type
class MemoMutation:
    @strawberry.mutation
    def touch_memo(self) -> bool:
        return True


def test_a_projector_listed_by_a_slice_derives_its_query_and_live_fields() -> None:
    """The projector's NAME names a query field of its view type and a live
    field over its union, described by its docstring; the slice owns the
    view type and the union's members."""
    fragment = SliceFragment("memo", projectors=[MemosView()])
    sdl = compose_service([fragment]).schema().as_str()
    assert "orgMemos: [MemoView!]!" in sdl
    assert "orgMemos: OrgMemosMessage!" in sdl
    assert '"""The memos of the caller\'s org."""' in sdl
    assert set(fragment.type_names()) >= {
        "MemoView", "OrgMemosReset", "OrgMemosUpsert", "OrgMemosRemove"}
    assert [v.projector for v in fragment.views] == ["org_memos"]


@strawberry.type
class PagedQuery:
    @strawberry.field
    def paged_memos(self) -> int:
        return 1


def test_a_dataclass_query_gives_the_fields_its_arguments() -> None:
    """A window taking a dataclass query derives fields whose arguments are
    its fields (their defaults kept)."""
    sdl = compose_service([SliceFragment("memo", projectors=[PagedMemos()])]).schema().as_str()
    assert "pagedMemos(limit: Int!, newestFirst: Boolean! = true): [MemoView!]!" in sdl
    assert "pagedMemos(limit: Int!, newestFirst: Boolean! = true): PagedMemosMessage!" in sdl


def test_a_field_the_slice_declares_itself_wins() -> None:
    """A derived field of a name the slice's own root declares is left out."""
    fragment = SliceFragment("memo", subscription=MemoSubscription, projectors=[PagedMemos()])
    sdl = compose_service([fragment]).schema().as_str()
    assert "pagedMemos: Int!" in sdl and "PagedMemosMessage!" not in sdl
    assert fragment.root_fields("subscription") == ("pagedMemos",)
    assert fragment.root_fields("query") == ("pagedMemos",)


def test_a_projector_whose_fields_are_all_the_slices_own_adds_no_type() -> None:
    """With both fields its own, the slice declares the union's types
    itself: the projector is only registered."""
    own = SliceFragment("memo", query=PagedQuery, subscription=MemoSubscription,
                        projectors=[PagedMemos()])
    assert own.types == () and own.views == ()


def test_a_projector_taking_another_query_is_registered_without_derived_fields() -> None:
    """A window taking a query that is no dataclass derives no field (the
    slice declares its own), but the projector is registered with the
    rest, in order."""
    registered: list[str] = []

    class Recorder:
        def register_projector(self, projector: Projector[Any, Any, Any, Any]) -> None:
            registered.append(type(projector).NAME)

    fragment = SliceFragment("memo", projectors=[KeyedMemos, MemosView()],
                             register=lambda engine: registered.append("register"))
    assert fragment.root_fields("query") == ("orgMemos",)
    compose_service([fragment]).register(Recorder())  # type: ignore[arg-type]
    assert registered == ["keyed_memos", "org_memos", "register"]


def test_a_handler_listed_by_a_slice_is_a_mutation_field() -> None:
    """Its name, its arguments after cx (their defaults kept), its
    docstring and the kit's result type of what it returns."""
    fragment = SliceFragment("memo", mutations=[write_memo, count_memos, forget_memos])
    sdl = compose_service([fragment]).schema().as_str()
    assert "writeMemo(text: String!, pinned: Boolean! = false): IdResult!" in sdl
    assert "countMemos: IntResult!" in sdl
    assert "forgetMemos(id: ID!): MutationResult!" in sdl
    assert '"""Write a memo."""' in sdl
    assert "type IdResult {\n  success: Boolean!\n  error: Refusal\n  id: ID\n}" in sdl


def test_derived_fields_join_the_slices_own_root_objects() -> None:
    """A slice's own mutation root and its derived fields are one root."""
    fragment = SliceFragment("memo", mutation=MemoMutation, mutations=[write_memo])
    assert set(fragment.root_fields("mutation")) == {"touchMemo", "writeMemo"}


def test_two_slices_deriving_one_field_are_refused() -> None:
    """Two slices listing projectors of one NAME claim one field."""
    with pytest.raises(DuplicateSchemaMember):
        compose_service([SliceFragment("a", projectors=[MemosView()]),
                         SliceFragment("b", projectors=[MemosView()])])


def test_the_result_type_carries_the_value_in_a_field_named_by_its_type() -> None:
    """An ID lands in ``id``, another scalar in ``value``, a Strawberry type
    in its snake-cased name; an optional return is its member's; None is
    the bare MutationResult; one type per returned type."""
    assert result_type(strawberry.ID)[1] == "id"
    assert result_type(strawberry.ID | None) == result_type(strawberry.ID)
    assert result_type(str)[1] == "value"
    built, into = result_type(MemoView)
    assert into == "memo_view" and built.__name__ == "MemoViewResult"
    assert issubclass(built, MutationResult)
    assert result_type(None) == (MutationResult, None)
    answered = built.of(MemoView(id=strawberry.ID("m1"), text="hi"), into)
    assert answered.success is True and answered.memo_view.text == "hi"  # type: ignore[attr-defined]


def test_a_handler_the_kit_cannot_serve_is_refused_by_name() -> None:
    """A return type it cannot answer, an unannotated argument, a
    function that is not async: ConfigError naming the handler."""

    async def listed(cx: Mutation[OrgMember]) -> list[str]:
        return []

    async def untyped(cx: Mutation[OrgMember], text):  # type: ignore[no-untyped-def]
        return None

    def blocking(cx: Mutation[OrgMember]) -> None:
        return None

    for handler in (listed, untyped, blocking):
        with pytest.raises(ConfigError, match=handler.__name__):
            SliceFragment("memo", mutations=[handler])


def test_an_unrestricted_projector_without_a_cohort_column_still_derives_fields() -> None:
    """Derivation reads the view type and the query type only: a projector
    declaring its own visibility is served the same way."""

    class Everyone(Projector[Memo, MemoView, OrgMember, None]):
        NAME = "all_memos"
        VISIBILITY = Unrestricted()
        WINDOW = TableWindow("memo")

        def project(self, memo: Memo, member: OrgMember) -> MemoView:
            return MemoView(id=strawberry.ID(memo.id), text=memo.text)

    assert SliceFragment("memo", projectors=[Everyone()]).root_fields("subscription") == (
        "allMemos",)


def test_what_a_slice_lists_is_registered_with_the_engine_in_order() -> None:
    """Projectors, mirrors, offers, reactions, commands, scopes and the
    erasure (under the slice's name), then ``register``; a string where a
    list belongs is refused."""
    calls: list[tuple[str, object]] = []

    class Recorder:
        def __getattr__(self, verb: str) -> Any:
            return lambda *args: calls.append((verb, args))

    mirror, offer, reaction, command, erasure = (object() for _ in range(5))
    fragment = SliceFragment(
        "memo", mirrors=[mirror], offers=[offer], reactions=[reaction], commands=[command],
        scopes=["memo:erase"], erasure=erasure, register=lambda e: calls.append(("own", ())),
    )
    compose_service([fragment]).register(Recorder())  # type: ignore[arg-type]
    assert calls == [
        ("register_mirror", (mirror,)), ("register_offer", (offer,)),
        ("register_reaction", (reaction,)), ("register_commands", (command,)),
        ("contribute_scopes", (["memo:erase"],)), ("register_erasable", ("memo", erasure)),
        ("own", ()),
    ]
    with pytest.raises(TypeError, match="scopes is a list"):
        SliceFragment("memo", scopes="memo:erase")
