"""The board slice registers its projectors, its principal fact and (on an
engine with NATS) its published-language offer."""

from __future__ import annotations

from service_engine import Engine

from ...kernel import PrincipalDirectory
from .domain import BOARD_MEMBERSHIPS, load_memberships
from .offer import BoardOffer
from .views import BoardsView, OrgBoardsRls


def register(engine: Engine) -> None:
    engine.register_projector(BoardsView())
    engine.register_projector(OrgBoardsRls())
    PrincipalDirectory.of(engine).contribute(BOARD_MEMBERSHIPS, load_memberships)
    if engine.nats is not None:  # an engine without a broker serves the slice unpublished
        engine.register_offer(BoardOffer())
