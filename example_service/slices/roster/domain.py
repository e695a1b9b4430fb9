"""The roster mirror: the twin's people into ``known_persons``.

`ROSTER` consumes `PersonPublished`, keyed by the person's id; the
projection writes a `KnownPerson` row (or removes it when the person was
retracted) and never any SQL of its own. `Person` reads the table for the
live view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from service_engine import Aggregate, CrudStore
from service_engine.mirrors import Known, KnownScope, Merged, Mirror, Projection

from .contract import PersonPublished

NOUN = "known_person"


@dataclass
class KnownPerson(Known):
    """A row of ``known_persons``, as the mirror writes it."""

    TABLE: ClassVar[str] = "known_persons"
    NOUN: ClassVar[str] = NOUN
    id: str
    name: str
    org: str


async def project_roster(projection: Projection, key: Any, merged: Merged) -> None:
    person = merged.get(PersonPublished)
    if person is None:
        await projection.remove(KnownScope.of(KnownPerson, id=key))
    else:
        await projection.replace_one(KnownPerson(id=person.id, name=person.name, org=person.org))


ROSTER = (
    Mirror("roster")
    .consume(PersonPublished)
    .keyed_by(lambda person: person.id)
    .project(project_roster)
)


@dataclass
class Person(Aggregate):
    """A known person as the live view reads it."""

    id: str
    name: str
    org: str


Person.Store = CrudStore.of(Person, "known_persons")
