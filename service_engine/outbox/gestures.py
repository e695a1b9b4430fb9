"""What a handler's context does for integration messages: an event or a
command staged as an outbox row with the transaction, or scheduled for a
later instant (`MessageGestures`, a part of every pipeline context)."""

from __future__ import annotations

import functools
import uuid
from typing import cast

from ..clock import Timestamp
from ..config import EngineConfig
from ..failures import DeclarationError
from ..messaging.envelope import (
    Actor,
    EventMetadata,
    OutboundCommand,
    OutboundEvent,
    OutboundMessage,
    build_command,
    build_event,
    service_identity,
    stamp_sequence,
)
from .staging import OutboxRow

__all__ = ["MessageGestures"]


class MessageGestures:
    """``cx.emit``, ``cx.command``, ``cx.schedule_at``: one correlation for
    every message of the transaction; the actor is the service identity
    unless a context knows better (`_acting_actor`)."""

    _config: EngineConfig
    _now: Timestamp
    _outbox: list[OutboxRow]
    _messages: list[OutboundMessage]
    _scheduled_messages: list[tuple[Timestamp, OutboundMessage]]
    _metadata: EventMetadata | None

    def emit(self, event: OutboundEvent, *, event_id: uuid.UUID | None = None) -> uuid.UUID:
        """Publish ``event`` as an integration event once this transaction commits.

        The envelope (``integration.evt.{service}.{AGGREGATE}.{FACT}``) is
        staged as an outbox row written with the transaction: a rollback
        emits nothing, a commit publishes it exactly once. Returns its
        ``event_id``. Raises `SequenceWithoutService` when ``event`` declares
        a sequence and no service is configured, `ServiceRequired` when no
        service is configured at all (an event's subject names its
        producer), `EnvelopeError` for a payload that is not a JSON object.
        """
        service = self._config.service
        stamp_sequence(event.sequence(), service)  # refused before anything is built
        message = build_event(
            event, service=service, metadata=self._outbound_metadata(),
            occurred_at=self._now.value, event_id=event_id,
        )
        self._stage_message(message)
        return message.message_id

    def command(
        self, command: OutboundCommand, *, command_id: uuid.UUID | None = None
    ) -> uuid.UUID:
        """Send ``command`` to ``command.SERVICE`` once this transaction commits.

        Staged like `emit` on ``integration.cmd.{SERVICE}.{AGGREGATE}.{VERB}``;
        returns its ``command_id``. Raises `SequenceWithoutService` when it
        declares a sequence and no service (its producer) is configured.
        """
        service = self._config.service
        stamp_sequence(command.sequence(), service)
        message = build_command(
            command, service=service, metadata=self._outbound_metadata(),
            occurred_at=self._now.value, command_id=command_id,
        )
        self._stage_message(message)
        return message.message_id

    def schedule_at(
        self,
        at: Timestamp,
        message: OutboundEvent | OutboundCommand,
        *,
        message_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Publish ``message`` (an event, or a command: a payload declaring
        ``VERB``) once the database clock passes ``at``.

        Committed with the transaction as a scheduled-message row; the beat
        publishes it when due (``occurred_at`` is ``at``). Returns its
        envelope id. Raises as `emit` / `command` do.
        """
        service = self._config.service
        stamp_sequence(message.sequence(), service)
        metadata = self._outbound_metadata()
        built = (
            build_command(
                cast(OutboundCommand, message), service=service, metadata=metadata,
                occurred_at=at.value, command_id=message_id,
            )
            if _is_command(message)
            else build_event(
                cast(OutboundEvent, message), service=service, metadata=metadata,
                occurred_at=at.value, event_id=message_id,
            )
        )
        self._scheduled_messages.append((at, built))
        return built.message_id

    def _stage_message(self, message: OutboundMessage) -> None:
        self._outbox.append(OutboxRow.of(message))
        self._messages.append(message)

    def _outbound_metadata(self) -> EventMetadata:
        """The metadata of every message this transaction sends: one
        correlation for all of them."""
        if self._metadata is None:
            self._metadata = EventMetadata.originating(self._acting_actor())
        return self._metadata

    def _acting_actor(self) -> Actor:
        """Who acts: the engine's service identity, unless a context knows better."""
        return Actor(kind="service", id=_service_identity(self._config.service or ""))

    def _stage_outbox(self, row: OutboxRow) -> None:
        """Stage an outbox row (the integration layer's ``emit`` / ``command``)."""
        if not isinstance(row, OutboxRow):
            raise DeclarationError(f"expected an OutboxRow, got {row!r}")
        self._outbox.append(row)



@functools.lru_cache(maxsize=64)
def _service_identity(service: str) -> uuid.UUID:
    """`service_identity`, computed once per service name (a v5 uuid on
    every message a reaction sends is measurable in the inbound loop)."""
    return service_identity(service)


def _is_command(message: object) -> bool:
    return hasattr(type(message), "VERB")
