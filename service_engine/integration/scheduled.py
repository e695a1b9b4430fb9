"""Scheduled messages: published once the database clock passes their due time.

`stage_scheduled` writes a ``service_engine.scheduled_message`` row in the
caller's transaction (``cx.schedule_at``). `ScheduledPublisher.fire_due`
(a beat step, on every pod) claims ONE due row per transaction with
``FOR UPDATE SKIP LOCKED`` and publishes it through the same `Nats.publish`
seam as the outbox, so each row is isolated from the rest of its batch:

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
from typing import Any

from ..clock import Timestamp
from ..db.pool import Database
from ..db.types import Conn
from ..errors import ConfigError
from .dead_letters import DeadLetter, DeadLetters, DeadLetterSource
from .envelope import (
    DeclaredSequence,
    Envelope,
    OutboundMessage,
    derive_dead_letter_id,
    outbound_message,
    row_publish_headers,
)
from .nats import Acked, Duplicate, Nats, Unanswered

_log = logging.getLogger(__name__)

SCHEDULED_WORK = "scheduled"
"""The ``work`` a scheduled-message dead letter names."""

_INSERT = """
INSERT INTO service_engine.scheduled_message
       (message_id, subject, payload, producer, seq_key, seq, due_at)
VALUES ($1, $2, $3::text::jsonb, $4, $5, $6, $7)
"""


async def stage_scheduled_message(conn: Conn, message: OutboundMessage, at: Timestamp) -> None:
    """Insert ``message`` to be published once the database clock passes
    ``at``, in the caller's open transaction (a rollback schedules nothing)."""
    seq = message.sequence
    await conn.execute(
        _INSERT, message.message_id, message.subject, message.body_json(),
        None if seq is None else seq.producer, None if seq is None else seq.seq_key,
        None if seq is None else seq.seq, at.value,
    )


async def stage_scheduled(
    conn: Conn,
    envelope: Envelope,
    subject: str,
    at: Timestamp,
    sequence: DeclaredSequence | None = None,
    service: str | None = None,
) -> OutboundMessage:
    """Schedule ``envelope`` on ``subject`` for ``at`` (``cx.schedule_at``).

    Raises `SequenceWithoutService` for a declared sequence with no service.
    """
    message = outbound_message(envelope, subject, sequence, service)
    await stage_scheduled_message(conn, message, at)
    return message


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

    async def beat(self) -> None:
        await self.fire_due()

    async def fire_due(self) -> FireReport:
        """Publish due rows one per transaction, within the pass bounds."""
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
        recorded = None
        async with self.db.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_CLAIM, tried)
            if row is None:
                return None
            headers = _headers(row)
            outcome = await self.nats.publish(row["subject"], row["payload"].encode(), headers)
            if isinstance(outcome, Acked | Duplicate):
                await conn.execute(
                    "DELETE FROM service_engine.scheduled_message WHERE id = $1", row["id"]
                )
                return "published"
            if isinstance(outcome, Unanswered):
                # Nothing written: the claim is released and no attempt spent.
                return "unanswered"
            tried.append(row["id"])
            attempts = row["attempts"] + 1
            if attempts < self.bounds.max_attempts:
                await conn.execute(
                    """UPDATE service_engine.scheduled_message
                          SET attempts = $2, last_error = $3 WHERE id = $1""",
                    row["id"], attempts, outcome.detail,
                )
                _log.warning(
                    "scheduled message %s rejected (attempt %s of %s): %s",
                    row["message_id"], attempts, self.bounds.max_attempts, outcome.detail,
                )
                return "rejected"
            await conn.execute(
                "DELETE FROM service_engine.scheduled_message WHERE id = $1", row["id"]
            )
            recorded = await self.dead_letters.record(
                conn,
                DeadLetter.for_message(
                    derive_dead_letter_id(DeadLetterSource.SCHEDULED.value, str(row["message_id"])),
                    DeadLetterSource.SCHEDULED, SCHEDULED_WORK,
                    reason="rejected", detail=outcome.detail, subject=row["subject"],
                    payload=row["payload"].encode(), headers=headers,
                    message_id=row["message_id"], attempts=attempts,
                ),
            )
        self.dead_letters.committed(recorded)
        _log.error(
            "scheduled message %s dead-lettered after %s rejections", row["message_id"], attempts
        )
        return "dead"



def _headers(row: Any) -> dict[str, str]:
    return row_publish_headers(
        row["message_id"], row["headers"], row["producer"], row["seq_key"], row["seq"]
    )
