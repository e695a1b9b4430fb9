"""Handler contexts: what a mutation or reaction handler may do, over one `Ops`.

A handler receives a context bound to the pipeline's open transaction::

    async def increment(cx: Mutation[Principal], key: str) -> None:
        counter = await cx.load(Counter, key)      # advisory lock, lock, load
        cx.require(counter.can_increment)          # the gate, in deny mode
        counter.increment(cx.principal.id)         # the domain command
        await cx.save(counter)                     # the store writes (style-agnostic)
        cx.impact("counter", key)                  # staged, sent at commit

Nothing a context stages is visible before the commit, and everything is
discarded when the handler raises. Reads and writes go through the
aggregate's ``Store``; database errors arrive as engine types
(`DatabaseError` subclasses) and leave the transaction unusable, so let
them propagate.

`Mutation` adds the acting ``principal`` and `Mutation.require`; `Bulk` adds
`Bulk.impact_all`. The integration layer builds its reaction context on
`Ops` the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..clock import Timestamp
from ..config import EngineConfig
from ..db.locks import aggregate_lock_key
from ..db.types import Conn
from ..errors import TooManyImpacts
from ..gates import BoundGate
from ..impacts.framing import MAX_IMPACT_BYTES, encode_group, new_group_id
from ..impacts.model import Cause, Impact, ImpactKind, JsonValue, canonical_json, impact_json
from ..persistence.base import Aggregate, NotFound, Persistence, store_of
from .errors import DRIVER_ERRORS, DatabaseError, Stage, is_lock_refusal, translate_db_error

__all__ = ["Bulk", "Mutation", "Ops", "OutboxRow", "Staged"]

AggT = TypeVar("AggT", bound=Aggregate)
P = TypeVar("P")
T = TypeVar("T")

BULK_PATH = "MutationExecutor.ack_bulk / execute_bulk with Bulk.impact_all"


@dataclass(frozen=True, slots=True, init=False)
class OutboxRow:
    """One ``service_engine.integration_outbox`` row staged by a command.

    Written in the command's transaction at flush; the relay publishes it
    after the commit. The payload and headers are encoded at construction,
    so a value that is not JSON (a `OneShot` secret included) is refused
    here with `TypeError`.
    """

    message_id: uuid.UUID
    subject: str
    payload_json: str
    headers_json: str
    producer: str | None
    seq_key: str | None
    seq: int | None

    def __init__(
        self,
        subject: str,
        payload: Mapping[str, JsonValue],
        *,
        message_id: uuid.UUID | None = None,
        headers: Mapping[str, str] | None = None,
        producer: str | None = None,
        seq_key: str | None = None,
        seq: int | None = None,
    ) -> None:
        if not isinstance(subject, str) or not subject:
            raise ValueError("an outbox row needs a subject")
        if not isinstance(payload, Mapping):
            raise TypeError("an outbox payload is a JSON object")
        try:
            payload_json = canonical_json(payload)
            headers_json = canonical_json(dict(headers or {}))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"an outbox row must be JSON: {exc}") from exc
        object.__setattr__(self, "message_id", message_id or uuid.uuid4())
        object.__setattr__(self, "subject", subject)
        object.__setattr__(self, "payload_json", payload_json)
        object.__setattr__(self, "headers_json", headers_json)
        object.__setattr__(self, "producer", producer)
        object.__setattr__(self, "seq_key", seq_key)
        object.__setattr__(self, "seq", seq)


@dataclass(frozen=True, slots=True)
class Staged:
    """Everything a handler staged, for the pipeline's flush."""

    impacts: list[Impact]
    scheduled: dict[Timestamp, list[Impact]]
    outbox: list[OutboxRow]


def _lockable(key: object) -> object:
    """The key as the advisory lock hashes it: JSON, a UUID as its string."""
    if isinstance(key, uuid.UUID):
        return str(key)
    if isinstance(key, list | tuple):
        return [_lockable(item) for item in key]
    if isinstance(key, dict):
        return {name: _lockable(item) for name, item in key.items()}
    return key


def _check_fits(impact: Impact) -> Impact:
    # Refuse an impact that can never ride NOTIFY where the handler staged
    # it, not at flush, so the error points at the slice's line.
    if len(impact_json(impact)) > MAX_IMPACT_BYTES // 4:
        encode_group(new_group_id(), [impact])
    return impact


