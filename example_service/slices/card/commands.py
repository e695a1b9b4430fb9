"""The card slice's commands. Each runs inside the engine's write pipeline
(one transaction: load, gate, domain command, save — state row and facts —
impacts, outbox rows, commit), whether a GraphQL mutation or a command on the
integration bus started it: the shared steps take either context.

Every stage change is a declared, revision-checked transition of
`workflow` (``startCard`` / ``finishCard`` from GraphQL, the bus command
``card.advance`` from its reaction): there is no unconditional advance."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeAlias

from service_engine import Bulk, Cause, Mutation, Reaction, Timestamp
from service_engine.errors import Refused

from ...kernel import Principal
from .domain import (
    BAD_DUE,
    BAD_ID,
    BAD_IMPORT,
    BAD_TITLE,
    MAX_IMPORT,
    NO_ORG,
    NOUN,
    Card,
    valid_id,
    valid_title,
)
from .messages import CardCreated, CardDue, CardImported

__all__ = [
    "CardCx",
    "ImportedCard",
    "create",
    "create_card",
    "import_cards",
    "rename_card",
]

CardCx: TypeAlias = Mutation[Principal] | Reaction[Principal]
"""Where the shared steps run: a mutation or a reaction."""

MAX_DUE = timedelta(days=365)


def _changed(cx: CardCx, card: Card, event: str, by: str, **data: str | bool | None) -> None:
    cx.impact_caused(NOUN, card.id, Cause(event, {"card": card.id, "by": by, **data}))


def due_at(cx: CardCx, due_in_seconds: float | None) -> datetime | None:
    if due_in_seconds is None:
        return None
    if not 0 < due_in_seconds <= MAX_DUE.total_seconds():
        raise Refused(BAD_DUE)
    return (cx.now() + timedelta(seconds=due_in_seconds)).value


async def create(
    cx: CardCx, by: Principal, card_id: str, org: str, title: str, due: datetime | None
) -> Card:
    """Create the card, announce it (``card.created``) and, with a deadline,
    schedule its ``card.due`` for the moment it passes."""
    if not valid_id(card_id):
        raise Refused(BAD_ID)
    if not valid_title(title):
        raise Refused(BAD_TITLE)
    card = Card.new(card_id, org, title, by.id, cx.now().value, due)
    await cx.create(card)  # an existing id fails with unique_violation
    _changed(cx, card, "card.created", by.id, title=card.title)
    cx.emit(CardCreated(
        card_id=card.id, version=card.version, org=card.org, title=card.title,
        stage=card.stage, due_at=card.due_at,
    ))
    if card.due_at is not None:
        cx.schedule_at(Timestamp(card.due_at), CardDue(card_id=card.id))
    return card


# -- the mutations ------------------------------------------------------------------

Cx = Mutation[Principal]


def _org_of(principal: Principal) -> str:
    if principal.org is None:
        raise Refused(NO_ORG)
    return principal.org


async def create_card(
    cx: Cx, title: str, card_id: str | None = None, due_in_seconds: float | None = None
) -> str:
    """A new card in the caller's org; answers its id."""
    org = _org_of(cx.principal)
    card = await create(
        cx, cx.principal, card_id or f"c-{uuid.uuid4().hex[:12]}", org, title,
        due_at(cx, due_in_seconds),
    )
    return card.id


async def rename_card(cx: Cx, card_id: str, title: str) -> None:
    card = await cx.load(Card, card_id)
    cx.require(card.can_rename)
    if not valid_title(title):
        raise Refused(BAD_TITLE, card.can_rename.action)
    card.rename(title, cx.principal.id)
    await cx.save(card)
    _changed(cx, card, "card.renamed", cx.principal.id, title=card.title)


@dataclass(frozen=True, slots=True)
class ImportedCard:
    """One card of a bulk import (``id`` generated when None)."""

    title: str
    id: str | None = None


async def import_cards(cx: Bulk[Principal], cards: Sequence[ImportedCard]) -> int:
    """Create every card in the caller's org in one transaction, with one
    projector-reset impact instead of one impact per card (the bulk path);
    answers how many were created."""
    org = _org_of(cx.principal)
    if not 1 <= len(cards) <= MAX_IMPORT:
        raise Refused(BAD_IMPORT)
    by = cx.principal.id
    now = cx.now().value
    for item in cards:
        card_id = item.id or f"c-{uuid.uuid4().hex[:12]}"
        if not valid_id(card_id):
            raise Refused(BAD_ID)
        if not valid_title(item.title):
            raise Refused(BAD_TITLE)
        await cx.create(Card.new(card_id, org, item.title, by, now))
    cx.impact_all(NOUN)
    cx.emit(CardImported(org=org, count=len(cards)))
    return len(cards)
