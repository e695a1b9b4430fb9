"""The integration outbox relays: rows staged with a write
(`outbox.staging`), published under one of two disciplines
(`OutboxDiscipline`, ``EngineConfig.outbox_discipline``):

* **Leader** (`OutboxRelay`, the default): the pod holding the fenced
  ``outbox`` lease publishes; every mark asserts the lease, so a leader
  frozen past its lease marks nothing. One publisher: rows leave in commit
  order.
* **RowClaim** (`RowClaimOutboxRelay`): every pod publishes, each claiming
  a batch of rows with ``FOR UPDATE SKIP LOCKED`` in a short transaction
  that publishes them and marks them PUBLISHED before it commits, so no
  two pods publish a row at once and a backlog drains on every pod. A
  sequenced row waits while an earlier row of its sequence is claimed
  elsewhere, so a producer sequence still leaves in order. The lease then
  only elects the pod that gauges the backlog and sweeps.

Each pass drains PENDING rows oldest first, up to its drain bound
and within a time budget, publishing each through `Nats.publish` with
``Nats-Msg-Id`` = the row's message id (a republish is deduplicated):

* Acked / Duplicate: marked PUBLISHED (in fenced batches);
* Unanswered: the pass halts, no attempt is spent, the rows wait;
* Rejected: a bounded attempt (`RowPublisher.reject`); at the bound the row
  is marked FAILED and dead-lettered (source Outbox) in one fenced transaction.

`OutboxRelay.step` (the beat) renews the lease, gauges the backlog (one
COUNT per beat, not per commit) and publishes; `OutboxRelay.wake` (a commit's
wake-up) publishes without those round trips while the lease is fresh.

The pass is skipped entirely while the broker is unreachable, so a backlog
during an outage costs nothing per beat. A periodic, best-effort hygiene
sweep deletes PUBLISHED rows, FAILED rows older than the message retention
(their audit copy is the dead letter) and ``message_claim`` rows older than it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..beat.leader import LeaderLease, LeaseLost
from ..db.errors import Stage, translating
from ..db.pool import Database
from ..failures import ConfigError
from ..messaging.dead_letters import DeadLetters, DeadLetterSource
from ..messaging.nats import Acked, Duplicate, Nats, Rejected, Unanswered
from ..metrics import Metrics
from .publishing import DeadLettered, RowPublisher, RowTable

_log = logging.getLogger(__name__)

OUTBOX_SLOT = "outbox"
"""The leader slot the relay holds."""
OUTBOX_WORK = "outbox"
"""The ``work`` an outbox dead letter names."""


class OutboxDiscipline(enum.StrEnum):
    """Who publishes the outbox (``EngineConfig.outbox_discipline``)."""

    LEADER = "leader"
    """The lease holder alone (`OutboxRelay`)."""
    ROW_CLAIM = "row_claim"
    """Every pod, each on the rows it claimed (`RowClaimOutboxRelay`)."""


class MessageRetentionTooShort(ConfigError):
    """``message_retention`` is below the ``max_age`` of an integration
    stream an inbound reaction binds (or the stream keeps messages forever):
    a claim could be swept while its message can still be redelivered."""


# -- bounds -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutboxBounds:
    """The relay's bounds, validated at construction (`ConfigError`).

    ``drain_bound``: rows one pass publishes at most (its batch cap).
    ``max_attempts``: broker rejections a row survives before it is
    dead-lettered. ``pass_budget``: time after which a pass stops taking new
    rows (one publish may still finish, bounded by the publish ack timeout).
    ``message_retention``: age past which FAILED rows and message claims are
    swept. ``sweep_every``: the hygiene sweep's period. ``sweep_batch``:
    rows one sweep statement deletes. ``unanswered_backoff`` /
    ``unanswered_backoff_cap``: the pause after an Unanswered publish before
    the relay tries again, doubling up to the cap.
    """

    drain_bound: int = 1000
    max_attempts: int = 5
    pass_budget: timedelta = timedelta(seconds=2)
    message_retention: timedelta = timedelta(days=7)
    sweep_every: timedelta = timedelta(minutes=1)
    sweep_batch: int = 5000
    unanswered_backoff: timedelta = timedelta(milliseconds=500)
    unanswered_backoff_cap: timedelta = timedelta(seconds=5)

    def __post_init__(self) -> None:
        problems = [
            relation
            for ok, relation in (
                (self.drain_bound > 0, "drain_bound > 0"),
                (self.max_attempts > 0, "max_attempts > 0"),
                (self.pass_budget > timedelta(0), "pass_budget > 0"),
                (self.message_retention > timedelta(0), "message_retention > 0"),
                (self.sweep_every > timedelta(0), "sweep_every > 0"),
                (self.sweep_batch > 0, "sweep_batch > 0"),
                (self.unanswered_backoff > timedelta(0), "unanswered_backoff > 0"),
                (
                    self.unanswered_backoff_cap >= self.unanswered_backoff,
                    "unanswered_backoff_cap >= unanswered_backoff",
                ),
            )
            if not ok
        ]
        if problems:
            raise ConfigError("invalid OutboxBounds: violated: " + "; ".join(problems))


def retention_problems(
    retention: timedelta, max_ages: Mapping[str, timedelta | None]
) -> list[str]:
    """Why ``retention`` cannot serve streams with these ``max_ages`` (None:
    unlimited); empty when it can."""
    problems = []
    for name, max_age in sorted(max_ages.items()):
        if max_age is None:
            problems.append(
                f"stream {name} keeps messages forever (unlimited max_age), so any "
                "message_retention could sweep a claim before its message is gone"
            )
        elif retention < max_age:
            problems.append(
                f"message_retention {retention} is below stream {name}'s max_age {max_age}"
            )
    return problems


async def check_message_retention(
    nats: Nats, retention: timedelta, streams: Iterable[str]
) -> None:
    """Boot check: raise `MessageRetentionTooShort` unless ``retention``
    covers the ``max_age`` of every stream in ``streams`` (the integration
    streams inbound reactions bind). Raises `StreamMissing` for an absent
    stream."""
    max_ages = {name: await nats.stream_max_age(name) for name in set(streams)}
    problems = retention_problems(retention, max_ages)
    if problems:
        raise MessageRetentionTooShort("; ".join(problems))


# -- the relay ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelayPass:
    """What one relay step did. ``skipped`` says why it published nothing
    (not the leader, unreachable, backing off); ``halted`` why it stopped
    early (Unanswered, the pass budget, the lease lost)."""

    published: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    skipped: str | None = None
    halted: str | None = None


@dataclass(frozen=True, slots=True)
class SweepReport:
    published: int = 0
    failed: int = 0
    claims: int = 0


_SELECT_BATCH = """
SELECT id, message_id, subject, payload::text AS payload, headers::text AS headers,
       producer, seq_key, seq, attempts
  FROM service_engine.integration_outbox
 WHERE status = 'PENDING'
 ORDER BY id
 LIMIT $1
