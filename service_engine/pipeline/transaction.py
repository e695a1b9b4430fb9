"""The pipeline's transaction: one pooled connection, what it sends and when.

A `Transaction` owns the connection of one pipeline run and decides how
its statements are batched into round trips; the handler contexts (`Ops`)
are a layer over it that stage writes and call its primitives::

    tx = Transaction(conn)
    tx.defer_begin("BEGIN; SET LOCAL lock_timeout = 5000")   # sent with the first statement
    tx.defer_claim(message_id, "reaction")                     # a reaction's claim, with BEGIN
    await tx.lock_keys([(identity, key)])      # BEGIN + claim + advisory locks: one round trip
    row = await tx.run(Stage.LOAD, lambda: store.load(tx.conn, key))
    tx.note_pinned(identity)                                # the load pinned its row
    tx.defer_write(Stage.SAVE, store.save_later(aggregate))   # sent with COMMIT
    await tx.commit(db, riders="SELECT pg_notify(...)")  # save + riders + COMMIT + reset: one

The batching rules, all kept here:

- BEGIN and ``SET LOCAL lock_timeout`` are deferred (`defer_begin`) and ride
  with the transaction's first statement: its advisory locks (`lock_keys`),
  a statement without parameters (`execute_first`), or alone (`ensure_begun`)
  when the first statement takes parameters (asyncpg sends a statement with
  parameters as one extended-protocol statement of its own: a round trip
  that returns rows holds that one statement).
- A reaction's idempotency claim (`defer_claim`) rides with BEGIN; when it
  was taken before, the transaction answers `ClaimedBefore` from then on.
- A write to a row this transaction pinned, inlined (`defer_write`: a
  `CrudStore`'s save after its ``SELECT ... FOR UPDATE``), waits for the
  next statement and rides in front of it: COMMIT's round trip when
  nothing follows, the next simple-protocol batch, or a round trip of its
  own before a statement with parameters. So a load + save is three round
  trips: BEGIN with the locks, the pinned load, the save with COMMIT.
- A blind insert without parameters (`defer_insert`: a `CrudStore`'s
  create behind its settings, or its handler's first statement) waits the
  same way, behind its advisory lock (and BEGIN, while deferred): a handler
  that creates one row commits in one round trip.
- COMMIT carries whatever may ride before it (statements without
  parameters: the deferred writes, the impacts' NOTIFYs, the offer marks)
  and the pool's release reset (`commit`).

Every database call goes through `run`, which translates driver errors into
the stage's `DatabaseError` and remembers it: a transaction a driver error
broke answers that error to every later call (``failed``), so a handler
that caught one cannot pretend to commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..db.errors import DRIVER_ERRORS, DatabaseError, Stage, is_lock_refusal, translate_db_error
from ..db.pool import Database
from ..db.types import Conn
from ..messaging.claims import claim_and_lock_statement, claim_statement, claim_taken

__all__ = ["ClaimedBefore", "DeferredWrite", "Identity", "InlinedWrite", "Transaction"]

T = TypeVar("T")

Identity = tuple[str, str]
"""An aggregate's identity in the transaction: its store type and canonical key."""


class DeferredWrite(Protocol):
    """A write `Transaction.defer_write` holds (`persistence.crud.PinnedSave`)."""

    @property
    def inlined(self) -> str:
        """The write without parameters, every value inlined and safe."""

    @property
    def table(self) -> str:
        """The table whose constraint errors are this write's."""

    async def send(self, conn: Conn) -> None:
        """The write alone in its round trip (with parameters)."""


_Write = tuple[Stage, DeferredWrite]


@dataclass(frozen=True, slots=True)
class InlinedWrite:
    """A `DeferredWrite` without parameters: the same statements whether it
    rides with others or goes alone (a blind insert behind its lock)."""

    inlined: str
    table: str

    async def send(self, conn: Conn) -> None:
        """The statements alone in their round trip."""
        await conn.execute(self.inlined)


def _joined(writes: list[_Write]) -> str:
    return "; ".join(write.inlined for _, write in writes)


class ClaimedBefore(Exception):
    """A reaction's deferred claim was taken before (a redelivery, a
    re-sent command): the pipeline replays the stored confirmations instead
    of the handler's work. Raised into the handler from its first database
    call and from every later one; never escapes `run_reaction`."""

    def __init__(self, message_id: uuid.UUID | None) -> None:
        super().__init__(f"message {message_id} was claimed before" if message_id else
                         "the message was claimed before")


