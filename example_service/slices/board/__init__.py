"""The board slice: direct CRUD, gate == affordance, a cohort-visibility
projector over ``board`` and an RLS projector over ``org_board``, a
one-shot invite, a contributed scope (`BOARD_ARCHIVE`) and principal fact
(`BOARD_MEMBERSHIPS`), and a published-language offer (which an engine
without NATS leaves unpublished).

Remove it by deleting this folder and its line in ``slices/__init__.py``.
"""

from service_engine.graphql import SliceFragment

from .domain import BOARD_ARCHIVE, BOARD_MEMBERSHIPS
from .graphql import TYPES, BoardMutation, BoardQuery, BoardSubscription
from .offer import BoardOffer
from .policy import COMMANDS
from .register import BoardErasure, register
from .views import BoardsView, OrgBoardsRls

SLICE = SliceFragment(
    "board",
    query=BoardQuery,
    mutation=BoardMutation,
    subscription=BoardSubscription,
    types=TYPES,
    projectors=[BoardsView, OrgBoardsRls],
    offers=[BoardOffer()],
    commands=COMMANDS,
    scopes=[BOARD_ARCHIVE],  # Identity grants what archiveBoard gates on
    erasure=BoardErasure(),
    register=register,
)

__all__ = ["BOARD_ARCHIVE", "BOARD_MEMBERSHIPS", "COMMANDS", "SLICE"]