"""

_BACKLOG = """
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8 AS oldest
  FROM service_engine.integration_outbox
 WHERE status = 'PENDING'
"""

OUTBOX_TABLE = RowTable(
    "outbox row", DeadLetterSource.OUTBOX, OUTBOX_WORK, "service_engine.integration_outbox",
    retire="UPDATE service_engine.integration_outbox SET status = 'FAILED' WHERE id = $1",
    publishable="status = 'PENDING'",
)

_MARK_PUBLISHED = """
UPDATE service_engine.integration_outbox
   SET status = 'PUBLISHED', published_at = now()
 WHERE id = ANY($1::bigint[]) AND status = 'PENDING'
"""

_MARK_EVERY = 100
"""Acked rows marked PUBLISHED per fenced transaction: a crash republishes at
most this many, and JetStream deduplicates them."""


class OutboxRelay:
    """Publishes the outbox under the ``outbox`` leader lease.

    Register `beat` as a beat step. Every pod runs it; only the lease holder
    publishes, measures the backlog gauges and sweeps.
    """

    def __init__(
        self,
        db: Database,
        nats: Nats,
        dead_letters: DeadLetters,
        lease: LeaderLease,
        *,
        metrics: Metrics | None = None,
        bounds: OutboxBounds | None = None,
    ) -> None:
        self.db = db
        self.nats = nats
        self.dead_letters = dead_letters
        self.lease = lease
        self.metrics = metrics
        self.bounds = bounds or OutboxBounds()
        self.publisher = RowPublisher(
            nats, dead_letters, OUTBOX_TABLE, max_attempts=self.bounds.max_attempts
        )
        self._quiet_until = 0.0
        self._backoff = self.bounds.unanswered_backoff.total_seconds()
        self._next_sweep = 0.0
        self._was_leader = False
        self._renewed_at = float("-inf")
        """`time.monotonic()` just before the last acquire that returned the lease."""

    async def beat(self) -> None:
        """The beat step: `step`, its report dropped."""
        await self.step()

    async def wake(self) -> RelayPass:
        """A pass on a commit's wake-up: while the lease is held and fresh
        (renewed less than half a lease ago by this pod's monotonic clock,
        measured from before the renewal was sent, so the database's expiry
        is later still), publish without renewing or counting the backlog —
        the beat does both. Otherwise a full `step`. Either way every mark
        is fenced by `LeaderLease.assert_lease` in its own transaction, so a
        relay whose lease was taken over marks nothing."""
        if not self._lease_fresh():
            return await self.step()
        return await self.publish_pass()

    def _lease_fresh(self) -> bool:
        if self.lease.current is None:
            return False
        age = time.monotonic() - self._renewed_at
        return age < self.lease.lease.total_seconds() / 2

    async def step(self) -> RelayPass:
        """Renew or take the lease; as leader, gauge the backlog, sweep when
        due and run one bounded publish pass. A database failure raises a
        `DatabaseError` (stage RELAY), never a driver error."""
        with translating(Stage.RELAY):
            return await self._step()

    async def _step(self) -> RelayPass:
        sent_at = time.monotonic()
        if await self.lease.acquire() is None:
            self._renewed_at = float("-inf")
            if self._was_leader and self.metrics is not None:
                # Only the leader's gauges describe the backlog.
                self.metrics.set_outbox_backlog(0, 0.0)
            self._was_leader = False
            return RelayPass(skipped="not the leader")
        self._was_leader = True
        self._renewed_at = sent_at
        await self.measure()
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.bounds.sweep_every.total_seconds()
            await self.sweep()
        return await self.publish_pass()

    async def measure(self) -> tuple[int, float]:
        """Gauge the backlog: (rows PENDING, age in seconds of the oldest)."""
        with translating(Stage.RELAY):
            row = await self.db.pool.fetchrow(_BACKLOG)
        assert row is not None
        pending, oldest = int(row["pending"]), float(row["oldest"])
        if self.metrics is not None:
            self.metrics.set_outbox_backlog(pending, oldest)
        return pending, oldest

    async def publish_pass(self) -> RelayPass:
        """Publish up to ``drain_bound`` PENDING rows, oldest first, within
        ``pass_budget``. Needs the lease (`step` takes it)."""
        with translating(Stage.RELAY):
            return await self._publish_pass()

    async def _publish_pass(self) -> RelayPass:
        if not self.nats.reachable():
            return RelayPass(skipped="NATS unreachable")
        if time.monotonic() < self._quiet_until:
            return RelayPass(skipped="backing off after an unanswered publish")
        deadline = time.monotonic() + self.bounds.pass_budget.total_seconds()
        rows = await self.db.pool.fetch(_SELECT_BATCH, self.bounds.drain_bound)
        acked: list[int] = []
        published = rejected = dead = 0
        halted: str | None = None
        try:
            for row in rows:
                if time.monotonic() >= deadline:
                    halted = "pass budget spent"
                    break
                outcome = await self.publisher.publish(row)
                if isinstance(outcome, Acked | Duplicate):
                    self._backoff = self.bounds.unanswered_backoff.total_seconds()
                    acked.append(row["id"])
                    if len(acked) >= _MARK_EVERY:
                        published += await self._mark_published(acked)
                        acked = []
                elif isinstance(outcome, Unanswered):
                    halted = f"unanswered: {outcome.detail}"
                    self._pause()
                    break
                else:
                    rejected += 1
                    dead += await self._reject(row, outcome)
            if acked:
                published += await self._mark_published(acked)
        except LeaseLost as exc:
            _log.info("outbox relay: %s; another pod relays now", exc)
            halted = "lease lost"
        if self.metrics is not None:
            self.metrics.add_outbox_published(published)
        return RelayPass(published, rejected, dead, halted=halted)

    def _pause(self) -> None:
        self._quiet_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.bounds.unanswered_backoff_cap.total_seconds())

    async def _mark_published(self, ids: list[int]) -> int:
        """Mark ``ids`` PUBLISHED in one fenced transaction: BEGIN, the lease
        check, the UPDATE, then COMMIT with the pool's release reset in the
        same round trip (`Database.commit`). Anything that fails before the
        COMMIT returned rolls back (and the release resets as usual)."""
        async with self.db.pool.acquire() as conn:
            await conn.execute("BEGIN")
            try:
                await self.lease.assert_lease(conn)
                result = await conn.execute(_MARK_PUBLISHED, ids)
                await self.db.commit(conn)
            except BaseException:
                # The pool's release rolls back too; a lost connection is discarded.
                with contextlib.suppress(Exception):
                    if not conn.is_closed() and conn.is_in_transaction():
                        await conn.execute("ROLLBACK")
                raise
        return int(result.split()[-1])

    async def _reject(self, row: Any, outcome: Rejected) -> int:
        """Count one attempt; at the bound mark FAILED and dead-letter in the
        same fenced transaction. Returns 1 when it dead-lettered."""
        async with self.db.pool.acquire() as conn, conn.transaction():
            await self.lease.assert_lease(conn)
            dead = await self.publisher.reject(conn, row, outcome)
        if dead is None:
            return 0
        self.publisher.committed(dead)
        return 1

    async def sweep(self) -> SweepReport:
        """Delete PUBLISHED rows, FAILED rows and message claims older than
        the message retention. Best-effort: a failure is logged and retried
        at the next period, never raised, never lowering readiness."""
        try:
            return await self._sweep()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            _log.warning("outbox hygiene sweep failed: %s", exc)
            return SweepReport()

    async def _sweep(self) -> SweepReport:
        # Small statements under one deadline: the sweep never holds a long
        # transaction, and its time is bounded like the publish pass.
        deadline = time.monotonic() + self.bounds.pass_budget.total_seconds()
        batch = self.bounds.sweep_batch
        retention = self.bounds.message_retention
        published = await self._delete_in_batches(
            """DELETE FROM service_engine.integration_outbox WHERE id IN (
                   SELECT id FROM service_engine.integration_outbox
                    WHERE status = 'PUBLISHED' LIMIT $1)""",
            deadline, batch,
        )
        failed = await self._delete_in_batches(
            """DELETE FROM service_engine.integration_outbox WHERE id IN (
                   SELECT id FROM service_engine.integration_outbox
                    WHERE status = 'FAILED' AND created_at < now() - $2::interval LIMIT $1)""",
            deadline, batch, retention,
        )
        claims = await self._delete_in_batches(
            """DELETE FROM service_engine.message_claim WHERE (message_id, reaction) IN (
                   SELECT message_id, reaction FROM service_engine.message_claim
                    WHERE claimed_at < now() - $2::interval LIMIT $1)""",
            deadline, batch, retention,
        )
        return SweepReport(published, failed, claims)

    async def _delete_in_batches(
        self, sql: str, deadline: float, batch: int, *args: object
    ) -> int:
        total = 0
        while True:
            result = await self.db.pool.execute(sql, batch, *args)
            deleted = int(result.split()[-1])
            total += deleted
            if deleted < batch or time.monotonic() >= deadline:
                return total

    async def aclose(self) -> None:
        """On shutdown: give up the lease so another pod relays at once."""
        try:
            await self.lease.release()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # best effort: the lease expires anyway
            _log.warning("outbox relay: releasing the lease failed: %s", exc)


_CLAIM_BATCH = _SELECT_BATCH.rstrip() + "\n   FOR UPDATE SKIP LOCKED\n"

# The claimed sequenced rows behind an earlier PENDING row of their sequence
# that is not in this claim (another pod holds it, SKIP LOCKED passed it, or
# it committed after the claim read): they wait.
_BLOCKED_ROWS = """
SELECT c.id
  FROM unnest($1::bigint[], $2::text[]) AS c(id, seq_key)
 WHERE EXISTS (SELECT 1 FROM service_engine.integration_outbox o
                WHERE o.status = 'PENDING' AND o.seq_key = c.seq_key AND o.id < c.id
                  AND NOT (o.id = ANY($3::bigint[])))
