"""Engine: boot, the register_* seams, the components it composes, run, shutdown.

Each feature folder provides one component (`service_engine.beat.component`):
`Upkeep`, `Integration`, `Offers`, `Mirrors`, `BlobRuntime`, `Scopes`,
`Lanes`, the `Eraser`. The engine builds them from the config's bounds, hands
each registration to its component, starts them when `run` begins, runs their
loops under its supervisor and their steps on its beat, and closes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .beat.component import BeatStep, Component, Delegate, run_beat
from .beat.upkeep import LOOP_LAG_INTERVAL, Upkeep, UpkeepBounds
from .blobs.model import DownloadUrl
from .blobs.runtime import BlobRuntime
from .clock import SystemClock
from .commands.checked import CheckedCommand
from .config import EngineConfig
from .db.pool import Database
from .db.schema_version import VersionIdentity
from .erasure import Eraser, ErasureResult
from .failures import (
    DuplicateRegistration,
    EngineError,
    NestedConnectionError,
    ShuttingDown,
    WorkerStopped,
)
from .impacts.model import JsonValue
from .impacts.transport import PgListenNotify
from .integration.component import Integration
from .lanes.accumulated.accumulator import Accumulator
from .lanes.component import Lanes
from .messaging.dead_letters import DeadLetters
from .messaging.nats import Nats
from .metrics import Metrics
from .mirrors.component import Mirrors
from .mirrors.worker import MirrorBounds
from .offers.component import Offers
from .offers.drain import OfferDrainBounds
from .pipeline import MutationExecutor
from .pipeline.ops import Ops
from .pipeline.run import run_pipeline
from .preflight import check_boot, check_start
from .principal_facts import PrincipalFactBatchLoader, PrincipalFactLoader, PrincipalFactLoaders
from .readiness import REASON_BOOTING, REASON_SHUTTING_DOWN, ReadinessHandle
from .render.projector import Projector, RlsApplier
from .render.registry import RenderRegistry
from .render.runtime import RenderRuntime
from .scopes.component import Scopes
from .scopes.manifest import ScopeError
from .supervisor import Supervisor, Worker

__all__ = ["ENGINE_VERSION", "LOOP_LAG_INTERVAL", "Engine"]

ENGINE_VERSION = "0.1.0"
REASON_NOT_RUNNING = "not_running"


class Engine:
    """The engine of one pod. Build it with `Engine.boot`."""

    def __init__(
        self, config: EngineConfig, db: Database, nats: Nats | None, readiness: ReadinessHandle
    ) -> None:
        self.config, self.db, self.nats, self.readiness = config, db, nats, readiness
        self.metrics = metrics = Metrics(config.service, config.pod_id)
        self.version = VersionIdentity(ENGINE_VERSION, config.service_version or "unversioned")
        self._supervisor = Supervisor(readiness)
        self.transport = PgListenNotify(db, config, readiness, metrics=metrics)
        self.render_loop = RenderRuntime(
            db, config, self.transport.channel, accepting=self.ensure_accepting, metrics=metrics
        )
        self.render = self.render_loop.registry
        """The projectors, the sessions and the reads that serve them."""
        self.dead_letters = DeadLetters(db, metrics)
        self._nouns = self.render.nouns
        self._beat_steps: dict[str, BeatStep] = {}
        self._commands: dict[str, CheckedCommand] = {}
        self.upkeep = Upkeep(
            db, UpkeepBounds.of(config), readiness, metrics, self.version,
            transport=self.transport, render=self.render_loop,
        )
        self.integration = Integration(
            db, config, nats, readiness, metrics, self.dead_letters,
            outbox_wake=self.transport.outbox_wake, nouns=self._nouns,
        )
        self.offers = Offers(
            db, nats, readiness, metrics, holder=config.pod_id, lease=config.lease,
            bounds=OfferDrainBounds.of(config),
        )
        self.mirrors = Mirrors(
            db, nats, readiness, metrics, self.dead_letters, holder=config.pod_id,
            bounds=MirrorBounds.of(config),
        )
        self.blobs = BlobRuntime(db, readiness)
        """The blob kinds and the bound bucket (`register_blobs`, `use_blob_store`)."""
        self.scopes = Scopes(
            nats, readiness, service=config.service, pod_id=config.pod_id,
            converged=self.mirrors.converged,
        )
        self.lanes = Lanes(
            db, config, nats, readiness, metrics, self.render, self.transport.channel,
            serve=self.register_projector, nats_health=self.integration.nats_health,
            accepting=self.ensure_accepting,
        )
        self.principal_facts = PrincipalFactLoaders(inline=self._holds_connection)
        """The slices' principal fact loaders (`register_principal_fact`)."""
        self._eraser = Eraser(
            db, config, lanes=self.lanes.accumulators, blobs=self.blobs,
            presence=self.lanes.clear_presence, metrics=metrics, purge_grace=config.lease,
            nouns=self._nouns,
        )
        self.components: tuple[Component, ...] = (
            self.integration, self.lanes, self.offers, self.mirrors, self.blobs, self.scopes,
            self._eraser,
        )
        """The features `run` starts, in order, after the pod's own `upkeep`."""
        self._running = False
        self._shutting_down = False

    @classmethod
    async def boot(
        cls, config: EngineConfig, db: Database, nats: Nats | None, readiness: ReadinessHandle
    ) -> Engine:
        """Check the pod may serve, in order: posture, schema version, listener
        (`check_boot`).

        A refusal raises its typed error and leaves ``readiness`` DOWN with
        the reason; success leaves it DOWN only until `run` starts.
        """
        readiness.set_down(REASON_BOOTING, "the engine is booting")
        engine = cls(config, db, nats, readiness)
        await check_boot(db, config, engine.version, readiness)
        readiness.clear(REASON_BOOTING)
        readiness.set_down(REASON_NOT_RUNNING, "booted; run() has not started")
        engine._supervisor.add("beat", engine._beat)
        for name, worker in engine.upkeep.tasks().items():
            engine._supervisor.add(name, worker)
        return engine

    # -- register seams (each delegates to the component it belongs to) ---

    def register_worker(self, name: str, worker: Worker) -> None:
        """Run ``worker`` under the engine's supervisor for the life of `run`;
        raises `DuplicateRegistration` for a name already registered."""
        self._supervisor.add(name, worker)

    def register_beat_step(self, name: str, step: BeatStep) -> None:
        """Run ``step`` on every beat; a failing step holds readiness DOWN
        under ``beat:<name>`` until it next succeeds."""
        if any(name == taken for taken, _ in self._steps()):
            raise DuplicateRegistration("beat step", name)
        self._beat_steps[name] = step

    def register_projector(self, projector: Projector[Any, Any, Any, Any]) -> None:
        """Serve ``projector``'s views; raises `DuplicateRegistration` for a
        name already registered and `InvalidProjector` for a bad declaration."""
        self.render.register_projector(projector)

    register_principal_refresh = Delegate("render", RenderRegistry.register_principal_refresh)

    # -- integration (`Integration`), offers (`Offers`), mirrors (`Mirrors`) --

    register_cron = Delegate("integration", Integration.register_cron)
    register_reaction = Delegate("integration", Integration.register_reaction)
    register_reaction_principal = Delegate("integration", Integration.register_reaction_principal)
    set_inbound_hook = Delegate("integration", Integration.set_inbound_hook)
    register_offer = Delegate("offers", Offers.register_offer)
    register_kv_relay = Delegate("offers", Offers.register_kv_relay)
    kv_relay = Delegate("offers", Offers.kv_relay)
    set_offer_drain_hook = Delegate("offers", Offers.set_drain_hook)
    register_mirror = Delegate("mirrors", Mirrors.register)
    mirror = Delegate("mirrors", Mirrors.runtime)

    # -- the NATS lanes (`Lanes`) -----------------------------------------

    register_presence = Delegate("lanes", Lanes.register_presence)
    presence = Delegate("lanes", Lanes.presence)
    present = Delegate("lanes", Lanes.present)
    bind_presence = Delegate("lanes", Lanes.bind_presence)
    lane_notices = Delegate("lanes", Lanes.lane_notices)
    watch_lane = Delegate("lanes", Lanes.watch_lane)
    lanes_of = Delegate("lanes", Lanes.lanes_of)
    register_accumulator = Delegate("lanes", Lanes.register_accumulator)
    push_chunk = Delegate("lanes", Lanes.push_chunk)
    fold = Delegate("lanes", Lanes.fold)

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
        resolved, config = self.lanes.accumulators.resolve(accumulator), self.config

        async def sealing(cx: Ops) -> Any:
            return await cx.seal(resolved, key, last_seq, hash)

        return await run_pipeline(
            self.db, config, lambda conn, now: Ops(conn, config, now), sealing,
            clock=SystemClock(), metrics=self.metrics,
        )

    # -- erasure and principal facts --------------------------------------

    register_erasable = Delegate("_eraser", Eraser.register)

    def eraser(self) -> Eraser:
        """The engine's `Eraser` (capture it before `run`; share it freely)."""
        return self._eraser

    async def erase(self, person: str) -> ErasureResult:
        """Erase ``person`` across every registered slice (see `service_engine.erasure`)."""
        return await self._eraser.erase(person)

    def register_commands(self, *commands: CheckedCommand) -> None:
        """Declare the checked commands this pod runs: `run` checks that the
        schema owner installed each one's database function (``service-engine
        migrate --commands``) and refuses to start, readiness DOWN under
        ``commands_not_installed`` naming them, when one is missing. Raises
        `DuplicateRegistration` for a second command of one name."""
        for command in commands:
            known = self._commands.get(command.name)
            if known is not None and known is not command:
                raise DuplicateRegistration("command", command.name)
            self._commands[command.name] = command

    def register_principal_fact(
        self, loader: PrincipalFactLoader | PrincipalFactBatchLoader, *, many: bool = False
    ) -> None:
        """Run ``loader`` (``async (principal) -> principal`` with the slice's
        fact) right after every principal is resolved and on a
        principal-facts refresh (through `load_principal_facts` unless the
        service registered its own refresh). With ``many=True`` the loader
        takes the list of principals resolved in one loop turn and answers
        the list (``async (principals) -> principals``, in order): one read
        for a burst of sockets. A failing loader is fail-closed."""
        first = not len(self.principal_facts)
        self.principal_facts.register(loader, many=many)
        if first:
            with contextlib.suppress(DuplicateRegistration):
                self.render.register_principal_refresh(self.load_principal_facts)

    load_principal_facts = Delegate("principal_facts", PrincipalFactLoaders.load)

    def _holds_connection(self) -> bool:
        """Whether the current task holds a connection of the pool (a
        handler's): its principal facts load in it, where a loader reaching
        the pool is refused (`NestedConnectionError`), not in a batch's task."""
        try:
            self.db.refuse_nested("load_principal_facts")
        except NestedConnectionError:
            return True
        return False

    # -- scopes (`Scopes`) ------------------------------------------------

    contribute_scopes = Delegate("scopes", Scopes.contribute)
    declare_contributed_scopes = Delegate("scopes", Scopes.declare_contributed)
    declare_scopes = Delegate("scopes", Scopes.declare)

    # -- blobs (`BlobRuntime`) --------------------------------------------

    register_blobs = Delegate("blobs", BlobRuntime.register)
    use_blob_store = Delegate("blobs", BlobRuntime.configure)

    @property
    def blob_store_configured(self) -> bool:
        """Whether `run` has an S3 store to bind (`BlobRuntime.configured`)."""
        return self.blobs.configured

    blob_kind = Delegate("blobs", BlobRuntime.kind)

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

    # -- writes and sessions ------------------------------------------------

    def mutation_executor(self) -> MutationExecutor:
        """Runs mutations (and bulk writes) through the write pipeline."""
        return MutationExecutor(
            self.db, self.config, self.metrics, accepting=self.ensure_accepting,
            nouns=self._nouns,
        )

    attach = Delegate("render", RenderRegistry.attach)
    page = Delegate("render", RenderRegistry.page)
    fetch = Delegate("render", RenderRegistry.fetch)
    fetch_window = Delegate("render", RenderRegistry.fetch_window)

    # -- run and shutdown -----------------------------------------------

    async def run(self) -> None:
        """Start every component, then run every worker until `shutdown`;
        raise `WorkerStopped` if one dies."""
        if self._shutting_down:
            raise ShuttingDown("the engine is shutting down")
        if self._running:
            raise EngineError("Engine.run() was already started")
        self._running = True
        try:
            await check_start(
                self.db, self.readiness, self._nouns.tables(), self._commands.values()
            )
            for component in self.components:
                await component.start()
                for name, worker in component.tasks().items():
                    self._supervisor.add(name, worker)
            self.readiness.clear(REASON_NOT_RUNNING)
            try:
                await self._supervisor.run()
            except WorkerStopped as exc:
                if isinstance(exc.__cause__, ScopeError):
                    raise exc.__cause__ from None  # Identity's refusal is the failure
                raise
        finally:
            for component in self.components:
                await component.aclose()
            self.metrics.shutdown()

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

    def _steps(self) -> Iterator[tuple[str, BeatStep]]:
        """This beat's steps: the pod's own, every component's, then those
        `register_beat_step` added."""
        for component in (self.upkeep, *self.components):
            yield from component.beat_steps().items()
        yield from self._beat_steps.items()

    async def _beat(self) -> None:
        await run_beat(self._steps, self.readiness, self.config.beat_interval)
