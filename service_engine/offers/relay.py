"""`KvDrainRelay`: publish a published language monotonically by key and version.

A source hands the relay `KvPut` / `KvRetract` changes, each carrying the
source's version of the key. The relay applies a change to the bucket only
when its version is above the key's watermark
(``service_engine.kv_relay_watermark``, which survives restarts), then
raises the watermark: a stale Put after a newer Retract is a no-op, and so
is a replay of what was already published.

Over a bucket an operator truncated and rebuilt, the relay refuses to
re-put unchanged-version keys (their watermark is still there) until
`KvDrainRelay.reset_watermarks` clears the relay's watermarks; the source's
re-staged set then converges the rebuilt bucket (s171).

The engine hosts a relay (``Engine.register_kv_relay``, `HostedKvRelay`):
it binds the bucket at ``run`` (an absent one fails loud, naming it) and,
on every beat, the pod holding the relay's lease (slot ``kv_relay:{name}``,
renewed on the beat, taken over once it expires) asks the relay's
`KvSource` for its pending changes, publishes them in order and
acknowledges them. A pod that dies between the publish and the
acknowledgement leaves them pending: the next leader republishes them and
the watermark makes that a no-op.

`KvDrainRelay.publish` is safe under concurrent publishers of one key (two
relays, or an old leader still running): it takes the key's advisory lock
(``service_engine.kv_relay`` domain; a transaction held across the one KV
round-trip, contended only by publishers of that same key), observes the
key's bucket revision *before* it checks the watermark, writes with a
compare-and-set on that revision (`create` for an absent key, `update` /
`delete` with ``last``), and raises the watermark only upward in the same
transaction. A publisher that lost the lock (its connection dropped) still
cannot overwrite a newer write: its compare-and-set fails, and the retry
re-reads the revision and the watermark.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, TypeAlias

from ..beat.leader import LeaderLease
from ..db.errors import Stage, translating
from ..db.locks import advisory_key
from ..db.pool import Database
from ..db.types import Conn
from ..failures import ConfigError
from ..messaging.nats import KvBucket, KvConflict, Nats

__all__ = [
    "KV_RELAY_SLOT",
    "HostedKvRelay",
    "KvChangeSet",
    "KvDrainRelay",
    "KvPut",
    "KvRetract",
    "KvSource",
    "RelayReport",
    "raise_watermark",
    "read_watermark",
]


@dataclass(frozen=True, slots=True)
class KvPut:
    key: str
    version: int
    value: bytes


@dataclass(frozen=True, slots=True)
class KvRetract:
    key: str
    version: int


KvChangeSet: TypeAlias = KvPut | KvRetract


@dataclass(frozen=True, slots=True)
class RelayReport:
    """What one `KvDrainRelay.drain` did: applied to the bucket, or skipped
    as at or below the key's watermark."""

    applied: int
    stale: int


_RAISE = """
INSERT INTO service_engine.kv_relay_watermark AS w (relay, key, version, retracted)
VALUES ($1, $2, $3, $4)
ON CONFLICT (relay, key) DO UPDATE
   SET version = EXCLUDED.version, retracted = EXCLUDED.retracted, updated_at = clock_timestamp()
 WHERE w.version < EXCLUDED.version
RETURNING version
"""


async def raise_watermark(
    conn: Conn, relay: str, key: str, version: int, *, retracted: bool = False
) -> bool:
    """Raise ``(relay, key)``'s watermark to ``version``; False when it was
    already at or above it."""
    return await conn.fetchval(_RAISE, relay, key, version, retracted) is not None


async def read_watermark(conn: Conn, relay: str, key: str) -> int | None:
    value = await conn.fetchval(
        "SELECT version FROM service_engine.kv_relay_watermark WHERE relay = $1 AND key = $2",
        relay, key,
    )
    return None if value is None else int(value)


RELAY_LOCK_DOMAIN = "service_engine.kv_relay"
_ATTEMPTS = 8

#: The test-support seam: awaited with the change after the key's revision
#: and watermark were read and before the bucket write.
RelayHook: TypeAlias = Callable[[KvChangeSet], Awaitable[None]]


