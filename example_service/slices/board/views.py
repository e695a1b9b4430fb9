"""The board slice's two read regimes, on two sources.

* `BoardsView` renders the plain ``board`` table under a cohort
  `Visibility`: a board's cohorts are its org and itself, a principal's
  their org and the boards they joined. The table carries no RLS, so the
  projector sees every candidate and a membership can grant a cross-org
  person a board a fail-closed org policy would hide.
* `OrgBoardsRls` renders the ``org_board`` projection under Postgres RLS:
  every read (populate, snapshot, render pass, repair, fetch) runs under
  `OrgContext`, and without an org the projection answers no rows at all.

The render regime is the projector's (``RLS``), never the table's.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import strawberry

from service_engine import (
    Emission,
    Impact,
    PerImpact,
    Populate,
    Projector,
    TableWindow,
    Unrestricted,
    Visibility,
)

from ...kernel import Affordance, Principal, affordance_list
from .domain import BOARD_MEMBERSHIPS, NOUN, Board, OrgBoard, enter_org

BOARDS = "boards"
ORG_BOARDS = "org_boards_rls"

MAX_WINDOW = 500


@strawberry.type(description="A board as the caller sees it, with what they may do to it.")
class BoardView:
    id: strawberry.ID
    org: str
    title: str
    owner: str
    archived: bool
    member: bool = strawberry.field(
        description="The caller sees it through an invite (not as a person of its org)."
    )
    affordances: list[Affordance]


@strawberry.type(description="A board of the caller's org, read under Postgres RLS.")
class OrgBoardView:
    id: strawberry.ID
    org: str
    title: str
    archived: bool


@dataclass(frozen=True, slots=True)
class BoardsQuery:
    """The boards the caller sees, by id; ``limit`` per page."""

    limit: int = 100


class BoardVisibility(Visibility[Board, Principal]):
    def cohorts(self, row: Board) -> Iterable[Hashable]:
        return (("org", row.org), ("board", row.id))

    def memberships(self, principal: Principal) -> Iterable[Hashable]:
        if principal.org is not None:
            yield ("org", principal.org)
        for board_id in principal.fact(BOARD_MEMBERSHIPS):
            yield ("board", board_id)


class BoardsView(Projector[Board, BoardView, Principal, BoardsQuery]):
    NAME = BOARDS
    NOUN = NOUN
    VISIBILITY = BoardVisibility()

    async def populate(self, cx: Populate[Principal], query: BoardsQuery) -> Sequence[Any]:
        orgs, boards = cx.cohort_values("org"), cx.cohort_values("board")
        rows = await cx.conn.fetch(
            "SELECT id FROM board WHERE (org = ANY($1) OR id = ANY($2))"
            " AND ($3::text IS NULL OR id > $3) ORDER BY id LIMIT $4",
            orgs, boards, cx.cursor, min(query.limit, MAX_WINDOW),
        )
        return [row["id"] for row in rows]

    async def populate_many(
        self, windows: Sequence[tuple[Populate[Principal], BoardsQuery]]
    ) -> list[list[Any]]:
        # A reconnect burst's windows in one statement: each window's org
        # and board ids, then `populate`'s query per window (its arrays
        # gathered from the flat lists by the window's number). A page
        # after a cursor is `populate`'s own.
        if any(cx.cursor is not None for cx, _ in windows):
            return [list(await self.populate(cx, query)) for cx, query in windows]
        orgs: list[str] = []
        org_of: list[int] = []
        boards: list[str] = []
        board_of: list[int] = []
        for n, (cx, _query) in enumerate(windows):
            found = cx.cohort_values("org")
            orgs += found
            org_of += [n] * len(found)
            found = cx.cohort_values("board")
            boards += found
            board_of += [n] * len(found)
        rows = await windows[0][0].conn.fetch(
            "SELECT w.n, k.id FROM unnest($1::int[], $2::int[]) AS w(n, lim)"
            " CROSS JOIN LATERAL (SELECT"
            "  ARRAY(SELECT o.v FROM unnest($3::text[], $4::int[]) AS o(v, n) WHERE o.n = w.n)"
            "  AS orgs,"
            "  ARRAY(SELECT b.v FROM unnest($5::text[], $6::int[]) AS b(v, n) WHERE b.n = w.n)"
            "  AS boards) AS a"
            " CROSS JOIN LATERAL (SELECT id FROM board WHERE (org = ANY(a.orgs)"
            "  OR id = ANY(a.boards)) ORDER BY id LIMIT w.lim) AS k"
            " ORDER BY w.n, k.id",
            list(range(len(windows))),
            [min(query.limit, MAX_WINDOW) for _, query in windows],
            orgs, org_of, boards, board_of,
        ) if windows else []
        lists: list[list[Any]] = [[] for _ in windows]
        for row in rows:
            lists[row["n"]].append(row["id"])
        return lists

    def project(self, row: Board, principal: Principal) -> BoardView:
        return BoardView(
            id=strawberry.ID(row.id), org=row.org, title=row.title, owner=row.owner,
            archived=row.archived, member=not row.in_org(principal),
            affordances=affordance_list(row, principal),
        )

    def view_key(self, principal: Principal) -> Hashable:
        # The view and its gates read the org, the roles and the invites only.
        return (principal.org, principal.roles, principal.fact(BOARD_MEMBERSHIPS))

    def emission(self, impact: Impact) -> Emission:
        # Every caused change reaches the subscriber with its cause.
        return PerImpact


class OrgBoardsRls(Projector[OrgBoard, OrgBoardView, Principal, None]):
    NAME = ORG_BOARDS
    # No cohort filter: the policy on org_board scopes the rows to the
    # applied context, and is the gate.
    WINDOW = TableWindow("org_board", limit=MAX_WINDOW)
    VISIBILITY = Unrestricted()
    RLS = True

    def project(self, row: OrgBoard, principal: Principal) -> OrgBoardView:
        return OrgBoardView(
            id=strawberry.ID(row.id), org=row.org, title=row.title, archived=row.archived
        )


class OrgContext:
    """The `RlsApplier` of `OrgBoardsRls`: the principal's org, or none."""

    async def apply(self, conn: Any, principal: Principal) -> None:
        await enter_org(conn, principal.org)


ORG_CONTEXT = OrgContext()
