"""The ledger slice's projector: the ledgers of the caller's org, live.

Rows load through the full-EDA store's ``read_many`` (a replay per key
through both hydration barriers: the render side replays exactly what the
write side does). A window lists the noun's keys with the kit's ``keys``,
scoped to the caller's org (the first part of every key).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import strawberry

from service_engine import CohortKey, Emission, PerImpact, Populate, Projector, Visibility
from service_engine.persistence import keys

from ...kernel import Affordance, Principal, affordance_list
from .domain import NOUN, Ledger, key_of

LEDGERS = "ledgers"

MAX_WINDOW = 500
_SCAN = 200


@strawberry.type(description="One posting, as the ledger keeps its latest ones.")
class LedgerEntryView:
    cents: int
    memo: str
    by: str


@strawberry.type(description="A ledger of the caller's org, with what they may do to it.")
class LedgerView:
    id: strawberry.ID = strawberry.field(description="``org/name``.")
    org: str
    name: str
    owner: str | None
    balance: int = strawberry.field(description="In cents.")
    postings: int
    closed: bool
    recent: list[LedgerEntryView] = strawberry.field(
        description="The latest postings, newest first."
    )
    affordances: list[Affordance]


@dataclass(frozen=True, slots=True)
class LedgersQuery:
    """The caller's org's ledgers, by key; ``limit`` per page."""

    limit: int = 100


class LedgerVisibility(Visibility[Ledger, Principal]):
    def cohorts(self, row: Ledger) -> Iterable[Hashable]:
        return (("org", row.org),)

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        if principal.org is not None:
            yield ("org", principal.org)


class LedgersView(Projector[Ledger, LedgerView, Principal, LedgersQuery]):
    NAME = LEDGERS
    NOUN = NOUN
    VISIBILITY = LedgerVisibility()

    async def populate(self, cx: Populate[Principal], query: LedgersQuery) -> Sequence[Any]:
        orgs = set(cx.cohort_values("org"))
        limit = min(query.limit, MAX_WINDOW)
        found: list[Any] = []
        # The kit lists every org's keys in one order; keep the caller's.
        after: Any = cx.cursor
        while len(found) < limit:
            batch = await keys(cx.conn, Ledger, after=after, limit=_SCAN)
            found.extend(key for key in batch if key_of(key)[0] in orgs)
            if len(batch) < _SCAN:
                break
            after = batch[-1]
        return found[:limit]

    def project(self, row: Ledger, principal: Principal) -> LedgerView:
        return LedgerView(
            id=strawberry.ID(f"{row.org}/{row.name}"), org=row.org, name=row.name,
            owner=row.owner, balance=row.balance, postings=row.postings, closed=row.closed,
            recent=[LedgerEntryView(cents=c, memo=m, by=b) for c, m, b in reversed(row.recent)],
            affordances=affordance_list(row, principal),
        )

    def cohort(self, principal: Principal) -> CohortKey:
        # Everyone of one org sees the same ledgers: one load per org.
        return CohortKey.of_parts("org", principal.org or "")

    def emission(self, impact: Any) -> Emission:
        return PerImpact


# Assigned outside the class body: a `FullEda` assigned in a class body binds
# itself to that class as its aggregate (``__set_name__``).
LedgersView.STORE = Ledger.Store
