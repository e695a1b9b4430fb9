"""Dead letters: the one table for every source of work that gave up.

Inbound reactions, scheduled messages, cron ticks, a mirror stuck past its
restart threshold and an outbox row the broker keeps rejecting all record a
`DeadLetter` in ``service_engine.dead_letter``. Each record stages an impact
on the ops noun (`DEAD_LETTER_NOUN`) in the same transaction, and
``service_engine_dead_letters_total{source}`` counts each *distinct* dead
letter once, after its transaction committed: a dead letter's id derives
from the work, so re-recording the same failure (every redelivery, every
beat of a stuck worker) updates one row and counts nothing new.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..db.errors import Stage, translating
from ..db.pool import Database
from ..db.types import Conn
from ..failures import EngineError
from ..impacts.model import Impact
from ..impacts.transport import stage_in
from ..metrics import Metrics
from .envelope import HEADER_MESSAGE_ID, HEADER_NATS_MSG_ID, derive_dead_letter_id
from .nats import Acked, Duplicate, Nats, PublishOutcome

DEAD_LETTER_NOUN = "dead_letter"
"""The ops noun a dead letter's impact is staged on (key: its id as text)."""


class DeadLetterSource(enum.Enum):
    """Which kind of work gave up."""

    REACTION = "Reaction"
    SCHEDULED = "Scheduled"
    CRON = "Cron"
    MIRROR = "Mirror"
    OUTBOX = "Outbox"


class DeadLetterNotFound(EngineError):
    """No dead letter has that id (discarded or retried already)."""


class NotRetryable(EngineError):
    """The dead letter is not a message (a stuck worker, a cron tick):
    there is nothing to republish. Fix the cause and discard it."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter, to record or as stored.

    Build one with `for_message` (work that was a message: it can be
    retried) or `for_work` (a worker or tick: it can only be discarded).
    """

    id: uuid.UUID
    source: DeadLetterSource
    work: str
    reason: str
    detail: str = ""
    subject: str | None = None
    message_id: uuid.UUID | None = None
    payload: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    attempts: int | None = None
    occurrences: int = 1
    recorded_at: datetime | None = None
    last_seen_at: datetime | None = None

    @classmethod
    def for_message(
        cls,
        id: uuid.UUID,
        source: DeadLetterSource,
        work: str,
        *,
        reason: str,
        detail: str = "",
        subject: str,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
        message_id: uuid.UUID | None = None,
        attempts: int | None = None,
    ) -> DeadLetter:
        """A message ``work`` gave up on. ``message_id`` is its logical id
        (a retry republishes under it); ``id`` derives from the message (see
        `derive_dead_letter_id`) so every re-record is one row."""
        return cls(
            id, source, work, reason, detail, subject, message_id, payload,
            dict(headers or {}), attempts,
        )

    @classmethod
    def for_work(
        cls,
        source: DeadLetterSource,
        work: str,
        *,
        reason: str,
        detail: str = "",
        key: str = "",
        attempts: int | None = None,
    ) -> DeadLetter:
        """Work that is not a message (a stuck worker, a cron tick). Its id
        derives from ``(source, work, key)``: the same worker stuck again is
        the same dead letter; a distinct ``key`` is a distinct one."""
        return cls(
            derive_dead_letter_id(source.value, work, key), source, work, reason, detail,
            attempts=attempts,
        )


@dataclass(frozen=True, slots=True)
class Recorded:
    """What `DeadLetters.record` did: ``fresh`` when it inserted a new dead
    letter (to be counted once committed), False when it re-recorded one."""

    id: uuid.UUID
    source: DeadLetterSource
    fresh: bool
    impacts: int


_INSERT = """
INSERT INTO service_engine.dead_letter
       (id, source, work, reason, detail, subject, message_id, payload, headers, attempts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb, $10)
ON CONFLICT (id) DO NOTHING
RETURNING id
"""

_RERECORD = """
UPDATE service_engine.dead_letter
   SET occurrences = occurrences + 1, last_seen_at = now(), reason = $2, detail = $3,
       attempts = coalesce($4, attempts)
 WHERE id = $1
"""

_COLUMNS = """id, source, work, reason, detail, subject, message_id, payload,
       headers::text AS headers, attempts, occurrences, recorded_at, last_seen_at"""


def _from_row(row: Any) -> DeadLetter:
    return DeadLetter(
        id=row["id"], source=DeadLetterSource(row["source"]), work=row["work"],
        reason=row["reason"], detail=row["detail"], subject=row["subject"],
        message_id=row["message_id"],
        payload=None if row["payload"] is None else bytes(row["payload"]),
        headers=json.loads(row["headers"]), attempts=row["attempts"],
        occurrences=row["occurrences"], recorded_at=row["recorded_at"],
        last_seen_at=row["last_seen_at"],
    )


