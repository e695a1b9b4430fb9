"""The leader's drain of dirty offer keys into their published-language buckets.

Per offer, the pod holding the fixed-slot lease ``offer:<NAME>`` (renewed
from its held state at most every ``interval``, a third of the lease at
most; taken over by another pod only once it expired) drains its dirty keys
in batches, in this order (s188), on one pooled connection, each step one
statement outside any transaction:

1. claim the batch skip-locked (a marker a write is re-dirtying right now
   is skipped, never waited on);
2. read each key's current bucket revision;
3. check the lease (holder, fence, unexpired: `LeaseLost` otherwise), then
   resolve the row images — the revision is observed *before* the image,
   so a write landing between the two bumps the revision and loses the
   compare-and-set instead of regressing the bucket;
4. the KV round-trip outside any transaction: a create for an absent key,
   a compare-and-set on the observed revision, a delete (retract) at that
   revision; an equal value is left alone. A lost compare-and-set leaves
   the key dirty for the next pass;
5. delete the marker at the generation it claimed, in one fenced statement
   that locks the lease row (``FOR SHARE``, as `LeaderLease.assert_lease`)
   and writes only while this pod holds it at its fence (a write that
   re-dirtied the key meanwhile keeps its marker).

A commit that staged marks wakes the drain (``NOTIFY``); the pass starts
``coalesce`` after the first wake, so the commits of that window (and any
wake while a pass runs, which schedules exactly one more) ride one pass.

The offer path keeps no ``kv_relay_watermark``: the compare-and-set on the
revision observed before the image (step 2 → 4) replaces it. A row has no
source version of its own, and a KV revision is no version of the source
(a truncated and rebuilt bucket restarts its revisions at 1, which would
freeze a revision watermark), so the drain's monotonic guarantee is "never
write over a revision it did not observe, never from a lost lease": the
bucket converges to the current row image, including after a rebuild —
the first pass of a tenure and every ``offer_reconcile`` re-stage every
key. `KvDrainRelay` (``relay.py``) is the versioned path for a source that
carries its own per-key versions; its watermark and `reset_watermarks`
(s171) apply there.

A key whose ``publish`` (or its encoding) raises is isolated: the rest of
its batch drains, the key stays dirty with its generation (a later write
is not lost) and moves to the back of the claim order, so it never blocks
another key; each failure counts in `OfferDrain.failures`,
``service_engine_offer_publish_failures_total{offer}`` and
`DrainReport.failed`, `OfferDrain.failing` holds each still-failing key's
consecutive failures, and a warning is logged on its 1st, 2nd, 4th, 8th...
failure (not once per pass). It is not dead-lettered:
the dead-letter sources are the spec's closed five (none is an offer) and a
dirty key already is its own durable retry — the next pass (or a fix to the
row or the offer, or `cx.dirty_offer`) retries it; readiness is untouched.

A write never waits on the drain: the marker's row lock is held only by
the two short transactions, never across the KV round-trip. A leader
frozen past its lease fails its fenced transactions (`LeaseLost`) instead
of regressing the bucket. The first pass after boot and every
``offer_reconcile`` period re-stage every store key and every bucket key
under the prefix, so a rebuilt or drifted bucket is repaired.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from ..db.errors import Stage, translating
from ..db.pool import Database
from ..leader import LeaderLease, Lease, LeaseLost
from ..messaging.nats import KvBucket, KvConflict, KvEntry, Nats, NatsUnavailable
from ..metrics import Metrics
from ..persistence.base import store_of
from .model import Offer
from .staging import OFFER_CHANNEL

__all__ = ["DrainHook", "DrainReport", "OfferDrain", "OfferDrainBounds"]

_log = logging.getLogger(__name__)


class DrainHook(Protocol):
    """The test-support seam: called at ``point`` (``"revision_read"``,
    after step 2 and before step 3) with the offer and the batch's keys."""

    async def __call__(self, point: str, offer: str, keys: Sequence[str]) -> None: ...


@dataclass(frozen=True, slots=True)
class OfferDrainBounds:
    batch: int = 256
    reconcile: timedelta = timedelta(minutes=5)
    lease: timedelta = timedelta(seconds=10)
    interval: timedelta = timedelta(seconds=1)
    coalesce: timedelta = timedelta(milliseconds=50)
    """How long a wake waits for more commits before its pass (0: none)."""


