"""Operator reads over the engine's tables: the outbox backlog and the dead
letters waiting, as the CLI and the ops page show them."""

from __future__ import annotations

from dataclasses import dataclass

from ..db.pool import Database

__all__ = ["OutboxStatus", "dead_letters_waiting", "outbox_status"]


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    pending: int
    failed: int
    published: int
    oldest_pending_age_seconds: float


_OUTBOX_STATUS = """
SELECT count(*) FILTER (WHERE status = 'PENDING') AS pending,
       count(*) FILTER (WHERE status = 'FAILED') AS failed,
       count(*) FILTER (WHERE status = 'PUBLISHED') AS published,
       coalesce(extract(epoch FROM clock_timestamp()
                - min(created_at) FILTER (WHERE status = 'PENDING')), 0)::float8
           AS oldest_pending_age_seconds
  FROM service_engine.integration_outbox
"""


async def outbox_status(db: Database) -> OutboxStatus:
    """Rows waiting, failed and published, and the oldest waiting row's age."""
    row = await db.pool.fetchrow(_OUTBOX_STATUS)
    assert row is not None
    return OutboxStatus(
        int(row["pending"]), int(row["failed"]), int(row["published"]),
        round(float(row["oldest_pending_age_seconds"]), 3),
    )


async def dead_letters_waiting(db: Database) -> dict[str, int]:
    """Dead letters waiting on a human, by source."""
    rows = await db.pool.fetch(
        "SELECT source, count(*) AS n FROM service_engine.dead_letter GROUP BY source"
    )
    return {row["source"]: int(row["n"]) for row in rows}