"""

_CLAIM_EVERY = _MARK_EVERY
"""Rows one claim transaction locks, publishes and marks at most."""


class RowClaimOutboxRelay(OutboxRelay):
    """Publishes the outbox from every pod, on rows each one claimed.

    A claim is one transaction: lock up to `_CLAIM_EVERY` PENDING rows
    oldest first with ``FOR UPDATE SKIP LOCKED`` (rows another pod holds
    are skipped, never waited for), publish them, mark the acked ones
    PUBLISHED and count rejections, then commit. A pod that dies mid-claim
    releases its rows by its connection's end; the next claimant republishes
    them, deduplicated by ``Nats-Msg-Id``. Within a claim a sequence whose
    row was not acked stops there, and a sequence with an earlier row
    outside the claim (held by another pod, even between two of this
    claim's rows) waits, so each producer sequence leaves in order.

    The ``outbox`` lease elects the one pod that gauges the backlog and
    sweeps (`OutboxRelay.measure`, `OutboxRelay.sweep`); publishing needs
    no lease.
    """

    async def wake(self) -> RelayPass:
        """A pass on a commit's wake-up: claim and publish (every pod)."""
        return await self.publish_pass()

    async def _step(self) -> RelayPass:
        if await self.lease.acquire() is None:
            if self._was_leader and self.metrics is not None:
                self.metrics.set_outbox_backlog(0, 0.0)
            self._was_leader = False
        else:
            self._was_leader = True
            await self.measure()
            if time.monotonic() >= self._next_sweep:
                self._next_sweep = time.monotonic() + self.bounds.sweep_every.total_seconds()
                await self.sweep()
        return await self.publish_pass()

    async def _publish_pass(self) -> RelayPass:
        if not self.nats.reachable():
            return RelayPass(skipped="NATS unreachable")
        if time.monotonic() < self._quiet_until:
            return RelayPass(skipped="backing off after an unanswered publish")
        deadline = time.monotonic() + self.bounds.pass_budget.total_seconds()
        total = RelayPass()
        remaining = self.bounds.drain_bound
        while remaining > 0 and total.halted is None:
            batch = min(remaining, _CLAIM_EVERY)
            claim = await self._claim_and_publish(batch, deadline)
            if self.metrics is not None:
                self.metrics.add_outbox_published(claim.published)
            total = RelayPass(
                total.published + claim.published, total.rejected + claim.rejected,
                total.dead_lettered + claim.dead_lettered, halted=claim.halted,
            )
            remaining -= batch
            if claim.skipped is not None:  # the claim found fewer rows than it asked for
                break
        return total

    async def _claim_and_publish(self, batch: int, deadline: float) -> RelayPass:
        """One claim transaction; ``skipped`` set when it claimed fewer
        than ``batch`` rows (nothing more to take now)."""
        acked: list[int] = []
        dead: list[DeadLettered] = []
        rejected = 0
        halted: str | None = None
        async with self.db.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_CLAIM_BATCH, batch)
            blocked = await self._blocked_rows(conn, rows)
            stopped: set[str] = set()
            for row in rows:
                if time.monotonic() >= deadline:
                    halted = "pass budget spent"
                    break
                key = row["seq_key"]
                if key is not None and (key in stopped or row["id"] in blocked):
                    continue
                outcome = await self.publisher.publish(row)
                if isinstance(outcome, Acked | Duplicate):
                    self._backoff = self.bounds.unanswered_backoff.total_seconds()
                    acked.append(row["id"])
                    continue
                if key is not None:
                    stopped.add(key)
                if isinstance(outcome, Unanswered):
                    halted = f"unanswered: {outcome.detail}"
                    self._pause()
                    break
                rejected += 1
                answered = await self.publisher.reject(conn, row, outcome)
                if answered is not None:
                    dead.append(answered)
            published = int((await conn.execute(_MARK_PUBLISHED, acked)).split()[-1]) \
                if acked else 0
        for answered in dead:
            self.publisher.committed(answered)
        return RelayPass(
            published, rejected, len(dead), halted=halted,
            skipped="drained" if len(rows) < batch else None,
        )

    async def _blocked_rows(self, conn: Any, rows: list[Any]) -> set[int]:
        """The claimed sequenced rows that must wait for an earlier row of
        their sequence outside the claim."""
        sequenced = [row for row in rows if row["seq_key"] is not None]
        if not sequenced:
            return set()
        found = await conn.fetch(
            _BLOCKED_ROWS, [row["id"] for row in sequenced],
            [row["seq_key"] for row in sequenced], [row["id"] for row in rows],
        )
        return {r["id"] for r in found}


def outbox_relay(
    discipline: OutboxDiscipline | str,
    db: Database,
    nats: Nats,
    dead_letters: DeadLetters,
    lease: LeaderLease,
    *,
    metrics: Metrics | None = None,
    bounds: OutboxBounds | None = None,
) -> OutboxRelay:
    """The relay of ``discipline`` (`OutboxDiscipline`)."""
    relay = RowClaimOutboxRelay if OutboxDiscipline(discipline) is OutboxDiscipline.ROW_CLAIM \
        else OutboxRelay
    return relay(db, nats, dead_letters, lease, metrics=metrics, bounds=bounds)

