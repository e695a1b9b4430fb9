"""Engine: boot, the register_* seams, run under supervision, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection
from datetime import timedelta
from typing import Any

from .blobs.model import BlobKind, BlobPolicy, DownloadUrl
from .blobs.runtime import BlobRuntime
from .blobs.store import BlobStoreConfig
from .clock import SystemClock
from .config import EngineConfig
from .db.pool import Database, IdleConnections
from .db.posture import assert_posture
from .db.schema_version import Claim, VersionIdentity, claim_at_boot, claim_schema_version
from .erasure import Erasable, Eraser, ErasureResult
from .failures import (
    ConfigError,
    DuplicateRegistration,
    EngineError,
    ListenerProbeFailed,
    ShuttingDown,
    WorkerStopped,
)
from .impacts.model import JsonValue
from .impacts.transport import PgListenNotify, fire_due
from .integration.cron import Cron, CronScheduler
from .integration.dispatch import InboundHook, ReactionRunner
from .integration.health import NatsHealth
from .integration.inbound import InboundConsumer
from .integration.inbound_health import ConsumerSupervisor, InboundHealth
from .integration.outbox import (
    OUTBOX_SLOT,
    OutboxBounds,
    OutboxRelay,
    check_message_retention,
    outbox_relay,
)
from .integration.scheduled import ScheduledBounds, ScheduledPublisher
from .lanes.accumulator import Accumulator, Durable, Folded
from .lanes.accumulators import Accumulators
from .lanes.ingress import IngressSupervisor, LaneIngress, bind_lane_stream
from .lanes.notices import LaneNotices, LaneNoticeStream
from .lanes.presence import (
    PRESENCE_LANE,
    PresenceProjector,
    PresenceWithoutNats,
    PresenceWithoutService,
)
from .lanes.presence_lane import PresenceHandle, PresenceLanes
from .leader import LeaderLease
from .memory import (
    RELEASE_FOLLOW_UP,
    ReleaseAfterClose,
    release_free_memory,
)
from .messaging.dead_letters import DeadLetters, DeadLetterSource
from .messaging.nats import Nats
from .metrics import Metrics
from .mirrors.declaration import Mirror
from .mirrors.worker import MirrorBounds, MirrorRuntime, MirrorSet, MirrorSupervisor
from .offers.drain import DrainHook, OfferDrain, OfferDrainBounds
from .offers.model import Offer, register_offer_type
from .offers.relay import HostedKvRelay, KvSource
from .ops.queries import dead_letters_waiting
from .pipeline import MutationExecutor
from .pipeline.contexts import Ops
from .pipeline.inbound import InboundReaction
from .pipeline.reaction import ReactionPrincipal
from .pipeline.run import run_pipeline
from .principal_facts import PrincipalFactLoader, PrincipalFactLoaders
from .readiness import (
    REASON_BOOTING,
    REASON_SCHEMA_VERSION_DISPLACED,
    REASON_SHUTTING_DOWN,
    ReadinessHandle,
)
from .render.paging import PageResult
from .render.projector import Projector, RlsApplier, route_of
from .render.registry import PrincipalRefresh
from .render.runtime import RenderRuntime
from .render.stream import SessionStream
from .render.windows import WindowSpec
from .scopes.handshake import ScopeHandshake
from .scopes.manifest import ScopeDeclaration, ScopeError, ScopeManifest, ScopeWithoutNats
from .supervisor import Supervisor, Worker

ENGINE_VERSION = "0.1.0"
REASON_NOT_RUNNING = "not_running"
REASON_INBOUND_BOOT = "inbound_boot"
DEAD_LETTER_GAUGE_EVERY = 5.0
"""The most seconds between reads of the dead letters waiting (a GROUP BY per pod)."""
LOOP_LAG_INTERVAL = 0.05
"""How often the loop-lag worker asks for a wake (20 a second): each wake's
lateness is one ``service_engine_loop_lag_seconds`` observation."""

_log = logging.getLogger(__name__)

BeatStep = Callable[[], Awaitable[None]]


class Engine:
    """The engine of one pod. Build it with `Engine.boot`."""

    def __init__(
        self,
        config: EngineConfig,
        db: Database,
        nats: Nats | None,
        readiness: ReadinessHandle,
    ) -> None:
        self.config = config
        self.db = db
        self.nats = nats
        self.readiness = readiness
        self.metrics = Metrics(config.service, config.pod_id)
        self.version = VersionIdentity(ENGINE_VERSION, config.service_version or "unversioned")
        self._supervisor = Supervisor(readiness)
        self.transport = PgListenNotify(db, config, readiness, metrics=self.metrics)
        self.render = RenderRuntime(
            db, config, self.transport.channel, accepting=self.ensure_accepting,
            metrics=self.metrics,
        )
        self.dead_letters = DeadLetters(db, self.metrics)
        self.crons = CronScheduler(
            db, self.dead_letters, holder=config.pod_id, service=config.service
        )
        self._dead_letters_gauged_at = float("-inf")
        self._beat_steps: dict[str, BeatStep] = {
            "postgres": self._probe_postgres,
            "schema_version": self._refresh_schema_version,
            "listener_queue": self.transport.check_queue,
            "dead_letters_waiting": self._gauge_dead_letters,
            "scheduled_impacts": self._fire_due,
            "sessions": self.render.beat,
            "memory": self._release_after_close,
            "idle_connections": self._close_unneeded_connections,
            "cron": self.crons.beat,
        }
        self._release = ReleaseAfterClose(follow_up=RELEASE_FOLLOW_UP)
        self._idle_connections = IdleConnections()
        self.nats_health: NatsHealth | None = None
        self.outbox: OutboxRelay | None = None
        self.scheduled: ScheduledPublisher | None = None
        if nats is not None:
            self.nats_health = NatsHealth(nats, readiness, self.metrics, grace=config.nats_grace)
            self.outbox = outbox_relay(
                config.outbox_discipline, db, nats, self.dead_letters,
                LeaderLease(db, OUTBOX_SLOT, config.pod_id, config.lease),
                metrics=self.metrics,
                bounds=OutboxBounds(
                    drain_bound=config.outbox_drain_bound,
                    max_attempts=config.outbox_max_attempts,
                    message_retention=config.message_retention,
                    sweep_every=config.outbox_sweep_every,
                ),
            )
            self.scheduled = ScheduledPublisher(
                db, nats, self.dead_letters,
                bounds=ScheduledBounds(max_attempts=config.scheduled_max_attempts),
            )
            # The relay never blocks the beat for long: each pass is bounded
            # and skipped outright while the broker is unreachable. Between
            # beats a commit that staged outbox rows wakes it (`_outbox_wakeups`).
            self._outbox_pass = asyncio.Lock()
            self._beat_steps["outbox"] = self._outbox_beat
            self._beat_steps["scheduled_messages"] = self.scheduled.beat
        self._reactions: dict[str, InboundReaction[Any]] = {}
        self._reaction_principal: ReactionPrincipal | None = None
        self._inbound_hook: InboundHook | None = None
        self.inbound: dict[str, ConsumerSupervisor] = {}
        """The running inbound consumers' supervisors, by reaction (after `run` started)."""
        self.inbound_health: InboundHealth | None = None
        self.lane_hub = LaneNotices(self.render, self.transport.channel)
        """Which projectors watch which NATS lane; the lane notices' hub."""
        self.presence_lanes: PresenceLanes | None = None
        """The presence lanes (after `register_presence`)."""
        self.offer_drain: OfferDrain | None = None
        """The leader drain of the registered offers (after `register_offer`)."""
        self._kv_relays: dict[str, HostedKvRelay] = {}
        self.mirrors = MirrorSet(self.metrics)
        self._mirror_bounds = MirrorBounds(
            interval=config.beat_interval, lease=config.lease,
            reconcile=config.mirror_reconcile,
            failure_threshold=config.mirror_failure_threshold,
            backoff=config.mirror_restart_backoff, backoff_cap=config.mirror_restart_backoff_cap,
        )
        self.lanes = Accumulators(db, config, nats, self.metrics)
        """Lane A: the registered accumulators, their fold cache and flush."""
        self.lane_ingress: IngressSupervisor | None = None
        self.blobs = BlobRuntime(db)
        """The blob kinds and the bound bucket (`register_blobs`, `use_blob_store`)."""
        self._scope_contributions: list[frozenset[str]] = []
        self.scope_declaration: ScopeDeclaration | None = None
        """The validated scope manifest `run` declares to Identity (None: scopeless)."""
        self.scope_handshake: ScopeHandshake | None = None
        self.principal_facts = PrincipalFactLoaders()
        """The slices' principal fact loaders (`register_principal_fact`)."""
        self._nouns: set[str] = set()
        """The nouns the registered projectors read (a principal-facts
        dependency must name one of them)."""
        self._eraser = Eraser(
            db, config, lanes=self.lanes, blobs=self.blobs, presence=self._clear_presence,
            metrics=self.metrics, purge_grace=config.lease, nouns=self._nouns,
        )
        self._running = False
        self._shutting_down = False

    @classmethod
    async def boot(
        cls,
        config: EngineConfig,
        db: Database,
        nats: Nats | None,
        readiness: ReadinessHandle,
    ) -> Engine:
        """Check the pod may serve, in order: posture, schema version, listener.

        A refusal raises its typed error and leaves ``readiness`` DOWN with
        the reason; success leaves it DOWN only until `run` starts.
        """
        readiness.set_down(REASON_BOOTING, "the engine is booting")
        engine = cls(config, db, nats, readiness)
        try:
            async with db.pool.acquire() as conn:
                await assert_posture(conn)
                await claim_at_boot(
                    conn, engine.version, pod_id=config.pod_id,
                    service=config.service, liveness=config.schema_version_liveness,
                )
            await engine._probe_listener()
        except EngineError as exc:
            readiness.set_down(getattr(exc, "reason", "boot"), str(exc))
            raise
        readiness.clear(REASON_BOOTING)
        readiness.set_down(REASON_NOT_RUNNING, "booted; run() has not started")
        engine._supervisor.add("beat", engine._beat)
        engine._supervisor.add("listener", engine.transport.run)
        engine._supervisor.add("render", engine.render.run)
        engine._supervisor.add("loop_lag", engine._watch_loop_lag)
        if engine.nats_health is not None:
            engine._supervisor.add("nats_health", engine.nats_health.run)
            engine._supervisor.add("lane_notices", engine._lane_notices)
        if engine.outbox is not None:
            engine._supervisor.add("outbox_wakeups", engine._outbox_wakeups)
        return engine

    async def _probe_listener(self) -> None:
        """LISTEN on a dedicated connection and NOTIFY it from the pool.

        Behind a transaction-mode pooler the LISTEN is released with its
        transaction and the notification never arrives.
        """
        channel = f"service_engine_probe_{secrets.token_hex(6)}"
        arrived = asyncio.get_running_loop().create_future()

        def on_notify(*_: object) -> None:
            if not arrived.done():
                arrived.set_result(None)

        conn = await self.db.connect_dedicated()
        try:
            await conn.add_listener(channel, on_notify)
            await self.db.pool.execute("SELECT pg_notify($1, 'probe')", channel)
            try:
                await asyncio.wait_for(arrived, self.config.listener_probe_timeout.total_seconds())
            except TimeoutError:
                raise ListenerProbeFailed(
                    "a self-NOTIFY did not arrive on the LISTEN connection within "
                    f"{self.config.listener_probe_timeout.total_seconds():g}s; a "
                    "transaction-mode pooler between the engine and Postgres drops LISTEN"
                ) from None
        finally:
            await conn.close()

    # -- register seams -------------------------------------------------

    def register_worker(self, name: str, worker: Worker) -> None:
        """Run ``worker`` under the engine's supervisor for the life of `run`.

        Raises `DuplicateRegistration` for a name already registered.
        """
        self._supervisor.add(name, worker)

    def register_beat_step(self, name: str, step: BeatStep) -> None:
        """Run ``step`` on every beat; a failing step holds readiness DOWN
        under ``beat:<name>`` until it next succeeds."""
        if name in self._beat_steps:
            raise DuplicateRegistration("beat step", name)
        self._beat_steps[name] = step

    def register_projector(self, projector: Projector[Any, Any, Any, Any]) -> None:
        """Serve ``projector``'s views; raises `DuplicateRegistration` for a
        name already registered and `InvalidProjector` for a bad declaration."""
        self.render.register_projector(projector)
        self._nouns.update(route_of(projector).nouns)

    def register_principal_refresh(self, refresh: PrincipalRefresh) -> None:
        """How a principal is re-resolved when its facts change."""
        self.render.register_principal_refresh(refresh)

    def register_cron(self, cron: Cron) -> None:
        """Fire ``cron`` once per slot across every pod of the service."""
        self.crons.register(cron)

    def register_reaction(self, reaction: InboundReaction[Any]) -> None:
        """Consume ``reaction``'s messages from `run` on, on one durable every
        pod shares.

        Raises `DuplicateRegistration` for a name already registered,
        `ConfigError` when the engine has no NATS connection, the reaction
        is a command reaction and no service is configured, or `run` has
        already started.
        """
        if self.nats is None:
            raise ConfigError(
                f"reaction {reaction.name} needs NATS: boot the engine with a Nats connection"
            )
        if self._running:
            raise ConfigError(f"reaction {reaction.name}: register reactions before run()")
        if reaction.name in self._reactions:
            raise DuplicateRegistration("reaction", reaction.name)
        reaction.subject(self.config.service)  # a command reaction needs a service
        self._reactions[reaction.name] = reaction

    def register_reaction_principal(self, resolver: ReactionPrincipal) -> None:
        """How a reaction's sender becomes the service's own principal:
        ``resolver(actor)`` (sync or async) answers the principal, or None
        for a sender it does not know (``cx.principal`` then raises
        `PrincipalUnresolved`). Raises `DuplicateRegistration` for a second
        resolver."""
        if self._reaction_principal is not None:
            raise DuplicateRegistration("reaction principal", "resolver")
        self._reaction_principal = resolver

    def register_offer(self, offer: Offer[Any, Any, Any]) -> None:
        """Publish ``offer``'s noun to its bucket from `run` on: every write of
        ``offer.ROW`` stages its dirty key, and the pod holding the offer's
        lease drains it. On an engine without NATS nothing is published: the
        offer is validated and logged as unpublished, so a slice registers
        it the same way everywhere. Raises `DeclarationError` for a
        malformed offer, `DuplicateRegistration` for a name already
        registered, `ConfigError` after `run` started."""
        if self._running:
            raise ConfigError("register offers before run()")
        offer.validate()
        if self.nats is None:
            _log.info("offer %s is not published: the engine has no NATS connection", offer.NAME)
            return
        if self.offer_drain is None:
            self.offer_drain = OfferDrain(
                self.db, self.nats, self.config.pod_id,
                OfferDrainBounds(
                    batch=self.config.offer_drain_batch, reconcile=self.config.offer_reconcile,
                    lease=self.config.lease, interval=self.config.beat_interval,
                ),
                metrics=self.metrics,
            )
        if offer.NAME in {o.NAME for o in self.offer_drain.offers}:
            raise DuplicateRegistration("offer", offer.NAME)
        register_offer_type(offer)
        self.offer_drain.add(offer)

    def register_kv_relay(
        self, name: str, bucket: str, source: KvSource, *, batch: int = 256
    ) -> HostedKvRelay:
        """Publish ``source``'s changes into ``bucket`` monotonically by key
        and version from `run` on (`KvDrainRelay`, watermarks under
        ``name``): `run` binds the bucket (absent: `BucketMissing`, readiness
        DOWN), and on every beat the pod holding the ``kv_relay:{name}``
        lease publishes up to ``batch`` pending changes and acknowledges
        them. Raises `DuplicateRegistration` for a name already registered,
        `ConfigError` without NATS, after `run` started or for a source
        without ``pending`` / ``published``."""
        if self.nats is None:
            raise ConfigError(f"kv relay {name!r} needs NATS")
        if self._running:
            raise ConfigError(f"kv relay {name!r}: register kv relays before run()")
        if not name:
            raise ConfigError("a kv relay needs a name (its watermarks' key)")
        if name in self._kv_relays:
            raise DuplicateRegistration("kv relay", name)
        hosted = HostedKvRelay(
            self.db, self.nats, name, bucket, source,
            holder=self.config.pod_id, lease=self.config.lease, batch=batch,
        )
        self._kv_relays[name] = hosted
        return hosted

    def kv_relay(self, name: str) -> HostedKvRelay:
        """The hosted relay ``name`` (its `HostedKvRelay.relay` once bound)."""
        try:
            return self._kv_relays[name]
        except KeyError:
            raise ConfigError(f"no kv relay named {name!r} is registered") from None

    def register_mirror(self, mirror: Mirror) -> None:
        """Mirror ``mirror``'s consumed prefixes from `run` on (a supervised
        worker; readiness is DOWN until it converged). Raises
        `DeclarationError` for an incomplete declaration,
        `DuplicateRegistration` for a name already registered, `ConfigError`
        after `run` started. On an engine without NATS nothing is mirrored
        (the ``known_*`` tables stay as they are) and it says so in the log,
        so a slice registers its mirror the same way everywhere."""
        if self._running:
            raise ConfigError("register mirrors before run()")
        if self.nats is None:
            _log.info("mirror %s is not running: the engine has no NATS connection", mirror.name)
            return
        if mirror.name in self.mirrors.supervisors:
            raise DuplicateRegistration("mirror", mirror.name)
        runtime = MirrorRuntime(
            mirror, self.db, self.nats, self.config.pod_id, self.readiness, self._mirror_bounds
        )
        self.mirrors.add(MirrorSupervisor(runtime, self.dead_letters, self._mirror_bounds))
        self._beat_steps.setdefault("mirrors", self.mirrors.beat)

    def mirror(self, name: str) -> MirrorRuntime:
        """The running state of mirror ``name`` (its shadows, its lease)."""
        return self.mirrors.supervisors[name].runtime

    def set_offer_drain_hook(self, hook: DrainHook | None) -> None:
        """The offer-drain pause seam (tests only; after `register_offer`)."""
        if self.offer_drain is not None:
            self.offer_drain.hook = hook

    # -- the NATS lanes ---------------------------------------------------

    def register_presence(
        self, projector: PresenceProjector[Any, Any, Any], ttl: timedelta
    ) -> PresenceHandle:
        """Serve presence lane ``projector`` (its NAME) whose keys expire
        ``ttl`` after their last put; returns the lane's writer.

        The ``EPHEMERAL_{service}`` bucket is bound when `run` starts (or
        `bind_presence`). Raises `PresenceWithoutNats` / `PresenceWithoutService`
        on an engine without NATS or a service, `ConfigError` after `run`
        started or for a bad ttl or NAME, `DuplicateRegistration` for a name
        already registered.
        """
        if self.nats is None:
            raise PresenceWithoutNats(f"presence lane {projector.NAME!r} needs NATS")
        if not self.config.service:
            raise PresenceWithoutService(
                f"presence lane {projector.NAME!r}: configure a service (EPHEMERAL_<service>)"
            )
        if self._running:
            raise ConfigError(f"presence lane {projector.NAME}: register presence before run()")
        if self.presence_lanes is None:
            hub = self.lane_hub
            self.presence_lanes = PresenceLanes(
                self.nats, self.config.service, self.render, self.transport.channel,
                self.readiness, self.metrics, paused=lambda: hub.paused,
            )
        handle = self.presence_lanes.register(projector, ttl)
        self.render.register_projector(projector)
        self._nouns.update(route_of(projector).nouns)
        self.lane_hub.watch(PRESENCE_LANE, projector.NAME)
        return handle

    def presence(self, projector: str) -> PresenceHandle:
        """The writer of presence lane ``projector``."""
        if self.presence_lanes is None:
            raise ConfigError("no presence lane is registered")
        return self.presence_lanes.handle(projector)

    async def present(self, projector: str, key: str, value: JsonValue) -> bool:
        """Put ``value`` under ``key`` in presence lane ``projector`` now
        (loss-tolerant: True when the bucket stored it)."""
        return await self.presence(projector).put(key, value)

    async def bind_presence(self) -> None:
        """Bind the presence bucket now rather than at `run` (idempotent);
        raises its `PresenceBucketRefused` with readiness DOWN."""
        if self.presence_lanes is not None:
            await self.presence_lanes.bind()

    def lane_notices(self, lanes: Collection[str] | None = None) -> LaneNoticeStream:
        """The raw lane signal: a stream of `LaneNotice` naming any of
        ``lanes`` (None: every lane). Close it when done."""
        return self.lane_hub.subscribe(lanes)

    def watch_lane(self, lane: str, projector: str) -> None:
        """Sessions of ``projector`` watch NATS lane ``lane`` (say
        ``ACCUMULATED_LANE`` for a view of accumulator state): they get its
        LanesPaused / LanesResumed notices and a Reset on resume. Presence
        lanes watch ``presence`` on their own."""
        self.lane_hub.watch(lane, self.render.projector(projector).NAME)

    def lanes_of(self, projector: str) -> frozenset[str]:
        """The NATS lanes sessions of ``projector`` watch (empty: none)."""
        return self.lane_hub.lanes_of(projector)

    async def _lane_notices(self) -> None:
        assert self.nats_health is not None
        await self.lane_hub.run(self.nats_health, self.nats_health.interval)

    def set_inbound_hook(self, hook: InboundHook | None) -> None:
        """The inbound fault-injection seam (tests only; before `run`)."""
        self._inbound_hook = hook

    def register_accumulator(self, accumulator: Accumulator[Any]) -> None:
        """Serve ``accumulator``'s lane from `run` on: its chunks from
        `push_chunk` and from ``stream.{service}.{key}`` on the
        ``STREAMING_{service}`` stream (bound at `run`). Raises
        `AccumulatorWithoutService` with no service configured,
        `DuplicateRegistration` for a name already registered, `ConfigError`
        without NATS or after `run` started."""
        if self._running:
            raise ConfigError(f"accumulator {accumulator.name}: register accumulators before run()")
        self.lanes.register(accumulator)
        self._beat_steps.setdefault("lane_seals", self.lanes.beat)

    async def push_chunk(
        self, accumulator: Accumulator[Any] | str, key: str, seq: int, chunk: bytes
    ) -> Durable:
        """Make chunk ``seq`` of ``key``'s stream durable; the `Durable`
        receipt answers once it committed. An identical resubmit is
        idempotent (``duplicate``); different bytes raise `ChunkConflict`, a
        sealed key `KeySealed`, a bad seq `ChunkSeqOutOfRange`."""
        self.ensure_accepting()
        return await self.lanes.push_chunk(accumulator, key, seq, chunk)

    async def fold(self, accumulator: Accumulator[Any] | str, key: str) -> Folded[Any]:
        """``key``'s state: the fold of its contiguous durable prefix."""
        return await self.lanes.fold(accumulator, key)

    async def seal(
        self, accumulator: Accumulator[Any] | str, key: str, last_seq: int, hash: str
    ) -> Any:
        """Seal ``key``'s stream at ``last_seq`` against ``hash`` (the hex
        SHA-256 of chunks ``0..last_seq``) in a write-pipeline transaction
        of its own, and return the folded state (``cx.seal`` seals inside a
        mutation or reaction instead). Raises, with nothing written,
        `SealTruncated`, `SealHashMismatch`, `SealChunkBeyondLastSeq`,
        `AlreadySealed`; `ShuttingDown` once shutdown began; `ConfigError`
        for an accumulator that is not registered."""
        self.ensure_accepting()
        resolved = self.lanes.resolve(accumulator)

        async def sealing(cx: Ops) -> Any:
            return await cx.seal(resolved, key, last_seq, hash)

        return await run_pipeline(
            self.db, self.config, lambda conn, now: Ops(conn, self.config, now), sealing,
            clock=SystemClock(), metrics=self.metrics,
        )

    # -- erasure ------------------------------------------------------------

    def register_erasable(self, name: str, erasable: Erasable) -> None:
        """A slice that holds person data: ``erasable.erase(cx, person)`` runs
        in every erasure's one transaction. The beat drains unfinished purges."""
        self._eraser.register(name, erasable)
        self._beat_steps.setdefault("erasure_purge", self._drain_erasures)

    def eraser(self) -> Eraser:
        """The engine's `Eraser` (capture it before `run`; share it freely)."""
        return self._eraser

    async def erase(self, person: str) -> ErasureResult:
        """Erase ``person`` across every registered slice (see `service_engine.erasure`)."""
        return await self._eraser.erase(person)

    async def _drain_erasures(self) -> None:
        await self._eraser.drain()

    async def _clear_presence(self, projector: str, key: str) -> bool:
        return await self.presence(projector).clear(key)

    # -- principal facts ----------------------------------------------------

    def register_principal_fact(self, loader: PrincipalFactLoader) -> None:
        """Run ``loader`` (``async (principal) -> principal`` with the slice's
        fact) right after every principal is resolved — GraphQL HTTP and
        WebSocket attach — and on a principal-facts refresh, which the
        engine drives through `load_principal_facts` unless the service
        registered its own refresh. A failing loader is fail-closed."""
        first = not len(self.principal_facts)
        self.principal_facts.register(loader)
        if first:
            with contextlib.suppress(DuplicateRegistration):
                self.render.register_principal_refresh(self.load_principal_facts)

    async def load_principal_facts(self, principal: Any) -> Any:
        """``principal`` with every registered fact loaded (in registration
        order); `PrincipalFactLoadFailed` when a loader fails."""
        return await self.principal_facts.load(principal)

    # -- scopes -----------------------------------------------------------

    def contribute_scopes(self, keys: Collection[str]) -> None:
        """A slice's scope keys (from its own register), for
        `declare_contributed_scopes`."""
        self._scope_contributions.append(ScopeManifest.of(keys).keys)

    def declare_contributed_scopes(self) -> ScopeDeclaration | None:
        """Assemble the contributed keys into one manifest, validate it
        (`MalformedScopeKey`, `ScopeManifestSpansServices`,
        `EmptyScopeManifest`) and declare it; None when nothing was
        contributed (a scopeless service skips the handshake)."""
        if not self._scope_contributions:
            return None
        return self.declare_scopes(ScopeManifest.assemble(self._scope_contributions))

    def declare_scopes(self, manifest: ScopeManifest) -> ScopeDeclaration:
        """Declare a manifest the service assembled itself (validated as
        `declare_contributed_scopes` does); `run` drives the handshake."""
        self.scope_declaration = manifest.declaration(self.config.service)
        return self.scope_declaration

    def _start_scope_handshake(self) -> None:
        declaration = self.scope_declaration
        if declaration is None:
            return
        if self.nats is None:
            error = ScopeWithoutNats("scopes are declared but the engine has no NATS connection")
            self.readiness.set_down(error.reason, str(error))
            raise error
        supervisors = self.mirrors.supervisors
        handshake = ScopeHandshake(
            self.nats, declaration, self.readiness, pod_id=self.config.pod_id,
            converged=lambda: all(s.runtime.converged for s in supervisors.values()),
        )
        handshake.hold()
        self.scope_handshake = handshake
        self._supervisor.add("scope_declaration", handshake.run)

    # -- blobs ------------------------------------------------------------

    def register_blobs(self, kind: str, policy: BlobPolicy) -> BlobKind:
        """Declare the blob kind ``kind`` (``cx.blob(handle)`` mints its
        uploads). A service with kinds needs an S3 store (`use_blob_store`,
        or ``SERVICE_ENGINE_S3_*``): `run` binds its bucket, fail-loud."""
        return self.blobs.register(kind, policy)

    def use_blob_store(self, config: BlobStoreConfig | None) -> None:
        """The S3-compatible store `run` binds (bind-only: the bucket must exist)."""
        self.blobs.configure(config)

    @property
    def blob_store_configured(self) -> bool:
        """Whether `run` has an S3 store to bind: one given to
        `use_blob_store`, or ``SERVICE_ENGINE_S3_*`` in the environment. A
        slice whose blobs are optional registers its kinds only then."""
        return self.blobs.config is not None or BlobStoreConfig.from_env() is not None

    def blob_kind(self, kind: str) -> BlobKind | None:
        """The blob kind ``kind`` as `register_blobs` declared it (pass it to
        ``cx.blob``), or None when this engine did not register it."""
        return self.blobs.kinds.get(kind)

    async def download(
        self, projector: str, key: JsonValue, reference: JsonValue, principal: Any,
        applier: RlsApplier[Any] | None = None,
    ) -> DownloadUrl | None:
        """A presigned GET of ``reference``, only when ``principal`` can see
        ``projector``'s view of ``key`` now (fetch's own read and gate) and
        the loaded row still lists the reference in ``blob_refs``; else None."""
        return await self.blobs.download(
            lambda: self.render.fetch_row(projector, key, principal, applier), reference
        )

    def mutation_executor(self) -> MutationExecutor:
        """Runs mutations (and bulk writes) through the write pipeline."""
        return MutationExecutor(
            self.db, self.config, self.metrics, accepting=self.ensure_accepting,
            nouns=self._nouns,
        )

    # -- sessions ---------------------------------------------------------

    async def attach(
        self,
        principal: Any,
        projector: str,
        window: WindowSpec[Any],
        *,
        session_id: str | None = None,
        applier: RlsApplier[Any] | None = None,
    ) -> SessionStream[Any]:
        """Open a live session (see `RenderRuntime.attach`); raises
        `AttachShuttingDown` once shutdown began."""
        return await self.render.attach(
            principal, projector, window, session_id=session_id, applier=applier
        )

    async def page(self, session_id: str, principal: Any, cursor: JsonValue) -> PageResult[Any]:
        """Append an older page behind a live window the caller owns."""
        return await self.render.page(session_id, principal, cursor)

    async def fetch(
        self, projector: str, key: JsonValue, principal: Any,
        applier: RlsApplier[Any] | None = None,
    ) -> Any | None:
        """One rendered view, read exactly as a session renders it."""
        return await self.render.fetch(projector, key, principal, applier)

    async def fetch_window(
        self, projector: str, query: Any, principal: Any,
        applier: RlsApplier[Any] | None = None,
    ) -> list[tuple[str, Any]]:
        """The views populate lists for ``query``, in window order, read
        exactly as a session renders them."""
        return await self.render.fetch_window(projector, query, principal, applier)

    # -- run and shutdown -----------------------------------------------

    async def run(self) -> None:
        """Run every worker until `shutdown`; raise `WorkerStopped` if one dies."""
        if self._shutting_down:
            raise ShuttingDown("the engine is shutting down")
        if self._running:
            raise EngineError("Engine.run() was already started")
        self._running = True
        try:
            if self._reactions:
                await self._start_inbound()
            if self.presence_lanes is not None:
                await self.presence_lanes.bind()
                self._supervisor.add("presence", self.presence_lanes.run)
            await self._start_offers_and_mirrors()
            blob_reaper = await self.blobs.start(self.readiness)
            if blob_reaper is not None:
                self._beat_steps.setdefault("blob_reaper", blob_reaper)
            self._start_scope_handshake()
            if self.lanes.registered:
                await self._start_lanes()
            self.readiness.clear(REASON_NOT_RUNNING)
            try:
                await self._supervisor.run()
            except WorkerStopped as exc:
                if isinstance(exc.__cause__, ScopeError):
                    raise exc.__cause__ from None  # Identity's refusal is the failure
                raise
        finally:
            if self.outbox is not None:
                # Hand the relay's lease over now rather than at its expiry.
                await self.outbox.aclose()
            if self.offer_drain is not None:
                await self.offer_drain.aclose()
            for hosted in self._kv_relays.values():
                await hosted.aclose()
            await self.mirrors.aclose()
            self.lanes.detach()
            await self.blobs.aclose()
            self.metrics.shutdown()

    async def _start_inbound(self) -> None:
        """Check the retention rule and bind every reaction's durable, then
        put each consumer under its own supervisor. A refusal (a missing
        stream, a retention below a stream's max_age, a durable JetStream
        refuses) raises and holds readiness DOWN."""
        assert self.nats is not None
        nats = self.nats
        try:
            await check_message_retention(
                nats, self.config.message_retention, {r.stream for r in self._reactions.values()}
            )
            consumers = []
            for reaction in self._reactions.values():
                runner = ReactionRunner(
                    reaction, self.db, self.config, self.dead_letters, metrics=self.metrics,
                    principal=self._reaction_principal, hook=self._inbound_hook,
                    nouns=self._nouns,
                )
                consumer = InboundConsumer(reaction, runner, nats, self.config)
                await consumer.bind()
                consumers.append(consumer)
        except EngineError as exc:
            self.readiness.set_down(REASON_INBOUND_BOOT, f"{type(exc).__name__}: {exc}")
            raise
        self.inbound_health = InboundHealth(self.readiness, self.metrics)
        for consumer in consumers:
            supervisor = ConsumerSupervisor(
                consumer, self.inbound_health,
                threshold=self.config.inbound_failure_threshold,
                backoff=self.config.inbound_restart_backoff,
                backoff_cap=self.config.inbound_restart_backoff_cap,
            )
            self.inbound[consumer.reaction.name] = supervisor
            self._supervisor.add(f"inbound:{consumer.reaction.name}", supervisor.run)

    async def _start_offers_and_mirrors(self) -> None:
        """Bind every offer's bucket (an absent one fails loud, naming it)
        and put the drain and each mirror under the supervisor."""
        if self.offer_drain is not None:
            try:
                await self.offer_drain.bind()
            except EngineError as exc:
                self.readiness.set_down("offer_boot", f"{type(exc).__name__}: {exc}")
                raise
            self._supervisor.add("offers", self.offer_drain.run)
        for name, supervisor in self.mirrors.supervisors.items():
            self._supervisor.add(f"mirror:{name}", supervisor.run)
        for name, hosted in self._kv_relays.items():
            try:
                await hosted.bind()
            except EngineError as exc:
                self.readiness.set_down("kv_relay_boot", f"{type(exc).__name__}: {exc}")
                raise
            self._beat_steps[f"kv_relay:{name}"] = hosted.beat

    async def _start_lanes(self) -> None:
        """Bind ``STREAMING_{service}`` (absent: `LaneStreamMissing`; its
        max_age above ``seal_retention``: `SealRetentionTooShort`; both hold
        readiness DOWN) and put the flush and the ingress under supervision."""
        assert self.nats is not None and self.config.service is not None
        try:
            await bind_lane_stream(self.nats, self.config.service, self.config.seal_retention)
        except EngineError as exc:
            self.readiness.set_down("lane_stream", f"{type(exc).__name__}: {exc}")
            self.metrics.set_dependency("streaming", False)
            raise
        self.lane_ingress = IngressSupervisor(
            LaneIngress(self.lanes, self.nats, self.config), self.readiness, self.metrics,
            threshold=self.config.inbound_failure_threshold,
            backoff=self.config.inbound_restart_backoff,
            backoff_cap=self.config.inbound_restart_backoff_cap,
        )
        self._supervisor.add("lane_flush", self.lanes.flusher.run)
        self._supervisor.add("lane_ingress", self.lane_ingress.run)

    def shutdown(self) -> None:
        """Begin graceful shutdown; new attaches are refused from now on."""
        if not self._shutting_down:
            self._shutting_down = True
            self.readiness.set_down(REASON_SHUTTING_DOWN, "the pod is shutting down")
            self._supervisor.stop()
            self.render.end_all("the pod is shutting down")

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def ensure_accepting(self) -> None:
        """Raise `ShuttingDown` once shutdown began (attach and the executors
        call this before taking new work)."""
        if self._shutting_down:
            raise ShuttingDown("the engine is shutting down and accepts no new work")

    # -- the beat ---------------------------------------------------------

    async def _beat(self) -> None:
        interval = self.config.beat_interval.total_seconds()
        while True:
            for name, step in list(self._beat_steps.items()):
                reason = f"beat:{name}"
                try:
                    await step()
                except Exception as exc:
                    # A bound that ran out or a typed engine error says it all
                    # in one line; formatting a traceback also fills linecache
                    # with every file's source for good (it would land amid a
                    # burst's sessions and outlive them).
                    expected = isinstance(exc, TimeoutError | EngineError)
                    _log.warning("beat step %s failed: %s: %s", name, type(exc).__name__, exc,
                                 exc_info=None if expected else exc)
                    self.readiness.set_down(reason, f"{type(exc).__name__}: {exc}")
                else:
                    self.readiness.clear(reason)
                # One loop turn between steps: the steps that await nothing
                # (the sessions sweep, the gauges) never hold the loop together.
                await asyncio.sleep(0)
            await asyncio.sleep(interval)

    async def _watch_loop_lag(self) -> None:
        """``service_engine_loop_lag_seconds``: every `LOOP_LAG_INTERVAL`,
        how late the wake ran past its deadline (a callback or a collection
        holding the loop shows here as the time every write, NOTIFY and
        frame due meanwhile waited)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LOOP_LAG_INTERVAL
            await asyncio.sleep(LOOP_LAG_INTERVAL)
            self.metrics.observe_loop_lag(max(0.0, loop.time() - due))

    async def _outbox_beat(self) -> None:
        assert self.outbox is not None
        async with self._outbox_pass:
            await self.outbox.beat()

    async def _outbox_wakeups(self) -> None:
        """Publish as soon as a commit staged outbox rows (the NOTIFY on
        `OUTBOX_CHANNEL`). Best effort: a failed pass is logged and the beat,
        which reports failures to readiness, retries it."""
        assert self.outbox is not None
        wake = self.transport.outbox_wake
        while True:
            await wake.wait()
            wake.clear()
            try:
                async with self._outbox_pass:
                    await self.outbox.wake()
            except Exception as exc:
                _log.warning("outbox pass on wake-up failed: %s", exc)

    async def _fire_due(self) -> None:
        await fire_due(self.db, self.metrics)

    async def _probe_postgres(self) -> None:
        """``dependency_up{postgres}``: one bounded round trip on the pool."""
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can drop
            # the beat's cancellation when it races the probe's answer.
            async with asyncio.timeout(self.config.listener_probe_timeout.total_seconds()):
                await self.db.pool.fetchval("SELECT 1")
        except BaseException:
            self.metrics.set_dependency("postgres", False)
            raise
        self.metrics.set_dependency("postgres", True)

    async def _release_after_close(self) -> None:
        """Once many sessions closed (`ReleaseAfterClose`), hand the heap's
        free pages back to the OS: a pod returns toward its idle footprint."""
        live = len(self.render.sessions)
        if self._release.observe(live):
            started = time.perf_counter()
            closed = 0
            if self._release.due_in:  # a fall, not its follow-up (the pool has its floor again)
                closed = await self.db.close_idle_connections()  # the burst's, and its statements
                await asyncio.sleep(0)  # their transports are let go in the next loop turn
            released = release_free_memory()
            if released:
                self.metrics.add_memory_release()
            _log.info("sessions fell to %d: %d idle pool connections closed, free memory %s"
                      " in %.1f ms", live, closed,
                      "released" if released else "not releasable here",
                      (time.perf_counter() - started) * 1e3)

    async def _close_unneeded_connections(self) -> None:
        """Close the pool connections the last `IDLE_CONNECTION_WINDOW`
        never needed at once (the pool arms no idle timer per release)."""
        keep = self._idle_connections.observe(
            asyncio.get_running_loop().time(), self.db.in_use()
        )
        if keep is not None:
            closed = await self.db.close_idle_above(keep)
            if closed:
                _log.info("%d pool connections unneeded for %.0f s closed", closed,
                          self._idle_connections.window)

    async def _gauge_dead_letters(self) -> None:
        """``dead_letters_waiting{source}``, read every ten beats (at most
        every `DEAD_LETTER_GAUGE_EVERY` seconds)."""
        now = asyncio.get_running_loop().time()
        every = min(DEAD_LETTER_GAUGE_EVERY, 10 * self.config.beat_interval.total_seconds())
        if now < self._dead_letters_gauged_at + every:
            return
        self._dead_letters_gauged_at = now
        waiting = await dead_letters_waiting(self.db)
        for source in DeadLetterSource:
            self.metrics.set_dead_letters_waiting(source.value, waiting.get(source.value, 0))

    async def _refresh_schema_version(self) -> None:
        async with self.db.pool.acquire() as conn:
            result = await claim_schema_version(
                conn, self.version, pod_id=self.config.pod_id,
                service=self.config.service, liveness=self.config.schema_version_liveness,
            )
        if result.claim is Claim.DISPLACED:
            self.readiness.set_down(
                REASON_SCHEMA_VERSION_DISPLACED,
                f"this pod runs {self.version}; a live pod holds the store at {result.holder}",
            )
        else:
            self.readiness.clear(REASON_SCHEMA_VERSION_DISPLACED)
