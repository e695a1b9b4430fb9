"""The people of the caller's org, live, over the mirrored ``known_persons``.

A person's cohort is their org; a principal's is theirs. The mirror's
projection stages the impacts, so a person the twin publishes reaches every
subscriber of that org as an Upsert, a retracted one as a Remove.
"""

from __future__ import annotations

from dataclasses import dataclass

import strawberry

from service_engine import Projector, TableWindow

from ...kernel import Principal
from .domain import NOUN, Person

PEOPLE = "people"
MAX_WINDOW = 500


@strawberry.type(description="A person of the caller's org, as the twin's roster publishes it.")
class PersonView:
    id: strawberry.ID
    name: str
    org: str


@dataclass(frozen=True, slots=True)
class PeopleQuery:
    limit: int = 100


class PeopleView(Projector[Person, PersonView, Principal, PeopleQuery]):
    """The people of the caller's org (the twin's roster)."""

    NAME = PEOPLE
    NOUN = NOUN
    WINDOW = TableWindow("known_persons", cohort="org", kind="org", limit=MAX_WINDOW)

    def project(self, row: Person, principal: Principal) -> PersonView:
        return PersonView(id=strawberry.ID(row.id), name=row.name, org=row.org)
