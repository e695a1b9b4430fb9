"""Fenced leases over ``service_engine.leader_slot``.

A `LeaderLease` names one slot (``"outbox"``, ``"offer:cards"``, ...) and
this pod as a holder. `acquire` (call it on every beat) takes a free slot,
renews our own, or takes over one whose lease expired by the *database*
clock; a takeover bumps the fence. Leader work then writes only inside a
transaction that first calls `assert_lease`, which checks holder, fence and
expiry and locks the slot row, so a holder frozen past its lease fails its
writes instead of racing the pod that took over.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ..db.errors import Stage, translating
from ..db.pool import Database
from ..db.types import Conn
from ..failures import ConfigError, EngineError


class LeaseLost(EngineError):
    """This pod does not hold the lease (never had it, it expired, or another
    pod took over): abandon the leader work; the transaction rolls back."""

    def __init__(self, slot: str, holder: str, detail: str) -> None:
        super().__init__(f"lease {slot!r} not held by {holder!r}: {detail}")
        self.slot = slot
        self.holder = holder


@dataclass(frozen=True, slots=True)
class Lease:
    """A held lease: the fence identifies this tenure of ``holder``."""

    slot: str
    holder: str
    fence: int
    expires_at: datetime


# Takes a free slot, renews our own (same fence) or takes over an expired
# one (fence + 1). clock_timestamp(), not now(): the expiry is judged at the
# instant of the statement, not the transaction start.
_ACQUIRE = """
INSERT INTO service_engine.leader_slot AS s (slot, holder, fence, acquired_at, expires_at)
VALUES ($1, $2, 1, clock_timestamp(), clock_timestamp() + $3::interval)
ON CONFLICT (slot) DO UPDATE
   SET holder      = EXCLUDED.holder,
       fence       = CASE WHEN s.holder = EXCLUDED.holder THEN s.fence ELSE s.fence + 1 END,
       acquired_at = CASE WHEN s.holder = EXCLUDED.holder THEN s.acquired_at
                          ELSE clock_timestamp() END,
       expires_at  = clock_timestamp() + $3::interval
 WHERE s.holder = EXCLUDED.holder OR s.expires_at <= clock_timestamp()
RETURNING fence, expires_at
"""

# FOR SHARE: a takeover's UPDATE waits for our transaction, and if it
# committed first the re-check sees its holder/fence and finds no row.
_ASSERT = """
SELECT 1 FROM service_engine.leader_slot
 WHERE slot = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp()
   FOR SHARE
"""

_RELEASE = """
UPDATE service_engine.leader_slot SET expires_at = clock_timestamp()
 WHERE slot = $1 AND holder = $2 AND fence = $3
"""


class LeaderLease:
    """One pod's claim on one leader slot.

    ``holder`` must be unique among the pods (`EngineConfig.pod_id`);
    ``lease`` is how long an acquire holds without renewal
    (`EngineConfig.lease`, which outlasts the beat). A database failure
    raises a `DatabaseError` (stage LEASE), never a driver error.
    """

    def __init__(self, db: Database, slot: str, holder: str, lease: timedelta) -> None:
        if not slot or not holder:
            raise ConfigError("a lease needs a slot and a holder")
        if lease <= timedelta(0):
            raise ConfigError("lease must be positive")
        self.db = db
        self.slot = slot
        self.holder = holder
        self.lease = lease
        self._current: Lease | None = None

    @property
    def current(self) -> Lease | None:
        """The lease as of the last `acquire` (None: not the leader). Only
        `assert_lease` inside a transaction proves it still holds."""
        return self._current

    async def acquire(self) -> Lease | None:
        """Take, renew or take over the slot; None while another pod's lease
        is live. Call on every beat."""
        with translating(Stage.LEASE):
            row = await self.db.pool.fetchrow(_ACQUIRE, self.slot, self.holder, self.lease)
            self._current = (
                None if row is None
                else Lease(self.slot, self.holder, int(row["fence"]), row["expires_at"])
            )
        return self._current

    async def assert_lease(self, conn: Conn) -> Lease:
        """Inside an open transaction: raise `LeaseLost` unless this pod
        still holds the slot at the fence it acquired, unexpired by the
        database clock. Call it before the leader's writes."""
        lease = self._current
        if lease is None:
            raise LeaseLost(self.slot, self.holder, "not acquired")
        with translating(Stage.LEASE):
            held = await conn.fetchval(_ASSERT, self.slot, self.holder, lease.fence)
        if held is None:
            self._current = None
            raise LeaseLost(self.slot, self.holder, f"fence {lease.fence} expired or taken over")
        return lease

    async def release(self) -> None:
        """Expire our lease now so another pod takes over without waiting
        (on shutdown)."""
        with translating(Stage.LEASE):
            lease = self._current
            self._current = None
            if lease is not None:
                await self.db.pool.execute(_RELEASE, self.slot, self.holder, lease.fence)
