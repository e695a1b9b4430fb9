"""The people of the caller's org, live, over the mirrored ``known_persons``.

A person's cohort is their org; a principal's is theirs. The mirror's
projection stages the impacts, so a person the twin publishes reaches every
subscriber of that org as an Upsert, a retracted one as a Remove.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import strawberry

from service_engine import Populate, Projector, Visibility

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


class OrgVisibility(Visibility[Person, Principal]):
    def cohorts(self, row: Person) -> Iterable[Hashable]:
        return (("org", row.org),)

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        if principal.org is not None:
            yield ("org", principal.org)


class PeopleView(Projector[Person, PersonView, Principal, PeopleQuery]):
    NAME = PEOPLE
    NOUN = NOUN
    STORE: ClassVar[Any] = Person.Store
    VISIBILITY = OrgVisibility()

    async def populate(self, cx: Populate[Principal], query: PeopleQuery) -> Sequence[Any]:
        orgs = [value for kind, value in (c for c in cx.cohorts or () if isinstance(c, tuple))
                if kind == "org"]
        rows = await cx.conn.fetch(
            "SELECT id FROM known_persons WHERE org = ANY($1)"
            " AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
            orgs, cx.cursor, min(query.limit, MAX_WINDOW),
        )
        return [row["id"] for row in rows]

    def project(self, row: Person, principal: Principal) -> PersonView:
        return PersonView(id=strawberry.ID(row.id), name=row.name, org=row.org)