class Ops:
    """The operations every context shares, bound to one open transaction.

    Built by the pipeline, never by a slice.
    """

    _bulk = False

    def __init__(self, conn: Conn, config: EngineConfig, now: Timestamp) -> None:
        self._conn = conn
        self._config = config
        self._now = now
        self._impacts: dict[Impact, None] = {}
        self._resets: dict[str, None] = {}
        self._scheduled: dict[Timestamp, list[Impact]] = {}
        self._outbox: list[OutboxRow] = []
        self._locked: set[tuple[str, str]] = set()
        self._failed: DatabaseError | None = None
        self._begin: str | None = None

    # -- time -------------------------------------------------------------

    def now(self) -> Timestamp:
        """The instant of this transaction (one value for the whole command)."""
        return self._now

    # -- aggregates -------------------------------------------------------

    async def load(self, aggregate_type: type[AggT], key: Any) -> AggT:
        """Lock and load the aggregate under ``key``; `NotFound` if absent.

        Takes the aggregate's transaction advisory lock (held to commit),
        then the store's `lock`, then reads it: concurrent commands on one
        key run one after the other. A lock not granted within
        ``lock_timeout`` raises `LockTimeout` (retryable).
        """
        found = await self.load_optional(aggregate_type, key)
        if found is None:
            raise NotFound(store_of(aggregate_type).store_type, key)
        return found

    async def load_optional(self, aggregate_type: type[AggT], key: Any) -> AggT | None:
        """As `load`, but ``None`` when there is no aggregate under ``key``."""
        store = store_of(aggregate_type)
        await self._lock(store, key)
        found = await self._db(Stage.LOAD, lambda: store.load(self._conn, key))
        if found is not None and not isinstance(found, aggregate_type):
            raise TypeError(
                f"{aggregate_type.__qualname__}.Store loaded a {type(found).__qualname__}: "
                "declare a Store on each concrete aggregate class"
            )
        return found

    async def create(self, aggregate: Aggregate) -> None:
        """Insert a new aggregate (and its pending events) under its lock.

        An existing key fails with `ConstraintViolation` (``unique``).
        """
        store = store_of(type(aggregate))
        await self._lock(store, store.key_of(aggregate))
        await self._db(Stage.CREATE, lambda: store.create(self._conn, aggregate))

    async def save(self, aggregate: Aggregate) -> None:
        """Write the aggregate's new state and its pending events."""
        store = store_of(type(aggregate))
        await self._lock(store, store.key_of(aggregate))
        await self._db(Stage.SAVE, lambda: store.save(self._conn, aggregate))

    async def delete(self, aggregate: Aggregate) -> None:
        """Remove the aggregate. Stage its impact as for any write."""
        store = store_of(type(aggregate))
        await self._lock(store, store.key_of(aggregate))
        await self._db(Stage.DELETE, lambda: store.delete(self._conn, aggregate))

    # -- impacts ------------------------------------------------------------

    def impact(self, noun: str, key: JsonValue) -> None:
        """The row ``(noun, key)`` changed: re-render it after the commit."""
        self._add(Impact.entity(noun, key))

    def impact_caused(self, noun: str, key: JsonValue, cause: Cause) -> None:
        """As `impact`, with the small fact that changed it (for PerImpact
        projectors). A cause too large for one NOTIFY frame raises
        `CauseTooLarge` here."""
        self._add(_check_fits(Impact.entity(noun, key, cause)))

    def impact_at(
        self, at: Timestamp, noun: str, key: JsonValue, cause: Cause | None = None
    ) -> None:
        """Deliver the impact of ``(noun, key)`` when the database clock passes
        ``at`` (a scheduled boundary: a deadline, an expiry). Committed with
        the command; does not count against ``impacts_per_commit``."""
        impact = _check_fits(Impact.entity(noun, key, cause))
        self._scheduled.setdefault(at, []).append(impact)

    def impact_principal_facts(self, principal_id: JsonValue, deps: Iterable[str]) -> None:
        """The facts of ``principal_id`` changed; projectors over ``deps`` re-gate."""
        self._add(_check_fits(Impact.principal_facts(principal_id, deps)))

    def _add(self, impact: Impact) -> None:
        if impact.kind is ImpactKind.ENTITY and impact.noun in self._resets:
            return  # a projector reset of the noun already covers it
        self._impacts[impact] = None
        if not self._bulk:
            self._check_limit()

    def _check_limit(self) -> None:
        limit = self._config.impacts_per_commit
        if len(self._impacts) > limit:
            raise TooManyImpacts(
                f"this transaction dirties more than impacts_per_commit={limit} keys; "
                f"write in bulk through the bulk path ({BULK_PATH}), which stages one "
                "projector-reset impact per noun instead of one per key"
            )

    # -- engine seams -------------------------------------------------------

    def _stage_outbox(self, row: OutboxRow) -> None:
        """Stage an outbox row (the integration layer's ``emit`` / ``command``)."""
        if not isinstance(row, OutboxRow):
            raise TypeError(f"expected an OutboxRow, got {row!r}")
        self._outbox.append(row)

    def _staged(self) -> Staged:
        """What the flush writes; refuses a transaction a database error broke."""
        if self._failed is not None:
            # The handler caught a database error and carried on: the
            # transaction is aborted and must not pretend to commit.
            raise self._failed
        self._check_limit()
        resets = [Impact.reset(noun) for noun in self._resets]
        return Staged([*resets, *self._impacts], self._scheduled, self._outbox)

    async def _lock(self, store: Persistence[Any, Any], key: object) -> None:
        store_type = store.store_type
        lockable = _lockable(key)
        try:
            identity = (store_type, canonical_json(lockable))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"an aggregate key must be JSON (or a UUID), got {key!r}") from exc
        if identity in self._locked:
            return
        lock_key = aggregate_lock_key(store_type, lockable)
        if self._begin is not None and self._failed is None:
            # The transaction's first statement rides with BEGIN: one round
            # trip fewer. The key is an int we computed, safe to inline.
            begin, self._begin = self._begin, None
            await self._db(
                Stage.BEGIN,
                lambda: self._conn.execute(f"{begin}; SELECT pg_advisory_xact_lock({lock_key:d})"),
            )
        else:
            await self._db(
                Stage.LOCK, lambda: self._conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key)
            )
        await self._db(Stage.LOCK, lambda: store.lock(self._conn, key))
        self._locked.add(identity)

    def _defer_begin(self, begin_sql: str) -> None:
        """The pipeline's BEGIN is sent with the first statement (`_ensure_begun`)."""
        self._begin = begin_sql

    async def _ensure_begun(self) -> None:
        """Send a deferred BEGIN now (before the flush, or a non-lock statement)."""
        if self._begin is not None:
            begin, self._begin = self._begin, None
            await self._db(Stage.BEGIN, lambda: self._conn.execute(begin))

    async def _db(self, stage: Stage, call: Callable[[], Awaitable[T]]) -> T:
        """Run one database call of ``stage``, translating driver errors."""
        if self._failed is not None:
            raise self._failed
        await self._ensure_begun()
        try:
            return await call()
        except DRIVER_ERRORS as exc:
            if stage is Stage.BEGIN and is_lock_refusal(exc):
                # The statement that began the transaction also took the
                # first lock: a refused lock is the lock's, not BEGIN's.
                stage = Stage.LOCK
            error = translate_db_error(exc, stage)
            self._failed = error
            raise error from exc


class Mutation(Ops, Generic[P]):
    """The context of a GraphQL mutation (or any command with an acting principal)."""

    def __init__(self, conn: Conn, config: EngineConfig, now: Timestamp, principal: P) -> None:
        super().__init__(conn, config, now)
        self.principal = principal

    def require(self, gate: BoundGate[P]) -> None:
        """The deny check: run ``gate`` for this principal; raise `Refused`
        (answered with the gate's `Reason` code) unless it allows."""
        gate.require(self.principal)


class Bulk(Mutation[P]):
    """A mutation that writes many rows of a noun at once.

    `impact_all` stages one projector-reset impact for the noun instead of
    one impact per key; the per-key impacts of that noun, staged before or
    after, are dropped. ``impacts_per_commit`` is checked at the flush, on
    what remains, so a bulk import that resets its noun is not refused.
    """

    _bulk = True

    def impact_all(self, noun: str) -> None:
        """Every key of ``noun`` may have changed: one reset at commit."""
        Impact.reset(noun)  # validates the noun
        self._resets[noun] = None
        for impact in [i for i in self._impacts if i.kind is ImpactKind.ENTITY and i.noun == noun]:
            del self._impacts[impact]
