"""The presence lane's running half: registration, the boot bind, the writes
(`PresenceHandle`) and the watcher worker.

`PresenceLanes.bind` binds the ``EPHEMERAL_{service}`` bucket once at boot
and refuses it loud (`PresenceBucketRefused`, readiness DOWN under
``presence_bucket``). `PresenceLanes.run` is the watcher, a supervised
worker of every pod: it seeds each lane's fold from the bucket, then folds
every change of the bucket's stream from the revision the seed reached and
hands the changed keys to the render loop as impacts of the lane's noun —
so the sessions of a presence projector get their Upserts and Removes
through the same pass as every other view. When the NATS connection comes
back (its reconnect count moved, or the watch broke) the watcher reseeds
every lane from the bucket and Resets every session of a presence projector:
a key that expired or changed while NATS was down is repaired, not served
forever. ``service_engine_dependency_up{dependency="presence"}`` is 1 while
the watcher is seeded and watching.

The watcher survives what goes wrong at runtime: the bucket deleted (it
checks the bucket every `CHECK_EVERY` seconds while it watches, since a
watch on a deleted stream just goes quiet), a bucket recreated under it
(its revision went back), a projector's fold raising. Each holds readiness
DOWN under `REASON_PRESENCE_WATCH` with the reason, and the watcher
retries with a bounded, doubling backoff (re-binding and re-checking the
bucket, then reseeding with a Reset); the first good seed clears it. The
pod keeps serving everything else meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ...failures import DuplicateRegistration, EngineError
from ...impacts.model import Impact, JsonValue
from ...impacts.transport import ImpactChannel
from ...messaging.nats import Acked, Duplicate, Nats, NatsUnavailable
from ...metrics import Metrics
from ...readiness import ReadinessHandle
from ...render.registry import RenderRegistry
from ...supervisor import Restarting
from ..notices import reset_sessions
from .bucket import PresenceBucket, bind_presence_bucket
from .model import (
    PRESENCE_LANE,
    PresenceBucketRefused,
    PresenceChange,
    PresenceProjector,
    bucket_key,
    check_bucket,
    check_lane_name,
    check_presence_key,
    check_ttl,
    encode_value,
    presence_bucket_name,
)

__all__ = [
    "DEPENDENCY",
    "REASON_PRESENCE_WATCH",
    "PresenceHandle",
    "PresenceLanes",
    "PresenceNotBound",
]

_log = logging.getLogger(__name__)

DEPENDENCY = "presence"
"""The ``dependency_up`` series of the presence bucket."""

POLL = 0.25
"""Seconds the watcher waits for a change before it re-checks the connection."""
CHECK_EVERY = 1.0
"""Seconds between two checks, while watching, that the bucket still exists."""
BACKOFF = 0.1
BACKOFF_CAP = 5.0
"""The watcher's restart backoff: doubling from BACKOFF, at most BACKOFF_CAP seconds."""
REASON_PRESENCE_WATCH = "presence_watch_stopped"
"""The readiness reason the watcher holds while it cannot watch the bucket."""


class _BucketReplaced(EngineError):
    """The bucket's revision went back: it was deleted and recreated."""


class PresenceNotBound(EngineError):
    """A presence write before the bucket was bound (`Engine.run` binds it,
    or ``await engine.bind_presence()``)."""


@dataclass(frozen=True, slots=True)
class PresenceHandle:
    """Writes one presence lane: ``put`` a key's value (it expires after the
    lane's ``ttl`` unless put again), ``clear`` it. Loss-tolerant: a write
    NATS does not take is dropped and counted, never raised; an invalid key
    or value raises (`InvalidPresenceKey`, `InvalidPresenceValue`)."""

    lane: str
    ttl: timedelta
    _lanes: PresenceLanes

    async def put(self, key: str, value: JsonValue) -> bool:
        """Write ``value`` under ``key``; True when the bucket stored it."""
        return await self.stage(key, value)()

    async def clear(self, key: str) -> bool:
        """Remove ``key`` now (watchers Remove it); True when the bucket took it."""
        return await self._lanes._clear(self.lane, bucket_key(self.lane, key))

    def stage(self, key: str, value: JsonValue) -> Callable[[], Awaitable[bool]]:
        """Validate the write now and return it to run later (``cx.present``
        runs it after the commit)."""
        target = bucket_key(self.lane, check_presence_key(key))
        payload = encode_value(value)
        lanes, lane = self._lanes, self.lane
        return lambda: lanes._put(lane, target, payload)


@dataclass(slots=True)
class _Lane:
    projector: PresenceProjector[Any, Any, Any]
    ttl: timedelta
    handle: PresenceHandle