class Transaction:
    """One pipeline transaction on ``conn`` (built by the pipeline).

    State a context may read: ``conn`` (for a store's own SQL, always run
    through `run`), ``failed`` (the error that broke it, or None),
    ``claimed_before``, ``settled`` and `holds_lock`.
    """

    __slots__ = ("_begin", "_claim", "_locked", "_on_begun", "_pinned", "_riding", "_writes",
                 "claimed_before", "conn", "failed")

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.failed: DatabaseError | None = None
        self.claimed_before = False
        self._begin: str | None = None
        self._on_begun: Callable[[], Awaitable[None]] | None = None
        self._claim: tuple[uuid.UUID, str] | None = None
        self._locked: set[Identity] = set()
        self._pinned: set[Identity] = set()
        self._writes: list[_Write] = []
        self._riding: list[_Write] = []  # the deferred writes in the round trip in flight

    # -- what is pending ------------------------------------------------------

    def defer_begin(
        self, begin_sql: str, on_begun: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Send ``begin_sql`` (BEGIN and the lock bound) with the first
        statement. ``on_begun`` (the fault hook's BEGIN stage) runs once that
        round trip returned, inside the transaction; a driver error it
        raises is BEGIN's."""
        self._begin = begin_sql
        self._on_begun = on_begun

    def defer_claim(self, message_id: uuid.UUID, reaction: str) -> None:
        """Take the claim ``(message_id, reaction)`` with the first statement
        (with BEGIN, and with the first advisory lock only when the claim is
        taken): that statement raises `ClaimedBefore`, and so does every
        later call, when the claim was taken before."""
        self._claim = (message_id, reaction)

    @property
    def begin_pending(self) -> bool:
        """BEGIN waits for the transaction's first statement."""
        return self._begin is not None

    @property
    def claim_pending(self) -> bool:
        return self._claim is not None

    @property
    def settled(self) -> bool:
        """BEGIN sent (or waiting in front of a deferred insert), no claim
        pending, nothing failed, no claim taken before: a statement may carry
        its own lock (`CrudStore.create_locked`)."""
        return (
            self._begin is None and self._claim is None
            and not self.claimed_before and self.failed is None
        )

    def holds_lock(self, identity: Identity) -> bool:
        """Whether this transaction took ``identity``'s advisory lock."""
        return identity in self._locked

    def note_locked(self, identity: Identity) -> None:
        """Record a lock a statement took on its own (an insert's)."""
        self._locked.add(identity)

    def note_pinned(self, identity: Identity) -> None:
        """Record that a statement of this transaction pinned ``identity``'s
        row (``SELECT ... FOR UPDATE``): no other transaction can change or
        remove it until the commit."""
        self._pinned.add(identity)

    def forget_pinned(self, identity: Identity) -> None:
        """``identity``'s row is being removed: a write to it may not wait."""
        self._pinned.discard(identity)

    def pins(self, identity: Identity) -> bool:
        """Whether this transaction pinned ``identity``'s row (`note_pinned`)."""
        return identity in self._pinned

    def defer_write(self, stage: Stage, write: DeferredWrite) -> None:
        """Send ``write`` (to a row this transaction pinned: it affects that
        row whenever it runs) in front of the next statement: inlined in
        COMMIT's round trip when nothing else follows, or in the next batch
        of statements without parameters; alone (`DeferredWrite.send`)
        before a statement with parameters. A constraint of its table it
        violates is reported as ``stage``'s."""
        self._writes.append((stage, write))

    @property
    def defers(self) -> bool:
        """A blind insert may wait for the next statement (`defer_insert`):
        nothing failed, no claim pending or taken before, and no hook waits
        on BEGIN's round trip."""
        return (self.failed is None and self._claim is None and not self.claimed_before
                and self._on_begun is None)

    def defers_on(self, stage: Stage, table: str) -> bool:
        """No write of another stage to ``table`` waits: a constraint error
        of ``table`` in the round trip they would share names one stage."""
        return all(write.table != table or write_stage is stage
                   for write_stage, write in self._writes)

    def defer_insert(
        self, stage: Stage, identity: Identity, lock_key: int, statements: str, table: str
    ) -> None:
        """Send ``statements`` (an insert without parameters, behind the
        settings it runs under) after ``identity``'s advisory lock
        ``lock_key`` (unless held) in front of the next statement: COMMIT's
        round trip when nothing else follows. BEGIN, while still deferred,
        goes in front of them. A constraint of ``table`` it violates is
        ``stage``'s; a refused lock in the round trip it rides in is the
        lock's. Only where `defers` and `defers_on`."""
        sql = statements
        if identity not in self._locked:
            sql = f"SELECT pg_advisory_xact_lock({lock_key:d}); {sql}"
            self._locked.add(identity)
        if self._begin is not None:
            begin, self._begin = self._begin, None
            sql = f"{begin}; {sql}"
        self._writes.append((stage, InlinedWrite(sql, table)))

    def forget_claim_taken(self) -> None:
        """The claim was taken before and the caller replays instead: the
        transaction stays usable."""
        self.claimed_before = False

    # -- sending ------------------------------------------------------------

    async def run(
        self, stage: Stage, call: Callable[[], Awaitable[T]], *, written: Stage | None = None
    ) -> T:
        """Run one database call of ``stage`` (after a deferred BEGIN),
        translating driver errors; a driver error breaks the transaction.
        ``written``: the stage of the write the call ends with, which names
        its errors other than a refused lock (`lock_keys`' ``then``)."""
        if self.failed is not None:
            raise self.failed
        if self.claimed_before:
            raise ClaimedBefore(None)
        await self.ensure_begun()
        if self._writes:
            # A statement with parameters travels alone: the writes go before it.
            await self.send_writes()
        try:
            result = await call()
        except DRIVER_ERRORS as exc:
            if stage is Stage.BEGIN and is_lock_refusal(exc):
                # The statement that began the transaction also took the
                # first lock: a refused lock is the lock's, not BEGIN's.
                stage = Stage.LOCK
            error = translate_db_error(exc, self.stage_of(exc, stage, written))
            self.failed = error
            raise error from exc
        self._riding = []  # the writes that rode in it are done
        if self._on_begun is not None and self._begin is None:
            # The call that just returned sent BEGIN: the hook's BEGIN stage.
            on_begun, self._on_begun = self._on_begun, None
            await self.run(Stage.BEGIN, on_begun)
        return result

    async def send_writes(self) -> None:
        """Send the deferred writes now, in a round trip of their own: as
        prepared statements (one) or inlined (several)."""
        writes = self._ride_writes()
        if len(writes) == 1:
            [(write_stage, write)] = writes
            await self.run(write_stage, lambda: write.send(self.conn))
        elif writes:
            await self.run(writes[0][0], lambda: self.conn.execute(_joined(writes)))

    async def ensure_begun(self) -> None:
        """Send a deferred BEGIN now (with a deferred claim): its own round
        trip. Raises `ClaimedBefore` when that claim was taken before."""
        if self._begin is None:
            return
        begin, self._begin = self._begin, None
        claim, self._claim = self._claim, None
        if claim is None:
            await self.run(Stage.BEGIN, lambda: self.conn.execute(begin))
            return
        sql = f"{begin}; {claim_statement(*claim)}"
        status = await self.run(Stage.CLAIM, lambda: self.conn.execute(sql))
        if not claim_taken(status):
            self.claimed_before = True
            raise ClaimedBefore(claim[0])

    async def lock_keys(
        self, pending: Sequence[tuple[Identity, int]], then: str = "",
        then_stage: Stage = Stage.CREATE,
    ) -> str:
        """Take the advisory locks ``(identity, lock_key)`` in the order
        given (one already held is skipped) in one round trip: with BEGIN and
        a deferred claim when nothing was sent yet. ``then`` (statements
        without parameters, every value a literal) runs after them in that
        round trip (alone when no lock is left to take); answers the command
        status of its last statement. An error of that round trip other than
        a refused lock is ``then_stage``'s."""
        todo: list[tuple[Identity, int]] = []
        seen = set(self._locked)
        for identity, key in pending:
            if identity not in seen:
                seen.add(identity)
                todo.append((identity, key))
        if todo and (self._claim is not None or self.claimed_before or self.failed is not None):
            # A deferred claim rides with the first lock alone (its status
            # says whether the rest may run).
            first, todo = todo[0], todo[1:]
            await self._lock_first_with_claim(*first)
        if not todo:
            if not then:
                return ""
            return await self.run(then_stage, lambda: self.conn.execute(then))
        # Ints we computed, safe to inline: one statement per lock, run in order.
        sql = "; ".join(f"SELECT pg_advisory_xact_lock({key:d})" for _, key in todo)
        if then:
            sql = f"{sql}; {then}"
        stage = Stage.LOCK
        if self._writes and self._begin is None:
            sql = f"{_joined(self._ride_writes())}; {sql}"
        if self._begin is not None:
            begin, self._begin = self._begin, None
            sql, stage = f"{begin}; {sql}", Stage.BEGIN
        status = await self.run(stage, lambda: self.conn.execute(sql),
                                written=then_stage if then else None)
        self._locked.update(identity for identity, _ in todo)
        return status

    async def lock_one(self, identity: Identity, key: int) -> None:
        """Take one advisory lock (with BEGIN and a deferred claim when it
        is the first statement; a parameterised statement otherwise)."""
        if identity in self._locked:
            return
        if self._begin is not None and self.failed is None and not self.claimed_before:
            await self._lock_first_with_claim(identity, key)
            return
        await self.run(
            Stage.LOCK, lambda: self.conn.execute("SELECT pg_advisory_xact_lock($1)", key)
        )
        self._locked.add(identity)

    async def _lock_first_with_claim(self, identity: Identity, key: int) -> None:
        if self._begin is None or self.failed is not None or self.claimed_before:
            await self.lock_one(identity, key)
            return
        # The transaction's first statement rides with BEGIN (and a
        # deferred claim): one round trip. The key is an int we computed,
        # safe to inline.
        begin, self._begin = self._begin, None
        claim, self._claim = self._claim, None
        if claim is None:
            await self.run(
                Stage.BEGIN,
                lambda: self.conn.execute(f"{begin}; SELECT pg_advisory_xact_lock({key:d})"),
            )
        else:
            sql = f"{begin}; {claim_and_lock_statement(*claim, key)}"
            status = await self.run(Stage.BEGIN, lambda: self.conn.execute(sql))
            if not claim_taken(status):
                self.claimed_before = True
                raise ClaimedBefore(claim[0])
        self._locked.add(identity)

    async def execute_first(self, stage: Stage, sql: str) -> str:
        """Run ``sql`` (no parameters: every value inlined and safe) in
        BEGIN's round trip when BEGIN is still deferred; its command status."""
        if self._claim is not None:
            # A deferred claim goes first (with BEGIN): never skip it.
            await self.ensure_begun()
        if self._begin is not None and self.failed is None:
            begin, self._begin = self._begin, None
            sql = f"{begin}; {sql}"
        elif self._writes and self.failed is None:
            sql = f"{_joined(self._ride_writes())}; {sql}"
        return await self.run(stage, lambda: self.conn.execute(sql))

    async def commit(self, db: Database, riders: str = "") -> None:
        """COMMIT with the deferred writes and ``riders`` (statements
        without parameters) before it and the pool's release reset after
        it, in one round trip (`Database.commit`), once BEGIN was sent
        (`ensure_begun`). Raises the driver error untranslated: the pipeline
        names its stage (`stage_of`)."""
        writes = _joined(self._ride_writes())
        await db.commit(self.conn, before="; ".join(s for s in (writes, riders) if s))

    def stage_of(
        self, exc: BaseException, stage: Stage, written: Stage | None = None
    ) -> Stage:
        """The stage to name for ``exc``, raised by the last round trip at
        ``stage``: when deferred writes rode in it, a constraint of one's
        table is that write's stage; when it ended with a write of stage
        ``written``, any error but a refused lock is that write's."""
        if self._riding and is_lock_refusal(exc):
            return Stage.LOCK  # a deferred insert's lock (`defer_insert`)
        table = getattr(exc, "table_name", None)
        for write_stage, write in self._riding:
            if table is not None and table == write.table:
                return write_stage
        if written is not None and not is_lock_refusal(exc):
            return written
        return stage

    def _ride_writes(self) -> list[_Write]:
        """Take the deferred writes for the round trip about to be sent."""
        self._riding, self._writes = self._writes, []
        return self._riding

    async def abandon(self) -> None:
        """Roll back whatever is open; a connection that cannot is closed."""
        conn: Any = self.conn
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
