"""The card slice's projector: the cards of the caller's org, newest first,
live — with paging back through older cards behind the live window.

Populate lists the newest ``limit`` cards for the live head (no cursor) and
the ``limit`` cards older than a cursor for a page (``pageCards``), both by
``(created_at, id)`` descending.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import strawberry

from service_engine import CohortKey, Emission, PerImpact, Populate, Projector, Visibility

from ...kernel import Affordance, Principal, affordance_list
from .domain import NOUN, BadCursor, Card, encode_cursor

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


class CardVisibility(Visibility[Card, Principal]):
    def cohorts(self, row: Card) -> Iterable[Hashable]:
        return (("org", row.org),)

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        if principal.org is not None:
            yield ("org", principal.org)


def _place(cursor: object) -> tuple[str, str]:
    """The ``[created_at, id]`` a paging cursor carries (`decode_cursor`'s shape)."""
    match cursor:
        case [str() as created, str() as card_id]:
            return created, card_id
    raise BadCursor(f"not a card cursor place: {cursor!r}")


class CardsView(Projector[Card, CardView, Principal, CardsQuery]):
    NAME = CARDS
    NOUN = NOUN
    STORE: ClassVar[Any] = Card.Store
    VISIBILITY = CardVisibility()

    async def populate(self, cx: Populate[Principal], query: CardsQuery) -> Sequence[Any]:
        orgs = cx.cohort_values("org")
        limit = max(1, min(query.limit, MAX_WINDOW))
        if cx.cursor is None:
            rows = await cx.conn.fetch(
                "SELECT id FROM card WHERE org = ANY($1)"
                " ORDER BY created_at DESC, id DESC LIMIT $2",
                orgs, limit,
            )
        else:
            created, card_id = _place(cx.cursor)
            rows = await cx.conn.fetch(
                "SELECT id FROM card WHERE org = ANY($1)"
                " AND (created_at, id) < ($2::text::timestamptz, $3)"
                " ORDER BY created_at DESC, id DESC LIMIT $4",
                orgs, created, card_id, limit,
            )
        return [row["id"] for row in rows]

    def project(self, row: Card, principal: Principal) -> CardView:
        return CardView(
            id=strawberry.ID(row.id), org=row.org, title=row.title, stage=row.stage,
            revision=row.version, owner=row.owner, due_at=row.due_at, overdue=row.overdue,
            reviewed_by=row.reviewed_by, cursor=encode_cursor(row),
            affordances=affordance_list(row, principal),
        )

    def cohort(self, principal: Principal) -> CohortKey:
        # Everyone of one org sees the same cards: one load per org.
        return CohortKey.of_parts("org", principal.org or "")

    def emission(self, impact: Any) -> Emission:
        return PerImpact
