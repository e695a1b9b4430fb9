"""What a reaction answers and what the inbound loop does with it (pure).

A reaction handler ends in one of:

* success (it returns anything that is not a `Disposition`): the effect
  commits and the frame is acked;
* `Retry`: not now, try again; the frame is nak'ed with a growing, capped
  backoff until the reaction's retry budget is spent, then dead-lettered;
* `Park`: too early (what it needs has not arrived yet); the frame is
  nak'ed with the long park delay and released when it expires, until the
  message is older than the park budget, then dead-lettered;
* `Terminal`: never; the frame is dead-lettered and terminated.

A handler may ``return`` or ``raise`` a disposition: either way the
transaction rolls back. `ReactionBudget` holds the per-reaction bounds;
`route` turns a disposition and the delivery count into the loop's
`RouteDecision` (`Ack`, `Nak`, `DeadLetterIt`). Only the consume loop acks, naks
or terminates a frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TypeAlias

from ..failures import ConfigError, EngineError
from .envelope import Incoming

__all__ = [
    "Ack",
    "DeadLetterIt",
    "Disposition",
    "Nak",
    "Park",
    "PrincipalUnresolved",
    "ReactionBudget",
    "ReactionDelivery",
    "Retry",
    "RouteDecision",
    "Settlement",
    "Term",
    "Terminal",
    "backoff_delay",
    "is_terminal_sqlstate",
    "route",
]


# -- dispositions ------------------------------------------------------------------


class Disposition(EngineError):
    """How a reaction handler says the frame in hand did not apply.

    Return it or raise it from the handler; the transaction rolls back
    either way. ``reason`` is a short machine-readable code (it becomes the
    dead letter's reason), ``detail`` a sentence for the operator.
    """

    kind = "disposition"

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Retry(Disposition):
    """Try this message again later (a dependency is down, a race lost).

    Nak'ed with a growing, capped backoff (``delay`` overrides it) until the
    reaction has seen it ``ReactionBudget.max_deliveries`` times; then it is
    dead-lettered as poison.
    """

    kind = "retry"

    def __init__(self, reason: str, detail: str = "", *, delay: timedelta | None = None) -> None:
        super().__init__(reason, detail)
        self.delay = delay


class Park(Disposition):
    """This message arrived early: what it needs is not there yet.

    Nak'ed with the reaction's park delay (``delay`` overrides it) so it is
    released later and tried again; once the message is older than
    ``ReactionBudget.park_for`` it is dead-lettered.
    """

    kind = "park"

    def __init__(self, reason: str, detail: str = "", *, delay: timedelta | None = None) -> None:
        super().__init__(reason, detail)
        self.delay = delay


class Terminal(Disposition):
    """This message can never apply: dead-letter it and terminate the frame.

    To answer the producer instead (a typed rejection), emit the rejection
    and return normally: the rejection commits and the frame is acked.
    """

    kind = "terminal"


class PrincipalUnresolved(Terminal):
    """``cx.principal`` was read but no principal was resolved for the
    sender (no resolver registered, or it answered None).

    Terminal: let it propagate. A reaction that needs no sender reads
    ``cx.try_principal`` instead.
    """

    def __init__(self, detail: str = "") -> None:
        super().__init__(
            "principal_unresolved",
            detail or "no principal was resolved for the sender of this message",
        )


# -- the frame in hand -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReactionDelivery:
    """One identified inbound frame as a reaction sees it: which reaction,
    the message, its subject and its JetStream delivery count (1 on the
    first delivery)."""

    reaction: str
    incoming: Incoming
    subject: str
    delivered: int


# -- budgets -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReactionBudget:
    """The bounds one reaction's frames are routed against.

    ``max_deliveries``: a `Retry` on the delivery that reaches it is
    dead-lettered (the poison budget; JetStream's ``max_deliver`` stays
    unlimited and this is enforced in code). ``retry_backoff`` /
    ``retry_backoff_cap``: the nak delay after delivery n is
    ``retry_backoff * 2**(n-1)``, capped; the same backoff paces retryable
    database faults (a lock timeout, a lost connection), which never spend
    the budget. ``park_delay``: the nak delay of a `Park`. ``park_for``: a
    parked message older than this (by its stream timestamp) is
    dead-lettered.
    """

    max_deliveries: int = 10
    retry_backoff: timedelta = timedelta(seconds=1)
    retry_backoff_cap: timedelta = timedelta(seconds=60)
    park_delay: timedelta = timedelta(seconds=30)
    park_for: timedelta = timedelta(hours=1)

    def __post_init__(self) -> None:
        problems = [
            relation
            for ok, relation in (
                (self.max_deliveries >= 1, "max_deliveries >= 1"),
                (self.retry_backoff > timedelta(0), "retry_backoff > 0"),
                (self.retry_backoff_cap >= self.retry_backoff,
                 "retry_backoff_cap >= retry_backoff"),
                (self.park_delay > timedelta(0), "park_delay > 0"),
                (self.park_for >= self.park_delay, "park_for >= park_delay"),
            )
            if not ok
        ]
        if problems:
            raise ConfigError("invalid ReactionBudget: violated: " + "; ".join(problems))


def backoff_delay(delivered: int, base: timedelta, cap: timedelta) -> float:
    """Seconds to wait before delivery ``delivered + 1``: ``base * 2**(delivered-1)``,
    capped at ``cap``."""
    exponent = min(max(delivered - 1, 0), 32)
    return min(base.total_seconds() * float(1 << exponent), cap.total_seconds())


def is_terminal_sqlstate(sqlstate: str | None) -> bool:
    """A data exception (class 22) or an integrity violation (class 23):
    the same message fails the same way on every delivery."""
    return sqlstate is not None and sqlstate[:2] in ("22", "23")


# -- verdicts ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    """The effect committed (or the frame was a no-op replay): ack it."""

    why: str = "applied"


@dataclass(frozen=True, slots=True)
class Nak:
    """Redeliver after ``delay`` seconds (a `Retry`, a `Park`, or a
    retryable fault); ``reason`` says why, for the log."""

    delay: float
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetterIt:
    """Record a dead letter, then terminate the frame (nak it if the
    record cannot be written)."""

    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Term:
    """The dead letter is durably written: terminate the frame."""

    reason: str


RouteDecision: TypeAlias = Ack | Nak | DeadLetterIt
"""What the handling of a frame came to."""

Settlement: TypeAlias = Ack | Nak | Term
"""What the consume loop does with a frame: ack, nak (with a delay) or term."""


def route(
    disposition: Disposition, *, delivered: int, age: timedelta | None, budget: ReactionBudget
) -> Nak | DeadLetterIt:
    """Route a handler's disposition against ``budget``.

    ``delivered`` is the JetStream delivery count of the frame in hand,
    ``age`` how long ago the message was stored (None when unknown).
    """
    if isinstance(disposition, Retry):
        if delivered >= budget.max_deliveries:
            return DeadLetterIt(
                "retry_budget_spent",
                f"still retrying after {delivered} deliveries "
                f"(max_deliveries={budget.max_deliveries}): {disposition}",
            )
        delay = (
            disposition.delay.total_seconds() if disposition.delay is not None
            else backoff_delay(delivered, budget.retry_backoff, budget.retry_backoff_cap)
        )
        return Nak(delay, disposition.reason, disposition.detail)
    if isinstance(disposition, Park):
        if age is not None and age >= budget.park_for:
            return DeadLetterIt(
                "park_budget_spent",
                f"still parked {age.total_seconds():.1f}s after it was published "
                f"(park_for={budget.park_for.total_seconds():g}s): {disposition}",
            )
        delay = (disposition.delay or budget.park_delay).total_seconds()
        return Nak(delay, disposition.reason, disposition.detail)
    return DeadLetterIt(disposition.reason, disposition.detail)
