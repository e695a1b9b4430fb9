"""The write pipeline: one transaction around one handler.

    BEGIN; SET LOCAL lock_timeout            (sent with the first lock)
      handler(cx): per aggregate advisory lock -> Persistence.lock -> load
                   (a create: the advisory lock only), gate (deny mode),
                   domain command, save
      flush: the impacts' NOTIFYs, the outbox rows (and a reaction's
             confirmation on its claim) in ONE statement; scheduled
             impacts, scheduled messages, blob rows
    [the NOTIFYs]; offer marks; COMMIT; the pool's release reset  (one round trip)
    record the committed impacts; respond

BEGIN and ``SET LOCAL lock_timeout`` travel in the same round trip as the
transaction's first advisory lock (or, for a handler that touches no
aggregate, just before the flush); COMMIT carries the reset the pool would
otherwise send on release (`Database.commit`), and the offer marks (their
values inlined, `offer_dirty_statement`) ride in front of COMMIT in that
same round trip; so do the impacts' NOTIFYs when no outbox row or claim
confirmation shares their statement (`notify_statement`). A `StageHook` observes the
stages without changing that sequence: it is called once BEGIN's round trip
returned, before the flush and before COMMIT, and sends nothing unless it
means to (a fault).

`run_pipeline` is shared by every entry point (the mutation executor, the
NATS reaction loop); each builds its own context over `Ops`. It returns the
handler's value or raises: `DatabaseError` (stage-tagged, translated from
the driver), `Refused`, `NotFound`, `HydrationFailed`, `TooManyImpacts`,
`CauseTooLarge`, or whatever the handler itself raised. Whatever it raises,
nothing was committed.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Protocol, TypeVar

from ..blobs.staging import stage_blobs
from ..clock import Clock, Timestamp
from ..config import EngineConfig
from ..db.errors import DRIVER_ERRORS, Stage, translate_db_error
from ..db.pool import Database
from ..db.types import Conn
from ..impacts.framing import encode_group, new_group_id
from ..impacts.transport import CHANNEL, schedule_in
from ..messaging.outbox import write_outbox
from ..messaging.scheduled import stage_scheduled_message
from ..metrics import Metrics
from ..offers.staging import dollar_quoted, offer_dirty_statement, stage_offer_dirty
from .contexts import Ops, Staged

__all__ = ["StageHook", "flush", "run_pipeline"]

C = TypeVar("C", bound=Ops)
R = TypeVar("R")


class StageHook(Protocol):
    """Called at the pipeline's own stages, inside the transaction.

    ``stage`` is `Stage.BEGIN` (once the round trip that began the
    transaction returned), `Stage.FLUSH` (before the staged writes) or
    `Stage.COMMIT` (just before COMMIT). The pipeline sends the same
    statements with a hook as without one; a statement the hook runs is
    part of the transaction, and an error it raises is a fault of that
    stage. The seam for fault injection in tests.
    """

    async def __call__(self, stage: Stage, conn: Conn) -> None: ...


async def flush(conn: Conn, staged: Staged) -> int:
    """Write what a handler staged, in its transaction; return the impacts
    staged for NOTIFY (record them only after the commit).

    The impacts travel as one framed group (`encode_group` raises
    `CauseTooLarge` for one that cannot fit) in the outbox's statement."""
    committed, _ = await _flush_but_riders(conn, staged, inline_notify=False)
    await stage_offer_dirty(conn, staged.offers)
    return committed


async def _flush_but_riders(
    conn: Conn, staged: Staged, *, inline_notify: bool = True
) -> tuple[int, str]:
    """The flush but what may ride in COMMIT's round trip: answers the
    impacts staged and, when no outbox row or confirmation shares their
    statement, the impacts' NOTIFYs as a statement with every frame
    inlined (``""`` otherwise: they went with the outbox statement)."""
    frames = encode_group(new_group_id(), staged.impacts) if staged.impacts else []
    notify = ""
    if inline_notify and frames and not staged.outbox and staged.confirmation is None:
        notify = notify_statement(frames)
    else:
        await write_outbox(conn, staged.outbox, frames=frames, confirmation=staged.confirmation)
    for at, impacts in staged.scheduled.items():
        await schedule_in(conn, at, impacts)
    for due, message in staged.scheduled_messages:
        await stage_scheduled_message(conn, message, due)
    if staged.blobs:
        await stage_blobs(conn, staged.blobs)
    return len(staged.impacts), notify


