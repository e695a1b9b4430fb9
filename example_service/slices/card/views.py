"""The card slice's projector: the cards of the caller's org, newest first,
live — with paging back through older cards behind the live window.

Its window (`TableWindow`) lists the newest ``limit`` cards for the live
head (no cursor) and the ``limit`` cards older than a cursor for a page
(``pageCards``), both by ``(created_at, id)`` descending.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import strawberry

from service_engine import Emission, PerImpact, Projector, TableWindow

from ...kernel import Affordance, Principal, affordance_list
from .domain import Card, encode_cursor

CARDS = "cards"

MAX_WINDOW = 500


@strawberry.type(description="A card as the caller sees it, with what they may do to it.")
class CardView:
    id: strawberry.ID
    org: str
    title: str
    stage: str = strawberry.field(description="todo, doing or done.")
    revision: int = strawberry.field(
        description="How many times the card changed: the expectedRevision of its next "
                    "startCard / finishCard."
    )
    owner: str
    due_at: datetime | None
    overdue: bool
    reviewed_by: str | None
    cursor: str = strawberry.field(
        description="This card's place in the window: page back from it with pageCards."
    )
    affordances: list[Affordance]


@dataclass(frozen=True, slots=True)
class CardsQuery:
    """The caller's org's cards, newest first; ``limit`` per page."""

    limit: int = 50


class CardsView(Projector[Card, CardView, Principal, CardsQuery]):
    """The caller's org's cards, newest first (the principals of one org
    share one load); a page back starts after a cursor's ``[created_at, id]``."""

    NAME = CARDS
    WINDOW = TableWindow("card", cohort="org", kind="org", order=("created_at", "id"),
                         descending=True, limit=MAX_WINDOW)

    def project(self, row: Card, principal: Principal) -> CardView:
        return CardView(
            id=strawberry.ID(row.id), org=row.org, title=row.title, stage=row.stage,
            revision=row.version, owner=row.owner, due_at=row.due_at, overdue=row.overdue,
            reviewed_by=row.reviewed_by, cursor=encode_cursor(row),
            affordances=affordance_list(row, principal),
        )

    def emission(self, impact: Any) -> Emission:
        return PerImpact
