"""Integration over NATS JetStream, as a service author declares it: the
envelope (`IntegrationEvent`, `IntegrationCommand`, `EventMetadata`,
`Actor`) and its subjects, what a transaction stages for the outbox
(`stage_outbox_row`, `stage_scheduled`, `OutboundEvent`,
`OutboundCommand`, `DeclaredSequence`), inbound reactions and their
dispositions (`InboundReaction`, `Retry`, `Park`, `Terminal`,
`ReactionBudget`), crons (`Cron`, `Tick`), direct publishes and their
outcomes (`Nats`, `PublishOutcome`), and the dead letters.

The loops themselves are the engine's own, each in its feature's folder
(the outbox relay, the scheduled publisher, the inbound consumers and
dispatch, cron, NATS health); this package's component composes them."""

from ..beat.cron import Cron, Tick
from ..inbound.declaration import InboundReaction
from ..messaging.dead_letters import DEAD_LETTER_NOUN, DeadLetter, DeadLetters, DeadLetterSource
from ..messaging.envelope import (
    Actor,
    DeclaredSequence,
    EventMetadata,
    IntegrationCommand,
    IntegrationEvent,
    OutboundCommand,
    OutboundEvent,
    SequenceWithoutService,
    command_subject,
    event_subject,
)
from ..messaging.nats import (
    Acked,
    BucketMissing,
    Duplicate,
    KvBucket,
    KvKey,
    Nats,
    NatsUnavailable,
    PublishOutcome,
    Rejected,
    StreamMissing,
    Unanswered,
    open_nats,
)
from ..messaging.reactions import (
    Disposition,
    Park,
    PrincipalUnresolved,
    ReactionBudget,
    Retry,
    Terminal,
)
from ..outbox.staging import stage_outbox_row
from ..scheduled.staging import stage_scheduled

__all__ = [
    "DEAD_LETTER_NOUN",
    "Acked",
    "Actor",
    "BucketMissing",
    "Cron",
    "DeadLetter",
    "DeadLetterSource",
    "DeadLetters",
    "DeclaredSequence",
    "Disposition",
    "Duplicate",
    "EventMetadata",
    "InboundReaction",
    "IntegrationCommand",
    "IntegrationEvent",
    "KvBucket",
    "KvKey",
    "Nats",
    "NatsUnavailable",
    "OutboundCommand",
    "OutboundEvent",
    "Park",
    "PrincipalUnresolved",
    "PublishOutcome",
    "ReactionBudget",
    "Rejected",
    "Retry",
    "SequenceWithoutService",
    "StreamMissing",
    "Terminal",
    "Tick",
    "Unanswered",
    "command_subject",
    "event_subject",
    "open_nats",
    "stage_outbox_row",
    "stage_scheduled",
]
