"""One inbound frame of one reaction, from bytes to its settlement.

`ReactionRunner.handle` identifies the envelope (none: a dead letter and a
Term), decodes the payload, runs the reaction through the write pipeline
under its claim and sequence guard (`run_reaction`) and answers what the
consume loop does with the frame: `Ack` once the effect (or a replay, or a
stale no-op) committed, `Nak` with a delay for a `Retry`, a `Park` or a
retryable fault, `Term` once the dead letter is durably written, and `Nak`
again when it cannot be. `classify_failure` is the one place a reaction's
failure is judged. No NATS types here: the loop hands a `InboundFrame`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from ..clock import Clock, SystemClock
from ..config import EngineConfig
from ..db.errors import DatabaseError, Stage
from ..db.pool import Database
from ..db.types import Conn
from ..failures import ConfigError, EngineError
from ..gates import Refused
from ..logs import in_message
from ..messaging.dead_letters import DeadLetter, DeadLetters, DeadLetterSource
from ..messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    EnvelopeError,
    PayloadMismatch,
    Unidentified,
    decode_payload,
    identify,
)
from ..messaging.reactions import (
    Ack,
    DeadLetterIt,
    Disposition,
    Nak,
    Park,
    ReactionBudget,
    ReactionDelivery,
    Settlement,
    Term,
    backoff_delay,
    is_terminal_sqlstate,
    route,
)
from ..metrics import Metrics
from ..pipeline.outcomes import ANSWERED
from ..pipeline.reaction import ReactionPrincipal, Replayed, Stale, run_reaction
from ..pipeline.run import StageHook

if TYPE_CHECKING:
    from ..inbound.declaration import InboundReaction

__all__ = [
    "InboundFrame",
    "InboundHook",
    "InboundPoint",
    "ReactionRunner",
    "classify_failure",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InboundFrame:
    """One inbound frame as the runner sees it (no NATS types)."""

    subject: str
    data: bytes
    headers: Mapping[str, str]
    delivered: int
    published_at: datetime | None = None


class InboundPoint(enum.Enum):
    """Where an `InboundHook` is called."""

    BEFORE_COMMIT = "before_commit"
    """The effect is written, the transaction not yet committed."""
    COMMITTED = "committed"
    """The effect committed; the frame is not acked yet."""


class InboundHook(Protocol):
    """The inbound fault-injection seam (tests only): called at each
    `InboundPoint` of a frame that runs its reaction."""

    async def __call__(self, point: InboundPoint, reaction: str, message_id: uuid.UUID) -> None: ...


def classify_failure(
    exc: BaseException, *, delivered: int, age: timedelta | None, budget: ReactionBudget
) -> Nak | DeadLetterIt:
    """Route what a reaction raised: a database fault on the engine's own
    authority (class 22/23 terminal, a retryable one naked), a disposition
    against the budget, anything else terminal."""
    if isinstance(exc, DatabaseError):
        if is_terminal_sqlstate(exc.sqlstate):
            violation = (
                "integrity_violation" if exc.sqlstate and exc.sqlstate.startswith("23")
                else "data_exception"
            )
            return DeadLetterIt(violation, f"{exc} (SQLSTATE {exc.sqlstate})")
        if exc.retryable:
            delay = backoff_delay(delivered, budget.retry_backoff, budget.retry_backoff_cap)
            return Nak(delay, exc.code, str(exc))
        return DeadLetterIt(exc.code, str(exc))
    if isinstance(exc, Disposition):
        return route(exc, delivered=delivered, age=age, budget=budget)
    if isinstance(exc, Refused):
        return DeadLetterIt(f"refused:{exc.reason.code}", str(exc))
    if isinstance(exc, _TERMINAL):
        # The engine's own terminal faults, dead-lettered under their code.
        return DeadLetterIt(exc.code, f"{type(exc).__name__}: {exc}")
    return DeadLetterIt("handler_error", f"{type(exc).__name__}: {exc}")


_TERMINAL: tuple[type[EngineError], ...] = (*ANSWERED, EnvelopeError, ConfigError)
"""What a reaction dead-letters under the error's own ``code``: the answered
errors of the one table (`ANSWERED`) and, on a reaction's own authority, a
bad envelope or configuration."""


def _header_uuid(headers: Mapping[str, str]) -> uuid.UUID | None:
    for name in (HEADER_MESSAGE_ID, HEADER_NATS_MSG_ID):
        try:
            return uuid.UUID(headers[name])
        except (KeyError, ValueError):
            continue
    return None


class ReactionRunner:
    """Turns one frame of one reaction into its `Settlement`, writing the
    effect (or the dead letter) on the way. Never raises but for cancellation."""

    def __init__(
        self,
        reaction: InboundReaction[Any],
        db: Database,
        config: EngineConfig,
        dead_letters: DeadLetters,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        principal: ReactionPrincipal | None = None,
        hook: InboundHook | None = None,
        nouns: Collection[str] | None = None,
    ) -> None:
        self.reaction = reaction
        self.nouns = nouns
        self.db = db
        self.config = config
        self.dead_letters = dead_letters
        self.clock = clock or SystemClock()
        self.metrics = metrics
        self.principal = principal
        self.hook = hook

    async def handle(self, frame: InboundFrame) -> Settlement:
        """Handle one frame; answer what the consume loop does with it."""
        message_id = _header_uuid(frame.headers)
        if message_id is None:
            return await self._handle(frame)
        with in_message(str(message_id)):  # every line logged for this message
            return await self._handle(frame)

    async def _handle(self, frame: InboundFrame) -> Settlement:
        name = self.reaction.name
        identified = identify(frame.data, frame.headers)
        if isinstance(identified, Unidentified):
            _log.error(
                "reaction %s: refused a frame on %s at identify (%s): %s",
                name, frame.subject, identified.reason, identified.detail,
            )
            return await self._dead_letter(
                frame, DeadLetterIt(identified.reason, identified.detail),
                identified.dead_letter_id(name), _header_uuid(frame.headers),
            )
        try:
            payload = decode_payload(identified, self.reaction.payload)
        except PayloadMismatch as exc:
            _log.error("reaction %s: message %s: %s", name, identified.message_id, exc)
            return await self._dead_letter(
                frame, DeadLetterIt("payload_mismatch", str(exc)),
                identified.dead_letter_id(name), identified.message_id,
            )
        delivery = ReactionDelivery(name, identified, frame.subject, frame.delivered)
        try:
            outcome = await run_reaction(
                self.db, self.config, delivery, payload, self.reaction.handler,
                clock=self.clock, resolve_principal=self.principal, metrics=self.metrics,
                hook=self._stage_hook(identified.message_id), nouns=self.nouns,
            )
        except Exception as exc:
            verdict = classify_failure(
                exc, delivered=frame.delivered, age=self._age(frame),
                budget=self.reaction.budget,
            )
            if isinstance(verdict, Nak):
                self._log_nak(identified.message_id, frame, verdict, exc)
                return verdict
            self._log_terminal(identified.message_id, frame, verdict, exc)
            return await self._dead_letter(
                frame, verdict, identified.dead_letter_id(name), identified.message_id
            )
        if self.hook is not None:
            await self.hook(InboundPoint.COMMITTED, name, identified.message_id)
        if isinstance(outcome, Replayed):
            _log.info(
                "reaction %s: message %s was claimed before; re-emitted %d confirmation(s)",
                name, identified.message_id, outcome.confirmations,
            )
            return Ack("replayed")
        if isinstance(outcome, Stale):
            _log.info("reaction %s: message %s is behind its sequence watermark (no-op)",
                      name, identified.message_id)
            return Ack("stale")
        return Ack("applied")

    def _stage_hook(self, message_id: uuid.UUID) -> StageHook | None:
        hook = self.hook
        if hook is None:
            return None
        name = self.reaction.name

        async def at_stage(stage: Stage, conn: Conn) -> None:
            if stage is Stage.COMMIT:
                await hook(InboundPoint.BEFORE_COMMIT, name, message_id)

        return at_stage

    def _age(self, frame: InboundFrame) -> timedelta | None:
        if frame.published_at is None:
            return None
        return datetime.now(UTC) - frame.published_at

    def _log_nak(
        self, message_id: uuid.UUID, frame: InboundFrame, verdict: Nak, exc: BaseException
    ) -> None:
        if isinstance(exc, Park):
            _log.info(
                "reaction %s: message %s parked (delivery %d, released in %.1fs): %s",
                self.reaction.name, message_id, frame.delivered, verdict.delay, exc,
            )
            return
        # A retryable fault is logged at warn with its chain: a transient blip
        # does not read as a hard error on every redelivery.
        _log.warning(
            "reaction %s: message %s not applied (delivery %d), redelivered in %.1fs: %s",
            self.reaction.name, message_id, frame.delivered, verdict.delay, exc,
            exc_info=None if isinstance(exc, Disposition) else exc,
        )

    def _log_terminal(
        self, message_id: uuid.UUID, frame: InboundFrame, verdict: DeadLetterIt, exc: BaseException
    ) -> None:
        _log.error(
            "reaction %s: message %s is terminal (delivery %d, %s): %s",
            self.reaction.name, message_id, frame.delivered, verdict.reason, verdict.detail,
            exc_info=None if isinstance(exc, Disposition) else exc,
        )

    async def _dead_letter(
        self, frame: InboundFrame, verdict: DeadLetterIt, letter_id: uuid.UUID,
        message_id: uuid.UUID | None,
    ) -> Term | Nak:
        letter = DeadLetter.for_message(
            letter_id, DeadLetterSource.REACTION, self.reaction.name,
            reason=verdict.reason, detail=verdict.detail, subject=frame.subject,
            payload=frame.data, headers=frame.headers, message_id=message_id,
            attempts=frame.delivered,
        )
        try:
            async with asyncio.timeout(self.config.ack_wait.total_seconds() / 2):
                await self.dead_letters.record_work(letter)
        except Exception as exc:
            budget = self.reaction.budget
            delay = backoff_delay(frame.delivered, budget.retry_backoff, budget.retry_backoff_cap)
            # Never Term a frame whose dead letter is not durable: the broker
            # keeps redelivering it (max_deliver is unlimited) until it is.
            _log.warning(
                "reaction %s: could not record the dead letter of a frame on %s (%s); "
                "nak'ing it, redelivered in %.1fs: %s",
                self.reaction.name, frame.subject, verdict.reason, delay, exc, exc_info=exc,
            )
            return Nak(delay, "dead_letter_unwritable", str(exc))
        return Term(verdict.reason)