class PresenceLanes:
    """The presence lanes of one engine, over one bucket."""

    def __init__(
        self,
        nats: Nats,
        service: str,
        render: RenderRegistry,
        channel: ImpactChannel,
        readiness: ReadinessHandle,
        metrics: Metrics | None = None,
        *,
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        self.nats = nats
        self._paused = paused
        self.bucket_name = presence_bucket_name(service)
        self._render = render
        self._channel = channel
        self._readiness = readiness
        self._metrics = metrics
        self._lanes: dict[str, _Lane] = {}
        self.bucket: PresenceBucket | None = None
        self.seeded = asyncio.Event()
        """Set once the watcher's first seed landed and it watches."""
        self.reseeds = 0
        """Seeds after the first (a reconnection or a broken watch)."""
        self.failures = 0
        """Watcher failures the supervision loop held DOWN and retried."""
        self.last_failure: str | None = None
        self.revision = 0
        """The last bucket revision folded."""
        self._seeded_once = False

    # -- registration --------------------------------------------------------------

    def register(
        self, projector: PresenceProjector[Any, Any, Any], ttl: timedelta
    ) -> PresenceHandle:
        """Add ``projector``'s lane (its NAME) with ``ttl``; the caller
        registers the projector with the render runtime."""
        lane = check_lane_name(projector.NAME)
        check_ttl(ttl)
        if lane in self._lanes:
            raise DuplicateRegistration("presence lane", lane)
        handle = PresenceHandle(lane, ttl, self)
        self._lanes[lane] = _Lane(projector, ttl, handle)
        return handle

    def handle(self, lane: str) -> PresenceHandle:
        try:
            return self._lanes[lane].handle
        except KeyError:
            raise EngineError(f"no presence lane named {lane!r}") from None

    @property
    def projectors(self) -> frozenset[str]:
        return frozenset(self._lanes)

    @property
    def lane(self) -> str:
        return PRESENCE_LANE

    # -- boot --------------------------------------------------------------------------

    async def bind(self) -> PresenceBucket:
        """Bind and check the bucket (idempotent). A refusal raises its
        `PresenceBucketRefused` subclass (or `NatsUnavailable`) and holds
        readiness DOWN under ``presence_bucket`` with the reason."""
        if self.bucket is not None:
            return self.bucket
        return await self._bind()

    async def _bind(self) -> PresenceBucket:
        try:
            bucket = await bind_presence_bucket(self.nats, self.bucket_name)
            check_bucket(bucket.facts, (lane.ttl for lane in self._lanes.values()))
        except (PresenceBucketRefused, NatsUnavailable) as exc:
            self._readiness.set_down(PresenceBucketRefused.reason, f"{type(exc).__name__}: {exc}")
            self._gauge(False)
            raise
        self._readiness.clear(PresenceBucketRefused.reason)
        self.bucket = bucket
        return bucket

    # -- writes --------------------------------------------------------------------------

    def _bound(self) -> PresenceBucket:
        if self.bucket is None:
            raise PresenceNotBound(
                f"presence bucket {self.bucket_name!r} is bound when the engine runs"
            )
        return self.bucket

    async def _put(self, lane: str, key: str, payload: bytes) -> bool:
        bucket = self._bound()
        outcome = await bucket.put(key, payload, self._lanes[lane].ttl)
        return self._written(lane, "put", outcome)

    async def _clear(self, lane: str, key: str) -> bool:
        bucket = self._bound()
        return self._written(lane, "clear", await bucket.clear(key))

    def _written(self, lane: str, op: str, outcome: object) -> bool:
        stored = isinstance(outcome, Acked | Duplicate)
        if not stored:
            _log.info("presence %s on lane %s dropped: %s", op, lane, outcome)
        if self._metrics is not None:
            self._metrics.add_presence_write(lane, op, stored)
        return stored

    # -- the watcher -----------------------------------------------------------------------

    def _reconnects(self) -> int:
        return int(self.nats.client.stats.get("reconnects", 0))

    async def run(self) -> None:
        """The watcher worker: seed, watch, reseed on every reconnection;
        a failure holds readiness DOWN and retries with a bounded backoff."""
        watcher = _Watcher(self, await self.bind())
        try:
            await watcher.run()
        finally:
            self._gauge(False)

    def _failed(self, detail: str) -> None:
        self.failures += 1
        self.last_failure = detail
        self._gauge(False)
        self.seeded.clear()
        self._readiness.set_down(REASON_PRESENCE_WATCH, detail)

    async def _watch(self, bucket: PresenceBucket, healthy: Callable[[], None]) -> None:
        """Seed and watch until the connection moved or the watch broke
        (calling ``healthy`` once seeded); raises what `_Watcher` holds DOWN
        and retries. Every seed after the first Resets the presence sessions."""
        await self._until_reachable()
        epoch = self._reconnects()
        try:
            seeded, reached = await bucket.snapshot()
            self._reseed(seeded, reset=self._seeded_once)
            self._seeded_once = True
            self.revision = reached
            watch = await bucket.watch(reached + 1)
        except NatsUnavailable as exc:
            _log.info("presence seed failed (retrying): %s", exc)
            self._gauge(False)
            await asyncio.sleep(POLL)
            return
        self._readiness.clear(REASON_PRESENCE_WATCH)
        self._gauge(True)
        self.seeded.set()
        healthy()
        checked = asyncio.get_running_loop().time()
        async with watch:
            while self._reconnects() == epoch and self.nats.reachable():
                change = await watch.next(POLL)
                if isinstance(change, PresenceChange):
                    self._apply(change)
                elif change is not None:  # the subscription broke
                    _log.info("presence watch broke (reseeding): %s", change.detail)
                    break
                now = asyncio.get_running_loop().time()
                if now - checked >= CHECK_EVERY:
                    checked = now
                    await self._check_bucket(bucket)
        self._gauge(False)
        self.seeded.clear()

    async def _check_bucket(self, bucket: PresenceBucket) -> None:
        """Raise when the bucket is gone (`PresenceBucketMissing`) or was
        recreated (its revision is behind what was folded)."""
        try:
            revision = await bucket.last_revision()
        except NatsUnavailable:
            return  # the connection state says it; the loop above reseeds
        if revision < self.revision:
            self.revision = 0
            raise _BucketReplaced(
                f"bucket {self.bucket_name} was recreated (revision {revision} is behind "
                "the folded one)"
            )

    async def _until_reachable(self) -> None:
        # nats-py exposes the connection state, not an event to wait on.
        while not self.nats.reachable():  # noqa: ASYNC110
            await asyncio.sleep(POLL)

    def _apply(self, change: PresenceChange) -> None:
        self.revision = max(self.revision, change.revision)
        lane = self._lanes.get(change.lane)
        if lane is None:
            return  # another service version's lane: not served here
        if lane.projector.STORE.fold.apply(change):
            self._channel.put([Impact.entity(lane.projector.NOUN, change.key)])
            if self._metrics is not None:
                self._metrics.add_presence_change(
                    change.lane, "remove" if change.value is None else "upsert"
                )

    def _reseed(self, seeded: dict[str, dict[str, Any]], *, reset: bool) -> None:
        """Replace every lane's fold with the bucket's state. After a
        reconnection every presence session is Reset — unless the lanes are
        paused: then the Reset that follows LanesResumed covers it, and the
        sessions see nothing before that notice."""
        paused = reset and self._paused()
        impacts: list[Impact] = []
        for name, lane in self._lanes.items():
            changed = lane.projector.STORE.fold.reseed(seeded.get(name, {}))
            impacts.extend(Impact.entity(lane.projector.NOUN, key) for key in sorted(changed))
        if impacts and not paused:
            self._channel.put(impacts)
        if reset:
            self.reseeds += 1
            if self._metrics is not None:
                self._metrics.add_presence_reseed()
            if not paused:
                reset_sessions(self._render, self._channel, self.projectors)

    def _gauge(self, up: bool) -> None:
        if self._metrics is not None:
            self._metrics.set_dependency(DEPENDENCY, up)


class _Watcher(Restarting):
    """The watcher's restart loop: every failure (threshold one) holds
    readiness DOWN and is retried with the bounded backoff, re-binding the
    bucket first (it may have been recreated); a good seed resets the count.
    A watch that ends without failing (a reconnection, a broken watch) is
    reseeded at once, with no backoff."""

    what = "presence watcher"

    def __init__(self, lanes: PresenceLanes, bucket: PresenceBucket) -> None:
        super().__init__(
            threshold=1, backoff=timedelta(seconds=BACKOFF),
            backoff_cap=timedelta(seconds=BACKOFF_CAP),
        )
        self.lanes = lanes
        self.bucket = bucket

    async def attempt(self, healthy: Callable[[], None]) -> None:
        if self.failures:
            self.bucket = await self.lanes._bind()
        while True:
            await self.lanes._watch(self.bucket, healthy)

    def stopped(self, detail: str) -> None:
        self.lanes._failed(detail)
