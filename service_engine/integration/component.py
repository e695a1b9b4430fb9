"""The integration component: crons, reactions, the outbox and the broker's health.

`Integration` is what `Engine` composes for the integrate flow: the crons
(every engine), and with a NATS connection the broker's health, the outbox
relay (on the beat and on every commit's wake-up), the scheduled messages
and the inbound consumers of the registered reactions, each under its own
`ConsumerSupervisor`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ..beat.component import BeatStep
from ..beat.cron import Cron, CronScheduler
from ..beat.leader import LeaderLease
from ..config import EngineConfig
from ..db.pool import Database
from ..failures import ConfigError, DuplicateRegistration, EngineError
from ..inbound.consumer import InboundConsumer
from ..inbound.declaration import InboundReaction
from ..inbound.dispatch import InboundHook, ReactionRunner
from ..inbound.health import ConsumerSupervisor, InboundHealth
from ..messaging.dead_letters import DeadLetters
from ..messaging.nats import Nats
from ..messaging.nats_health import NatsHealth
from ..metrics import Metrics
from ..outbox.relay import (
    OUTBOX_SLOT,
    OutboxBounds,
    OutboxRelay,
    check_message_retention,
    outbox_relay,
)
from ..pipeline.reaction import ReactionPrincipal
from ..readiness import ReadinessHandle
from ..scheduled.publisher import ScheduledBounds, ScheduledPublisher
from ..supervisor import Worker

__all__ = ["REASON_INBOUND_BOOT", "Integration"]

REASON_INBOUND_BOOT = "inbound_boot"

_log = logging.getLogger(__name__)


class Integration:
    """Crons, reactions, outbox and scheduled messages of one pod."""

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        nats: Nats | None,
        readiness: ReadinessHandle,
        metrics: Metrics,
        dead_letters: DeadLetters,
        *,
        outbox_wake: asyncio.Event,
        nouns: set[str],
    ) -> None:
        self._db = db
        self._config = config
        self._nats = nats
        self._readiness = readiness
        self._metrics = metrics
        self._dead_letters = dead_letters
        self._outbox_wake = outbox_wake
        self._nouns = nouns
        self._started = False
        self.crons = CronScheduler(db, dead_letters, holder=config.pod_id, service=config.service)
        self.nats_health: NatsHealth | None = None
        self.outbox: OutboxRelay | None = None
        self.scheduled: ScheduledPublisher | None = None
        # The relay never blocks the beat for long: each pass is bounded and
        # skipped outright while the broker is unreachable. Between beats a
        # commit that staged outbox rows wakes it (`_outbox_wakeups`).
        self._outbox_pass = asyncio.Lock()
        if nats is not None:
            self.nats_health = NatsHealth(nats, readiness, metrics, grace=config.nats_grace)
            self.outbox = outbox_relay(
                config.outbox_discipline, db, nats, dead_letters,
                LeaderLease(db, OUTBOX_SLOT, config.pod_id, config.lease),
                metrics=metrics,
                bounds=OutboxBounds(
                    drain_bound=config.outbox_drain_bound,
                    max_attempts=config.outbox_max_attempts,
                    message_retention=config.message_retention,
                    sweep_every=config.outbox_sweep_every,
                ),
            )
            self.scheduled = ScheduledPublisher(
                db, nats, dead_letters,
                bounds=ScheduledBounds(max_attempts=config.scheduled_max_attempts),
            )
        self.reactions: dict[str, InboundReaction[Any]] = {}
        self.reaction_principal: ReactionPrincipal | None = None
        self.inbound_hook: InboundHook | None = None
        self.inbound: dict[str, ConsumerSupervisor] = {}
        """The running inbound consumers' supervisors, by reaction (after `start`)."""
        self.inbound_health: InboundHealth | None = None

    def register_cron(self, cron: Cron) -> None:
        """Fire ``cron`` once per slot across every pod of the service."""
        self.crons.register(cron)

    def register_reaction(self, reaction: InboundReaction[Any]) -> None:
        """Consume ``reaction``'s messages from `run` on, on one durable every
        pod shares. Raises `DuplicateRegistration` for a name already
        registered, `ConfigError` when the engine has no NATS connection, the
        reaction is a command reaction and no service is configured, or
        `run` has already started."""
        if self._nats is None:
            raise ConfigError(
                f"reaction {reaction.name} needs NATS: boot the engine with a Nats connection"
            )
        if self._started:
            raise ConfigError(f"reaction {reaction.name}: register reactions before run()")
        if reaction.name in self.reactions:
            raise DuplicateRegistration("reaction", reaction.name)
        reaction.subject(self._config.service)  # a command reaction needs a service
        self.reactions[reaction.name] = reaction

    def register_reaction_principal(self, resolver: ReactionPrincipal) -> None:
        """How a reaction's sender becomes the service's own principal:
        ``resolver(actor)`` (sync or async) answers the principal, or None
        for a sender it does not know (``cx.principal`` then raises
        `PrincipalUnresolved`). `DuplicateRegistration` for a second one."""
        if self.reaction_principal is not None:
            raise DuplicateRegistration("reaction principal", "resolver")
        self.reaction_principal = resolver

    def set_inbound_hook(self, hook: InboundHook | None) -> None:
        """The inbound fault-injection seam (tests only; before `run`)."""
        self.inbound_hook = hook

    async def start(self) -> None:
        """Check the retention rule and bind every reaction's durable, then
        put each consumer under its own supervisor. A refusal (a missing
        stream, a retention below a stream's max_age, a durable JetStream
        refuses) raises and holds readiness DOWN."""
        self._started = True
        if not self.reactions:
            return
        assert self._nats is not None
        nats, config = self._nats, self._config
        try:
            await check_message_retention(
                nats, config.message_retention, {r.stream for r in self.reactions.values()}
            )
            consumers = []
            for reaction in self.reactions.values():
                runner = ReactionRunner(
                    reaction, self._db, config, self._dead_letters, metrics=self._metrics,
                    principal=self.reaction_principal, hook=self.inbound_hook,
                    nouns=self._nouns,
                )
                consumer = InboundConsumer(reaction, runner, nats, config)
                await consumer.bind()
                consumers.append(consumer)
        except EngineError as exc:
            self._readiness.set_down(REASON_INBOUND_BOOT, f"{type(exc).__name__}: {exc}")
            raise
        self.inbound_health = InboundHealth(self._readiness, self._metrics)
        for consumer in consumers:
            self.inbound[consumer.reaction.name] = ConsumerSupervisor(
                consumer, self.inbound_health,
                threshold=config.inbound_failure_threshold,
                backoff=config.inbound_restart_backoff,
                backoff_cap=config.inbound_restart_backoff_cap,
            )

    def tasks(self) -> Mapping[str, Worker]:
        tasks: dict[str, Worker] = {}
        if self.nats_health is not None:
            tasks["nats_health"] = self.nats_health.run
        if self.outbox is not None:
            tasks["outbox_wakeups"] = self._outbox_wakeups
        for name, supervisor in self.inbound.items():
            tasks[f"inbound:{name}"] = supervisor.run
        return tasks

    def beat_steps(self) -> Mapping[str, BeatStep]:
        steps: dict[str, BeatStep] = {"cron": self.crons.beat}
        if self.outbox is not None:
            steps["outbox"] = self._outbox_beat
        if self.scheduled is not None:
            steps["scheduled_messages"] = self.scheduled.beat
        return steps

    async def aclose(self) -> None:
        if self.outbox is not None:
            # Hand the relay's lease over now rather than at its expiry.
            await self.outbox.aclose()

    async def _outbox_beat(self) -> None:
        assert self.outbox is not None
        async with self._outbox_pass:
            await self.outbox.beat()

    async def _outbox_wakeups(self) -> None:
        """Publish as soon as a commit staged outbox rows (the NOTIFY on
        `OUTBOX_CHANNEL`). Best effort: a failed pass is logged and the beat,
        which reports failures to readiness, retries it."""
        assert self.outbox is not None
        wake = self._outbox_wake
        while True:
            await wake.wait()
            wake.clear()
            try:
                async with self._outbox_pass:
                    await self.outbox.wake()
            except Exception as exc:
                _log.warning("outbox pass on wake-up failed: %s", exc)
