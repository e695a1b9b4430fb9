"""The board slice registers its projectors, its principal fact loader, its
scope (`BOARD_ARCHIVE`), its erasure (the person's memberships) and its
published-language offer (which an engine without NATS leaves unpublished)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from service_engine import Database, Engine, Erase

from ...kernel import Principal
from .domain import BOARD_ARCHIVE, BOARD_MEMBERSHIPS, NOUN, Board, load_memberships
from .offer import BoardOffer
from .policy import COMMANDS
from .views import BoardsView, OrgBoardsRls

ERASED = "erased"
"""What an erased person's name is replaced with on a board or an invite."""


def register(engine: Engine) -> None:
    engine.register_projector(BoardsView())
    engine.register_projector(OrgBoardsRls())
    engine.register_principal_fact(memberships_loader(engine.db))
    engine.contribute_scopes([BOARD_ARCHIVE])
    engine.register_erasable("board", BoardErasure())
    engine.register_offer(BoardOffer())
    engine.register_commands(*COMMANDS)


def memberships_loader(db: Database) -> Callable[[Principal], Awaitable[Principal]]:
    """The `BOARD_MEMBERSHIPS` fact loader: the boards the principal joined."""

    async def load(principal: Principal) -> Principal:
        return principal.with_fact(BOARD_MEMBERSHIPS, await load_memberships(db, principal.id))

    return load


class BoardErasure:
    """Erasable: the person's board memberships go (their facts re-gated);
    a board belongs to its org, so a board they own or an invite they made
    or redeemed stays, its person named ``erased``. Each board they owned
    is re-offered (its published image loses their name) and re-rendered."""

    async def erase(self, cx: Erase, person: str) -> None:
        await cx.execute("DELETE FROM board_member WHERE person = $1", person)
        cx.impact_principal_facts(person, [NOUN])
        owned = await cx.fetch("SELECT id FROM board WHERE owner = $1", person)
        await cx.execute("UPDATE board SET owner = $2 WHERE owner = $1", person, ERASED)
        await cx.execute(
            "UPDATE board_invite SET created_by = $2 WHERE created_by = $1", person, ERASED
        )
        await cx.execute(
            "UPDATE board_invite SET redeemed_by = $2 WHERE redeemed_by = $1", person, ERASED
        )
        for row in owned:
            board_id = str(row["id"])
            cx.dirty_offer(Board, board_id)
            cx.impact(NOUN, board_id)
