"""The write pipeline: one transaction around one handler.

    BEGIN; SET LOCAL lock_timeout [; a reaction's claim]; the first locks
                                                  (one round trip)
      handler(cx): per aggregate advisory lock -> Persistence.lock -> load
                   (a create: the advisory lock only), gate (deny mode),
                   domain command, save (a pinned CrudStore row's: deferred)
    [the deferred saves]; [a reaction's confirmation]; [the impacts' NOTIFYs]; [the outbox rows
    and their wake-up]; [scheduled impacts]; [scheduled messages]; [blob
    rows]; [offer marks]; COMMIT; the pool's release reset (one round trip)
    record the committed impacts; respond

The connection is held by a `Transaction` (`pipeline.transaction`), which
batches: BEGIN and ``SET LOCAL lock_timeout`` travel in the same round trip
as the transaction's first advisory locks (for a handler that sent
nothing, just before the flush); COMMIT carries the reset the pool
would otherwise send on release (`Database.commit`), and every staged row
that can be written without parameters rides in front of COMMIT in that
same round trip, its values inlined: the reaction's confirmation, the
impacts' NOTIFYs and the outbox rows (`outbox_statement`), the offer marks
(`offer_dirty_statement`), the scheduled impacts and messages and the blob
rows. A `StageHook` observes the stages without
changing that sequence: it is called once BEGIN's round trip returned,
before the flush and before COMMIT, and sends nothing unless it means to
(a fault).

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
from collections.abc import Awaitable, Callable, Collection
from datetime import timedelta
from typing import Protocol, TypeVar

from ..blobs.staging import blob_statement
from ..clock import Clock, Timestamp
from ..config import EngineConfig
from ..db.errors import DRIVER_ERRORS, Stage, translate_db_error
from ..db.pool import Database
from ..db.types import Conn
from ..impacts.framing import encode_group, new_group_id
from ..impacts.transport import schedule_statement
from ..metrics import Metrics
from ..offers.staging import offer_dirty_statement
from ..outbox.staging import outbox_statement
from ..scheduled.staging import scheduled_message_statement
from .ops import Ops, Staged
from .transaction import Transaction

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
    committed, riders = _flush_but_riders(staged)
    if riders:
        await conn.execute(riders)
    return committed


def _flush_but_riders(staged: Staged) -> tuple[int, str]:
    """What a handler staged, as statements with every value inlined
    (`db.literals`), to ride in COMMIT's round trip: the reaction's
    confirmation, the impacts' NOTIFYs and the outbox rows
    (`outbox_statement`), the scheduled impacts and messages, the blob
    rows, the offer marks (`offer_dirty_statement`). Answers the impacts
    staged for NOTIFY and those statements. Sends nothing."""
    frames = encode_group(new_group_id(), staged.impacts) if staged.impacts else []
    riders = [
        outbox_statement(staged.outbox, frames=frames, confirmation=staged.confirmation),
        *(schedule_statement(at, impacts) for at, impacts in staged.scheduled.items()),
        *(scheduled_message_statement(message, due)
          for due, message in staged.scheduled_messages),
        blob_statement(staged.blobs) if staged.blobs else "",
        offer_dirty_statement(staged.offers),
    ]
    return len(staged.impacts), "; ".join(r for r in riders if r)


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
    nouns: Collection[str] | None = None,
) -> R:
    """Run ``handler`` in one pipeline transaction and commit.

    ``open_context(conn, now)`` builds the handler's context over the open
    transaction. The committed impacts are recorded on ``metrics`` only
    after COMMIT returned. The connection is taken as a writer's
    (`Database.acquire` with ``write=True``): past the pool's write slots a
    run waits at the write pipeline's admission queue, holding nothing,
    while reads keep their reserved connections. The handler runs with the task marked as holding
    the connection (`Database.hold`): an engine entry that would take a
    second one from the same pool raises `NestedConnectionError` (nothing
    commits); ``after_commit`` hooks run after the release, unmarked.
    ``nouns`` (the engine's registered nouns) lets the context refuse a
    principal-facts dependency that names none of them.
    """
    stage = Stage.BEGIN
    bound = config.lock_timeout.total_seconds()
    try:
        conn = await db.acquire(bound, write=True)
    except DRIVER_ERRORS as exc:
        raise translate_db_error(exc, stage) from exc
    # The handler (and its stores) runs holding this connection: an engine
    # entry reaching the same pool from this task is refused at once
    # (`NestedConnectionError`) rather than wait for a second connection.
    held = db.hold()
    committed = 0
    try:
        cx = open_context(conn, clock.now())
        if nouns is not None:
            cx._nouns = nouns
        # BEGIN rides with the handler's first lock (or the flush), hooked or not.
        cx._defer_begin(
            _begin_sql(config), None if hook is None else (lambda: hook(Stage.BEGIN, conn))
        )

        result = await handler(cx)
        staged = cx._staged()
        # A handler that sent nothing: BEGIN (and a reaction's claim) now, in
        # a round trip of its own, hooked or not (the hook's BEGIN stage runs
        # once BEGIN returned; a claim's answer decides what commits).
        await cx._ensure_begun()

        try:
            stage = Stage.FLUSH
            if hook is not None:
                await hook(stage, conn)
            committed, riders = _flush_but_riders(staged)
            stage = Stage.COMMIT
            if hook is not None:
                await hook(stage, conn)
            await cx._tx.commit(db, riders)
        except DRIVER_ERRORS as exc:
            raise translate_db_error(exc, cx._tx.stage_of(exc, stage)) from exc
    except BaseException:
        await _abandon(conn)
        raise
    finally:
        db.unhold(held)  # after_commit hooks run free to take a connection
        # The pool discards a lost connection it could not reset.
        with contextlib.suppress(*DRIVER_ERRORS):
            await db.release(conn, bound, write=True)
    if metrics is not None:
        metrics.add_impacts_committed(committed)
    for after_commit in staged.after_commit:
        await after_commit()  # best effort by contract: each catches its own failure
    return result


async def _abandon(conn: Conn) -> None:
    """Roll back whatever is open; a connection that cannot is closed."""
    await Transaction(conn).abandon()
