"""Mirror declarations, shadows and merged values: pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from service_engine.errors import DeclarationError
from service_engine.mirrors import Known, KnownScope, Merged, Mirror, Shadow
from service_engine.mirrors.declaration import ShadowEntry
from service_engine.offers import Published


class PersonPublished(Published):
    BUCKET: ClassVar[str] = "PUBLISHED_unit"
    PREFIX: ClassVar[str] = "unit.person"
    id: str
    name: str


class BadgePublished(Published):
    BUCKET: ClassVar[str] = "PUBLISHED_unit"
    PREFIX: ClassVar[str] = "unit.badge"
    person: str
    badge: str


@dataclass
class KnownUnitPerson(Known):
    TABLE: ClassVar[str] = "known_unit_persons"
    id: str
    name: str


async def project(projection: Any, key: Any, merged: Merged) -> None:
    return None


def test_a_complete_mirror_validates() -> None:
    """A mirror consuming published types, keyed and projected, validates, with its lease slot and
    consumed types in order."""
    mirror = (
        Mirror("people").consume(PersonPublished).consume(BadgePublished)
        .keyed_by(lambda v: getattr(v, "id", None) or v.person).project(project)
    )
    mirror.validate()
    assert mirror.slot == "mirror:people"
    assert mirror.consumed[0] is PersonPublished and mirror.consumed[1] is BadgePublished


@pytest.mark.parametrize(
    ("mirror", "message"),
    [
        (Mirror("m").keyed_by(str).project(project), "consume at least one"),
        (Mirror("m").consume(PersonPublished).project(project), "keyed_by"),
        (Mirror("m").consume(PersonPublished).keyed_by(str), "project"),
    ],
)
def test_an_incomplete_mirror_is_refused(mirror: Mirror, message: str) -> None:
    """A mirror consuming nothing, or without keyed_by or project, is refused naming what is
    missing."""
    with pytest.raises(DeclarationError, match=message):
        mirror.validate()


def test_bad_declarations_are_refused_where_they_are_written() -> None:
    """A bad mirror name, a consumed type that is not Published, one consumed twice or without a
    PREFIX is refused where it is written."""
    with pytest.raises(DeclarationError):
        Mirror("bad name")
    with pytest.raises(DeclarationError, match="Published"):
        Mirror("m").consume(dict)  # type: ignore[arg-type]
    with pytest.raises(DeclarationError, match="twice"):
        Mirror("m").consume(PersonPublished).consume(PersonPublished)

    class NoPrefix(Published):
        BUCKET: ClassVar[str] = "b"

    with pytest.raises(DeclarationError, match="PREFIX"):
        Mirror("m").consume(NoPrefix)


def test_a_shadow_holds_typed_values_by_kv_key() -> None:
    """A shadow holds typed values by KV key, with their revisions."""
    shadow: Shadow[PersonPublished] = Shadow(PersonPublished)
    ann = PersonPublished(id="p1", name="Ann")
    shadow._set(ShadowEntry("unit.person.p1", 3, ann))
    assert shadow.get("unit.person.p1") == ann and len(shadow) == 1
    assert shadow.entry("unit.person.p1") == ShadowEntry("unit.person.p1", 3, ann)
    assert shadow.values() == [ann]
    assert shadow.get("unit.person.p2") is None


def test_merged_answers_by_published_type() -> None:
    """A merged value answers by published type, and is falsy when empty."""
    ann = PersonPublished(id="p1", name="Ann")
    merged = Merged({PersonPublished: ann})
    assert merged.get(PersonPublished) == ann
    assert merged.get(BadgePublished) is None
    assert merged and not Merged({})


def test_a_known_row_is_its_dataclass_fields_and_a_scope_its_selector() -> None:
    """A known row's columns are its dataclass fields and its noun known_<name>; a scope is a
    parameterised selector, and a column that is not an identifier is refused."""
    row = KnownUnitPerson(id="p1", name="Ann")
    assert row.columns() == {"id": "p1", "name": "Ann"}
    assert KnownUnitPerson.noun() == "known_unit_persons"
    sql, args = KnownScope.of(KnownUnitPerson, id="p1")._sql()
    assert (sql, args) == ('"id" = $1', ["p1"])
    assert KnownScope(KnownUnitPerson)._sql() == ("TRUE", [])
    with pytest.raises(DeclarationError):
        KnownScope.of(KnownUnitPerson, **{"id; drop": 1})._sql()
