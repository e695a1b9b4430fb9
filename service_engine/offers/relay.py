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

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeAlias

from ..db.errors import Stage, translating
from ..db.locks import advisory_key
from ..db.pool import Database
from ..db.types import Conn
from ..errors import ConfigError
from ..messaging.nats import KvBucket, KvConflict

__all__ = [
    "KvChangeSet",
    "KvDrainRelay",
    "KvPut",
    "KvRetract",
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
