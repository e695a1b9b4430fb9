"""The declaration of an inbound reaction: a handler of the pipeline's
`Reaction` context bound to one inbound subject.

Declare a reaction with `InboundReaction.command` (a command addressed to
this service) or `InboundReaction.event` (a fact another service
publishes) and register it with ``Engine.register_reaction``::

    async def create_card(cx: Reaction[Principal], command: CreateCard) -> None:
        ...                                   # the same pipeline as a mutation
        cx.emit(CardCreated(card_id=command.card_id))

    engine.register_reaction(InboundReaction.command(
        "create_card", aggregate="card", verb="create",
        payload=CreateCard, handler=create_card,
    ))

Each reaction gets one durable consumer on the gitops-declared
``INTEGRATION_CMD`` / ``INTEGRATION_EVT`` stream (`COMMAND_STREAM`,
`EVENT_STREAM`); the pull loop that runs it is `inbound.consumer`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from ..failures import ConfigError
from ..messaging.envelope import EnvelopeError, check_token, command_subject, event_subject
from ..messaging.reactions import ReactionBudget
from ..pipeline.contexts import Reaction

__all__ = ["COMMAND_STREAM", "EVENT_STREAM", "InboundReaction", "ReactionHandler"]

PayloadT = TypeVar("PayloadT", bound=BaseModel)

COMMAND_STREAM = "INTEGRATION_CMD"
"""The gitops-declared stream of ``integration.cmd.>``."""
EVENT_STREAM = "INTEGRATION_EVT"
"""The gitops-declared stream of ``integration.evt.>``."""

_REACTION_NAME = re.compile(r"^[A-Za-z0-9_]+$")

ReactionHandler = Callable[[Reaction[Any], PayloadT], Awaitable[object]]
"""``async def handler(cx: Reaction[P], payload: Payload) -> None | Disposition``."""


@dataclass(frozen=True, slots=True)
class InboundReaction(Generic[PayloadT]):
    """A reaction to one kind of inbound message.

    Build one with `command` or `event`. ``name`` names the durable (with
    the service: ``{service}-{name}``) and the reaction's claims, watermarks
    and dead letters: renaming it starts a new durable from the start of
    the stream. ``budget`` bounds `Retry` and `Park`; ``concurrency`` is how
    many of its frames one pod handles at once (capped by
    ``max_ack_pending``; 1 handles them one at a time).
    """

    name: str
    kind: Literal["command", "event"]
    service: str | None
    aggregate: str
    action: str
    payload: type[PayloadT]
    handler: ReactionHandler[PayloadT]
    budget: ReactionBudget = field(default_factory=ReactionBudget)
    concurrency: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _REACTION_NAME.match(self.name):
            raise ConfigError(f"a reaction name is [A-Za-z0-9_]+, not {self.name!r}")
        try:
            check_token(self.aggregate, "aggregate")
            check_token(self.action, "verb" if self.kind == "command" else "fact")
            if self.service is not None:
                check_token(self.service, "service")
        except EnvelopeError as exc:
            raise ConfigError(f"reaction {self.name}: {exc}") from exc
        if self.concurrency < 1:
            raise ConfigError(f"reaction {self.name}: concurrency must be >= 1")
        if not (isinstance(self.payload, type) and issubclass(self.payload, BaseModel)):
            raise ConfigError(f"reaction {self.name}: payload must be a pydantic model class")

    @classmethod
    def command(
        cls,
        name: str,
        *,
        aggregate: str,
        verb: str,
        payload: type[PayloadT],
        handler: ReactionHandler[PayloadT],
        service: str | None = None,
        budget: ReactionBudget | None = None,
        concurrency: int = 16,
    ) -> InboundReaction[PayloadT]:
        """React to ``integration.cmd.{service}.{aggregate}.{verb}``, the
        commands addressed to ``service`` (default: the engine's own)."""
        return cls(
            name, "command", service, aggregate, verb, payload, handler,
            budget or ReactionBudget(), concurrency,
        )

    @classmethod
    def event(
        cls,
        name: str,
        *,
        producer: str,
        aggregate: str,
        fact: str,
        payload: type[PayloadT],
        handler: ReactionHandler[PayloadT],
        budget: ReactionBudget | None = None,
        concurrency: int = 16,
    ) -> InboundReaction[PayloadT]:
        """React to ``integration.evt.{producer}.{aggregate}.{fact}``."""
        return cls(
            name, "event", producer, aggregate, fact, payload, handler,
            budget or ReactionBudget(), concurrency,
        )

    @property
    def stream(self) -> str:
        """The integration stream the reaction's durable lives on."""
        return COMMAND_STREAM if self.kind == "command" else EVENT_STREAM

    def subject(self, own_service: str | None) -> str:
        """The exact filter subject. A command reaction naming no service
        takes ``own_service``; raises `ConfigError` when neither is set."""
        if self.kind == "event":
            assert self.service is not None
            return event_subject(self.service, self.aggregate, self.action)
        service = self.service or own_service
        if not service:
            raise ConfigError(
                f"command reaction {self.name} names no service and EngineConfig.service "
                "is not set: the commands addressed to whom?"
            )
        return command_subject(service, self.aggregate, self.action)

    def durable(self, own_service: str | None) -> str:
        """The durable every pod of ``own_service`` binds: ``{service}-{name}``
        (the reaction name holds no ``-``, so the pair is unambiguous)."""
        return f"{own_service}-{self.name}" if own_service else self.name
