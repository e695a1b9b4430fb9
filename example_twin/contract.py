"""The card contract as the twin reads and writes it: JSON on the wire.

These models mirror the reference service's card slice
(``example_service/slices/card/messages.py``) field for field; the twin is
another service and shares no code with it, only the wire. A consumer
ignores the fields it does not know, so either side may add one.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

CARD = "card"
"""The aggregate of the service's card commands and events."""
REVIEW = "review"
"""The aggregate of the twin's own review events."""


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# -- what the twin sends ----------------------------------------------------------------


class CreateCard(_Wire):
    """Command ``integration.cmd.{service}.card.create``."""

    VERB: ClassVar[str] = "create"

    card_id: str
    org: str
    title: str
    due_in_seconds: float | None = Field(default=None, gt=0)


class AdvanceCard(_Wire):
    """Command ``integration.cmd.{service}.card.advance``: from
    ``expected_revision``, the card's ``version`` as the twin last saw it."""

    VERB: ClassVar[str] = "advance"

    card_id: str
    expected_revision: int = Field(ge=1)


class ReviewApproved(_Wire):
    """The twin's event ``integration.evt.{twin}.review.approved``."""

    FACT: ClassVar[str] = "approved"

    card_id: str


# -- what the twin reads --------------------------------------------------------------


class CardFact(_Wire):
    """Every ``integration.evt.{service}.card.*`` event names its card."""

    card_id: str


class CardCreated(CardFact):
    org: str
    title: str
    stage: str
    version: int
    due_at: datetime | None = None


class CardAdvanced(CardFact):
    stage: str
    version: int


class CardReviewed(CardFact):
    reviewed_by: str
    version: int


class CardRejected(CardFact):
    """A refused command; a declared outcome names itself and the card's
    current ``revision`` (``StaleRevision``: retry from there)."""

    command: str
    code: str
    message: str
    outcome: str | None = None
    revision: int | None = None


STALE_REVISION = "StaleRevision"
"""The outcome of an advance from a revision the card has moved past."""


# -- published languages (KV) ------------------------------------------------------


ROSTER_BUCKET = "PUBLISHED_twin"
"""The twin's published-language bucket (gitops-declared)."""
ROSTER_PREFIX = "twin.person"
BOARD_BUCKET = "PUBLISHED_example"
"""The service's published-language bucket; the twin reads its board offer."""
BOARD_PREFIX = "example.board"


class Person(_Wire):
    """One person of the twin's roster, at ``twin.person.<id>``."""

    id: str
    name: str
    org: str


class OfferedBoard(_Wire):
    """A board as the service offers it, at ``example.board.<id>``."""

    id: str
    title: str
    org: str
    archived: bool
