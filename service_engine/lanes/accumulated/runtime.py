"""The accumulated lane of one engine: the registered accumulators, the
fold cache, `push_chunk`, the post-commit purge of a sealed key's NATS
subject and the beat's backstop and retention sweep."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors

from ...config import EngineConfig
from ...db.errors import Stage, translating
from ...db.pool import Database
from ...failures import ConfigError, DuplicateRegistration
from ...messaging.nats import Nats
from ...metrics import Metrics
from .accumulator import Accumulator, Durable, Folded, fold_key
from .chunks import ChunkSeq, FoldCache, Gesture, check_key, stream_name, stream_subject
from .errors import AccumulatorWithoutService, ChunkConflict, KeySealed
from .flush import ChunkFlusher, Outcome

__all__ = ["Accumulators"]

_log = logging.getLogger(__name__)

RETENTION_SWEEP_EVERY = 60.0
"""Seconds between two retention sweeps (a beat runs far more often)."""
PURGE_BACKSTOP_AFTER = 2.0
"""Seconds a marker may wait for its sealing pod's purge before the beat does it."""
_PURGE_BATCH = 100


class Accumulators:
    """Lane A for one engine (`Engine.register_accumulator`, `push_chunk`, `fold`)."""

    def __init__(
        self, db: Database, config: EngineConfig, nats: Nats | None, metrics: Metrics | None
    ) -> None:
        self.db = db
        self.config = config
        self.nats = nats
        self.metrics = metrics
        self.registered: dict[str, Accumulator[Any]] = {}
        self.cache: FoldCache[Any] = FoldCache(config.fold_cache_capacity)
        self.flusher = ChunkFlusher(db, config.lock_timeout, on_outcomes=self._count)
        self.purged = 0
        self._swept_at: float | None = None
        self._bound = config.lock_timeout.total_seconds()
        """How long an acquire waits for a pool connection."""

    @property
    def stream(self) -> str:
        assert self.config.service is not None
        return stream_name(self.config.service)

    def register(self, accumulator: Accumulator[Any]) -> None:
        if not isinstance(accumulator, Accumulator):
            raise ConfigError(f"expected an Accumulator, got {accumulator!r}")
        if self.config.service is None:
            raise AccumulatorWithoutService(
                f"accumulator {accumulator.name}: configure a service; its chunks ride "
                "the STREAMING_{service} stream"
            )
        if self.nats is None:
            raise ConfigError(
                f"accumulator {accumulator.name} needs NATS: boot the engine with a Nats connection"
            )
        if accumulator.name in self.registered:
            raise DuplicateRegistration("accumulator", accumulator.name)
        self.registered[accumulator.name] = accumulator
        accumulator._attach(self)

    def detach(self) -> None:
        for accumulator in self.registered.values():
            accumulator._detach(self)

    def resolve(self, accumulator: Accumulator[Any] | str | None) -> Accumulator[Any]:
        """The registered accumulator (by declaration or name; None: the only one)."""
        if accumulator is None:
            if len(self.registered) != 1:
                raise ConfigError(
                    "name the accumulator: this engine registers "
                    f"{len(self.registered)} ({', '.join(sorted(self.registered)) or 'none'})"
                )
            return next(iter(self.registered.values()))
        name = accumulator if isinstance(accumulator, str) else accumulator.name
        found = self.registered.get(name)
        if found is None:
            raise ConfigError(f"accumulator {name!r} is not registered on this engine")
        return found

    async def push_chunk(
        self, accumulator: Accumulator[Any] | str, key: str, seq: int, chunk: bytes
    ) -> Durable:
        """Make one chunk durable; `Durable` once committed. Raises
        `ChunkConflict`, `KeySealed`, `ChunkSeqOutOfRange`, `InvalidChunkKey`."""
        checked = ChunkSeq(seq)
        check_key(key)
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise ConfigError(f"a chunk is bytes, got {type(chunk).__name__}")
        declared = self.resolve(accumulator)
        return await self.flusher.submit(declared.name, key, checked, bytes(chunk))

    async def fold(self, accumulator: Accumulator[Any] | str, key: str) -> Folded[Any]:
        """The key's folded contiguous prefix (cached, verified against the table)."""
        declared = self.resolve(accumulator)
        with translating(Stage.LOAD):
            # One snapshot: a seal committing meanwhile is either wholly
            # seen (the marker) or not at all (the chunks).
            async with self.db.connection("Engine.fold", self._bound) as conn, conn.transaction(
                isolation="repeatable_read", readonly=True
            ):
                return await fold_key(conn, declared, key, self.cache)

    # -- after a seal -------------------------------------------------------

    def sealed(self, accumulator: str, key: str, gesture: Gesture) -> Callable[[], Awaitable[None]]:
        """What the sealing transaction runs once it committed: count the
        seal, drop the cached fold and purge the key's NATS subject."""

        async def after_commit() -> None:
            self.cache.invalidate(accumulator, key)
            if self.metrics is not None:
                self.metrics.add_seals(gesture, "sealed")
            try:
                await self.purge(accumulator, key)
            except Exception as exc:  # the beat is the backstop
                _log.warning("purge of sealed key %s/%s failed: %s", accumulator, key, exc)

        return after_commit

    def refused(self, gesture: Gesture, code: str) -> None:
        if self.metrics is not None:
            self.metrics.add_seals(gesture, code)

    async def purge(self, accumulator: str, key: str) -> None:
        """Purge ``stream.{service}.{key}`` and mark the marker purged."""
        if self.nats is None or self.config.service is None:
            return
        subject = stream_subject(self.config.service, key)
        try:
            await asyncio.wait_for(
                self.nats.js.purge_stream(self.stream, subject=subject),
                self.nats.publish_ack_timeout,
            )
        except nats.js.errors.NotFoundError:
            pass  # no stream, nothing to purge
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise ConnectionError(
                f"purge of {subject} failed: {type(exc).__name__}: {exc}"
            ) from exc
        with translating(Stage.RELAY):
            async with self.db.connection("Accumulators.purge", self._bound) as conn:
                await conn.execute(
                    "UPDATE service_engine.accumulator_seal SET stream_purged = true "
                    "WHERE accumulator = $1 AND key = $2",
                    accumulator, key,
                )
        self.purged += 1

    async def beat(self) -> None:
        """The backstop: purge the subjects of sealed keys a pod died before
        purging; sweep markers older than ``seal_retention`` (see `_sweep`)."""
        retention = self.config.seal_retention
        now = time.monotonic()
        every = min(RETENTION_SWEEP_EVERY, retention.total_seconds() / 2)
        sweep = self._swept_at is None or now - self._swept_at >= every
        with translating(Stage.RELAY):
            async with self.db.connection("Accumulators.beat", self._bound) as conn:
                rows = await conn.fetch(
                    "SELECT accumulator, key FROM service_engine.accumulator_seal "
                    "WHERE NOT stream_purged AND sealed_at < now() - make_interval(secs => $1) "
                    "ORDER BY sealed_at LIMIT $2",
                    PURGE_BACKSTOP_AFTER, _PURGE_BATCH,
                )
                if sweep:
                    await self._sweep(conn, retention.total_seconds())
                    self._swept_at = now
        if self.nats is not None and self.nats.reachable():
            for row in rows:
                await self.purge(row["accumulator"], row["key"])

    async def _sweep(self, conn: Any, retention_seconds: float) -> None:
        """Sweep purged markers older than ``seal_retention`` (the marker
        outlives the stream, whose max_age retention covers) and any chunk
        left behind by a sealed key. A chunk of an open key is never swept
        by age: it was acked durable, and an acked chunk is never dropped
        (aging chunk 0 away would stall the fold and fail every seal). An
        open stream ends through a seal gesture (``seal_current`` cancels
        it) or an erasure, never through retention."""
        with translating(Stage.RELAY):
            async with conn.transaction():
                await conn.execute(
                    "DELETE FROM service_engine.accumulator_chunk c "
                    "USING service_engine.accumulator_seal s "
                    "WHERE c.accumulator = s.accumulator AND c.key = s.key"
                )
                await conn.execute(
                    "DELETE FROM service_engine.accumulator_seal "
                    "WHERE stream_purged AND sealed_at < now() - make_interval(secs => $1)",
                    retention_seconds,
                )

    def _count(self, outcomes: list[Outcome]) -> None:
        if self.metrics is None:
            return
        counts: dict[str, int] = {}
        for outcome in outcomes:
            if isinstance(outcome, Durable):
                label = "duplicate" if outcome.duplicate else "durable"
            elif isinstance(outcome, ChunkConflict):
                label = "conflict"
            elif isinstance(outcome, KeySealed):
                label = "sealed"
            else:
                label = "other"
            counts[label] = counts.get(label, 0) + 1
        for label, count in counts.items():
            self.metrics.add_chunks(label, count)
