"""The board slice: direct CRUD, gate == affordance, a cohort-visibility
projector over ``board`` and an RLS projector over ``org_board``, a
one-shot invite, a contributed scope (`BOARD_ARCHIVE`) and principal fact
(`BOARD_MEMBERSHIPS`).

Remove it by deleting this folder and its line in ``slices/__init__.py``.
"""

from service_engine.graphql import SliceFragment

from .domain import BOARD_ARCHIVE, BOARD_MEMBERSHIPS
from .graphql import TYPES, BoardMutation, BoardQuery, BoardSubscription
from .policy import COMMANDS
from .register import register

SLICE = SliceFragment(
    "board",
    query=BoardQuery,
    mutation=BoardMutation,
    subscription=BoardSubscription,
    types=TYPES,
    register=register,
)

__all__ = ["BOARD_ARCHIVE", "BOARD_MEMBERSHIPS", "COMMANDS", "SLICE"]
