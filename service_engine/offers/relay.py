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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

from ..db.errors import Stage, translating
from ..db.pool import Database
from ..db.types import Conn
from ..errors import ConfigError
from ..messaging.nats import KvBucket

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


class KvDrainRelay:
    """Publishes one source's changes into ``bucket`` under watermark ``name``."""

    def __init__(self, db: Database, name: str, bucket: KvBucket) -> None:
        if not name:
            raise ConfigError("a KvDrainRelay needs a name (its watermarks' key)")
        self.db = db
        self.name = name
        self.bucket = bucket

    async def watermark(self, key: str) -> int | None:
        """The highest version published for ``key`` (None: never)."""
        with translating(Stage.RELAY):
            async with self.db.pool.acquire() as conn:
                return await read_watermark(conn, self.name, key)

    async def publish(self, change: KvChangeSet) -> bool:
        """Apply ``change`` if it is newer than the key's watermark; True
        when applied. A bucket failure raises `NatsUnavailable` and leaves
        the watermark where it was (the source re-stages the change)."""
        current = await self.watermark(change.key)
        if current is not None and change.version <= current:
            return False
        if isinstance(change, KvPut):
            await self.bucket.put(change.key, change.value)
        else:
            await self.bucket.delete(change.key)
        with translating(Stage.RELAY):
            async with self.db.pool.acquire() as conn:
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
