"""The card aggregate (soft EDA), its gates, and the window cursor.

A card belongs to one org and moves ``todo`` → ``doing`` → ``done``. People
of its org see it and rename it; advancing it needs the `CARD_ADVANCE`
scope. A service (a command on the integration bus) acts on its own
authority: its commands pass the same gates as a principal of kind
``service``. Each gate is declared once with `gated`: the view's affordances
and the deny checks of the mutations and reactions are the same function.

The ``card`` row is the truth; every command also records its facts
(``card.created``, ``card.renamed``, ...), which `CardStore` appends to
``card_fact`` in the same statement as the state write. ``version`` counts
the card's changes: the integration events a card emits declare it as their
producer sequence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal

from service_engine import DomainEvent, Gate, Reason, RecordsEvents, SoftEdaStore, gated

from ...kernel import Principal

NOUN = "card"

CARD_ADVANCE = "card:advance"
"""The scope (a passport role) a person needs to advance a card."""

Stage = Literal["todo", "doing", "done"]
STAGES: tuple[Stage, ...] = ("todo", "doing", "done")

MAX_TITLE = 200
MAX_IMPORT = 1000
"""The most cards one bulk import takes."""

FORBIDDEN = Reason("card.forbidden", "this card is not yours to change")
DONE = Reason("card.done", "the card is done")
ADVANCE_SCOPE = Reason("card.advance_scope_required", f"advancing a card needs {CARD_ADVANCE}")
NO_ORG = Reason("card.no_org", "a card is created in the caller's org; the passport has none")
BAD_TITLE = Reason("card.title_invalid", f"a title is 1 to {MAX_TITLE} characters")
BAD_ID = Reason("card.id_invalid", "a card id is 1 to 64 of [A-Za-z0-9_-]")
BAD_DUE = Reason("card.due_invalid", "a deadline lies in the future, within a year")
BAD_IMPORT = Reason("card.import_invalid", f"an import holds 1 to {MAX_IMPORT} cards")
EXISTS = Reason("card.exists", "a card with this id exists")
NOT_A_SERVICE = Reason(
    "card.sender_not_service", "card commands on the integration bus come from services only"
)

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def valid_title(title: str) -> bool:
    return 1 <= len(title.strip()) <= MAX_TITLE


def valid_id(card_id: str) -> bool:
    return _ID.fullmatch(card_id) is not None


@dataclass
class Card(RecordsEvents):
    id: str
    org: str
    title: str
    owner: str
    created_at: datetime
    stage: Stage = "todo"
    due_at: datetime | None = None
    overdue: bool = False
    reviewed_by: str | None = None
    version: int = 1

    Store: ClassVar[CardStore]

    # -- who ------------------------------------------------------------------

    def in_org(self, principal: Principal) -> bool:
        return principal.org == self.org

    def acts_on(self, principal: Principal) -> bool:
        """A person of the card's org, or a service on its own authority."""
        return principal.kind == "service" or self.in_org(principal)

    # -- gates (== affordances) ---------------------------------------------------

    @gated("rename")
    def can_rename(self, principal: Principal) -> Gate:
        if not self.acts_on(principal):
            return Gate.deny(FORBIDDEN)
        if self.stage == "done":
            return Gate.deny(DONE)
        return Gate.allow()

    @gated("advance")
    def can_advance(self, principal: Principal) -> Gate:
        if not self.acts_on(principal):
            return Gate.deny(FORBIDDEN)
        if principal.kind != "service" and not principal.has_role(CARD_ADVANCE):
            return Gate.deny(ADVANCE_SCOPE)
        if self.stage == "done":
            return Gate.deny(DONE)
        return Gate.allow()

    # -- domain commands (each records its fact) -----------------------------------

    @classmethod
    def new(
        cls, card_id: str, org: str, title: str, owner: str, now: datetime,
        due_at: datetime | None = None,
    ) -> Card:
        card = cls(card_id, org, title.strip(), owner, now, due_at=due_at)
        card.record(DomainEvent("card.created", {
            "org": org, "title": card.title, "by": owner,
            "due_at": None if due_at is None else due_at.isoformat(),
        }))
        return card

    def _changed(self, fact: str, data: Mapping[str, Any]) -> None:
        self.version += 1
        self.record(DomainEvent(fact, data))

    def rename(self, title: str, by: str) -> None:
        self.title = title.strip()
        self._changed("card.renamed", {"title": self.title, "by": by})

    def review(self, by: str) -> None:
        self.reviewed_by = by
        self._changed("card.reviewed", {"by": by})

    def mark_overdue(self) -> bool:
        """Flag the card overdue once its deadline passed; False when there
        is nothing to flag (done already, or flagged)."""
        if self.stage == "done" or self.overdue:
            return False
        self.overdue = True
        self._changed("card.overdue", {"due_at": None if self.due_at is None
                                       else self.due_at.isoformat()})
        return True


class CardStore(SoftEdaStore[Card, str]):
    TABLE = "card"
    AGGREGATE = Card
    FACTS_TABLE = "card_fact"
    FACT_KEY = "card_id"


Card.Store = CardStore()


# -- the window cursor ------------------------------------------------------------------


def encode_cursor(card: Card) -> str:
    """The opaque cursor of ``card``'s place in a window (newest first):
    page back from it with ``pageCards``."""
    return f"{card.created_at.isoformat()}~{card.id}"


class BadCursor(ValueError):
    """A cursor that `encode_cursor` did not produce."""


def decode_cursor(cursor: str) -> list[str]:
    """The ``[created_at, id]`` a cursor stands for (the populate's JSON cursor)."""
    created, sep, card_id = cursor.rpartition("~")
    if not sep or not valid_id(card_id):
        raise BadCursor(f"not a card cursor: {cursor!r}")
    try:
        datetime.fromisoformat(created)
    except ValueError as exc:
        raise BadCursor(f"not a card cursor: {cursor!r}") from exc
    return [created, card_id]
