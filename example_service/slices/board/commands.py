"""The board slice's mutation handlers: each runs inside the engine's write
pipeline (one transaction: load, gate, domain command, save, impacts)."""

from __future__ import annotations

import secrets
import uuid

from service_engine import Cause, Mutation, OneShot, Refused

from ...kernel import Principal
from .domain import (
    BAD_TITLE,
    INVITE_SPENT,
    INVITE_UNKNOWN,
    NO_ORG,
    NOUN,
    ORG_NOUN,
    Board,
    BoardMember,
    Invite,
    OrgBoard,
    member_id,
    valid_title,
)

__all__ = [
    "accept_invite",
    "archive_board",
    "create_board",
    "invite_to_board",
    "rename_board",
    "unarchive_board",
]

Cx = Mutation[Principal]


def _changed(cx: Cx, board: Board, event: str, **data: str | bool) -> None:
    """Both projectors re-render the board; BoardsView carries the cause."""
    cause = Cause(event, {"board": board.id, "by": cx.principal.id, **data})
    cx.impact_caused(NOUN, board.id, cause)
    cx.impact(ORG_NOUN, board.id)


async def create_board(cx: Cx, title: str, board_id: str | None = None) -> str:
    """A new board in the caller's org; answers its id."""
    org = cx.principal.org
    if org is None:
        raise Refused(NO_ORG)
    if not valid_title(title):
        raise Refused(BAD_TITLE)
    board = Board(board_id or f"b-{uuid.uuid4().hex[:12]}", org, title.strip(), cx.principal.id)
    await cx.create(board)
    await cx.create(OrgBoard.of(board))
    _changed(cx, board, "board.created", title=board.title)
    return board.id


async def rename_board(cx: Cx, board_id: str, title: str) -> None:
    board = await cx.load(Board, board_id)
    cx.require(board.can_rename)
    if not valid_title(title):
        raise Refused(BAD_TITLE, board.can_rename.action)
    board.rename(title)
    await cx.save(board)
    await cx.save(OrgBoard.of(board))
    _changed(cx, board, "board.renamed", title=board.title)


async def archive_board(cx: Cx, board_id: str) -> None:
    board = await cx.load(Board, board_id)
    cx.require(board.can_archive)
    board.set_archived(True)
    await cx.save(board)
    await cx.save(OrgBoard.of(board))
    _changed(cx, board, "board.archived")


async def unarchive_board(cx: Cx, board_id: str) -> None:
    board = await cx.load(Board, board_id)
    cx.require(board.can_unarchive)
    board.set_archived(False)
    await cx.save(board)
    await cx.save(OrgBoard.of(board))
    _changed(cx, board, "board.unarchived")


async def invite_to_board(cx: Cx, board_id: str) -> OneShot[str]:
    """Mint an invite onto the board. The secret goes to the caller alone:
    the store keeps its hash; no view, impact or cause carries it."""
    board = await cx.load(Board, board_id)
    cx.require(board.can_invite)
    token = secrets.token_urlsafe(24)
    await cx.create(Invite(Invite.hash_of(token), board.id, cx.principal.id))
    return OneShot(token)


async def accept_invite(cx: Cx, token: str) -> str:
    """Redeem an invite: the caller becomes a member of its board (from any
    org) and their sessions re-gate on the new fact. Answers the board id."""
    invite = await cx.load_optional(Invite, Invite.hash_of(token))
    if invite is None:
        raise Refused(INVITE_UNKNOWN)
    if invite.redeemed_by is not None:
        raise Refused(INVITE_SPENT)
    person = cx.principal.id
    invite.redeemed_by = person
    await cx.save(invite)
    if await cx.load_optional(BoardMember, member_id(invite.board_id, person)) is None:
        await cx.create(BoardMember(invite.board_id, person))
    # The person's facts changed: their live windows re-resolve and re-gate.
    cx.impact_principal_facts(person, [NOUN])
    cx.impact(NOUN, invite.board_id)
    return invite.board_id

