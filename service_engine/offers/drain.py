"""The leader's drain of dirty offer keys into their published-language buckets.

Per offer, the pod holding the fixed-slot lease ``offer:<NAME>`` (renewed
from its held state at most every ``interval``, a third of the lease at
most; taken over by another pod only once it expired) drains its dirty keys
in batches, in this order (s188), on one pooled connection, each step one
statement outside any transaction:

1. claim the batch skip-locked (a marker a write is re-dirtying right now
   is skipped, never waited on);
2. read each key's current bucket revision (or take the one this tenure
   last saw from the revision cache, below);
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

The revision cache (`RevisionCache`, per offer, `REVISION_CACHE_KEYS` keys
by default, least recently used out first) spares step 2's bucket read for a
key this tenure already knows: after a create, a compare-and-set, a delete or
an "unchanged" decision the drain remembers the key's revision and value (or
that it is absent), tagged with the lease fence it was learned under. A
later pass under the *same* fence takes a claimed key's entry from the cache
instead of ``bucket.get`` (the others are read, gathered, as before). Why
that keeps the guarantees:

* *The revision is still observed before the image.* The cached revision is
  the one the bucket answered a previous pass with (its write's new revision,
  or the revision it read); this pass resolves its image after it, so a
  write anywhere since — another pod after a takeover, an operator, a
  rebuilt bucket (whose revisions restart) — has moved the key off that
  revision and the compare-and-set (or the create over a present key) fails:
  `KvConflict` drops the entry, the key stays dirty, the next pass reads it.
  Any other failure of the KV call drops the entry too (the write may have
  landed at a revision the drain never saw).
* *The "unchanged" shortcut (the image equals the cached value) is right
  under the fence*: a fence names one tenure of one holder, and only the
  lease holder writes the bucket, so the bucket still holds what this
  tenure last wrote or read. What it cannot see is a writer outside that
  contract (an operator's put, a rebuilt bucket, a leader frozen past its
  lease whose last compare-and-set landed): the bucket keeps that value
  until a pass writes the key for a changed image, which then fails its
  compare-and-set and re-reads, or until the reconcile, which clears the
  cache, reads the whole prefix and re-stages every key — the same repair
  as for an outside write to a key nobody dirtied, which the drain without
  a cache does not see before the reconcile either.
* *A new tenure starts empty*: the cache is cleared when the fence changes
  (a takeover and back bumps it), when the lease is not held or is found
  lost, and by the reconcile, which refills it from its own read of the
  bucket (every re-staged key with its revision there, or absent), which
  precedes the pass that resolves the images.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from ..beat.leader import LeaderLease, Lease, LeaseLost
from ..db.errors import Stage, translating
from ..db.pool import Database
from ..failures import ConfigError
from ..messaging.nats import KvBucket, KvConflict, KvEntry, Nats, NatsUnavailable
from ..metrics import Metrics
from ..persistence.base import store_of
from .model import Offer
from .staging import OFFER_CHANNEL

if TYPE_CHECKING:
    from ..config import EngineConfig

__all__ = [
    "REVISION_CACHE_KEYS",
    "DrainHook",
    "DrainReport",
    "OfferDrain",
    "OfferDrainBounds",
    "RevisionCache",
]

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

    @classmethod
    def of(cls, config: EngineConfig) -> OfferDrainBounds:
        return cls(
            batch=config.offer_drain_batch, reconcile=config.offer_reconcile,
            lease=config.lease, interval=config.beat_interval,
        )


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


REVISION_CACHE_KEYS = 4096
"""How many keys' revisions the drain remembers per offer (`RevisionCache`)."""


