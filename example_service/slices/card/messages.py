"""The card slice's integration contract: what it reads off and puts on the bus.

Commands addressed to this service (``integration.cmd.{service}.card.…``):

* `CreateCard` (``card.create``) — create a card, optionally with a deadline;
  answered with `CardCreated`, or `CardRejected` when the sender is not a
  service;
* `AdvanceCard` (``card.advance``) — move a card on one stage from the
  revision the sender saw (``expected_revision``: the ``version`` of the
  last card event it read); answered with `CardAdvanced`, or `CardRejected`
  naming the declared outcome (``StaleRevision`` with the card's current
  ``revision``, ``IllegalStage``, or the gate's refusal).

Events it reads (``integration.evt.…``):

* `ReviewApproved` from the twin (``twin`` / ``review.approved``): the card
  is marked reviewed, answered with `CardReviewed`;
* `CardDue`, its own, published by the scheduled-message publisher at a
  card's deadline (``cx.schedule_at``): an open card is flagged overdue
  (`CardOverdue`).

Events it emits (``integration.evt.{service}.card.…``): `CardCreated`,
`CardAdvanced`, `CardReviewed`, `CardOverdue` — each declaring the producer
sequence (seq_key = card id, seq = the card's version) — and `CardRejected`,
`CardImported`, `CardDue`, `CardDigest` (the hourly cron).

Every payload is a JSON object; consumers ignore fields they do not know.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from service_engine.integration import DeclaredSequence

AGGREGATE = "card"
REVIEWER = "twin"
"""The service whose ``review.approved`` events the card slice reacts to."""


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _Event(_Payload):
    AGGREGATE: ClassVar[str] = AGGREGATE
    FACT: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def sequence(self) -> DeclaredSequence | None:
        return None


class _CardFact(_Event):
    """A change of one card: ordered per card by its version."""

    card_id: str
    version: int

    def sequence(self) -> DeclaredSequence | None:
        return DeclaredSequence(self.card_id, self.version)


# -- inbound --------------------------------------------------------------------------


class CreateCard(_Payload):
    """``card.create``: a new card in ``org``; ``due_in_seconds`` sets a deadline."""

    card_id: str
    org: str
    title: str
    due_in_seconds: float | None = Field(default=None, gt=0)


class AdvanceCard(_Payload):
    """``card.advance``: move the card on one stage, from ``expected_revision``
    (the card's ``version`` as the sender last saw it; any other revision is
    answered ``StaleRevision`` and changes nothing)."""

    card_id: str
    expected_revision: int = Field(ge=1)


class ReviewApproved(_Payload):
    """The reviewer's ``review.approved`` fact about a card."""

    card_id: str


# -- outbound ---------------------------------------------------------------------------


class CardCreated(_CardFact):
    FACT: ClassVar[str] = "created"

    org: str
    title: str
    stage: str
    due_at: datetime | None = None


class CardAdvanced(_CardFact):
    FACT: ClassVar[str] = "advanced"

    stage: str


class CardReviewed(_CardFact):
    FACT: ClassVar[str] = "reviewed"

    reviewed_by: str


class CardOverdue(_CardFact):
    FACT: ClassVar[str] = "overdue"

    due_at: datetime | None


class CardRejected(_Event):
    """A command the service refused: ``command`` is its type, ``code`` and
    ``message`` why. Its causation id is the refused command's id.

    A declared command's refusal also names its typed ``outcome``
    (``StaleRevision``, ``IllegalStage``, ``Refused``) and the card's current
    ``revision``, the one a sender may retry from; both are absent on the
    refusals made before any card was read (a sender that is not a service)."""

    FACT: ClassVar[str] = "rejected"

    card_id: str
    command: str
    code: str
    message: str
    outcome: str | None = None
    revision: int | None = None


class CardImported(_Event):
    FACT: ClassVar[str] = "imported"

    org: str
    count: int


class CardDue(_Event):
    """A card's deadline came (scheduled at creation; its own reaction reads it)."""

    FACT: ClassVar[str] = "due"

    card_id: str


class CardDigest(_Event):
    """The hourly count of cards by stage, per org."""

    FACT: ClassVar[str] = "digest"

    slot: datetime
    counts: dict[str, dict[str, int]] = Field(description="org -> stage -> cards")