class KvDrainRelay:
    """Publishes one source's changes into ``bucket`` under watermark ``name``."""

    def __init__(
        self, db: Database, name: str, bucket: KvBucket, *, hook: RelayHook | None = None
    ) -> None:
        if not name:
            raise ConfigError("a KvDrainRelay needs a name (its watermarks' key)")
        self.db = db
        self.name = name
        self.bucket = bucket
        self.hook = hook

    async def watermark(self, key: str) -> int | None:
        """The highest version published for ``key`` (None: never)."""
        with translating(Stage.RELAY):
            async with self.db.pool.acquire() as conn:
                return await read_watermark(conn, self.name, key)

    async def publish(self, change: KvChangeSet) -> bool:
        """Apply ``change`` if it is newer than the key's watermark; True
        when applied. A bucket failure raises `NatsUnavailable` and leaves
        the watermark where it was (the source re-stages the change)."""
        lock = advisory_key(RELAY_LOCK_DOMAIN, self.name, change.key)
        attempts = 0
        while True:
            with translating(Stage.RELAY):
                async with self.db.pool.acquire() as conn, conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock($1::bigint)", lock)
                    # The revision before the watermark: a write landing after
                    # this read moves the revision and loses the compare-and-set.
                    entry = await self.bucket.get(change.key)
                    current = await read_watermark(conn, self.name, change.key)
                    if current is not None and change.version <= current:
                        return False
                    if self.hook is not None:
                        await self.hook(change)
                    try:
                        if isinstance(change, KvPut):
                            if entry is None:
                                await self.bucket.create(change.key, change.value)
                            else:
                                await self.bucket.update(
                                    change.key, change.value, last=entry.revision
                                )
                        elif entry is not None:
                            await self.bucket.delete(change.key, last=entry.revision)
                    except KvConflict:
                        # The key moved under a writer outside this relay's lock:
                        # re-read the revision and the watermark (bounded).
                        attempts += 1
                        if attempts >= _ATTEMPTS:
                            raise
                        continue
                    await raise_watermark(
                        conn, self.name, change.key, change.version,
                        retracted=isinstance(change, KvRetract),
                    )
                    return True

    async def drain(self, changes: Iterable[KvChangeSet]) -> RelayReport:
        """`publish` each change in order."""
        applied = stale = 0
        for change in changes:
            if await self.publish(change):
                applied += 1
            else:
                stale += 1
        return RelayReport(applied, stale)

    async def reset_watermarks(self) -> int:
        """Forget every watermark of this relay (after the bucket was
        truncated and rebuilt); returns how many. The source then re-stages
        its whole set and the relay re-puts it."""
        with translating(Stage.RELAY):
            status = await self.db.pool.execute(
                "DELETE FROM service_engine.kv_relay_watermark WHERE relay = $1", self.name
            )
        return int(status.split()[-1])


_log = logging.getLogger(__name__)

KV_RELAY_SLOT = "kv_relay:{name}"
"""The leader slot of hosted relay ``name``."""


class KvSource(Protocol):
    """Where a hosted `KvDrainRelay`'s changes come from (the source of a
    published language: a table of staged changes, a change feed)."""

    async def pending(self, limit: int) -> Sequence[KvChangeSet]:
        """Up to ``limit`` changes not yet acknowledged, oldest first."""
        ...

    async def published(self, changes: Sequence[KvChangeSet]) -> None:
        """``changes`` reached the bucket or were stale (at or below their
        key's watermark): forget them. Called only by the lease holder."""
        ...


class HostedKvRelay:
    """A `KvDrainRelay` the engine runs: bound at ``run``, drained on the
    beat by the pod holding its lease (`Engine.register_kv_relay`)."""

    def __init__(
        self,
        db: Database,
        nats: Nats,
        name: str,
        bucket: str,
        source: KvSource,
        *,
        holder: str,
        lease: timedelta,
        batch: int,
    ) -> None:
        if not bucket:
            raise ConfigError(f"kv relay {name!r} needs a bucket")
        if not callable(getattr(source, "pending", None)) or not callable(
            getattr(source, "published", None)
        ):
            raise ConfigError(
                f"kv relay {name!r}: the source implements pending(limit) and "
                f"published(changes), got {source!r}"
            )
        if batch <= 0:
            raise ConfigError(f"kv relay {name!r}: batch must be positive")
        self.name = name
        self.bucket_name = bucket
        self.source = source
        self.nats = nats
        self.lease = LeaderLease(db, KV_RELAY_SLOT.format(name=name), holder, lease)
        self.batch = batch
        self._db = db
        self._relay: KvDrainRelay | None = None

    @property
    def relay(self) -> KvDrainRelay:
        """The bound relay (its watermarks, `KvDrainRelay.reset_watermarks`);
        `ConfigError` before `bind`."""
        if self._relay is None:
            raise ConfigError(f"kv relay {self.name!r} is not bound yet (run binds it)")
        return self._relay

    async def bind(self) -> None:
        """Bind the bucket; `BucketMissing` names an absent one."""
        bucket = await self.nats.bind_bucket(self.bucket_name)
        self._relay = KvDrainRelay(self._db, self.name, bucket)

    async def beat(self) -> None:
        """The beat step: `step`, its report dropped."""
        await self.step()

    async def step(self) -> RelayReport:
        """As the lease holder, publish up to ``batch`` pending
        changes of the source in order and acknowledge them. Skipped while
        the broker is unreachable; a failed publish raises (the beat holds
        readiness on it) and leaves the changes pending."""
        if not self.nats.reachable():
            return RelayReport(0, 0)
        if await self.lease.acquire() is None:
            return RelayReport(0, 0)
        changes = list(await self.source.pending(self.batch))
        if not changes:
            return RelayReport(0, 0)
        report = await self.relay.drain(changes)
        await self.source.published(changes)
        return report

    async def aclose(self) -> None:
        """On shutdown: give up the lease so another pod relays at once."""
        try:
            await self.lease.release()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # best effort: the lease expires anyway
            _log.warning("kv relay %s: releasing the lease failed: %s", self.name, exc)