@dataclass(slots=True)
class DrainReport:
    """One pass over one offer."""

    published: int = 0
    retracted: int = 0
    unchanged: int = 0
    conflicts: int = 0
    failed: int = 0
    reconciled: bool = False


@dataclass(slots=True)
class _Claimed:
    kv_key: str
    agg_key: Any
    gen: int
    entry: KvEntry | None = None
    image: bytes | None = None
    failed: bool = False


_CLAIM = """
SELECT kv_key, agg_key::text AS agg_key, gen FROM service_engine.offer_dirty
 WHERE offer = $1 ORDER BY dirtied_at, kv_key LIMIT $2 FOR UPDATE SKIP LOCKED
"""

# The lease as `LeaderLease.assert_lease` checks it, for a read: a pod that
# lost it stops before resolving an image.
_HELD = """
SELECT 1 FROM service_engine.leader_slot
 WHERE slot = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp()
"""

# The settle, fenced in one statement: the lease row locked FOR SHARE (a
# takeover's UPDATE waits for this statement, and one that committed first
# leaves no row to find), then the markers at the generation claimed go,
# and a key whose `publish` raised stays dirty (its generation untouched, so
# a write meanwhile is not lost) and goes to the back of the claim order.
_SETTLE = """
WITH lease AS (
    SELECT 1 FROM service_engine.leader_slot
     WHERE slot = $5 AND holder = $6 AND fence = $7 AND expires_at > clock_timestamp()
       FOR SHARE
), done AS (
    DELETE FROM service_engine.offer_dirty AS d
     USING unnest($2::text[], $3::bigint[]) AS m(k, g)
     WHERE d.offer = $1 AND d.kv_key = m.k AND d.gen = m.g AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
), requeued AS (
    UPDATE service_engine.offer_dirty SET dirtied_at = clock_timestamp()
     WHERE offer = $1 AND kv_key = ANY($4::text[]) AND EXISTS (SELECT 1 FROM lease)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM lease) AS held
"""

_RESTAGE = """
INSERT INTO service_engine.offer_dirty AS d (offer, kv_key, agg_key)
SELECT $1, k, a::jsonb FROM unnest($2::text[], $3::text[]) AS m(k, a)
ON CONFLICT (offer, kv_key) DO UPDATE
   SET gen = d.gen + 1, agg_key = COALESCE(EXCLUDED.agg_key, d.agg_key)
"""


class _OfferState:
    def __init__(self, offer: Offer[Any, Any, Any], lease: LeaderLease) -> None:
        self.offer = offer
        self.lease = lease
        self.bucket: KvBucket | None = None
        self.reconciled_at: float | None = None
        self.fence: int | None = None
        self.acquired_at: float | None = None
        """When the last `LeaderLease.acquire` ran (monotonic), or None:
        acquire on the next pass."""


