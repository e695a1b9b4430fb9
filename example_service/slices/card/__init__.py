"""The card slice: soft EDA (a state row plus its facts, in one statement),
command reactions (``create_card`` refuses a sender that is not a service;
``advance_card``), an event reaction (the reviewer's ``review.approved``),
emitted integration events (``card.created``, ...), a scheduled deadline
reaction (``card.due`` via ``cx.schedule_at``), a cron (``card.digest``), a
bulk import, the paging pair (``cardPageDeltas`` + ``pageCards``) and a
contributed scope (`CARD_ADVANCE`).

Remove it by deleting this folder and its line in ``slices/__init__.py``.
"""

from service_engine.graphql import SliceFragment

from .domain import CARD_ADVANCE
from .graphql import TYPES, CardMutation, CardQuery, CardSubscription
from .register import CardErasure, register
from .views import CardsView
from .workflow import COMMANDS

SLICE = SliceFragment(
    "card",
    query=CardQuery,
    mutation=CardMutation,
    subscription=CardSubscription,
    types=TYPES,
    projectors=[CardsView],
    commands=COMMANDS,
    scopes=[CARD_ADVANCE],  # Identity grants what startCard and finishCard gate on
    erasure=CardErasure(),
    register=register,
)

__all__ = ["CARD_ADVANCE", "COMMANDS", "SLICE"]
