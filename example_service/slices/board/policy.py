"""The board's declared commands (the command layer, `service_engine.commands`):
a title unique per org, and a delete under a declared policy.

* `BOARD` keeps ``by_title`` (org, title) unique by an occupancy row the
  create and every rename claim in their own commit: two boards of one org
  never share a title, whatever the interleaving (``TitleTaken``, answered
  as ``board.title_taken``). Boards are one partition (the route is the
  fixed scope, so a cross-org member's board is reachable by id) whose
  writers contend only on the board id.
* A board is deleted under ``cascade``: its memberships and invites go with
  it in the same commit, at most `MAX_MEMBERS` and `MAX_INVITES` of them (one
  bounded hop); a board with more of either answers ``TooManyAttached`` and
  keeps everything. The delete needs the ``delete`` permit (an archived
  board, by an org member with the archive scope). Its ``org_board`` projection row
  goes with the board row (its foreign key), its offer is retracted.

The handlers in `commands` run these inside their own transaction
(`run_in`), next to the ``org_board`` projection they keep, and answer a
declared outcome as a `MutationError` with a stable code: ``TitleTaken`` is
``board.title_taken``, ``BoardExists`` ``board.board_exists``,
``TooManyAttached`` ``board.too_many_attached``, ``BoardMissing``
``not_found``; a refusal keeps its reason code.

Who may rename or delete is declared as a `Permit` over the board row and
the principal's facts (its org, its board memberships, its roles), so the
commands compile into the database: each says what the board's gate of the
same action says (`Board.can_rename`, `Board.can_delete`, the view's
affordances), rule for rule and reason for reason.
"""

from __future__ import annotations

from service_engine.commands import (
    Cascade,
    CascadeEdge,
    Catalog,
    Caused,
    Command,
    Const,
    Contains,
    Create,
    Delete,
    Entity,
    Eq,
    Fact,
    Field,
    Input,
    Mutate,
    NoInbound,
    Not,
    Outcome,
    Permit,
    Relationship,
    Return,
    ReverseIndex,
    Set,
    Unique,
    Unless,
    Var,
)

from .domain import (
    ARCHIVE_SCOPE,
    ARCHIVED,
    BOARD_ARCHIVE,
    BOARD_MEMBERSHIPS,
    FORBIDDEN,
    NOT_ARCHIVED,
    NOUN,
    ORG_NOUN,
    ORG_ONLY,
    Board,
    BoardMember,
    Invite,
)

__all__ = [
    "BOARD",
    "CATALOG",
    "COMMANDS",
    "CREATE_BOARD",
    "DELETE_BOARD",
    "MAX_INVITES",
    "MAX_MEMBERS",
    "REASONS",
    "RENAME_BOARD",
]

MAX_MEMBERS = 100
MAX_INVITES = 100

BOARD = Entity(
    "Board", Board, key=("id",), conflict_key=("id",),
    unique=(Unique("by_title", ("org", "title")),),
    delete_policy=Cascade((
        CascadeEdge("BoardMember", "board", "by_board", MAX_MEMBERS),
        CascadeEdge("Invite", "board", "by_board", MAX_INVITES),
    )),
    nouns=(NOUN, ORG_NOUN),
)
MEMBER = Entity(
    "BoardMember", BoardMember, key=("id",),
    relationships=(Relationship("board", "Board", ("board_id",)),),
    indexes=(ReverseIndex("by_board", ("board_id",), table="board_member"),),
    delete_policy=NoInbound(),
)
INVITE = Entity(
    "Invite", Invite, key=("token_hash",),
    relationships=(Relationship("board", "Board", ("board_id",)),),
    indexes=(ReverseIndex("by_board", ("board_id",), table="board_invite"),),
    delete_policy=NoInbound(),
)
CATALOG = Catalog([BOARD, MEMBER, INVITE], facts={
    "org": str, "id": str, BOARD_MEMBERSHIPS: frozenset[str], "roles": frozenset[str],
})
"""The principal facts the board's commands read: the caller's org (the
create handler refuses a caller without one before it runs; for another
command a missing org makes a condition comparing it not true), id, the
boards they joined (`BOARD_MEMBERSHIPS`) and their roles."""

REASONS = {r.code: r for r in (FORBIDDEN, ARCHIVED, ORG_ONLY, ARCHIVE_SCOPE, NOT_ARCHIVED)}
"""The reasons the board's permits refuse with, by code (a refusal answers
the reason's own message, as the gate of the same action does)."""

IN_ORG = Eq(Field("board", "org"), Fact("org"))
VISIBLE = Unless(FORBIDDEN, IN_ORG, Contains(Fact(BOARD_MEMBERSHIPS), Field("board", "id")))
"""`Board.visible_to`: a person of the board's org, or a member of it."""

CREATE_BOARD = CATALOG.command(Command(
    "CreateBoard",
    Input("board_id", str), Input("title", str),
    Create("Board", (Var("board_id"),), as_="board", else_=Outcome("BoardExists"),
           taken={"by_title": Outcome("TitleTaken")}),
    Set("board", "org", Fact("org")),
    Set("board", "title", Var("title")),
    Set("board", "owner", Fact("id")),
    Set("board", "archived", Const(False)),
    Caused("board", NOUN, "board.created",
           {"board": Var("board_id"), "by": Fact("id"), "title": Var("title")}),
    Return("Created"),
))
RENAME_BOARD = CATALOG.command(Command(
    "RenameBoard",
    Input("board_id", str), Input("title", str),
    Mutate("Board", (Var("board_id"),), as_="board", else_=Outcome("BoardMissing"),
           taken={"by_title": Outcome("TitleTaken")}),
    Permit("rename", VISIBLE, Unless(ARCHIVED, Not(Field("board", "archived")))),
    # A rename replaces the title (its permit judged the row, the title's
    # uniqueness is claimed in the same commit): a deliberate overwrite.
    Set("board", "title", Var("title"), overwrite=True),
    Caused("board", NOUN, "board.renamed",
           {"board": Var("board_id"), "by": Fact("id"), "title": Var("title")}),
    Return("Renamed", org=Field("board", "org"), archived=Field("board", "archived")),
))
DELETE_BOARD = CATALOG.command(Command(
    "DeleteBoard",
    Input("board_id", str),
    Mutate("Board", (Var("board_id"),), as_="board", else_=Outcome("BoardMissing")),
    Permit("delete", VISIBLE, Unless(ORG_ONLY, IN_ORG),
           Unless(ARCHIVE_SCOPE, Contains(Fact("roles"), Const(BOARD_ARCHIVE))),
           Unless(NOT_ARCHIVED, Field("board", "archived"))),
    Delete("board", too_many=Outcome("TooManyAttached")),
    Caused("board", NOUN, "board.deleted", {"board": Var("board_id"), "by": Fact("id")}),
    Return("Deleted"),
))

COMMANDS = (CREATE_BOARD, RENAME_BOARD, DELETE_BOARD)
"""The board's commands: the schema owner installs their functions, a pod
registers them (`Engine.register_commands`)."""
