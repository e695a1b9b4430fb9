"""The flush worker: chunk writes batched into one transaction per window.

Every chunk (from `Engine.push_chunk` or the NATS ingress) is submitted
here and its caller waits for the commit: the receipt is `Durable` only
once the chunk is in Postgres. One pass writes everything pending in one
transaction under ``SET LOCAL lock_timeout``:

1. a non-blocking try of each key's lane lock, shared
   (``pg_try_advisory_xact_lock_shared``): a key a seal is holding is
   deferred to the next window, so one slow seal never parks the batch;
2. chunks of a sealed key are refused (`KeySealed`);
3. the rest are inserted in one fixed order, ``(accumulator, key, seq)``:
   every pod folds every frame, so two pods' passes write the same rows;
   arrival order (a deferred chunk re-queued at the end, ``push_chunk``
   mixed with ingress) would let two passes wait on each other's rows and
   deadlock. One already durable is compared: identical bytes are an
   idempotent `Durable(duplicate=True)`, different bytes a `ChunkConflict`.

A pass that fails with a retryable error (`TransientConflict`,
`LockTimeout`) is retried once before its callers see the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from ...db.errors import LockTimeout, Stage, TransientConflict, translating
from ...db.pool import Database
from ...db.types import Conn
from ...failures import ShuttingDown
from .accumulator import Durable, lane_lock_key
from .chunks import ChunkSeq
from .errors import ChunkConflict, KeySealed

__all__ = ["FLUSH_BATCH", "ChunkFlusher", "PendingChunk", "write_chunks"]

_log = logging.getLogger(__name__)

FLUSH_BATCH = 2000
"""At most this many chunks per transaction."""

Outcome = Durable | ChunkConflict | KeySealed


@dataclass(eq=False, slots=True)
class PendingChunk:
    accumulator: str
    key: str
    seq: ChunkSeq
    chunk: bytes
    done: asyncio.Future[Durable] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    not_before: float = 0.0


async def write_chunks(
    conn: Conn, batch: list[PendingChunk], lock_timeout: timedelta
) -> tuple[dict[int, Outcome], list[int]]:
    """Write ``batch`` in one transaction on ``conn``; the outcome of each
    written or refused chunk by index, and the indexes deferred (their key's
    lane lock is held by a seal)."""
    millis = max(1, math.ceil(lock_timeout.total_seconds() * 1000))
    keys = sorted({(p.accumulator, p.key) for p in batch})
    lock_keys = [lane_lock_key(a, k) for a, k in keys]
    outcomes: dict[int, Outcome] = {}
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = {millis:d}")
        granted = await conn.fetch(
            "SELECT ord, pg_try_advisory_xact_lock_shared(lk) AS ok "
            "FROM unnest($1::bigint[]) WITH ORDINALITY AS t(lk, ord) ORDER BY ord",
            lock_keys,
        )
        locked = {keys[int(r["ord"]) - 1] for r in granted if r["ok"]}
        deferred = [i for i, p in enumerate(batch) if (p.accumulator, p.key) not in locked]
        live = sorted(locked)
        sealed: dict[tuple[str, str], int] = {}
        if live:
            for row in await conn.fetch(
                "SELECT s.accumulator, s.key, s.high_water FROM service_engine.accumulator_seal s "
                "JOIN unnest($1::text[], $2::text[]) AS t(a, k) "
                "ON s.accumulator = t.a AND s.key = t.k",
                [a for a, _ in live], [k for _, k in live],
            ):
                sealed[(row["accumulator"], row["key"])] = int(row["high_water"])
        writes: list[int] = []
        for i, p in enumerate(batch):
            ident = (p.accumulator, p.key)
            if ident not in locked:
                continue
            if ident in sealed:
                outcomes[i] = KeySealed(p.accumulator, p.key, sealed[ident])
            else:
                writes.append(i)
        # One total order over the rows, so concurrent passes never deadlock.
        writes.sort(key=lambda i: (batch[i].accumulator, batch[i].key, int(batch[i].seq)))
        if writes:
            inserted = {
                (r["accumulator"], r["key"], int(r["seq"]))
                for r in await conn.fetch(
                    "INSERT INTO service_engine.accumulator_chunk (accumulator, key, seq, chunk) "
                    "SELECT a, k, s, c FROM "
                    "unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) "
                    "WITH ORDINALITY AS t(a, k, s, c, ord) ORDER BY ord "
                    "ON CONFLICT DO NOTHING RETURNING accumulator, key, seq",
                    [batch[i].accumulator for i in writes], [batch[i].key for i in writes],
                    [int(batch[i].seq) for i in writes], [batch[i].chunk for i in writes],
                )
            }
            claimed: set[tuple[str, str, int]] = set()
            existing: list[int] = []
            for i in writes:
                p = batch[i]
                ident3 = (p.accumulator, p.key, int(p.seq))
                if ident3 in inserted and ident3 not in claimed:
                    claimed.add(ident3)
                    outcomes[i] = Durable(p.accumulator, p.key, p.seq)
                else:
                    existing.append(i)
            if existing:
                stored = {
                    (r["accumulator"], r["key"], int(r["seq"])): bytes(r["chunk"])
                    for r in await conn.fetch(
                        "SELECT c.accumulator, c.key, c.seq, c.chunk "
                        "FROM service_engine.accumulator_chunk c JOIN "
                        "unnest($1::text[], $2::text[], $3::bigint[]) AS t(a, k, s) "
                        "ON c.accumulator = t.a AND c.key = t.k AND c.seq = t.s",
                        [batch[i].accumulator for i in existing],
                        [batch[i].key for i in existing],
                        [int(batch[i].seq) for i in existing],
                    )
                }
                for i in existing:
                    p = batch[i]
                    if stored.get((p.accumulator, p.key, int(p.seq))) == p.chunk:
                        outcomes[i] = Durable(p.accumulator, p.key, p.seq, duplicate=True)
                    else:
                        outcomes[i] = ChunkConflict(p.accumulator, p.key, int(p.seq))
    return outcomes, deferred


class ChunkFlusher:
    """Batches chunk writes; `submit` answers once the chunk committed.

    Run `run` under the engine's supervisor; until it runs, a submit
    flushes inline (one pass) so `push_chunk` works before `Engine.run`.
    """

    def __init__(
        self,
        db: Database,
        lock_timeout: timedelta,
        *,
        defer_window: timedelta = timedelta(milliseconds=20),
        on_outcomes: Callable[[list[Outcome]], None] | None = None,
    ) -> None:
        self.db = db
        self.lock_timeout = lock_timeout
        self.defer_window = defer_window.total_seconds()
        self._pending: list[PendingChunk] = []
        self._wake = asyncio.Event()
        self._pass = asyncio.Lock()
        self._running = False
        self._on_outcomes = on_outcomes
        self.passes = 0
        self.deferrals = 0
        self.retries = 0

    async def submit(self, accumulator: str, key: str, seq: ChunkSeq, chunk: bytes) -> Durable:
        """Queue one chunk and wait for its commit; raises `ChunkConflict`,
        `KeySealed`, the `DatabaseError` of a failed flush, `ShuttingDown`
        when the worker stopped before the chunk was written, or
        `NestedConnectionError` (before queueing) for a task that holds a
        connection of the pool."""
        # Waiting on the flush (whose pass takes a pool connection) while
        # holding one of the same pool is the wait that stops a pod.
        self.db.refuse_nested("push_chunk")
        pending = PendingChunk(accumulator, key, seq, chunk)
        self._pending.append(pending)
        self._wake.set()
        while not self._running and not pending.done.done():
            await self.flush_pass()
            if not pending.done.done():
                await asyncio.sleep(self.defer_window)  # deferred behind a seal
        return await pending.done

    async def run(self) -> None:
        """Flush whatever is pending, one pass per wake-up, until cancelled."""
        self._running = True
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self.flush_pass()
                waiting = [p.not_before for p in self._pending]
                if waiting and not self._wake.is_set():
                    delay = max(0.0, min(waiting) - time.monotonic())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), delay)
                    self._wake.set()
        finally:
            self._running = False
            for pending in self._pending:
                if not pending.done.done():
                    pending.done.set_exception(ShuttingDown("the flush worker stopped"))

    async def flush_pass(self) -> None:
        """One transaction over the chunks due now."""
        async with self._pass:
            now = time.monotonic()
            due = [p for p in self._pending if p.not_before <= now and not p.done.done()]
            if not due:
                self._pending = [p for p in self._pending if not p.done.done()]
                return
            batch = due[:FLUSH_BATCH]
            taken = {id(p) for p in batch}
            self._pending = [p for p in self._pending if id(p) not in taken and not p.done.done()]
            self.passes += 1
            try:
                outcomes, deferred = await self._write(batch)
            except Exception as exc:
                for p in batch:
                    if not p.done.done():
                        p.done.set_exception(exc)
                return
            later = now + self.defer_window
            for i in deferred:
                batch[i].not_before = later
                self._pending.append(batch[i])
            self.deferrals += len(deferred)
            for i, outcome in outcomes.items():
                done = batch[i].done
                if done.done():
                    continue
                if isinstance(outcome, Durable):
                    done.set_result(outcome)
                else:
                    done.set_exception(outcome)
            if self._on_outcomes is not None:
                self._on_outcomes(list(outcomes.values()))
            if self._pending:
                self._wake.set()

    async def _write(self, batch: list[PendingChunk]) -> tuple[dict[int, Outcome], list[int]]:
        """`write_chunks` on a pooled connection, retried once on a
        retryable failure (a lock timeout or a deadlock a foreign writer
        caused), so a transient conflict never reaches a caller."""
        for attempt in (1, 2):
            try:
                with translating(Stage.FLUSH):
                    bound = self.lock_timeout.total_seconds()
                    async with self.db.connection("the chunk flush", bound) as conn:
                        return await write_chunks(conn, batch, self.lock_timeout)
            except (TransientConflict, LockTimeout) as exc:
                if attempt == 2:
                    raise
                self.retries += 1
                _log.info("chunk flush pass retried after %s", exc)
        raise AssertionError("unreachable")
