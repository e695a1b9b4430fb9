"""`Ops`: the verbs every handler context shares, over the pipeline's
`Transaction`.

Its core is the aggregate (`load`, `lock_all`, `create`, `save`, `delete`)
and the impact (`impact`, `impact_caused`, `impact_at`,
`impact_principal_facts`); each feature's gestures live in the feature's
folder and are part of every context: blobs (`blobs/gestures.py`), integration
messages (`outbox/gestures.py`), the accumulated lane's seal
(`lanes/accumulated/gestures.py`). What a handler staged is handed to the
flush as `Staged`. The contexts a handler receives (`Mutation`, `Bulk`,
`Reaction`) are `contexts`'s.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from ..blobs.gestures import BlobGestures
from ..blobs.staging import BlobStaging, blob_refs_of, released_refs
from ..clock import Timestamp
from ..config import EngineConfig
from ..db.errors import DatabaseError, Stage
from ..db.locks import aggregate_lock_key
from ..db.types import Conn
from ..failures import DeclarationError, TooManyImpacts
from ..impacts.framing import MAX_IMPACT_BYTES, encode_group, new_group_id
from ..impacts.model import (
    Cause,
    Impact,
    ImpactKind,
    JsonValue,
    UnknownFactDependency,
    canonical_json,
    impact_json,
)
from ..impacts.watched import UnwatchedNoun, WatchedNouns
from ..lanes.accumulated.gestures import SealGestures
from ..messaging.claims import Confirmation
from ..messaging.envelope import EventMetadata, OutboundMessage
from ..offers.staging import DirtyMark, DirtyMarks
from ..outbox.gestures import MessageGestures
from ..outbox.staging import OutboxRow
from ..persistence.base import Aggregate, NotFound, Persistence, load_pinned, store_of
from ..persistence.crud import CrudStore, affected, batched
from ..persistence.full_eda import EventSourced, Redactor
from ..persistence.full_eda import erase as erase_events
from .transaction import Identity, Transaction

__all__ = ["BULK_PATH", "Ops", "Staged"]

AggT = TypeVar("AggT", bound=Aggregate)
T = TypeVar("T")

BULK_PATH = "MutationExecutor.ack_bulk / execute_bulk with Bulk.impact_all"


@dataclass(frozen=True, slots=True)
class Staged:
    """Everything a handler staged, for the pipeline's flush.

    ``messages`` are the envelopes behind the ``emit`` / ``command`` rows in
    ``outbox`` (a reaction stores them on its claim as its confirmations:
    ``confirmation``, written by the flush's outbox statement);
    ``scheduled_messages`` are ``schedule_at``'s, by due time.
    """

    impacts: list[Impact]
    scheduled: dict[Timestamp, list[Impact]]
    outbox: list[OutboxRow]
    messages: list[OutboundMessage] = field(default_factory=list)
    scheduled_messages: list[tuple[Timestamp, OutboundMessage]] = field(default_factory=list)
    offers: list[DirtyMark] = field(default_factory=list)
    after_commit: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    blobs: BlobStaging = field(default_factory=BlobStaging)
    confirmation: Confirmation | None = None


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


class Ops(BlobGestures, SealGestures, MessageGestures):
    """The operations every context shares, bound to one open transaction.

    A layer over the pipeline's `Transaction` (``_tx``), which owns the
    connection and decides what rides in which round trip: `Ops` stages
    (impacts, messages, offer marks, blob rows) and turns aggregates into
    the transaction's locks, loads and writes. Built by the pipeline, never
    by a slice.
    """

    _bulk = False
    _nouns: Collection[str] | None = None
    """The nouns the engine's projectors read (`run_pipeline` sets it); an
    impact or a principal-facts dependency outside them is refused, and a
    write through a store its projectors read (`WatchedNouns`) stages their
    impacts. None: unchecked, and no write stages an impact (a pipeline run
    without an engine)."""

    def __init__(self, conn: Conn, config: EngineConfig, now: Timestamp) -> None:
        self._conn = conn
        self._tx = Transaction(conn)
        self._config = config
        self._now = now
        self._impacts: dict[Impact, None] = {}
        self._entities: dict[tuple[str, str], Impact] = {}
        """The last entity impact staged per ``(noun, key)`` (one per key)."""
        self._resets: dict[str, None] = {}
        self._scheduled: dict[Timestamp, list[Impact]] = {}
        self._outbox: list[OutboxRow] = []
        self._messages: list[OutboundMessage] = []
        self._scheduled_messages: list[tuple[Timestamp, OutboundMessage]] = []
        self._metadata: EventMetadata | None = None
        self._offers = DirtyMarks()
        self._after_commit: list[Callable[[], Awaitable[None]]] = []
        self._blobs = BlobStaging()
        self._blob_seen: dict[tuple[str, str], frozenset[str]] = {}
        self._confirmation: Confirmation | None = None
        # The image of each row loaded (and pinned) since this transaction's
        # last write: a second load of it answers a copy, no round trip.
        self._images: dict[tuple[Persistence[Any, Any], str], Any] = {}

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
        """As `load`, but ``None`` when there is no aggregate under ``key``.

        A row loaded again in the same transaction, with nothing written
        through this context since and its row pinned by the first load
        (a `CrudStore`'s ``SELECT ... FOR UPDATE``: no other transaction
        can change it until the commit), is answered as the first load's
        image (a copy taken at that load; handed out once, so a third load
        reads again) instead of a second read."""
        store = store_of(aggregate_type)
        await self._lock(store, key, pin=False)  # the load pins the row
        identity = self._identity(store, key)
        image = self._images.pop((store, identity[1]), None)
        if image is not None:
            found = image
        else:
            found = await self._db(
                Stage.LOAD, lambda: load_pinned(store, self._conn, key), writes=False
            )
            if found is not None and _pins_on_load(store):
                self._tx.note_pinned(identity)
                with contextlib.suppress(Exception):  # an image that cannot be copied is re-read
                    self._images[(store, identity[1])] = copy.deepcopy(found)
        if found is not None and not isinstance(found, aggregate_type):
            raise DeclarationError(
                f"{aggregate_type.__qualname__}.Store loaded a {type(found).__qualname__}: "
                "declare a Store on each concrete aggregate class"
            )
        if found is not None:
            self._blob_seen[identity] = blob_refs_of(found)
        return found

    async def lock_all(self, *targets: tuple[type[Aggregate], Any]) -> None:
        """Take the advisory locks of ``(aggregate_type, key)`` targets now,
        in the order given, in one round trip (BEGIN's, when this is the
        transaction's first statement). A later `load`, `save` or `delete`
        of one takes no lock of its own (a load still pins and reads its
        row). For a handler that knows up front every aggregate it writes:
        one round trip instead of one per aggregate. Lock in the same order
        as every other writer of those aggregates (`LockTimeout` otherwise
        ends a deadlock)."""
        await self._lock_all((store_of(aggregate_type), key) for aggregate_type, key in targets)

    async def create(self, aggregate: Aggregate, *, cause: Cause | None = None) -> None:
        """Insert a new aggregate (and its pending events) under its lock,
        and stage the impact of each noun whose projector reads through its
        store (``cause``, if given, rides it: see `save`).

        An existing key fails with `ConstraintViolation` (``unique``). Takes
        the advisory lock only: there is no row image to pin (`Persistence.lock`
        pins a row before a load), and the insert itself meets a concurrent
        writer of the key on its unique index.

        A `CrudStore`'s insert behind the store's `settings`, or as the
        transaction's first statement, waits for the next statement and
        rides in front of it with its lock (and BEGIN, while deferred): a
        handler that creates one row commits in one round trip. Its error
        (a taken key, a refused lock) is raised by that next call, or by the
        commit, instead of here; a handler that must know the key is free
        before going on loads it first (`load_optional`).
        """
        store = store_of(type(aggregate))
        key = store.key_of(aggregate)
        identity = self._identity(store, key)
        if isinstance(store, CrudStore):
            await self._create_crud(store, key, identity, aggregate)
        else:
            await self._lock(store, key, pin=False)
            await self._db(Stage.CREATE, lambda: store.create(self._conn, aggregate))
        self._offers.aggregate(type(aggregate), key)
        self._stage_write(store, key, cause)

    async def save(self, aggregate: Aggregate, *, cause: Cause | None = None) -> None:
        """Write the aggregate's new state and its pending events.

        Under the aggregate's advisory lock; a store's row `lock` is taken
        first for an aggregate this transaction did not load, except a
        `CrudStore`'s, whose one UPDATE locks the row itself.

        Stages the impact of each noun whose registered projector reads
        through the aggregate's store (its ``NOUN`` and ``STORE``): no
        ``cx.impact`` is needed for the row written. ``cause`` (the small
        fact that changed it, for a `PerImpact` projector) rides that
        impact; a cause on a store no registered projector reads raises
        `UnwatchedNoun`. One impact per ``(noun, key)`` per transaction."""
        store = store_of(type(aggregate))
        identity = self._identity(store, store.key_of(aggregate))
        later = None
        if (
            isinstance(store, CrudStore) and self._tx.pins(identity) and self._tx.settled
            and self._tx.defers_on(Stage.SAVE, store.error_table)
        ):
            later = store.save_later(aggregate)
        if later is not None:
            # Its row is pinned: the UPDATE rides in front of the next
            # statement (COMMIT's round trip when none follows).
            self._images.clear()
            self._tx.defer_write(Stage.SAVE, later)
        elif isinstance(store, CrudStore):
            await self._write_crud(Stage.SAVE, store, aggregate, identity,
                                   store.save_inlined(aggregate),
                                   lambda: store.save(self._conn, aggregate))
        else:
            await self._lock(store, store.key_of(aggregate))
            await self._db(Stage.SAVE, lambda: store.save(self._conn, aggregate))
        self._offers.aggregate(type(aggregate), store.key_of(aggregate))
        self._stage_write(store, store.key_of(aggregate), cause)
        after = blob_refs_of(aggregate)
        self._blobs.release(released_refs(self._blob_seen.get(identity, frozenset()), after))
        self._blob_seen[identity] = after

    async def delete(self, aggregate: Aggregate, *, cause: Cause | None = None) -> None:
        """Remove the aggregate, staging its impact as `save` does; an
        offered noun's key is retracted by the leader's next drain."""
        store = store_of(type(aggregate))
        identity = self._identity(store, store.key_of(aggregate))
        if isinstance(store, CrudStore):
            self._tx.forget_pinned(identity)
            await self._write_crud(Stage.DELETE, store, aggregate, identity,
                                   store.delete_inlined(aggregate),
                                   lambda: store.delete(self._conn, aggregate))
        else:
            await self._lock(store, store.key_of(aggregate))
            self._tx.forget_pinned(identity)
            await self._db(Stage.DELETE, lambda: store.delete(self._conn, aggregate))
        self._offers.aggregate(type(aggregate), store.key_of(aggregate))
        self._stage_write(store, store.key_of(aggregate), cause)
        self._blobs.release(self._blob_seen.pop(identity, frozenset()) | blob_refs_of(aggregate))

    def dirty_offer(self, aggregate_type: type[Aggregate], key: Any) -> None:
        """The row of ``aggregate_type`` under ``key`` changed outside the
        aggregate API (an erasure's anonymising UPDATE, a hand-written
        DELETE): its offers re-publish (or retract) it after the commit.
        Staged with the transaction; a no-op for a noun no offer carries."""
        self._images.clear()
        self._offers.aggregate(aggregate_type, key)

    async def redact_events(
        self, aggregate: type[EventSourced], redactor: Redactor[T], subject: T
    ) -> list[JsonValue]:
        """Rewrite the events of ``aggregate`` (a full-EDA aggregate) in
        place through ``redactor(event, subject)`` and re-snapshot each
        touched aggregate from genesis, under the pipeline's advisory lock
        of each, in this transaction; answers the touched keys. In-log
        erasure (`Erase.erase_events`) is this with the erased person.
        Raises `HydrationFailed` (nothing commits) when a rewritten log no
        longer replays."""
        return await self._db(
            Stage.SAVE, lambda: erase_events(self._conn, aggregate, redactor, subject)
        )

    # -- impacts ------------------------------------------------------------

    def impact(self, noun: str, key: JsonValue) -> None:
        """The row ``(noun, key)`` changed: re-render it after the commit.

        For a derived or foreign impact: a `create`, `save` or `delete`
        already stages its own store's noun. Raises `UnwatchedNoun` for a
        noun no registered projector watches."""
        self._add(self._watched(Impact.entity(noun, key)))

    def impact_caused(self, noun: str, key: JsonValue, cause: Cause) -> None:
        """As `impact`, with the small fact that changed it (for PerImpact
        projectors). A cause too large for one NOTIFY frame raises
        `CauseTooLarge` here."""
        self._add(_check_fits(self._watched(Impact.entity(noun, key, cause))))

    def impact_at(
        self, at: Timestamp, noun: str, key: JsonValue, cause: Cause | None = None
    ) -> None:
        """Deliver the impact of ``(noun, key)`` when the database clock passes
        ``at`` (a scheduled boundary: a deadline, an expiry). Committed with
        the command; does not count against ``impacts_per_commit``."""
        impact = _check_fits(self._watched(Impact.entity(noun, key, cause)))
        self._scheduled.setdefault(at, []).append(impact)

    def impact_principal_facts(self, principal_id: JsonValue, deps: Iterable[str]) -> None:
        """The facts of ``principal_id`` changed; projectors reading the nouns
        ``deps`` re-gate that principal's sessions (empty: every projector).
        Raises `UnknownFactDependency` for a dependency no registered
        projector reads (a fact name where a noun belongs)."""
        deps = list(deps)
        nouns = self._nouns
        if nouns is not None:
            unknown = {dep for dep in deps if dep not in nouns}
            if unknown:
                raise UnknownFactDependency(unknown, nouns)
        self._add(_check_fits(Impact.principal_facts(principal_id, deps)))

    def _watched(self, impact: Impact) -> Impact:
        nouns = self._nouns
        if nouns is not None and impact.noun not in nouns:
            raise UnwatchedNoun(impact.noun, nouns)
        return impact

    def _stage_write(self, store: Persistence[Any, Any], key: object, cause: Cause | None) -> None:
        """Stage the impact of a write through ``store`` on each noun bound to it."""
        nouns = self._nouns.of_store(store) if isinstance(self._nouns, WatchedNouns) else ()
        if not nouns and cause is not None and self._nouns is not None:
            raise UnwatchedNoun(store.store_type, self._nouns, store=True)
        for noun in nouns:
            impact = Impact.entity(noun, cast(JsonValue, _lockable(key)), cause)
            self._add(impact if cause is None else _check_fits(impact))

    def _add(self, impact: Impact) -> None:
        if impact.kind is ImpactKind.ENTITY:
            if impact.noun in self._resets:
                return  # a projector reset of the noun already covers it
            slot = (impact.noun, impact.key_json)
            held = self._entities.get(slot)
            if held is not None and held in self._impacts:
                if impact.cause is None or impact.cause == held.cause:
                    return  # the key is already staged (with its cause, if any)
                if held.cause is None:
                    del self._impacts[held]  # the caused impact replaces it
            self._entities[slot] = impact
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

    def _staged(self) -> Staged:
        """What the flush writes; refuses a transaction a database error broke."""
        if self._failed is not None:
            # The handler caught a database error and carried on: the
            # transaction is aborted and must not pretend to commit.
            raise self._failed
        self._check_limit()
        resets = [Impact.reset(noun) for noun in self._resets]
        return Staged(
            [*resets, *self._impacts], self._scheduled, self._outbox, self._messages,
            self._scheduled_messages, self._offers.marks(), after_commit=self._after_commit,
            blobs=self._blobs, confirmation=self._confirmation,
        )

    def _identity(self, store: Persistence[Any, Any], key: object) -> tuple[str, str]:
        try:
            return store.store_type, canonical_json(_lockable(key))
        except (TypeError, ValueError) as exc:
            raise DeclarationError(
                f"an aggregate key must be JSON (or a UUID), got {key!r}"
            ) from exc

    async def _create_crud(
        self, store: CrudStore[Any, Any], key: object, identity: Identity, aggregate: Aggregate
    ) -> None:
        """A `CrudStore`'s insert. Where it travels inlined anyway (behind the
        store's `settings`, or as the transaction's first statement, with
        BEGIN) it waits for the next statement behind its advisory lock
        (`Transaction.defer_insert`): a reaction's pending claim is answered
        first (with BEGIN and the lock), and a write of another stage to its
        table goes first alone, so an error of each names its own stage.
        Otherwise the store's prepared insert runs (planned once per
        connection: less work for Postgres than an inlined one, parsed and
        planned on every run), with its lock in its statement
        (`create_locked`) where the lock is not held yet. With a hook waiting
        on BEGIN's round trip, the insert rides with BEGIN."""
        settings = store.settings_sql(aggregate)
        inlined = (store.create_inlined(aggregate)
                   if settings or self._tx.begin_pending else None)
        if inlined is not None:
            if self._tx.claim_pending:
                await self._lock_all([(store, key)])
            if not self._tx.defers_on(Stage.CREATE, store.error_table):
                await self._tx.send_writes()
            if self._tx.defers and (settings or self._tx.begin_pending):
                self._images.clear()
                self._tx.defer_insert(
                    Stage.CREATE, identity, aggregate_lock_key(identity[0], _lockable(key)),
                    batched(settings, inlined), store.error_table,
                )
                return
            if self._tx.begin_pending:
                await self._lock_all([(store, key)], batched(settings, inlined), Stage.CREATE)
                return
        if (
            not settings and store.creates_locked
            and not self._tx.holds_lock(identity) and self._tx.settled
        ):
            lock_key = aggregate_lock_key(identity[0], _lockable(key))
            await self._db(
                Stage.CREATE, lambda: store.create_locked(self._conn, aggregate, lock_key)
            )
            self._tx.note_locked(identity)
            return
        await self._lock_all([(store, key)], settings, Stage.CREATE)
        await self._db(Stage.CREATE, lambda: store.create(self._conn, aggregate))

    async def _write_crud(
        self, stage: Stage, store: CrudStore[Any, Any], aggregate: Aggregate,
        identity: Identity, inlined: str | None, write: Callable[[], Awaitable[None]],
    ) -> None:
        """A `CrudStore`'s save or delete (its one statement locks the row)
        in one round trip with its advisory lock (and BEGIN, while
        deferred) and the store's `settings`: ``inlined``, whose status
        counts the rows it touched (none: `NotFound`). Where the lock is held
        and there are no settings, or the write cannot be inlined, ``write``
        (the store's own, prepared) runs after them."""
        key = store.key_of(aggregate)
        settings = store.settings_sql(aggregate)
        held = self._tx.holds_lock(identity)
        if inlined is not None and (settings or not held):
            status = await self._lock_all([(store, key)], batched(settings, inlined), stage)
            if affected(status) == 0:
                raise NotFound(store.store_type, key)
            return
        await self._lock_all([(store, key)], settings, stage)
        await self._db(stage, write)

    async def _lock(self, store: Persistence[Any, Any], key: object, *, pin: bool = True) -> None:
        store_type = store.store_type
        lockable = _lockable(key)
        try:
            identity = (store_type, canonical_json(lockable))
        except (TypeError, ValueError) as exc:
            raise DeclarationError(
                f"an aggregate key must be JSON (or a UUID), got {key!r}"
            ) from exc
        if self._tx.holds_lock(identity):
            return
        await self._tx.lock_one(identity, aggregate_lock_key(store_type, lockable))
        if pin:
            await self._db(Stage.LOCK, lambda: store.lock(self._conn, key), writes=False)

    async def _lock_all(
        self, targets: Iterable[tuple[Persistence[Any, Any], object]], then: str = "",
        then_stage: Stage = Stage.CREATE,
    ) -> str:
        """Take the advisory locks of ``(store, key)`` targets in the order
        given, in one round trip (each as `_lock` without a row pin would; a
        key already locked is skipped), with BEGIN when nothing was sent yet.
        The caller orders the keys (the command layer's one fixed lock order).
        ``then`` (one write without parameters, every value a literal) runs
        after the locks in that same round trip (alone, as ``then_stage``,
        when no lock is left to take); answers its command status."""
        pending: list[tuple[tuple[str, str], int]] = []
        for store, key in targets:
            identity = self._identity(store, key)
            pending.append((identity, aggregate_lock_key(identity[0], _lockable(key))))
        if then:
            self._images.clear()
        return await self._tx.lock_keys(pending, then, then_stage)

    async def _execute_first(self, stage: Stage, sql: str) -> str:
        """Run ``sql`` (no parameters: every value inlined and safe) as the
        transaction's first statement, in BEGIN's round trip when BEGIN is
        still deferred; returns the command status of ``sql``."""
        self._images.clear()
        return await self._tx.execute_first(stage, sql)

    def _defer_begin(
        self, begin_sql: str, on_begun: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """`Transaction.defer_begin`."""
        self._tx.defer_begin(begin_sql, on_begun)

    async def _ensure_begun(self) -> None:
        """`Transaction.ensure_begun`."""
        await self._tx.ensure_begun()

    def _defer_claim(self, message_id: uuid.UUID, reaction: str) -> None:
        """`Transaction.defer_claim`."""
        self._tx.defer_claim(message_id, reaction)

    @property
    def _claim_pending(self) -> bool:
        return self._tx.claim_pending

    @property
    def _claimed_before(self) -> bool:
        return self._tx.claimed_before

    @property
    def _failed(self) -> DatabaseError | None:
        return self._tx.failed

    def _discard_staged(self) -> None:
        """Forget everything staged so far (a reaction whose claim was
        taken before replays instead); the transaction stays usable."""
        self._tx.forget_claim_taken()
        self._impacts.clear()
        self._entities.clear()
        self._resets.clear()
        self._scheduled.clear()
        self._outbox.clear()
        self._messages.clear()
        self._scheduled_messages.clear()
        self._offers = DirtyMarks()
        self._after_commit.clear()
        self._blobs = BlobStaging()
        self._blob_seen.clear()
        self._images.clear()
        self._confirmation = None

    async def _db(
        self, stage: Stage, call: Callable[[], Awaitable[T]], *, writes: bool = True
    ) -> T:
        """Run one database call of ``stage``, translating driver errors.
        A call that may write (any but the context's own locks and loads,
        ``writes=False``) forgets the loaded images first."""
        if writes and self._tx.failed is None and not self._tx.claimed_before:
            self._images.clear()
        return await self._tx.run(stage, call)


def _pins_on_load(store: Persistence[Any, Any]) -> bool:
    """Whether the pipeline's load of ``store`` pins its row (a `CrudStore`
    with row locks and its own lock and load: ``SELECT ... FOR UPDATE``)."""
    return (
        isinstance(store, CrudStore) and store.lock_rows
        and type(store).lock is CrudStore.lock and type(store).load is CrudStore.load
    )



