"""One publisher of stored rows, for every loop that publishes them (the
outbox relay, the scheduled publisher).

`RowPublisher.publish` sends a stored row through `Nats.publish`, the seam
bounded by ``publish_ack_timeout`` that never raises for a broker condition.
`RowPublisher.reject` is the one answer to a real rejection (`Rejected`):
count one attempt in the caller's transaction and, at the bound, retire the
row and dead-letter it in that same transaction. The caller decides what an
`Acked` / `Duplicate` / `Unanswered` means for its table.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from ..db.types import Conn
from ..messaging.dead_letters import DeadLetter, DeadLetters, DeadLetterSource, Recorded
from ..messaging.envelope import derive_dead_letter_id, row_publish_headers
from ..messaging.nats import Nats, PublishOutcome, Rejected

__all__ = ["DeadLettered", "RowPublisher", "RowTable", "row_headers"]

_log = logging.getLogger(__name__)


def row_headers(row: Any) -> dict[str, str]:
    """The publish headers of a stored outbox or scheduled-message row."""
    return row_publish_headers(
        row["message_id"], row["headers"], row["producer"], row["seq_key"], row["seq"]
    )


@dataclass(frozen=True, slots=True)
class RowTable:
    """One table of publishable rows: ``table`` its name, ``publishable`` the
    predicate a row still to publish meets (an attempt is counted only on
    such a row), ``retire`` what becomes of a row at the attempt bound;
    ``label`` names a row in logs, ``source`` and ``work`` its dead letter."""

    label: str
    source: DeadLetterSource
    work: str
    table: str
    retire: str
    publishable: str = "TRUE"

    @property
    def count_attempt(self) -> str:
        """``$1`` the row id, ``$2`` the rejection's detail; returns the new
        attempt count, no row when the row is no longer publishable."""
        return (
            f"UPDATE {self.table} SET attempts = attempts + 1, last_error = $2"
            f" WHERE id = $1 AND {self.publishable} RETURNING attempts"
        )


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A row `RowPublisher.reject` dead-lettered; pass it to
    `RowPublisher.committed` once the transaction committed."""

    recorded: Recorded
    message_id: uuid.UUID
    attempts: int
    detail: str


class RowPublisher:
    """Publishes rows of one `RowTable` and answers their rejections."""

    def __init__(
        self, nats: Nats, dead_letters: DeadLetters, table: RowTable, *, max_attempts: int
    ) -> None:
        self.nats = nats
        self.dead_letters = dead_letters
        self.table = table
        self.max_attempts = max_attempts

    async def publish(self, row: Any) -> PublishOutcome:
        """Publish ``row`` (``Nats-Msg-Id`` = its message id: a republish is
        deduplicated)."""
        return await self.nats.publish(row["subject"], row["payload"].encode(), row_headers(row))

    async def reject(self, conn: Conn, row: Any, outcome: Rejected) -> DeadLettered | None:
        """Count one attempt for ``row`` in the caller's open transaction; at
        ``max_attempts`` retire the row and record its dead letter there too.
        Returns what was dead-lettered (None: the row waits for its next try)."""
        table = self.table
        attempts = await conn.fetchval(table.count_attempt, row["id"], outcome.detail)
        if attempts is None:
            return None
        if attempts < self.max_attempts:
            _log.warning(
                "%s %s rejected (attempt %s of %s): %s",
                table.label, row["message_id"], attempts, self.max_attempts, outcome.detail,
            )
            return None
        await conn.execute(table.retire, row["id"])
        recorded = await self.dead_letters.record(
            conn,
            DeadLetter.for_message(
                derive_dead_letter_id(table.source.value, str(row["message_id"])),
                table.source, table.work,
                reason="rejected", detail=outcome.detail, subject=row["subject"],
                payload=row["payload"].encode(), headers=row_headers(row),
                message_id=row["message_id"], attempts=attempts,
            ),
        )
        return DeadLettered(recorded, row["message_id"], attempts, outcome.detail)

    def committed(self, dead: DeadLettered) -> None:
        """Count and log a dead letter once its transaction committed."""
        self.dead_letters.committed(dead.recorded)
        _log.error(
            "%s %s dead-lettered after %s rejections: %s",
            self.table.label, dead.message_id, dead.attempts, dead.detail,
        )
