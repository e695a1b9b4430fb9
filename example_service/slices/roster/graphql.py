"""The roster slice's root fields: the people of the caller's org, read and live."""

from __future__ import annotations

import strawberry

from service_engine import Query, WindowSpec
from service_engine.graphql import Views

from ...kernel import Info
from .views import PEOPLE, PeopleQuery, PersonView

PEOPLE_VIEWS = Views(PEOPLE, PersonView, description="the caller's org's people")


@strawberry.type
class RosterQuery:
    @strawberry.field(description="The people of the caller's org (the twin's roster).")
    async def people(self, info: Info, limit: int = 100) -> list[PersonView]:
        return await PEOPLE_VIEWS.window(info.context, PeopleQuery(limit))


@strawberry.type
class RosterSubscription:
    @PEOPLE_VIEWS.field(description="The people of the caller's org, live.")
    def people(self, limit: int = 100) -> WindowSpec[PeopleQuery]:
        return WindowSpec(Query(PeopleQuery(limit)))


TYPES = (PersonView, *PEOPLE_VIEWS.types)
