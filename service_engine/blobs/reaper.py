"""The beat's blob reaper: promote completed uploads, reap two categories.

One pass, every beat, on every pod (each step is idempotent and guarded by
the row's state, so two pods racing do no harm):

* **promote** — a ``pending`` row whose object now exists (a HEAD answers)
  becomes ``complete`` with the object's size; independent of the orphan
  window, and no size policing (the POST policy already refused an
  oversize object);
* **incomplete upload** — a ``pending`` row past ``orphan_after`` whose
  object never landed: the row is deleted;
* **unreferenced blob** — a ``released`` row past ``orphan_after``: its
  object is deleted, then the row.

Nothing else is reaped: a complete, referenced blob is never touched.
Times are compared against the database clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..db.errors import Stage, translating
from ..db.pool import Database
from .s3 import BlobStore

__all__ = ["BlobReaper", "ReapTally"]

_log = logging.getLogger(__name__)


@dataclass
class ReapTally:
    """What one pass did."""

    promoted: int = 0
    incomplete_reaped: int = 0
    released_reaped: int = 0


class BlobReaper:
    """The reaper of one service's bucket."""

    def __init__(self, db: Database, store: BlobStore, *, batch: int = 100) -> None:
        self._db = db
        self._store = store
        self._batch = batch

    async def beat(self) -> None:
        await self.run_once()

    async def run_once(self) -> ReapTally:
        tally = ReapTally()
        with translating(Stage.READ):
            async with self._db.pool.acquire() as conn:
                pending = await conn.fetch(
                    "SELECT id, object_key, clock_timestamp() > created_at + orphan_after AS due"
                    " FROM service_engine.blob WHERE state = 'pending'"
                    " ORDER BY created_at LIMIT $1", self._batch,
                )
                released = await conn.fetch(
                    "SELECT id, object_key FROM service_engine.blob WHERE state = 'released'"
                    " AND clock_timestamp() > released_at + orphan_after"
                    " ORDER BY released_at LIMIT $1", self._batch,
                )
        for row in pending:
            head = await self._store.head(row["object_key"])
            with translating(Stage.SAVE):
                async with self._db.pool.acquire() as conn:
                    if head is not None:
                        status = await conn.execute(
                            "UPDATE service_engine.blob SET state = 'complete', size = $2,"
                            " completed_at = clock_timestamp() WHERE id = $1 AND state = 'pending'",
                            row["id"], head.size,
                        )
                        tally.promoted += status.endswith(" 1")
                    elif row["due"]:
                        status = await conn.execute(
                            "DELETE FROM service_engine.blob WHERE id = $1 AND state = 'pending'",
                            row["id"],
                        )
                        tally.incomplete_reaped += status.endswith(" 1")
        for row in released:
            await self._store.delete(row["object_key"])
            with translating(Stage.SAVE):
                async with self._db.pool.acquire() as conn:
                    status = await conn.execute(
                        "DELETE FROM service_engine.blob WHERE id = $1 AND state = 'released'",
                        row["id"],
                    )
                    tally.released_reaped += status.endswith(" 1")
        if tally.promoted or tally.incomplete_reaped or tally.released_reaped:
            _log.info("blob reaper: %s", tally)
        return tally
