"""The lanes component: lane A's accumulators and the presence lanes.

`Lanes` is what `Engine` composes for the NATS lanes: the registered
accumulators (their chunks from `push_chunk` and from the
``STREAMING_{service}`` stream, bound when `Engine.run` starts, flushed and
sealed on the beat), the presence lanes over ``EPHEMERAL_{service}``, and
the hub of lane notices that pauses and resumes the sessions watching a
lane while the broker is away.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import Any

from ..beat.component import BeatStep
from ..config import EngineConfig
from ..db.pool import Database
from ..failures import ConfigError, EngineError
from ..impacts.model import JsonValue
from ..impacts.transport import ImpactChannel
from ..messaging.nats import Nats
from ..metrics import Metrics
from ..readiness import ReadinessHandle
from ..render.projector import Projector
from ..render.registry import RenderRegistry
from ..supervisor import Worker
from .accumulated.accumulator import Accumulator, Durable, Folded
from .accumulated.ingress import IngressSupervisor, LaneIngress, bind_lane_stream
from .accumulated.runtime import Accumulators
from .notices import LaneHealth, LaneNotices, LaneNoticeStream
from .presence.model import (
    PRESENCE_LANE,
    PresenceProjector,
    PresenceWithoutNats,
    PresenceWithoutService,
)
from .presence.runtime import PresenceHandle, PresenceLanes

__all__ = ["Lanes"]


class Lanes:
    """The accumulators, presence lanes and lane notices of one pod."""

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        nats: Nats | None,
        readiness: ReadinessHandle,
        metrics: Metrics,
        render: RenderRegistry,
        channel: ImpactChannel,
        *,
        serve: Callable[[Projector[Any, Any, Any, Any]], None],
        nats_health: LaneHealth | None,
        accepting: Callable[[], None],
    ) -> None:
        self._db = db
        self._config = config
        self._nats = nats
        self._readiness = readiness
        self._metrics = metrics
        self._render = render
        self._channel = channel
        self._serve = serve
        self._nats_health = nats_health
        self._accepting = accepting
        """Raises `ShuttingDown` once the engine's shutdown began."""
        self._started = False
        self.accumulators = Accumulators(db, config, nats, metrics)
        """Lane A: the registered accumulators, their fold cache and flush."""
        self.ingress: IngressSupervisor | None = None
        self.hub = LaneNotices(render, channel)
        """Which projectors watch which NATS lane; the lane notices' hub."""
        self.presence_lanes: PresenceLanes | None = None
        """The presence lanes (after `register_presence`)."""

    # -- presence -------------------------------------------------------

    def register_presence(
        self, projector: PresenceProjector[Any, Any, Any], ttl: timedelta
    ) -> PresenceHandle:
        """Serve presence lane ``projector`` (its NAME) whose keys expire
        ``ttl`` after their last put; returns the lane's writer. The
        ``EPHEMERAL_{service}`` bucket is bound when `run` starts (or
        `bind_presence`). Raises `PresenceWithoutNats` / `PresenceWithoutService`,
        `ConfigError` after `run` started or for a bad ttl or NAME,
        `DuplicateRegistration` for a name already registered."""
        if self._nats is None:
            raise PresenceWithoutNats(f"presence lane {projector.NAME!r} needs NATS")
        if not self._config.service:
            raise PresenceWithoutService(
                f"presence lane {projector.NAME!r}: configure a service (EPHEMERAL_<service>)"
            )
        if self._started:
            raise ConfigError(f"presence lane {projector.NAME}: register presence before run()")
        if self.presence_lanes is None:
            hub = self.hub
            self.presence_lanes = PresenceLanes(
                self._nats, self._config.service, self._render, self._channel,
                self._readiness, self._metrics, paused=lambda: hub.paused,
            )
        handle = self.presence_lanes.register(projector, ttl)
        self._serve(projector)
        self.hub.watch(PRESENCE_LANE, projector.NAME)
        return handle

    def presence(self, projector: str) -> PresenceHandle:
        """The writer of presence lane ``projector``."""
        if self.presence_lanes is None:
            raise ConfigError("no presence lane is registered")
        return self.presence_lanes.handle(projector)

    async def clear_presence(self, projector: str, key: str) -> bool:
        return await self.presence(projector).clear(key)

    async def present(self, projector: str, key: str, value: JsonValue) -> bool:
        """Put ``value`` under ``key`` in presence lane ``projector`` now
        (loss-tolerant: True when the bucket stored it)."""
        return await self.presence(projector).put(key, value)

    async def bind_presence(self) -> None:
        """Bind the presence bucket now rather than at `run` (idempotent);
        raises its `PresenceBucketRefused` with readiness DOWN."""
        if self.presence_lanes is not None:
            await self.presence_lanes.bind()

    # -- lane notices ---------------------------------------------------

    def lane_notices(self, lanes: Collection[str] | None = None) -> LaneNoticeStream:
        """The raw lane signal: a stream of `LaneNotice` naming any of
        ``lanes`` (None: every lane). Close it when done."""
        return self.hub.subscribe(lanes)

    def watch_lane(self, lane: str, projector: str) -> None:
        """Sessions of ``projector`` watch NATS lane ``lane`` (say
        ``ACCUMULATED_LANE``): they get its LanesPaused / LanesResumed
        notices and a Reset on resume. Presence lanes watch on their own."""
        self.hub.watch(lane, self._render.projector(projector).NAME)

    def lanes_of(self, projector: str) -> frozenset[str]:
        """The NATS lanes sessions of ``projector`` watch (empty: none)."""
        return self.hub.lanes_of(projector)

    async def _lane_notices(self) -> None:
        assert self._nats_health is not None
        await self.hub.run(self._nats_health, self._nats_health.interval)

    # -- accumulators ---------------------------------------------------

    def register_accumulator(self, accumulator: Accumulator[Any]) -> None:
        """Serve ``accumulator``'s lane from `run` on: its chunks from
        `push_chunk` and from ``stream.{service}.{key}`` on the
        ``STREAMING_{service}`` stream (bound at `run`). Raises
        `AccumulatorWithoutService`, `DuplicateRegistration`, `ConfigError`
        without NATS or after `run` started."""
        if self._started:
            raise ConfigError(f"accumulator {accumulator.name}: register accumulators before run()")
        self.accumulators.register(accumulator)

    async def push_chunk(
        self, accumulator: Accumulator[Any] | str, key: str, seq: int, chunk: bytes
    ) -> Durable:
        """Make chunk ``seq`` of ``key``'s stream durable; the `Durable`
        receipt answers once it committed. An identical resubmit is
        idempotent (``duplicate``); different bytes raise `ChunkConflict`, a
        sealed key `KeySealed`, a bad seq `ChunkSeqOutOfRange`."""
        self._accepting()
        return await self.accumulators.push_chunk(accumulator, key, seq, chunk)

    async def fold(self, accumulator: Accumulator[Any] | str, key: str) -> Folded[Any]:
        """``key``'s state: the fold of its contiguous durable prefix."""
        return await self.accumulators.fold(accumulator, key)

    # -- the component --------------------------------------------------

    async def start(self) -> None:
        """Bind the presence bucket, and ``STREAMING_{service}`` for the
        accumulators (absent: `LaneStreamMissing`; its max_age above
        ``seal_retention``: `SealRetentionTooShort`; both hold readiness
        DOWN), then the flush and the ingress join the supervisor."""
        self._started = True
        if self.presence_lanes is not None:
            await self.presence_lanes.bind()
        if not self.accumulators.registered:
            return
        config, service = self._config, self._config.service
        assert self._nats is not None and service is not None
        try:
            await bind_lane_stream(self._nats, service, config.seal_retention)
        except EngineError as exc:
            self._readiness.set_down("lane_stream", f"{type(exc).__name__}: {exc}")
            self._metrics.set_dependency("streaming", False)
            raise
        self.ingress = IngressSupervisor(
            LaneIngress(self.accumulators, self._nats, config), self._readiness, self._metrics,
            threshold=config.inbound_failure_threshold,
            backoff=config.inbound_restart_backoff,
            backoff_cap=config.inbound_restart_backoff_cap,
        )

    def tasks(self) -> Mapping[str, Worker]:
        tasks: dict[str, Worker] = {}
        if self._nats_health is not None:
            tasks["lane_notices"] = self._lane_notices
        if self._started and self.presence_lanes is not None:
            tasks["presence"] = self.presence_lanes.run
        if self.ingress is not None:
            tasks["lane_flush"] = self.accumulators.flusher.run
            tasks["lane_ingress"] = self.ingress.run
        return tasks

    def beat_steps(self) -> Mapping[str, BeatStep]:
        return {"lane_seals": self.accumulators.beat} if self.accumulators.registered else {}

    async def aclose(self) -> None:
        self.accumulators.detach()
