"""The render battery's sample service: cards in orgs.

`CardsView` renders the plain ``sample_card`` table under an org-cohort
`Visibility`; `OrgCardsRls` renders ``sample_org_card`` under Postgres RLS.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from service_engine.db.types import Conn
from service_engine.impacts import Impact, JsonValue
from service_engine.impacts.transport import stage_in
from service_engine.persistence.crud import CrudStore
from service_engine.render.cohort import CohortKey
from service_engine.render.projector import Populate, Projector, Unrestricted, Visibility


@dataclass(frozen=True)
class Principal:
    id: str
    orgs: frozenset[str] = field(default_factory=frozenset)


@dataclass
class Card:
    id: str
    org: str
    rank: int
    title: str = ""

    def pending_events(self) -> Sequence[Any]:
        return ()


class CardStore(CrudStore[Card, str]):
    TABLE = "sample_card"
    KEY = "id"
    COLUMNS: ClassVar[tuple[str, ...]] = ("id", "org", "rank", "title")

    def to_row(self, card: Card) -> Mapping[str, object]:
        return {"id": card.id, "org": card.org, "rank": card.rank, "title": card.title}

    def from_row(self, row: Mapping[str, Any]) -> Card:
        return Card(row["id"], row["org"], row["rank"], row["title"])


class OrgCardStore(CardStore):
    TABLE = "sample_org_card"
    COLUMNS: ClassVar[tuple[str, ...]] = ("id", "org", "title")

    def to_row(self, card: Card) -> Mapping[str, object]:
        return {"id": card.id, "org": card.org, "title": card.title}

    def from_row(self, row: Mapping[str, Any]) -> Card:
        return Card(row["id"], row["org"], 0, row["title"])


class OrgVisibility(Visibility[Card, Principal]):
    def cohorts(self, row: Card) -> Iterable[Hashable]:
        return (row.org,)

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        return principal.orgs


@dataclass(frozen=True)
class RankQuery:
    """Cards by rank, highest first; ``limit`` per page, older pages below
    the cursor's rank."""

    limit: int = 100


CARDS = CardStore()


class CardsView(Projector[Card, tuple[str, int, str], Principal, RankQuery]):
    NAME = "cards"
    NOUN = "card"
    STORE: ClassVar[Any] = CARDS
    VISIBILITY = OrgVisibility()

    async def populate(self, cx: Populate[Principal], query: RankQuery) -> Sequence[JsonValue]:
        cohorts = sorted(str(c) for c in (cx.cohorts or ()))
        if cx.cursor is None:
            rows = await cx.conn.fetch(
                "SELECT id FROM sample_card WHERE org = ANY($1) ORDER BY rank DESC, id LIMIT $2",
                cohorts, query.limit,
            )
        else:
            rows = await cx.conn.fetch(
                "SELECT id FROM sample_card WHERE org = ANY($1) AND rank < $2"
                " ORDER BY rank DESC, id LIMIT $3",
                cohorts, cx.cursor, query.limit,
            )
        return [r["id"] for r in rows]

    def project(self, row: Card, principal: Principal) -> tuple[str, int, str]:
        return (row.org, row.rank, row.title)

    def cohort(self, principal: Principal) -> CohortKey:
        return CohortKey.of_parts(*sorted(principal.orgs))


class OrgCardsRls(Projector[Card, str, Principal, None]):
    NAME = "org_cards_rls"
    NOUN = "org_card"
    STORE: ClassVar[Any] = OrgCardStore()
    VISIBILITY = Unrestricted()
    RLS = True

    async def populate(self, cx: Populate[Principal], query: None) -> Sequence[JsonValue]:
        rows = await cx.conn.fetch("SELECT id FROM sample_org_card ORDER BY id")
        return [r["id"] for r in rows]

    def project(self, row: Card, principal: Principal) -> str:
        return row.title


class OrgApplier:
    """Sets the RLS org context for a principal with exactly one org."""

    async def apply(self, conn: Conn, principal: Principal) -> None:
        (org,) = principal.orgs
        await conn.execute("SELECT set_config('app.current_org_id', $1, true)", org)


async def write_card(conn: Conn, card: Card, *, table: str = "sample_card") -> None:
    """Upsert ``card`` and stage its impact, in one transaction."""
    async with conn.transaction():
        if table == "sample_card":
            await conn.execute(
                "INSERT INTO sample_card (id, org, rank, title) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (id) DO UPDATE SET org = $2, rank = $3, title = $4",
                card.id, card.org, card.rank, card.title,
            )
            await stage_in(conn, [Impact.entity("card", card.id)])
        else:
            await conn.execute("SELECT set_config('app.current_org_id', $1, true)", card.org)
            await conn.execute(
                "INSERT INTO sample_org_card (id, org, title) VALUES ($1, $2, $3)"
                " ON CONFLICT (id) DO UPDATE SET org = $2, title = $3",
                card.id, card.org, card.title,
            )
            await stage_in(conn, [Impact.entity("org_card", card.id)])


async def delete_card(conn: Conn, card_id: str) -> None:
    async with conn.transaction():
        await conn.execute("DELETE FROM sample_card WHERE id = $1", card_id)
        await stage_in(conn, [Impact.entity("card", card_id)])
