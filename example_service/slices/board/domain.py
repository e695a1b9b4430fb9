"""The board aggregate (direct CRUD), its gates, and the rows it keeps.

A board belongs to one org. People of that org see and edit it; a person
of another org sees and edits it once they accepted an invite onto it (the
`BOARD_MEMBERSHIPS` principal fact). Archiving needs the `BOARD_ARCHIVE`
scope, and so does deleting an archived board. Each gate is declared once
with `gated`: the view's affordances and the mutation's deny check are the
same function.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service_engine import Aggregate, CrudStore, Database, Gate, Reason, gated

from ...kernel import Principal

BOARD_ARCHIVE = "board:archive"
"""The scope (a passport role) archiving and unarchiving need."""

BOARD_MEMBERSHIPS = "board_memberships"
"""The principal fact: the boards a person was invited onto, across orgs."""

NOUN = "board"
ORG_NOUN = "org_board"

FORBIDDEN = Reason("board.forbidden", "this board is not yours to change")
ARCHIVED = Reason("board.archived", "the board is archived")
NOT_ARCHIVED = Reason("board.not_archived", "the board is not archived")
ARCHIVE_SCOPE = Reason("board.archive_scope_required", f"archiving needs {BOARD_ARCHIVE}")
ORG_ONLY = Reason("board.org_only", "only people of the board's org may do this")
NO_ORG = Reason("board.no_org", "a board is created in the caller's org; the passport has none")
BAD_TITLE = Reason("board.title_invalid", "a title is 1 to 200 characters")
INVITE_UNKNOWN = Reason("invite.unknown", "no such invite")
INVITE_SPENT = Reason("invite.spent", "the invite was already redeemed")

MAX_TITLE = 200


def valid_title(title: str) -> bool:
    return 1 <= len(title.strip()) <= MAX_TITLE


@dataclass
class Board(Aggregate):
    id: str
    org: str
    title: str
    owner: str
    archived: bool = False

    # -- who -----------------------------------------------------------------

    def in_org(self, principal: Principal) -> bool:
        return principal.org == self.org

    def has_member(self, principal: Principal) -> bool:
        return self.id in principal.fact(BOARD_MEMBERSHIPS)

    def visible_to(self, principal: Principal) -> bool:
        return self.in_org(principal) or self.has_member(principal)

    # -- gates (== affordances) -----------------------------------------------

    @gated("rename")
    def can_rename(self, principal: Principal) -> Gate:
        if not self.visible_to(principal):
            return Gate.deny(FORBIDDEN)
        if self.archived:
            return Gate.deny(ARCHIVED)
        return Gate.allow()

    def _archive_scope(self, principal: Principal) -> Gate:
        """Who may archive or unarchive at all: an org member with the scope."""
        if not self.visible_to(principal):
            return Gate.deny(FORBIDDEN)
        if not self.in_org(principal):
            return Gate.deny(ORG_ONLY)
        if not principal.has_role(BOARD_ARCHIVE):
            return Gate.deny(ARCHIVE_SCOPE)
        return Gate.allow()

    @gated("archive")
    def can_archive(self, principal: Principal) -> Gate:
        scope = self._archive_scope(principal)
        if not scope.allowed:
            return scope
        return Gate.deny(ARCHIVED) if self.archived else Gate.allow()

    @gated("unarchive")
    def can_unarchive(self, principal: Principal) -> Gate:
        scope = self._archive_scope(principal)
        if not scope.allowed:
            return scope
        return Gate.allow() if self.archived else Gate.deny(NOT_ARCHIVED)

    @gated("delete")
    def can_delete(self, principal: Principal) -> Gate:
        """An archived board, by who may unarchive it: the delete takes its
        memberships and invites with it (the declared cascade)."""
        scope = self._archive_scope(principal)
        if not scope.allowed:
            return scope
        return Gate.allow() if self.archived else Gate.deny(NOT_ARCHIVED)

    @gated("invite")
    def can_invite(self, principal: Principal) -> Gate:
        if not self.visible_to(principal):
            return Gate.deny(FORBIDDEN)
        if not self.in_org(principal):
            return Gate.deny(ORG_ONLY)
        if self.archived:
            return Gate.deny(ARCHIVED)
        return Gate.allow()

    # -- domain commands ------------------------------------------------------

    def rename(self, title: str) -> None:
        self.title = title.strip()

    def set_archived(self, archived: bool) -> None:
        self.archived = archived


Board.Store = CrudStore.of(Board, "board")


# -- the RLS projection ---------------------------------------------------------


@dataclass
class OrgBoard(Aggregate):
    """The ``org_board`` projection of a board, readable only in its org's context."""

    id: str
    org: str
    title: str
    archived: bool = False

    @classmethod
    def of(cls, board: Board) -> OrgBoard:
        return cls(board.id, board.org, board.title, board.archived)


ORG_SETTING = "app.current_org_id"
"""The transaction-local setting ``org_board``'s row-level security policy reads."""


async def enter_org(conn: Any, org: str | None) -> None:
    """Set the transaction's RLS org context (``''``: none, so nothing is visible)."""
    await conn.execute("SELECT set_config($1, $2, true)", ORG_SETTING, org or "")


class OrgBoardStore(CrudStore[OrgBoard, str]):
    """``org_board`` is under FORCE ROW LEVEL SECURITY for writes as well as
    reads: every write enters the row's org first (a transaction-local
    setting the pipeline sets in the write's own round trip, gone at commit)."""

    TABLE = "org_board"
    AGGREGATE = OrgBoard

    def settings(self, aggregate: OrgBoard) -> Mapping[str, str]:
        return {ORG_SETTING: aggregate.org or ""}


OrgBoard.Store = OrgBoardStore()


# -- memberships and invites ----------------------------------------------------------


@dataclass
class BoardMember(Aggregate):
    board_id: str
    person: str

    @property
    def id(self) -> str:
        return member_id(self.board_id, self.person)


def member_id(board_id: str, person: str) -> str:
    return f"{board_id}/{person}"


class BoardMemberStore(CrudStore[BoardMember, str]):
    """Keyed by the member's derived ``id`` (``board/person``), a column
    the aggregate computes rather than holds."""

    TABLE = "board_member"
    AGGREGATE = BoardMember
    COLUMNS = ("id", "board_id", "person")

    def from_row(self, row: Mapping[str, Any]) -> BoardMember:
        return BoardMember(row["board_id"], row["person"])


BoardMember.Store = BoardMemberStore()


@dataclass
class Invite(Aggregate):
    """An invite onto a board; the store keeps only the secret's hash."""

    token_hash: str
    board_id: str
    created_by: str
    redeemed_by: str | None = None

    @staticmethod
    def hash_of(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()


Invite.Store = CrudStore.of(Invite, "board_invite", key="token_hash")


async def with_memberships(db: Database, principals: list[Principal]) -> list[Principal]:
    """Each of ``principals`` with its `BOARD_MEMBERSHIPS` fact: the boards
    they joined (registered ``many``: one read for every principal resolved
    in one loop turn)."""
    # One autocommit read that leaves no session state: released without
    # the pool's reset round trip.
    rows = await db.fetch(
        "SELECT person, board_id FROM board_member WHERE person = ANY($1::text[])",
        [principal.id for principal in principals],
    )
    joined: dict[str, list[str]] = {}
    for row in rows:
        joined.setdefault(row["person"], []).append(row["board_id"])
    return [principal.with_fact(BOARD_MEMBERSHIPS, joined.get(principal.id, ()))
            for principal in principals]
