"""The notes service of the tutorial (docs/tutorial/index.md): a table, a
mutation gated to a note's author, and a live view of the caller's org."""

from dataclasses import dataclass
from uuid import uuid4

import strawberry

from service_engine import Aggregate, CrudStore, Gate, Mutation, Projector, TableWindow, gated
from service_engine.graphql import SliceFragment, compose_service
from service_engine.server import OrgMember


@dataclass
class Note(Aggregate):
    id: str
    org: str
    author: str
    body: str

    @gated("edit")
    def can_edit(self, member: OrgMember) -> Gate:
        if member.id != self.author:
            return Gate.deny("note.not_author", "only its author edits a note")
        return Gate.allow()


Note.Store = CrudStore.of(Note, "note")


@strawberry.type
class NoteView:
    id: strawberry.ID
    author: str
    body: str
    can_edit: bool


class NotesView(Projector[Note, NoteView, OrgMember, None]):
    """The notes of the caller's org."""

    NAME = "notes"
    WINDOW = TableWindow("note", cohort="org")

    def project(self, note: Note, member: OrgMember) -> NoteView:
        return NoteView(id=strawberry.ID(note.id), author=note.author, body=note.body,
                        can_edit=note.can_edit(member).allowed)


async def create_note(cx: Mutation[OrgMember], body: str) -> strawberry.ID:
    """Write a note in the caller's org."""
    note = Note(uuid4().hex, cx.principal.org, cx.principal.id, body)
    await cx.create(note)
    return strawberry.ID(note.id)


async def edit_note(cx: Mutation[OrgMember], id: strawberry.ID, body: str) -> strawberry.ID:
    """Rewrite a note: its author only."""
    note = await cx.load(Note, id)
    cx.require(note.can_edit)
    note.body = body
    await cx.save(note)
    return id


SERVICE = compose_service([
    SliceFragment("notes", projectors=[NotesView()], mutations=[create_note, edit_note]),
])
