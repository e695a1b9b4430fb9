"""Handler contexts: what a mutation or reaction handler may do, over one `Ops`.

A handler receives a context bound to the pipeline's open transaction::

    async def increment(cx: Mutation[Principal], key: str) -> None:
        counter = await cx.load(Counter, key)      # advisory lock, lock, load
        cx.require(counter.can_increment)          # the gate, in deny mode
        counter.increment(cx.principal.id)         # the domain command
        await cx.save(counter)                     # the store writes (style-agnostic)
        cx.impact("counter", key)                  # staged, sent at commit

Nothing a context stages is visible before the commit, and everything is
discarded when the handler raises. Reads and writes go through the
aggregate's ``Store``; database errors arrive as engine types
(`DatabaseError` subclasses) and leave the transaction unusable, so let
them propagate.

Every context sends integration messages with the transaction:
``cx.emit(event)``, ``cx.command(command)`` (outbox rows, published after the
commit) and ``cx.schedule_at(at, message)`` (published once ``at`` passes).

`Mutation` adds the acting ``principal`` and `Mutation.require`; `Bulk` adds
`Bulk.impact_all`; `Reaction` (an inbound NATS message) adds the frame in
hand: ``delivered``, the sender's ``metadata`` / ``actor`` and its resolved
``principal`` / ``try_principal``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from ..clock import Timestamp
from ..config import EngineConfig
from ..db.types import Conn
from ..gates import BoundGate
from ..impacts.model import Impact, ImpactKind, JsonValue
from ..messaging.envelope import Actor, Envelope, EventMetadata
from ..messaging.reactions import PrincipalUnresolved, ReactionDelivery
from .ops import Ops

__all__ = ["Bulk", "Mutation", "PresenceWriter", "Reaction", "principal_actor"]

P = TypeVar("P")


def principal_actor(principal: object) -> Actor | None:
    """The passport actor a principal exposes, as an envelope `Actor`.

    A principal exposes one through an ``actor`` attribute holding an
    `Actor`, or a uuid (a `uuid.UUID` or its text) together with an
    optional ``kind`` (``"person"``, the default, or ``"service"``). None
    when it exposes none: the service identity acts instead.
    """
    if isinstance(principal, Actor):
        return principal
    actor = getattr(principal, "actor", None)
    if isinstance(actor, Actor):
        return actor
    if isinstance(actor, uuid.UUID):
        ident = actor
    elif isinstance(actor, str):
        try:
            ident = uuid.UUID(actor)
        except ValueError:
            return None
    else:
        return None
    kind = getattr(principal, "kind", "person")
    return Actor(kind="service" if kind == "service" else "person", id=ident)


class PresenceWriter(Protocol):
    """A presence lane's writer (``Engine.register_presence`` returns one)."""

    def stage(self, key: str, value: JsonValue) -> Callable[[], Awaitable[bool]]: ...


_log = logging.getLogger(__name__)


class Mutation(Ops, Generic[P]):
    """The context of a GraphQL mutation (or any command with an acting principal).

    Messages it sends (``emit`` / ``command`` / ``schedule_at``) carry the
    principal's passport actor (`principal_actor`), else the service identity.
    """

    def __init__(self, conn: Conn, config: EngineConfig, now: Timestamp, principal: P) -> None:
        super().__init__(conn, config, now)
        self.principal = principal

    def _acting_actor(self) -> Actor:
        return principal_actor(self.principal) or super()._acting_actor()

    def require(self, gate: BoundGate[P]) -> None:
        """The deny check: run ``gate`` for this principal; raise `Refused`
        (answered with the gate's `Reason` code) unless it allows."""
        gate.require(self.principal)

    def present(self, presence: PresenceWriter, key: str, value: JsonValue) -> None:
        """Put ``value`` under ``key`` in ``presence``'s lane once this
        mutation commits (a rolled-back mutation presents nothing).

        The key and value are checked now (`InvalidPresenceKey`,
        `InvalidPresenceValue`); the put itself is loss-tolerant: one NATS
        does not take is dropped and counted, never raised.
        """
        write = presence.stage(key, value)

        async def put() -> None:
            try:
                await write()
            except Exception as exc:
                _log.warning("presence put after commit failed: %s", exc)

        self._after_commit.append(put)


class Bulk(Mutation[P]):
    """A mutation that writes many rows of a noun at once.

    `impact_all` stages one projector-reset impact for the noun instead of
    one impact per key; the per-key impacts of that noun, staged before or
    after, are dropped. ``impacts_per_commit`` is checked at the flush, on
    what remains, so a bulk import that resets its noun is not refused.
    """

    _bulk = True

    def impact_all(self, noun: str) -> None:
        """Every key of ``noun`` may have changed: one reset at commit.
        Raises `UnwatchedNoun` for a noun no registered projector watches."""
        self._watched(Impact.reset(noun))  # validates the noun
        self._resets[noun] = None
        for impact in [i for i in self._impacts if i.kind is ImpactKind.ENTITY and i.noun == noun]:
            del self._impacts[impact]


class Reaction(Ops, Generic[P]):
    """The context of a reaction to one inbound NATS message.

    Adds the frame in hand: ``delivered`` (its JetStream delivery count, 1
    on the first delivery: bound your own retries with it), the sender's
    ``metadata`` and ``actor``, the ``envelope`` and its logical
    ``message_id``; and the sender as the service's own principal:
    ``principal`` (raises `PrincipalUnresolved`, terminal, when none was
    resolved) or ``try_principal`` (None then).

    Messages it sends carry the engine's own service identity as actor and
    the inbound message's correlation, with its envelope id as causation.
    """

    def __init__(
        self,
        conn: Conn,
        config: EngineConfig,
        now: Timestamp,
        delivery: ReactionDelivery,
        principal: P | None = None,
    ) -> None:
        super().__init__(conn, config, now)
        self.delivery = delivery
        self._principal = principal

    @property
    def delivered(self) -> int:
        """How many times JetStream delivered this frame (1 the first time)."""
        return self.delivery.delivered

    @property
    def metadata(self) -> EventMetadata:
        """The sender's metadata: actor, correlation and causation."""
        return self.delivery.incoming.metadata

    @property
    def actor(self) -> Actor:
        """Who sent the message (the sender's envelope actor)."""
        return self.delivery.incoming.metadata.actor

    @property
    def envelope(self) -> Envelope:
        """The whole inbound envelope (type, version, occurred_at, ...)."""
        return self.delivery.incoming.envelope

    @property
    def message_id(self) -> uuid.UUID:
        """The logical id the message is claimed under."""
        return self.delivery.incoming.message_id

    @property
    def principal(self) -> P:
        """The sender resolved by the engine's reaction-principal resolver;
        raises `PrincipalUnresolved` (terminal) when there is none."""
        if self._principal is None:
            raise PrincipalUnresolved(
                f"no principal resolved for sender {self.actor.kind} {self.actor.id}"
            )
        return self._principal

    @property
    def try_principal(self) -> P | None:
        """The resolved sender, or None."""
        return self._principal

    def _outbound_metadata(self) -> EventMetadata:
        if self._metadata is None:
            self._metadata = self.metadata.caused(
                self.delivery.incoming.envelope.envelope_id, self._acting_actor()
            )
        return self._metadata