class OfferDrain:
    """Drains every registered offer of this pod (one worker, one LISTEN)."""

    def __init__(
        self,
        db: Database,
        nats: Nats,
        holder: str,
        bounds: OfferDrainBounds = OfferDrainBounds(),
        *,
        hook: DrainHook | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.db = db
        self.nats = nats
        self.holder = holder
        self.bounds = bounds
        self.hook = hook
        self.metrics = metrics
        self._offers: dict[str, _OfferState] = {}
        self._wake = asyncio.Event()
        self._pass = asyncio.Lock()
        #: per offer, how many times a key's `publish` raised (cumulative).
        self.failures: dict[str, int] = {}
        #: (offer, kv_key) -> consecutive failed publishes of a key still failing.
        self.failing: dict[tuple[str, str], int] = {}

    def add(self, offer: Offer[Any, Any, Any]) -> None:
        lease = LeaderLease(self.db, offer.slot, self.holder, self.bounds.lease)
        self._offers[offer.NAME] = _OfferState(offer, lease)

    @property
    def offers(self) -> list[Offer[Any, Any, Any]]:
        return [state.offer for state in self._offers.values()]

    def lease_of(self, name: str) -> LeaderLease:
        return self._offers[name].lease

    async def bind(self) -> None:
        """Bind every offer's bucket; `BucketMissing` names an absent one."""
        for state in self._offers.values():
            state.bucket = await self.nats.bind_bucket(state.offer.bucket)

    def wake(self) -> None:
        self._wake.set()

    # -- the loop -----------------------------------------------------------

    async def run(self) -> None:
        """Drain on every wake-up (a commit that staged marks notifies
        `OFFER_CHANNEL`), ``coalesce`` after it, and at least every interval."""
        conn = None
        try:
            with contextlib.suppress(Exception):
                conn = await self.db.connect_dedicated()
                await conn.add_listener(OFFER_CHANNEL, lambda *_: self._wake.set())
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.bounds.interval.total_seconds())
                coalesce = self.bounds.coalesce.total_seconds()
                if coalesce > 0 and self._wake.is_set():
                    # The commits of the next moment ride this pass.
                    await asyncio.sleep(coalesce)
                self._wake.clear()
                try:
                    await self.step()
                except (NatsUnavailable, LeaseLost) as exc:
                    _log.info("offer drain pass stopped: %s", exc)
                except Exception as exc:
                    _log.warning("offer drain pass failed: %s", exc, exc_info=exc)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()

    async def step(self) -> dict[str, DrainReport]:
        """One pass over every offer this pod leads (until each is drained)."""
        reports: dict[str, DrainReport] = {}
        async with self._pass:
            for name, state in self._offers.items():
                lease = await self._lease(state)
                if lease is None:
                    state.fence = None
                    continue
                if state.fence != lease.fence:
                    # A new tenure: the first drain after boot or takeover reconciles.
                    state.fence = lease.fence
                    state.reconciled_at = None
                reports[name] = await self.drain(name)
        return reports

    async def _lease(self, state: _OfferState) -> Lease | None:
        """The lease as held, renewed (or tried for) at most every renewal
        period: a pass between renewals sends nothing for it. Every write
        of the pass is still fenced in the database (`_SETTLE`)."""
        now = time.monotonic()
        renew = min(self.bounds.interval, self.bounds.lease / 3).total_seconds()
        if state.acquired_at is None or now - state.acquired_at >= renew:
            state.acquired_at = now
            try:
                return await state.lease.acquire()
            except BaseException:
                state.acquired_at = None
                raise
        return state.lease.current

    async def drain(self, name: str) -> DrainReport:
        """Drain offer ``name`` until no dirty key is left (or a pass made no
        progress: lost compare-and-sets wait for the next pass)."""
        state = self._offers[name]
        report = DrainReport()
        now = time.monotonic()
        if (
            state.reconciled_at is None
            or now - state.reconciled_at >= self.bounds.reconcile.total_seconds()
        ):
            await self.reconcile(name)
            state.reconciled_at = now
            report.reconciled = True
        while True:
            done = await self._batch(state, report)
            if done < self.bounds.batch:
                return report

    async def reconcile(self, name: str) -> int:
        """Re-stage every store key and every bucket key under the prefix;
        returns how many keys were staged."""
        state = self._offers[name]
        offer, bucket = state.offer, self._bucket(state)
        entries, _ = await bucket.read_prefix(offer.prefix)
        with translating(Stage.RELAY):
            async with self.db.pool.acquire() as conn, conn.transaction():
                await state.lease.assert_lease(conn)
                staged: dict[str, str | None] = dict.fromkeys(entries)
                for key in await offer.keys(conn):
                    staged[offer.kv_key(key)] = offer.agg_key_json(key)
                if staged:
                    await conn.execute(_RESTAGE, offer.NAME, list(staged), list(staged.values()))
        return len(staged)

    def _bucket(self, state: _OfferState) -> KvBucket:
        if state.bucket is None:
            raise RuntimeError(f"offer {state.offer.NAME}: bind() was not called")
        return state.bucket

    def _lost(self, state: _OfferState, detail: str) -> LeaseLost:
        state.acquired_at = None  # the next pass asks the database again
        lease = state.lease
        return LeaseLost(lease.slot, lease.holder, detail)

    async def _batch(self, state: _OfferState, report: DrainReport) -> int:
        lease = state.lease.current
        if lease is None:
            raise self._lost(state, "not acquired")
        with translating(Stage.RELAY):
            async with self.db.plain() as conn:
                return await self._batch_on(conn, state, lease, report)

    async def _batch_on(
        self, conn: Any, state: _OfferState, lease: Lease, report: DrainReport
    ) -> int:
        offer, bucket = state.offer, self._bucket(state)

        # 1. claim skip-locked
        rows = await conn.fetch(_CLAIM, offer.NAME, self.bounds.batch)
        batch = [
            _Claimed(
                r["kv_key"], None if r["agg_key"] is None else json.loads(r["agg_key"]),
                int(r["gen"]),
            )
            for r in rows
        ]
        if not batch:
            return 0

        # 2. the bucket revision of every key, before any image
        entries = await asyncio.gather(*(bucket.get(c.kv_key) for c in batch))
        for claimed, entry in zip(batch, entries, strict=True):
            claimed.entry = entry
        if self.hook is not None:
            await self.hook("revision_read", offer.NAME, [c.kv_key for c in batch])

        # 3. the lease, then the row images
        if await conn.fetchval(_HELD, lease.slot, lease.holder, lease.fence) is None:
            raise self._lost(state, f"fence {lease.fence} expired or taken over")
        store = store_of(offer.ROW)

        async def resolve(conn: Any) -> None:
            wanted = [c for c in batch if c.agg_key is not None]
            if not wanted:
                return
            rows = await store.read_many(conn, [c.agg_key for c in wanted])
            by_key = {offer.agg_key_json(store.key_of(row)): row for row in rows}
            for claimed in wanted:
                row = by_key.get(offer.agg_key_json(claimed.agg_key))
                try:
                    published = None if row is None else offer.publish(row)
                    claimed.image = None if published is None else published.encode()
                except Exception as exc:
                    # One bad row never stops the rest of the batch.
                    claimed.failed = True
                    slot = (offer.NAME, claimed.kv_key)
                    count = self.failing[slot] = self.failing.get(slot, 0) + 1
                    if count & (count - 1) == 0:  # the 1st, 2nd, 4th, 8th... time
                        _log.warning(
                            "offer %s: publish of %s failed (%d times); the key stays dirty: %s",
                            offer.NAME, claimed.kv_key, count, exc, exc_info=exc,
                        )

        await resolve(conn)

        # 4. the KV round-trips, outside any transaction
        async def write(claimed: _Claimed) -> int | None:
            if claimed.failed:
                return None
            entry, image = claimed.entry, claimed.image
            try:
                if image is None:
                    if entry is None:
                        report.unchanged += 1
                        return 0
                    await bucket.delete(claimed.kv_key, last=entry.revision)
                    report.retracted += 1
                    return entry.revision + 1
                if entry is not None and entry.value == image:
                    report.unchanged += 1
                    return entry.revision
                if entry is None:
                    revision = await bucket.create(claimed.kv_key, image)
                else:
                    revision = await bucket.update(claimed.kv_key, image, last=entry.revision)
                report.published += 1
                return revision
            except KvConflict:
                report.conflicts += 1
                return None  # stays dirty: the next pass re-reads and decides again

        written = await asyncio.gather(*(write(c) for c in batch))

        # 5. the markers, fenced
        failed = [c for c in batch if c.failed]
        done = [(c, r) for c, r in zip(batch, written, strict=True) if r is not None]
        if done or failed:
            held = await conn.fetchval(
                _SETTLE, offer.NAME, [c.kv_key for c, _ in done], [c.gen for c, _ in done],
                [c.kv_key for c in failed], lease.slot, lease.holder, lease.fence,
            )
            if not held:
                raise self._lost(state, f"fence {lease.fence} expired or taken over")
        if failed:
            report.failed += len(failed)
            self.failures[offer.NAME] = self.failures.get(offer.NAME, 0) + len(failed)
            if self.metrics is not None:
                self.metrics.add_offer_publish_failures(offer.NAME, len(failed))
        for claimed in batch:
            if not claimed.failed:
                self.failing.pop((offer.NAME, claimed.kv_key), None)
        settled = sum(1 for r in written if r is not None)
        return len(batch) if settled else 0

    async def aclose(self) -> None:
        """Hand every held lease over now rather than at its expiry."""
        for state in self._offers.values():
            with contextlib.suppress(Exception):
                await state.lease.release()
