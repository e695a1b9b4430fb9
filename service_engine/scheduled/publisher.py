"""Scheduled messages: published once the database clock passes their due time.

`scheduled.staging.stage_scheduled` writes a ``service_engine.scheduled_message``
row in the caller's transaction (``cx.schedule_at``). `ScheduledPublisher.fire_due`
(a beat step, on every pod) claims ONE due row per transaction with
``FOR UPDATE SKIP LOCKED`` and publishes it through the same `Nats.publish`
seam as the outbox (`RowPublisher`), so each row is isolated from the rest of its batch:

* Acked / Duplicate: the row is deleted;
* Unanswered: the transaction rolls back, no attempt is spent and the pass
  halts (the broker is out, not the message);
* Rejected: one attempt; past the budget the row is dead-lettered (source
  Scheduled) and deleted in the same transaction, and the pass moves on.

While the broker is unreachable the pass is skipped altogether.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from ..db.errors import Stage, translating
from ..db.pool import Database
from ..failures import ConfigError
from ..messaging.dead_letters import DeadLetters, DeadLetterSource
from ..messaging.nats import Acked, Duplicate, Nats, Unanswered
from ..outbox.publishing import RowPublisher, RowTable

_log = logging.getLogger(__name__)

SCHEDULED_WORK = "scheduled"
"""The ``work`` a scheduled-message dead letter names."""
SCHEDULED_TABLE = RowTable(
    "scheduled message", DeadLetterSource.SCHEDULED, SCHEDULED_WORK,
    "service_engine.scheduled_message",
    retire="DELETE FROM service_engine.scheduled_message WHERE id = $1",
)


@dataclass(frozen=True, slots=True)
class ScheduledBounds:
    """``max_attempts``: broker rejections a row survives before it is
    dead-lettered. ``pass_bound`` / ``pass_budget``: rows and time one pass
    takes at most."""

    max_attempts: int = 5
    pass_bound: int = 500
    pass_budget: timedelta = timedelta(seconds=2)

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.pass_bound < 1 or self.pass_budget <= timedelta(0):
            raise ConfigError(
                "invalid ScheduledBounds: max_attempts, pass_bound and pass_budget must be "
                "positive"
            )


@dataclass(frozen=True, slots=True)
class FireReport:
    published: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    skipped: str | None = None
    halted: str | None = None


_CLAIM = """
SELECT id, message_id, subject, payload::text AS payload, headers::text AS headers,
       producer, seq_key, seq, attempts
  FROM service_engine.scheduled_message
 WHERE due_at <= now() AND NOT (id = ANY($1::bigint[]))
 ORDER BY due_at, id
 LIMIT 1
   FOR UPDATE SKIP LOCKED
"""


class ScheduledPublisher:
    """Publishes due scheduled messages; register `beat` as a beat step.

    Safe on every pod: a row is claimed by one transaction at a time.
    """

    def __init__(
        self,
        db: Database,
        nats: Nats,
        dead_letters: DeadLetters,
        *,
        bounds: ScheduledBounds | None = None,
    ) -> None:
        self.db = db
        self.nats = nats
        self.dead_letters = dead_letters
        self.bounds = bounds or ScheduledBounds()
        self.publisher = RowPublisher(
            nats, dead_letters, SCHEDULED_TABLE, max_attempts=self.bounds.max_attempts
        )

    async def beat(self) -> None:
        await self.fire_due()

    async def fire_due(self) -> FireReport:
        """Publish due rows one per transaction, within the pass bounds. A
        database failure raises a `DatabaseError` (stage RELAY)."""
        with translating(Stage.RELAY):
            return await self._fire_due()

    async def _fire_due(self) -> FireReport:
        if not self.nats.reachable():
            return FireReport(skipped="NATS unreachable")
        deadline = time.monotonic() + self.bounds.pass_budget.total_seconds()
        tried: list[int] = []  # rejected this pass: each row gets one attempt per pass
        published = rejected = dead = 0
        halted: str | None = None
        for _ in range(self.bounds.pass_bound):
            if time.monotonic() >= deadline:
                halted = "pass budget spent"
                break
            result = await self._fire_one(tried)
            if result is None:
                break
            if result == "published":
                published += 1
            elif result == "unanswered":
                halted = "unanswered"
                break
            else:
                rejected += 1
                dead += result == "dead"
        return FireReport(published, rejected, dead, halted=halted)

    async def _fire_one(self, tried: list[int]) -> str | None:
        async with self.db.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_CLAIM, tried)
            if row is None:
                return None
            outcome = await self.publisher.publish(row)
            if isinstance(outcome, Acked | Duplicate):
                await conn.execute(SCHEDULED_TABLE.retire, row["id"])
                return "published"
            if isinstance(outcome, Unanswered):
                # Nothing written: the claim is released and no attempt spent.
                return "unanswered"
            tried.append(row["id"])
            dead = await self.publisher.reject(conn, row, outcome)
        if dead is None:
            return "rejected"
        self.publisher.committed(dead)
        return "dead"