class DeadLetters:
    """The dead-letter store of one engine.

    ``metrics`` receives ``service_engine_dead_letters_total{source}`` and the
    impacts a record commits. The admin calls (`get`, `list`, `discard`,
    `retry`, `record_work`) raise a `DatabaseError` (stage DEAD_LETTER) for
    a database failure, never a driver error.
    """

    def __init__(self, db: Database, metrics: Metrics | None = None) -> None:
        self.db = db
        self.metrics = metrics

    async def record(self, conn: Conn, letter: DeadLetter) -> Recorded:
        """Record ``letter`` inside the caller's open transaction and stage
        its impact there. After the transaction commits, pass the result to
        `committed` (never before: a rollback records nothing)."""
        inserted = await conn.fetchval(
            _INSERT, letter.id, letter.source.value, letter.work, letter.reason,
            letter.detail, letter.subject, letter.message_id, letter.payload,
            json.dumps(dict(letter.headers)), letter.attempts,
        )
        if inserted is None:
            await conn.execute(_RERECORD, letter.id, letter.reason, letter.detail, letter.attempts)
        impacts = await stage_in(conn, [Impact.entity(DEAD_LETTER_NOUN, str(letter.id))])
        return Recorded(letter.id, letter.source, inserted is not None, impacts)

    def committed(self, *recorded: Recorded) -> None:
        """Count what `record` did, once its transaction committed: each
        fresh dead letter once, re-records not at all."""
        if self.metrics is None:
            return
        for r in recorded:
            if r.fresh:
                self.metrics.add_dead_letters(r.source.value)
            self.metrics.add_impacts_committed(r.impacts)

    async def record_work(self, letter: DeadLetter) -> Recorded:
        """Record ``letter`` in a transaction of its own and count it: for a
        worker that gives up outside any other transaction (a mirror past its
        restart threshold). Safe to call on every beat: one row, one count."""
        with translating(Stage.DEAD_LETTER):
            async with self.db.pool.acquire() as conn, conn.transaction():
                recorded = await self.record(conn, letter)
        self.committed(recorded)
        return recorded

    async def get(self, id: uuid.UUID) -> DeadLetter | None:
        with translating(Stage.DEAD_LETTER):
            row = await self.db.pool.fetchrow(
                f"SELECT {_COLUMNS} FROM service_engine.dead_letter WHERE id = $1", id
            )
        return None if row is None else _from_row(row)

    async def list(
        self, source: DeadLetterSource | None = None, *, limit: int = 100
    ) -> list[DeadLetter]:
        """Dead letters waiting on a human, oldest first; of one ``source``
        when given."""
        with translating(Stage.DEAD_LETTER):
            rows = await self.db.pool.fetch(
                f"""SELECT {_COLUMNS} FROM service_engine.dead_letter
                     WHERE $1::text IS NULL OR source = $1
                     ORDER BY recorded_at, id LIMIT $2""",
                None if source is None else source.value, limit,
            )
        return [_from_row(r) for r in rows]

    async def discard(self, id: uuid.UUID) -> bool:
        """Delete a dead letter a human resolved; False when it was gone."""
        with translating(Stage.DEAD_LETTER):
            async with self.db.pool.acquire() as conn, conn.transaction():
                deleted = await conn.fetchval(
                    "DELETE FROM service_engine.dead_letter WHERE id = $1 RETURNING id", id
                )
                impacts = 0
                if deleted is not None:
                    impacts = await stage_in(conn, [Impact.entity(DEAD_LETTER_NOUN, str(id))])
        if self.metrics is not None:
            self.metrics.add_impacts_committed(impacts)
        return deleted is not None

    async def retry(self, id: uuid.UUID, nats: Nats) -> PublishOutcome:
        """Republish a dead message with a fresh dedup token (``Nats-Msg-Id``)
        but its original logical id (``Br-Message-Id``), so JetStream does
        not drop it as a duplicate while the consumer's claim and sequence
        guard still make a replay on newer state a no-op.

        The dead letter is deleted only when the publish is acked; on any
        other outcome it stays and the outcome says why. Raises
        `DeadLetterNotFound` or `NotRetryable` (not a message).
        """
        with translating(Stage.DEAD_LETTER):
            async with self.db.pool.acquire() as conn, conn.transaction():
                # The row lock makes two concurrent retries of one letter publish once.
                row = await conn.fetchrow(
                    f"SELECT {_COLUMNS} FROM service_engine.dead_letter WHERE id = $1 FOR UPDATE",
                    id,
                )
                if row is None:
                    raise DeadLetterNotFound(f"no dead letter {id}")
                letter = _from_row(row)
                if letter.subject is None or letter.payload is None:
                    raise NotRetryable(
                        f"dead letter {id} ({letter.source.value} {letter.work!r}) is not a message"
                    )
                headers = dict(letter.headers)
                headers[HEADER_NATS_MSG_ID] = str(uuid.uuid4())
                if letter.message_id is not None:
                    headers[HEADER_MESSAGE_ID] = str(letter.message_id)
                outcome = await nats.publish(letter.subject, letter.payload, headers)
                impacts = 0
                if isinstance(outcome, Acked | Duplicate):
                    await conn.execute("DELETE FROM service_engine.dead_letter WHERE id = $1", id)
                    impacts = await stage_in(conn, [Impact.entity(DEAD_LETTER_NOUN, str(id))])
        if self.metrics is not None:
            self.metrics.add_impacts_committed(impacts)
        return outcome
