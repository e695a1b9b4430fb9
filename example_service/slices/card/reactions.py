"""The card slice's reactions to the integration bus, its sender resolver and
its cron.

Each reaction runs in the same write pipeline as a mutation, under the
message's idempotency claim: a redelivered or re-sent message re-emits the
confirmation it already produced instead of acting twice.

* `create_card` (command ``card.create``) creates the card, answering
  ``card.created``; a sender that is not a service — the envelope's actor,
  resolved into the service's own principal — is refused with a
  ``card.rejected`` answer to the producer (acked, never dead-lettered);
* `advance_card` (command ``card.advance``) runs the card's declared,
  revision-checked transition (`workflow`: ``StartCard`` from todo,
  ``FinishCard`` from doing) with the command's ``expected_revision``, inside
  the reaction's transaction, keyed by the message id: it answers
  ``card.advanced``, or ``card.rejected`` naming the typed outcome
  (``StaleRevision``, ``IllegalStage``, the gate's ``Refused``) and the
  card's current revision, with nothing changed; a card it does not know yet
  is parked (the create may still be on its way);
* `record_review` (event ``review.approved`` of the reviewer service) marks
  the card reviewed, answering ``card.reviewed``;
* `expire_card` (the service's own ``card.due``, published at a card's
  deadline by ``cx.schedule_at``) flags an open card overdue
  (``card.overdue``) once the deadline the card holds has passed — a
  ``card.due`` that arrives early is parked until then;
* the ``card_digest`` cron publishes the count of cards per org and stage
  (``card.digest``) once an hour, once across every pod.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from service_engine import (
    Actor,
    Conn,
    Engine,
    EventMetadata,
    InboundReaction,
    IntegrationEvent,
    Reaction,
    Reason,
)
from service_engine.commands import REFUSED, CommandOutcome, run_in
from service_engine.errors import Refused
from service_engine.integration import (
    Cron,
    Park,
    ReactionBudget,
    Tick,
    event_subject,
    stage_outbox_row,
)

from ...kernel import ConfigurationError, Principal
from .commands import create, due_at
from .domain import EXISTS, NO_ORG, NOT_A_SERVICE, NOUN, Card
from .messages import (
    AGGREGATE,
    REVIEWER,
    AdvanceCard,
    CardDigest,
    CardDue,
    CardOverdue,
    CardRejected,
    CardReviewed,
    CreateCard,
    ReviewApproved,
)
from .workflow import FINISH_CARD, START_CARD

__all__ = [
    "DIGEST_EVERY",
    "DUE_BUDGET",
    "EARLY_BUDGET",
    "digest_cron",
    "reactions",
    "sender_resolver",
]

Cx = Reaction[Principal]

DIGEST_EVERY = timedelta(hours=1)

EARLY_BUDGET = ReactionBudget(park_delay=timedelta(seconds=1), park_for=timedelta(minutes=5))
"""A message about a card not created yet waits for it, a few minutes at most."""
DUE_BUDGET = ReactionBudget(park_for=timedelta(hours=1))
"""A ``card.due`` a little ahead of its card's deadline (clock skew) waits for
it; a stray one far ahead is dead-lettered after an hour."""
DUE_RECHECK = timedelta(minutes=1)


def sender_resolver(engine: Engine) -> Callable[[Actor], Awaitable[Principal]]:
    """The sender of a message as the service's own principal: its envelope
    actor (a person or a service) with the facts the slices know about it."""

    async def resolve(actor: Actor) -> Principal:
        subject = str(actor.id)
        principal = Principal(id=subject, actor=subject, kind=actor.kind)
        loaded: Principal = await engine.load_principal_facts(principal)
        return loaded

    return resolve


def _reject(
    cx: Cx, card_id: str, reason: Reason, outcome: str | None = None,
    revision: int | None = None,
) -> None:
    """Answer the producer: its command was refused, and why."""
    cx.emit(CardRejected(
        card_id=card_id, command=cx.envelope.type, code=reason.code, message=reason.message,
        outcome=outcome, revision=revision,
    ))


def _refusal(outcome: CommandOutcome, card: Card, sender: Principal) -> Reason:
    """The reason of a declared command's zero-mutation outcome: the gate's
    own for ``Refused`` (the same function as the affordance), else the
    outcome's stable code."""
    if outcome.name == REFUSED:
        reason = card.can_advance(sender).reason
        if reason is not None:
            return reason
    code = outcome.code(NOUN) or outcome.name
    return Reason(code, f"{outcome.command}: {outcome.name}")


def _service_sender(cx: Cx) -> Principal | None:
    sender = cx.principal
    return sender if sender.kind == "service" else None


