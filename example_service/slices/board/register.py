"""The board slice registers its projectors and its principal fact."""

from __future__ import annotations

from service_engine import Engine

from ...kernel import PrincipalDirectory
from .domain import BOARD_MEMBERSHIPS, load_memberships
from .views import BoardsView, OrgBoardsRls


def register(engine: Engine) -> None:
    engine.register_projector(BoardsView())
    engine.register_projector(OrgBoardsRls())
    PrincipalDirectory.of(engine).contribute(BOARD_MEMBERSHIPS, load_memberships)
