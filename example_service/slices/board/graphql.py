"""The board slice's root fields: queries read rendered views through the
kit's `Views` (the same path as a subscription's snapshot, under the
projector's RLS regime); mutations run on the engine's mutation executor;
subscriptions stream one projector's typed union.

createBoard, renameBoard and deleteBoard run the board's declared commands
(`policy`); their typed outcomes arrive as ``error.code``: ``board.title_taken``
(another board of the org holds the title; nothing changed),
``board.board_exists`` (the id is taken), ``board.too_many_attached`` (more
memberships or invites than the delete's cascade takes; nothing deleted),
``not_found``, or the gate's reason (``board.not_archived``, ...)."""

from __future__ import annotations

import strawberry

from service_engine import MutationError, Query, WindowSpec
from service_engine.graphql import MutationResult, Views

from ...kernel import Info, Principal
from .commands import (
    accept_invite,
    archive_board,
    create_board,
    delete_board,
    invite_to_board,
    rename_board,
    unarchive_board,
)
from .views import BOARDS, ORG_BOARDS, ORG_CONTEXT, BoardsQuery, BoardView, OrgBoardView

BOARD_VIEWS = Views(BOARDS, BoardView, description="the caller's boards")
ORG_BOARD_VIEWS = Views(ORG_BOARDS, OrgBoardView, ORG_CONTEXT, union_name="OrgBoards",
                        description="the boards of the caller's org (under RLS)")


@strawberry.type(description="The outcome of a board mutation: the board as the caller now "
                             "sees it, or why nothing changed.")
class BoardResult(MutationResult):
    board_id: strawberry.Private[str | None] = None
    viewer: strawberry.Private[Principal | None] = None
    board: BoardView | None = BOARD_VIEWS.after_commit("board_id", principal="viewer")


@strawberry.type(description="An invite's one-shot token: shown to its creator once, never stored.")
class InviteResult(MutationResult):
    token: str | None = None


@strawberry.type
class BoardQuery:
    @strawberry.field(description="The boards the caller sees, by id.")
    async def boards(self, info: Info, limit: int = 100) -> list[BoardView]:
        return await BOARD_VIEWS.window(info.context, BoardsQuery(limit))

    @strawberry.field(description="One board, if the caller sees it.")
    async def board(self, info: Info, id: strawberry.ID) -> BoardView | None:
        return await BOARD_VIEWS.one(info.context, str(id))

    @strawberry.field(description="The boards of the caller's org, read under Postgres RLS.")
    async def org_boards(self, info: Info) -> list[OrgBoardView]:
        return await ORG_BOARD_VIEWS.window(info.context, None)

    @strawberry.field(description="One board of the caller's org, read under Postgres RLS.")
    async def org_board(self, info: Info, id: strawberry.ID) -> OrgBoardView | None:
        return await ORG_BOARD_VIEWS.one(info.context, str(id))


@strawberry.type
class BoardMutation:
    @strawberry.mutation(description="Create a board in the caller's org.")
    async def create_board(
        self, info: Info, title: str, id: strawberry.ID | None = None
    ) -> BoardResult:
        outcome = await info.context.execute(create_board, title, None if id is None else str(id))
        return BoardResult.of(outcome, "board_id")

    @strawberry.mutation
    async def rename_board(self, info: Info, id: strawberry.ID, title: str) -> BoardResult:
        outcome = await info.context.execute(rename_board, str(id), title)
        return BoardResult.of(outcome, board_id=str(id))

    @strawberry.mutation
    async def archive_board(self, info: Info, id: strawberry.ID) -> BoardResult:
        outcome = await info.context.execute(archive_board, str(id))
        return BoardResult.of(outcome, board_id=str(id))

    @strawberry.mutation
    async def unarchive_board(self, info: Info, id: strawberry.ID) -> BoardResult:
        outcome = await info.context.execute(unarchive_board, str(id))
        return BoardResult.of(outcome, board_id=str(id))

    @strawberry.mutation(description="Delete an archived board with its memberships and "
                                     "invites (a declared cascade, at most 100 of each: "
                                     "more answer board.too_many_attached).")
    async def delete_board(self, info: Info, id: strawberry.ID) -> BoardResult:
        return BoardResult.of(await info.context.execute(delete_board, str(id)))

    @strawberry.mutation(description="Mint a one-shot invite onto a board; the token is "
                                     "returned here once and stored only as a hash.")
    async def invite_to_board(self, info: Info, id: strawberry.ID) -> InviteResult:
        outcome = await info.context.execute(invite_to_board, str(id))
        if isinstance(outcome, MutationError):
            return InviteResult.refused(outcome)
        return InviteResult(success=True, token=outcome.reveal())

    @strawberry.mutation(description="Join a board (from any org) with an invite token.")
    async def accept_invite(self, info: Info, token: str) -> BoardResult:
        outcome = await info.context.execute(accept_invite, token)
        if isinstance(outcome, MutationError):
            return BoardResult.refused(outcome)
        # The caller's facts just changed: answer with the view they now have.
        joined = await info.context.engine.load_principal_facts(info.context.principal)
        return BoardResult.of(outcome, "board_id", viewer=joined)


@strawberry.type
class BoardSubscription:
    @BOARD_VIEWS.field(description="The caller's boards, live: a Reset, then Upserts and "
                                   "Removes on a contiguous revision.")
    def boards(self, limit: int = 100) -> WindowSpec[BoardsQuery]:
        return WindowSpec(Query(BoardsQuery(limit)))

    @ORG_BOARD_VIEWS.field(description="The boards of the caller's org, live, under RLS.")
    def org_boards(self) -> WindowSpec[None]:
        return WindowSpec(Query(None), rls=True)


TYPES = (
    BoardView, OrgBoardView, BoardResult, InviteResult,
    *BOARD_VIEWS.types, *ORG_BOARD_VIEWS.types,
)