async def create_card(cx: Cx, command: CreateCard) -> None:
    sender = _service_sender(cx)
    if sender is None:
        _reject(cx, command.card_id, NOT_A_SERVICE)
        return
    if not command.org:
        _reject(cx, command.card_id, NO_ORG)
        return
    if await cx.load_optional(Card, command.card_id) is not None:
        _reject(cx, command.card_id, EXISTS)
        return
    try:
        await create(
            cx, sender, command.card_id, command.org, command.title,
            due_at(cx, command.due_in_seconds),
        )
    except Refused as refused:  # refused before anything was written
        _reject(cx, command.card_id, refused.reason)


async def advance_card(cx: Cx, command: AdvanceCard) -> Park | None:
    sender = _service_sender(cx)
    if sender is None:
        _reject(cx, command.card_id, NOT_A_SERVICE)
        return None
    # Read under the card's lock (held to commit): the stage picks the
    # transition, the version is what a stale sender is told to retry from.
    card = await cx.load_optional(Card, command.card_id)
    if card is None:
        return Park("card.unknown", f"no card {command.card_id} yet")
    transition = FINISH_CARD if card.stage == "doing" else START_CARD
    outcome = await run_in(cx, transition, {
        "idempotency_key": str(cx.message_id), "card_id": command.card_id,
        "expected_revision": command.expected_revision,
    }, principal=sender)
    if not outcome.ok:  # a declared outcome: nothing of the card changed
        _reject(cx, command.card_id, _refusal(outcome, card, sender), outcome.name,
                card.version)
    return None


async def record_review(cx: Cx, event: ReviewApproved) -> Park | None:
    card = await cx.load_optional(Card, event.card_id)
    if card is None:
        return Park("card.unknown", f"no card {event.card_id} yet")
    if card.reviewed_by is not None:
        return None  # reviewed already: a second approval changes nothing
    card.review(REVIEWER)
    await cx.save(card)
    cx.emit(CardReviewed(card_id=card.id, version=card.version, reviewed_by=REVIEWER))
    return None


async def expire_card(cx: Cx, due: CardDue) -> Park | None:
    card = await cx.load_optional(Card, due.card_id)
    if card is None or card.due_at is None:
        return None  # no such card, or no deadline: nothing is due
    # The deadline is the card's, not the message's: one that arrives early
    # (clock skew, or a stray copy) waits for it.
    early = card.due_at - cx.now().value
    if early > timedelta(0):
        return Park("card.not_due", f"due at {card.due_at.isoformat()}",
                    delay=min(early, DUE_RECHECK))
    if card.mark_overdue():
        await cx.save(card)
        cx.emit(CardOverdue(card_id=card.id, version=card.version, due_at=card.due_at))
    return None


def reactions(service: str) -> list[InboundReaction[Any]]:
    """The card slice's reactions for the engine of ``service``."""
    return [
        InboundReaction.command(
            "create_card", aggregate=AGGREGATE, verb="create", payload=CreateCard,
            handler=create_card,
        ),
        InboundReaction.command(
            "advance_card", aggregate=AGGREGATE, verb="advance", payload=AdvanceCard,
            handler=advance_card, budget=EARLY_BUDGET,
        ),
        InboundReaction.event(
            "record_review", producer=REVIEWER, aggregate="review", fact="approved",
            payload=ReviewApproved, handler=record_review, budget=EARLY_BUDGET,
        ),
        InboundReaction.event(
            "expire_card", producer=service, aggregate=AGGREGATE, fact="due",
            payload=CardDue, handler=expire_card, budget=DUE_BUDGET,
        ),
    ]


# -- the cron -----------------------------------------------------------------------------


def digest_cron(service: str) -> Cron:
    """Publish ``card.digest`` — cards per org and stage — once per hour."""

    async def tick(conn: Conn, tick: Tick) -> None:
        if tick.actor is None:
            raise ConfigurationError("the card digest needs a configured service")
        rows = await conn.fetch("SELECT org, stage, count(*) AS n FROM card GROUP BY org, stage")
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            counts.setdefault(row["org"], {})[row["stage"]] = int(row["n"])
        # One id per slot: a republished digest is deduplicated downstream.
        slot_id = f"{service}/card_digest/{tick.slot.isoformat()}"
        envelope: IntegrationEvent[CardDigest] = IntegrationEvent(
            event_id=uuid.uuid5(uuid.NAMESPACE_URL, slot_id),
            type=f"{AGGREGATE}.{CardDigest.FACT}", version=CardDigest.VERSION,
            occurred_at=datetime.now(UTC), metadata=EventMetadata.originating(tick.actor),
            payload=CardDigest(slot=tick.slot, counts=counts),
        )
        await stage_outbox_row(
            conn, envelope, event_subject(service, AGGREGATE, CardDigest.FACT), None, service
        )

    return Cron("card_digest", DIGEST_EVERY, tick)
