"""A projector declared by its window: ``NOUN`` from the window's table,
``STORE`` from the row type's ``Store``, ``VISIBILITY`` from the window's
cohort column matched to the principal's attribute of that name, and the
sessions grouped by that value; what is declared explicitly wins, and a
column the principal lacks is refused at registration."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from service_engine import Aggregate, CohortKey, CrudStore, Projector, TableWindow, Visibility
from service_engine.errors import InvalidProjector
from service_engine.graphql import OrgMember
from service_engine.render.projector import CohortColumn, check_projector, derive_declaration


@dataclass
class Note(Aggregate):
    id: str
    org: str
    team: str


Note.Store = CrudStore.of(Note, "note")

ALICE = OrgMember("alice", "acme")
BOB = OrgMember("bob", "acme")
GINA = OrgMember("gina", "globex")


class OrgNotes(Projector[Note, str, OrgMember, None]):
    NAME = "org_notes"
    WINDOW = TableWindow("note", cohort="org")

    def project(self, note: Note, member: OrgMember) -> str:
        return note.id


def test_the_window_and_row_type_declare_noun_store_and_visibility() -> None:
    """The noun is the table, the store the row type's, the visibility the
    cohort column's; the declaration passes the registration check."""
    assert OrgNotes.NOUN == "note"
    assert OrgNotes.STORE is Note.Store
    assert isinstance(OrgNotes.VISIBILITY, CohortColumn)
    check_projector(OrgNotes())


def test_a_member_sees_the_rows_of_its_org_only() -> None:
    """The one rule: the window filter, the visibility and the render gate agree."""
    projector, acme, globex = OrgNotes(), Note("n1", "acme", "t"), Note("n2", "globex", "t")
    assert projector.visible(acme, ALICE) and not projector.visible(globex, ALICE)
    gate = projector.render_gate(GINA)
    assert gate(globex) and not gate(acme)
    assert OrgNotes.VISIBILITY.window(ALICE) == frozenset({"acme"})


def test_the_sessions_of_one_org_share_a_cohort() -> None:
    """Alice and Bob (acme) load together; Gina (globex) apart."""
    projector = OrgNotes()
    assert projector.cohort(ALICE) == projector.cohort(BOB) != projector.cohort(GINA)


def test_a_narrowed_visible_keeps_one_cohort_per_principal() -> None:
    """A projector narrowing ``visible`` may show two members different
    rows: each is its own cohort."""

    class Mine(OrgNotes):
        NAME = "mine"

        def visible(self, row: Note, principal: OrgMember) -> bool:
            return super().visible(row, principal) and row.id == principal.id

    assert Mine().cohort(ALICE) == CohortKey.of_principal("alice") != Mine().cohort(BOB)


def test_a_kind_tags_the_cohorts_as_pairs() -> None:
    """With a ``kind`` the cohorts are ``(kind, value)``, as the window filters them."""

    @dataclass(frozen=True)
    class TeamMember:
        id: str
        team: str

    class TeamNotes(Projector[Note, str, TeamMember, None]):
        NAME = "team_notes"
        WINDOW = TableWindow("note", cohort="team", kind="team")

        def project(self, note: Note, member: TeamMember) -> str:
            return note.id

    visibility = TeamNotes.VISIBILITY
    assert visibility.window(TeamMember("a", "t1")) == frozenset({("team", "t1")})
    assert list(visibility.cohorts(Note("n1", "acme", "t1"))) == [("team", "t1")]
    check_projector(TeamNotes())


def test_what_is_declared_wins() -> None:
    """An explicit NOUN and VISIBILITY are kept."""

    class Everything(Visibility[Note, OrgMember]):
        def cohorts(self, row: Note) -> Iterable[Hashable]:
            return ("all",)

        def memberships(self, principal: OrgMember) -> Iterable[Hashable]:
            return ("all",)

    class Declared(OrgNotes):
        NAME = "declared"
        NOUN = "memo"
        VISIBILITY = Everything()

    assert Declared.NOUN == "memo" and isinstance(Declared.VISIBILITY, Everything)
    assert Declared().cohort(ALICE) == CohortKey.of_principal("alice")


def test_a_column_the_principal_lacks_is_refused_at_registration() -> None:
    """A cohort column that is no attribute of the principal type names both."""

    @dataclass(frozen=True)
    class Stranger:
        id: str

    class Wrong(Projector[Note, str, Stranger, None]):
        NAME = "wrong"
        WINDOW = TableWindow("note", cohort="org")

        def project(self, note: Note, principal: Stranger) -> str:
            return note.id

    with pytest.raises(InvalidProjector, match="'org' is no attribute of the principal type"):
        check_projector(Wrong())


def test_a_window_without_a_cohort_column_derives_no_visibility() -> None:
    """No permissive default: declare VISIBILITY (Unrestricted() for none)."""

    class Open(Projector[Note, str, OrgMember, None]):
        NAME = "open"
        WINDOW = TableWindow("note")

        def project(self, note: Note, member: OrgMember) -> str:
            return note.id

    with pytest.raises(InvalidProjector, match="VISIBILITY must be a Visibility"):
        check_projector(Open())


def test_a_store_named_after_the_projector_is_found_at_registration() -> None:
    """The row type's Store assigned after the projector class is derived
    when the projector is checked."""

    @dataclass
    class Late(Aggregate):
        id: str
        org: str

    class LateNotes(Projector[Late, str, OrgMember, None]):
        NAME = "late"
        WINDOW = TableWindow("late", cohort="org")

        def project(self, row: Late, member: OrgMember) -> str:
            return row.id

    assert getattr(LateNotes, "STORE", None) is None
    Late.Store = CrudStore.of(Late, "late")
    derive_declaration(LateNotes)
    check_projector(LateNotes())
    assert LateNotes.STORE is Late.Store


def test_crud_store_of_is_the_declared_store_in_one_line() -> None:
    """Named ``<Aggregate>Store`` in the aggregate's module (its lock key),
    its columns the dataclass's fields, its mapping the default one."""
    store: Any = Note.Store
    assert store.store_type == f"{__name__}.NoteStore"
    assert (store.TABLE, store.KEY, store.COLUMNS) == ("note", "id", ("id", "org", "team"))
    note = Note("n1", "acme", "t")
    assert store.from_row(store.to_row(note)) == note
    assert CrudStore.of(Note, "note", lock_rows=False).lock_rows is False