class RevisionCache:
    """What the bucket holds for the most recently drained keys of one
    offer, valid for one lease fence: ``kv_key -> KvEntry`` (the revision and
    value) or ``None`` (absent), at most ``bound`` keys, the least recently
    used dropped first. Pure: no I/O."""

    __slots__ = ("_entries", "bound", "fence", "hits", "misses")

    def __init__(self, bound: int = REVISION_CACHE_KEYS) -> None:
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
            raise ConfigError(f"the revision cache bound must be an int >= 0, not {bound!r}")
        self.bound = bound
        self.fence: int | None = None
        self._entries: OrderedDict[str, KvEntry | None] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def under(self, fence: int) -> None:
        """Serve ``fence``: what another fence learned is forgotten."""
        if fence != self.fence:
            self._entries.clear()
            self.fence = fence

    def clear(self) -> None:
        self._entries.clear()
        self.fence = None

    def lookup(self, key: str) -> tuple[bool, KvEntry | None]:
        """``(True, entry)`` for a remembered key (``None``: absent), marked
        recently used; ``(False, None)`` for one to read."""
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
            self.hits += 1
            return True, entries[key]
        self.misses += 1
        return False, None

    def remember(self, key: str, entry: KvEntry | None) -> None:
        if self.bound == 0:
            return
        entries = self._entries
        entries[key] = entry
        entries.move_to_end(key)
        while len(entries) > self.bound:
            entries.popitem(last=False)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)


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
    def __init__(
        self, offer: Offer[Any, Any, Any], lease: LeaderLease, cache: RevisionCache
    ) -> None:
        self.offer = offer
        self.lease = lease
        self.cache = cache
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
        cache_keys: int = REVISION_CACHE_KEYS,
    ) -> None:
        RevisionCache(cache_keys)  # a bad bound is refused here, not at add()
        self.cache_keys = cache_keys
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
        self._offers[offer.NAME] = _OfferState(offer, lease, RevisionCache(self.cache_keys))

    @property
    def offers(self) -> list[Offer[Any, Any, Any]]:
        return [state.offer for state in self._offers.values()]

    def lease_of(self, name: str) -> LeaderLease:
        return self._offers[name].lease

    def cache_of(self, name: str) -> RevisionCache:
        """Offer ``name``'s revision cache (what the next pass need not read)."""
        return self._offers[name].cache

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
                    state.cache.clear()
                    continue
                if state.fence != lease.fence:
                    # A new tenure: the first drain after boot or takeover reconciles.
                    state.fence = lease.fence
                    state.reconciled_at = None
                    state.cache.clear()
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
        returns how many keys were staged. The revision cache is refilled
        from this read of the bucket (each staged key's entry, or absent)."""
        state = self._offers[name]
        offer, bucket, cache = state.offer, self._bucket(state), state.cache
        cache.clear()
        entries, _ = await bucket.read_prefix(offer.prefix)
        with translating(Stage.RELAY):
            async with self.db.pool.acquire() as conn, conn.transaction():
                lease = await state.lease.assert_lease(conn)
                staged: dict[str, str | None] = dict.fromkeys(entries)
                for key in await offer.keys(conn):
                    staged[offer.kv_key(key)] = offer.agg_key_json(key)
                if staged:
                    await conn.execute(_RESTAGE, offer.NAME, list(staged), list(staged.values()))
        cache.under(lease.fence)
        keys = list(staged)
        for kv_key in keys[max(0, len(keys) - cache.bound):]:
            cache.remember(kv_key, entries.get(kv_key))
        return len(staged)

    def _bucket(self, state: _OfferState) -> KvBucket:
        if state.bucket is None:
            raise RuntimeError(f"offer {state.offer.NAME}: bind() was not called")
        return state.bucket

    def _lost(self, state: _OfferState, detail: str) -> LeaseLost:
        state.acquired_at = None  # the next pass asks the database again
        state.cache.clear()
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

        # 2. the bucket revision of every key, before any image: remembered
        # under this fence, or read
        cache = state.cache
        cache.under(lease.fence)
        unknown: list[_Claimed] = []
        for claimed in batch:
            known, entry = cache.lookup(claimed.kv_key)
            if known:
                claimed.entry = entry
            else:
                unknown.append(claimed)
        if unknown:
            entries = await asyncio.gather(*(bucket.get(c.kv_key) for c in unknown))
            for claimed, entry in zip(unknown, entries, strict=True):
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
        async def write(claimed: _Claimed) -> bool:
            """True when the key is settled (written or left equal)."""
            if claimed.failed:
                return False
            key, entry, image = claimed.kv_key, claimed.entry, claimed.image
            try:
                if image is None:
                    if entry is not None:
                        await bucket.delete(key, last=entry.revision)
                        report.retracted += 1
                    else:
                        report.unchanged += 1
                    # a tombstone's revision is not returned: remembered as
                    # absent, a later create finds its way over it
                    cache.remember(key, None)
                    return True
                if entry is not None and entry.value == image:
                    report.unchanged += 1
                    cache.remember(key, entry)
                    return True
                if entry is None:
                    revision = await bucket.create(key, image)
                else:
                    revision = await bucket.update(key, image, last=entry.revision)
                report.published += 1
                cache.remember(key, KvEntry(key, image, revision))
                return True
            except KvConflict:
                report.conflicts += 1
                cache.forget(key)
                return False  # stays dirty: the next pass re-reads and decides again
            except BaseException:
                cache.forget(key)  # it may have landed at a revision never seen
                raise

        written = await asyncio.gather(*(write(c) for c in batch))

        # 5. the markers, fenced
        failed = [c for c in batch if c.failed]
        done = [c for c, settled in zip(batch, written, strict=True) if settled]
        if done or failed:
            held = await conn.fetchval(
                _SETTLE, offer.NAME, [c.kv_key for c in done], [c.gen for c in done],
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
        return len(batch) if done else 0

    async def aclose(self) -> None:
        """Hand every held lease over now rather than at its expiry."""
        for state in self._offers.values():
            with contextlib.suppress(Exception):
                await state.lease.release()
