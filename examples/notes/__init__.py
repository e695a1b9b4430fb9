"""The notes service of the tutorial (docs/tutorial/index.md): a table, a
mutation gated to a note's author, and a live view of the caller's org."""

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeAlias
from uuid import uuid4

import strawberry
from starlette.applications import Starlette

from service_engine import (
    Aggregate,
    CohortKey,
    CrudStore,
    Engine,
    Gate,
    Mutation,
    Projector,
    Query,
    TableWindow,
    Visibility,
    WindowSpec,
    gated,
    service_migrations,
)
from service_engine.graphql import (
    GraphQLContext,
    MutationResult,
    SliceFragment,
    Views,
    compose_service,
)
from service_engine.server import Passport, PassportRefused, graphql_app

MIGRATIONS = service_migrations(Path(__file__).parent / "migrations")


@dataclass(frozen=True)
class Principal:
    id: str
    org: str


def principal_of(passport: Passport) -> Principal:
    if passport.org is None:
        raise PassportRefused("a note belongs to an org: the passport names none")
    return Principal(passport.sub, passport.org)


@dataclass
class Note(Aggregate):
    id: str
    org: str
    author: str
    body: str
    Store: ClassVar["NoteStore"]

    @gated("edit")
    def can_edit(self, principal: Principal) -> Gate:
        if principal.id != self.author:
            return Gate.deny("note.not_author", "only its author edits a note")
        return Gate.allow()


class NoteStore(CrudStore[Note, str]):
    TABLE = "note"
    AGGREGATE = Note


Note.Store = NoteStore()


class SameOrg(Visibility[Note, Principal]):
    def cohorts(self, note: Note) -> Iterable[Hashable]:
        return (note.org,)

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        return (principal.org,)


@strawberry.type
class NoteView:
    id: strawberry.ID
    author: str
    body: str
    can_edit: bool


class NotesView(Projector[Note, NoteView, Principal, None]):
    NAME = "notes"
    NOUN = "note"
    STORE = Note.Store
    VISIBILITY = SameOrg()
    WINDOW = TableWindow("note", cohort="org")

    def cohort(self, principal: Principal) -> CohortKey:
        return CohortKey.of_parts(principal.org)

    def project(self, note: Note, principal: Principal) -> NoteView:
        return NoteView(id=strawberry.ID(note.id), author=note.author, body=note.body,
                        can_edit=note.can_edit(principal).allowed)


async def create_note(cx: Mutation[Principal], body: str) -> str:
    note = Note(uuid4().hex, cx.principal.org, cx.principal.id, body)
    await cx.create(note)
    return note.id


async def edit_note(cx: Mutation[Principal], note_id: str, body: str) -> str:
    note = await cx.load(Note, note_id)
    cx.require(note.can_edit)
    note.body = body
    await cx.save(note)
    return note.id


Info: TypeAlias = strawberry.Info[GraphQLContext[Principal], None]
NOTES = Views(NotesView.NAME, NoteView)


@strawberry.type
class NoteResult(MutationResult):
    id: strawberry.ID | None = None


@strawberry.type
class NotesMutation:
    @strawberry.mutation
    async def create_note(self, info: Info, body: str) -> NoteResult:
        return NoteResult.of(await info.context.execute(create_note, body), "id")

    @strawberry.mutation
    async def edit_note(self, info: Info, id: strawberry.ID, body: str) -> NoteResult:
        return NoteResult.of(await info.context.execute(edit_note, id, body), "id")


@strawberry.type
class NotesSubscription:
    @NOTES.field(description="The notes of the caller's org, live.")
    def notes(self) -> WindowSpec[None]:
        return WindowSpec(Query(None))


SLICE = SliceFragment(
    "notes", mutation=NotesMutation, subscription=NotesSubscription,
    types=(NoteView, NoteResult, *NOTES.types),
    register=lambda engine: engine.register_projector(NotesView()),
)
SERVICE = compose_service([SLICE])


def app(engine: Engine, *, passport_from_connection_params: bool = False) -> Starlette:
    """The notes slice registered with ``engine``, and its GraphQL app."""
    SERVICE.register(engine)
    return graphql_app(engine, SERVICE.schema(), principal_of,
                       passport_from_connection_params=passport_from_connection_params)
