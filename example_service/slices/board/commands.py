"""The board slice's mutation handlers: each runs inside the engine's write
pipeline (one transaction: load, gate, domain command, save, impacts).

Creating, renaming and deleting a board run its declared commands (`policy`)
inside the handler's transaction: the title's uniqueness per org and the
delete's cascade are the command layer's; a declared refusal is answered as
a `MutationError` with its stable code (the kit's `require_ok`)."""

from __future__ import annotations

import secrets
import uuid

from service_engine import ActionName, Cause, Mutation, OneShot
from service_engine.commands import CommandOutcome, run_in
from service_engine.errors import Refused
from service_engine.graphql import require_ok

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
from .policy import CREATE_BOARD, DELETE_BOARD, REASONS, RENAME_BOARD

__all__ = [
    "accept_invite",
    "archive_board",
    "create_board",
    "delete_board",
    "invite_to_board",
    "rename_board",
    "unarchive_board",
]

Cx = Mutation[Principal]


def _answer(outcome: CommandOutcome, board_id: str) -> CommandOutcome:
    """A declared command's refusal as the handler's (``BoardMissing`` is ``not_found``)."""
    return require_ok(outcome, NOUN, reasons=REASONS,
                      missing=("BoardMissing", Board.Store.store_type, board_id))


def _changed(cx: Cx, board: Board, event: str, **data: str | bool) -> None:
    """Both projectors re-render the board; BoardsView carries the cause."""
    cause = Cause(event, {"board": board.id, "by": cx.principal.id, **data})
    cx.impact_caused(NOUN, board.id, cause)
    cx.impact(ORG_NOUN, board.id)


async def create_board(cx: Cx, title: str, board_id: str | None = None) -> str:
    """A new board in the caller's org, its title unique there; answers its id."""
    org = cx.principal.org
    if org is None:
        raise Refused(NO_ORG)
    if not valid_title(title):
        raise Refused(BAD_TITLE)
    board_id = board_id or f"b-{uuid.uuid4().hex[:12]}"
    _answer(await run_in(cx, CREATE_BOARD, {"board_id": board_id, "title": title.strip()}),
            board_id)
    await cx.create(OrgBoard(board_id, org, title.strip()))
    return board_id


async def rename_board(cx: Cx, board_id: str, title: str) -> None:
    """Rename the board (its ``rename`` permit), onto a title no other board
    of its org holds; the org projection follows in the same commit."""
    if not valid_title(title):
        raise Refused(BAD_TITLE, ActionName("rename"))
    # The command locks and writes the board; the org projection's row is
    # written after it (the board first, as every writer of it does).
    renamed = _answer(
        await run_in(cx, RENAME_BOARD, {"board_id": board_id, "title": title.strip()}), board_id
    )
    org, archived = renamed.data["org"], renamed.data["archived"]
    assert isinstance(org, str) and isinstance(archived, bool)
    await cx.save(OrgBoard(board_id, org, title.strip(), archived))


async def delete_board(cx: Cx, board_id: str) -> None:
    """Delete an archived board (gated) with its memberships and invites, at
    most the cascade's maximum of each; more answer ``board.too_many_attached``."""
    _answer(await run_in(cx, DELETE_BOARD, {"board_id": board_id}), board_id)


async def archive_board(cx: Cx, board_id: str) -> None:
    await cx.lock_all((Board, board_id), (OrgBoard, board_id))
    board = await cx.load(Board, board_id)
    cx.require(board.can_archive)
    board.set_archived(True)
    await cx.save(board)
    await cx.save(OrgBoard.of(board))
    _changed(cx, board, "board.archived")


async def unarchive_board(cx: Cx, board_id: str) -> None:
    await cx.lock_all((Board, board_id), (OrgBoard, board_id))
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