def notify_statement(frames: Sequence[str]) -> str:
    """The impacts' NOTIFYs on their channel, in order, every frame a
    dollar-quoted literal: statements without parameters, to ride in another
    round trip of the same transaction (delivered, as any NOTIFY, only once
    it committed)."""
    return "; ".join(f"SELECT pg_notify('{CHANNEL}', {dollar_quoted(f)})" for f in frames)


def _begin_sql(config: EngineConfig) -> str:
    return _begin_for(config.lock_timeout)


@functools.lru_cache(maxsize=64)
def _begin_for(lock_timeout: timedelta) -> str:
    # BEGIN and the transaction's lock bound in one statement. The value is
    # an int we computed, so formatting it into SQL is safe.
    millis = max(1, math.ceil(lock_timeout.total_seconds() * 1000))
    return f"BEGIN; SET LOCAL lock_timeout = {millis}"


async def run_pipeline(
    db: Database,
    config: EngineConfig,
    open_context: Callable[[Conn, Timestamp], C],
    handler: Callable[[C], Awaitable[R]],
    *,
    clock: Clock,
    metrics: Metrics | None = None,
    hook: StageHook | None = None,
) -> R:
    """Run ``handler`` in one pipeline transaction and commit.

    ``open_context(conn, now)`` builds the handler's context over the open
    transaction. The committed impacts are recorded on ``metrics`` only
    after COMMIT returned. The handler runs with the task marked as holding
    the connection (`Database.hold`): an engine entry that would take a
    second one from the same pool raises `NestedConnectionError` (nothing
    commits); ``after_commit`` hooks run after the release, unmarked.
    """
    stage = Stage.BEGIN
    try:
        conn = await db.acquire(config.lock_timeout.total_seconds())
    except DRIVER_ERRORS as exc:
        raise translate_db_error(exc, stage) from exc
    # The handler (and its stores) runs holding this connection: an engine
    # entry reaching the same pool from this task is refused at once
    # (`NestedConnectionError`) rather than wait for a second connection.
    held = db.hold()
    committed = 0
    try:
        cx = open_context(conn, clock.now())
        # BEGIN rides with the handler's first lock (or the flush), hooked or not.
        cx._defer_begin(
            _begin_sql(config), None if hook is None else (lambda: hook(Stage.BEGIN, conn))
        )

        result = await handler(cx)
        staged = cx._staged()
        await cx._ensure_begun()

        try:
            stage = Stage.FLUSH
            if hook is not None:
                await hook(stage, conn)
            committed, notify = await _flush_but_riders(conn, staged)
            riders = "; ".join(s for s in (notify, offer_dirty_statement(staged.offers)) if s)
            stage = Stage.COMMIT
            if hook is not None:
                await hook(stage, conn)
            await db.commit(conn, before=riders)
        except DRIVER_ERRORS as exc:
            raise translate_db_error(exc, stage) from exc
    except BaseException:
        await _abandon(conn)
        raise
    finally:
        db.unhold(held)  # after_commit hooks run free to take a connection
        # The pool discards a lost connection it could not reset.
        with contextlib.suppress(*DRIVER_ERRORS):
            await db.release(conn)
    if metrics is not None:
        metrics.add_impacts_committed(committed)
    for after_commit in staged.after_commit:
        await after_commit()  # best effort by contract: each catches its own failure
    return result


async def _abandon(conn: Conn) -> None:
    """Roll back whatever is open; a connection that cannot is closed."""
    try:
        if conn.is_closed() or not conn.is_in_transaction():
            return
    except DRIVER_ERRORS:
        return  # a lost connection the driver already detached: nothing to roll back
    # A connection in an unknown state (cancelled mid-statement, lost) is
    # closed, never handed back to the pool as if it were clean.
    try:
        await conn.execute("ROLLBACK")
    except Exception:
        conn.terminate()
    except BaseException:
        conn.terminate()
        raise
