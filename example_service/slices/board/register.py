"""The board slice registers its projectors, its principal fact loader, its
scope (`BOARD_ARCHIVE`), its erasure (the person's memberships) and (on an
engine with NATS) its published-language offer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from service_engine import Database, Engine, Erase

from ...kernel import Principal
from .domain import BOARD_ARCHIVE, BOARD_MEMBERSHIPS, load_memberships
from .offer import BoardOffer
from .views import BoardsView, OrgBoardsRls


def register(engine: Engine) -> None:
    engine.register_projector(BoardsView())
    engine.register_projector(OrgBoardsRls())
    engine.register_principal_fact(memberships_loader(engine.db))
    engine.contribute_scopes([BOARD_ARCHIVE])
    engine.register_erasable("board", BoardErasure())
    if engine.nats is not None:  # an engine without a broker serves the slice unpublished
        engine.register_offer(BoardOffer())


def memberships_loader(db: Database) -> Callable[[Principal], Awaitable[Principal]]:
    """The `BOARD_MEMBERSHIPS` fact loader: the boards the principal joined."""

    async def load(principal: Principal) -> Principal:
        return principal.with_fact(BOARD_MEMBERSHIPS, await load_memberships(db, principal.id))

    return load


class BoardErasure:
    """Erasable: the person's board memberships (the only person data the
    slice holds; boards belong to orgs). Their facts are re-gated."""

    async def erase(self, cx: Erase, person: str) -> None:
        await cx.execute("DELETE FROM board_member WHERE person = $1", person)
        cx.impact_principal_facts(person, [BOARD_MEMBERSHIPS])
