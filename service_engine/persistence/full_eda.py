"""The full-EDA kit: the event log is the state.

A slice declares an `EventSourced` aggregate and uses `FullEda` as its
store; it writes no SQL::

    class Ledger(EventSourced):
        NOUN = "ledger"
        EVENT_VERSION = 2
        SNAPSHOT_EVERY = 50
        Store: ClassVar[FullEda[Ledger]] = FullEda()

        @classmethod
        def genesis(cls, key): ...           # the state before any event
        def apply(self, event): ...          # fold one event (current version)
        def to_snapshot(self): ...           # JSON object
        @classmethod
        def from_snapshot(cls, key, state): ...
        def check_hydrated(self): ...        # None, or what is wrong
        @classmethod
        def upcast(cls, event, version): ... # an older event -> current version

A command starts a new aggregate with ``Ledger.start(key)``, changes it with
``ledger.record(DomainEvent(...))`` (applied at once, appended on save), and
the kit owns the rest, in the engine's generic tables
``service_engine.event_log`` (``noun, key, seq``) and
``service_engine.event_snapshot`` (``noun, key``):

* the append with per-key seq arithmetic (seq ``n+1..n+k`` after a load at
  ``n``; the primary key refuses a second writer of one seq);
* the snapshot cadence: the snapshot is rewritten only when an append
  crosses a multiple of ``SNAPSHOT_EVERY``, so it lags the log;
* the replay: snapshot, then the events after it, each upcast at read
  time to ``EVENT_VERSION``, with two barriers: the log must be gap-free and
  not newer than the code, and ``check_hydrated`` must accept the result
  (else `HydrationFailed`);
* `erase`, which rewrites a person's events in place through a redactor
  and re-snapshots every touched aggregate from genesis, and `keys`.

The generic snapshot carries only the structural ``(noun, key)`` key: a
full-EDA slice enforces uniqueness and integrity in its gates and its
hydration check, not in declared constraints.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

from ..db.errors import DRIVER_ERRORS, Stage, translate_db_error
from ..db.locks import aggregate_lock_key
from ..db.types import Conn
from ..failures import ConfigError, DeclarationError
from ..impacts.model import JsonValue, canonical_json
from .base import DomainEvent, HydrationFailed, NotFound, RecordsEvents, Row, Style, as_row

__all__ = ["EventSourced", "FullEda", "Redactor", "erase", "keys"]

E = TypeVar("E", bound="EventSourced")
P = TypeVar("P")

Redactor = Callable[[DomainEvent, P], "DomainEvent | None"]
"""``(event, person) -> rewritten event, or None to leave it as it is``.

The event it receives is already upcast to the current ``EVENT_VERSION``;
the rewrite is stored at that version.
"""

_UNBOUND = object()


class EventSourced(RecordsEvents, ABC):
    """An aggregate whose state is its event log (see the module docstring).

    Declare ``NOUN`` (the log's noun, stable forever), ``EVENT_VERSION``
    (bump it when an event's shape changes, and teach `upcast` the old
    shape), ``SNAPSHOT_EVERY`` and ``Store = FullEda()``. Do not give the
    class ``__slots__``: the kit keeps the stream key and seq on it.
    """

    NOUN: ClassVar[str]
    EVENT_VERSION: ClassVar[int] = 1
    SNAPSHOT_EVERY: ClassVar[int] = 100
    Store: ClassVar[FullEda[Any]]

    _stream_key: Any = _UNBOUND
    _stream_seq: int = 0

    @classmethod
    def start(cls, key: JsonValue) -> Self:
        """A new aggregate under ``key``, before its first event."""
        aggregate = cls.genesis(key)
        aggregate._bind(key, 0)
        return aggregate

    def _bind(self, key: JsonValue, seq: int) -> None:
        self._stream_key = key
        self._stream_seq = seq

    @property
    def stream_key(self) -> JsonValue:
        """The aggregate's key in the log."""
        if self._stream_key is _UNBOUND:
            raise DeclarationError(
                f"{type(self).__qualname__} was not started with {type(self).__qualname__}"
                ".start(key) nor loaded: it has no key in the log"
            )
        key: JsonValue = self._stream_key
        return key

    @property
    def stream_seq(self) -> int:
        """The seq of the last saved event this instance reflects (0: none)."""
        return self._stream_seq

    def record(self, event: DomainEvent) -> None:
        """Apply ``event`` now and append it to the log on save."""
        self.apply(event)
        super().record(event)

    @classmethod
    @abstractmethod
    def genesis(cls, key: JsonValue) -> Self:
        """The state of ``key`` before any event."""

    @abstractmethod
    def apply(self, event: DomainEvent) -> None:
        """Fold one event (at the current ``EVENT_VERSION``) into the state."""

    @abstractmethod
    def to_snapshot(self) -> Mapping[str, JsonValue]:
        """The state as a JSON object (what `from_snapshot` reads back)."""

    @classmethod
    @abstractmethod
    def from_snapshot(cls, key: JsonValue, state: Mapping[str, Any]) -> Self:
        """The state a snapshot holds."""

    def check_hydrated(self) -> str | None:
        """The hydration barrier: ``None`` when the rebuilt state is sound,
        else a description of what is wrong (the load is then refused)."""
        return None

    @classmethod
    def upcast(cls, event: DomainEvent, version: int) -> DomainEvent:
        """Bring ``event``, stored at ``version`` (older than
        ``EVENT_VERSION``), to the current version. Override it whenever
        ``EVENT_VERSION`` is raised; the default refuses."""
        raise NotImplementedError(
            f"{cls.__qualname__} has no upcast of {event.type!r} from version {version} "
            f"to {cls.EVENT_VERSION}"
        )


_LOAD = """
WITH snap AS (
    SELECT seq, state FROM service_engine.event_snapshot WHERE noun = $1 AND key = $2
)
SELECT 0 AS part, snap.seq, NULL::text AS event_type, NULL::int AS event_version,
       snap.state AS payload
  FROM snap
UNION ALL
SELECT 1, e.seq, e.event_type, e.event_version, e.payload
  FROM service_engine.event_log e
 WHERE e.noun = $1 AND e.key = $2 AND e.seq > COALESCE((SELECT seq FROM snap), 0)
ORDER BY 1, 2
"""

_APPEND = """
INSERT INTO service_engine.event_log (noun, key, seq, event_type, event_version, payload)
SELECT $1, $2, $3 + e.ord, e.event_type, $4, e.payload::jsonb
  FROM unnest($5::text[], $6::text[]) WITH ORDINALITY AS e(event_type, payload, ord)
"""

_SNAPSHOT = """
INSERT INTO service_engine.event_snapshot (noun, key, seq, state, updated_at)
VALUES ($1, $2, $7, $8::text::jsonb, now())
ON CONFLICT (noun, key) DO UPDATE
   SET seq = EXCLUDED.seq, state = EXCLUDED.state, updated_at = EXCLUDED.updated_at
"""

# The append and the snapshot in one round trip when a boundary is crossed.
_APPEND_AND_SNAPSHOT = f"WITH appended AS ({_APPEND.strip()} RETURNING 1) {_SNAPSHOT.strip()}"

_LOCK = """
SELECT 1 FROM service_engine.event_snapshot WHERE noun = $1 AND key = $2 FOR UPDATE
"""

_DELETE = """
WITH gone AS (DELETE FROM service_engine.event_log WHERE noun = $1 AND key = $2 RETURNING 1),
     snap AS (DELETE FROM service_engine.event_snapshot WHERE noun = $1 AND key = $2 RETURNING 1)
SELECT count(*) FROM gone
"""

_LOG_OF = """
SELECT seq, event_type, event_version, payload FROM service_engine.event_log
 WHERE noun = $1 AND key = $2 ORDER BY seq
"""


class FullEda(Generic[E]):
    """The store of an `EventSourced` aggregate: ``Store = FullEda()``.

    Bound to its aggregate class when the class body assigns it (each
    concrete aggregate class declares its own). ``store_type`` is
    ``service_engine.full_eda/<NOUN>``: every class over one noun shares the
    advisory lock. ``lock_rows=False`` makes `lock` a no-op.
    """

    STYLE: ClassVar[Style] = Style.FULL_EDA

    def __init__(self, *, lock_rows: bool = True) -> None:
        self.lock_rows = lock_rows
        self._aggregate: type[E] | None = None

    def __set_name__(self, owner: type[Any], name: str) -> None:
        if not (isinstance(owner, type) and issubclass(owner, EventSourced)):
            raise DeclarationError(f"FullEda is the store of an EventSourced class, not {owner!r}")
        noun = getattr(owner, "NOUN", None)
        if not isinstance(noun, str) or not noun:
            raise DeclarationError(f"{owner.__qualname__}.NOUN must be a non-empty str")
        for attr in ("EVENT_VERSION", "SNAPSHOT_EVERY"):
            value = getattr(owner, attr)
            if type(value) is not int or value < 1:
                raise DeclarationError(
                    f"{owner.__qualname__}.{attr} must be an int >= 1, got {value!r}"
                )
        if self._aggregate is not None:
            raise DeclarationError(f"this FullEda already serves {self._aggregate.__qualname__}")
        self._aggregate = cast(type[E], owner)

    @property
    def aggregate(self) -> type[E]:
        if self._aggregate is None:
            raise DeclarationError("FullEda() must be assigned in an EventSourced class body")
        return self._aggregate

    @property
    def noun(self) -> str:
        return self.aggregate.NOUN

    @property
    def store_type(self) -> str:
        return f"service_engine.full_eda/{self.noun}"

    def key_of(self, aggregate: E) -> JsonValue:
        return aggregate.stream_key

    async def load(self, conn: Conn, key: JsonValue) -> E | None:
        rows = await conn.fetch(_LOAD, self.noun, canonical_json(key))
        if not rows:
            return None
        return _rebuild(self.aggregate, key, [as_row(r) for r in rows])

    async def read_many(self, conn: Conn, keys: Sequence[JsonValue]) -> list[E]:
        """A load per key, so the render side replays exactly what the write
        side does."""
        found: list[E] = []
        for key in keys:
            aggregate = await self.load(conn, key)
            if aggregate is not None:
                found.append(aggregate)
        return found

    async def lock(self, conn: Conn, key: JsonValue) -> None:
        if self.lock_rows:
            await conn.execute(_LOCK, self.noun, canonical_json(key))

    async def create(self, conn: Conn, aggregate: E) -> None:
        if aggregate.stream_seq != 0:
            raise ConfigError(
                f"create of {self.noun} {aggregate.stream_key!r}, which is already in the log"
            )
        if not aggregate.pending_events():
            raise ConfigError(f"create of {self.noun} records no event: nothing would be stored")
        await self._append(conn, aggregate)

    async def save(self, conn: Conn, aggregate: E) -> None:
        if aggregate.pending_events():
            await self._append(conn, aggregate)

    async def delete(self, conn: Conn, aggregate: E) -> None:
        """Remove the aggregate's whole log and snapshot (a hard delete)."""
        key = aggregate.stream_key
        events = await conn.fetchval(_DELETE, self.noun, canonical_json(key))
        if not events:
            raise NotFound(self.store_type, key)

    async def _append(self, conn: Conn, aggregate: E) -> None:
        cls = self.aggregate
        events = aggregate.pending_events()
        start = aggregate.stream_seq
        end = start + len(events)
        params: list[object] = [
            self.noun, canonical_json(aggregate.stream_key), start, cls.EVENT_VERSION,
            [e.type for e in events], [e.data_json for e in events],
        ]
        if start // cls.SNAPSHOT_EVERY < end // cls.SNAPSHOT_EVERY:
            state = _snapshot_json(aggregate)
            await conn.execute(_APPEND_AND_SNAPSHOT, *params, end, state)
        else:
            await conn.execute(_APPEND, *params)
        aggregate.clear_pending_events()
        aggregate._bind(aggregate.stream_key, end)


def _snapshot_json(aggregate: EventSourced) -> str:
    state = aggregate.to_snapshot()
    if not isinstance(state, Mapping):
        raise DeclarationError(
            f"{type(aggregate).__qualname__}.to_snapshot must return a JSON object"
        )
    try:
        return canonical_json(state)
    except (TypeError, ValueError) as exc:
        raise DeclarationError(
            f"{type(aggregate).__qualname__} snapshot is not JSON: {exc}"
        ) from exc


def _current(cls: type[EventSourced], key: JsonValue, row: Row) -> DomainEvent:
    """The stored event ``row`` at the current ``EVENT_VERSION``."""
    version: int = row["event_version"]
    event = DomainEvent(row["event_type"], row["payload"])
    if version == cls.EVENT_VERSION:
        return event
    if version > cls.EVENT_VERSION:
        raise HydrationFailed(
            cls.NOUN, key,
            f"event {row['seq']} is at version {version}, newer than this code's "
            f"{cls.EVENT_VERSION}",
        )
    try:
        upcast = cls.upcast(event, version)
    except NotImplementedError as exc:
        raise HydrationFailed(cls.NOUN, key, str(exc)) from exc
    if not isinstance(upcast, DomainEvent):
        raise DeclarationError(f"{cls.__qualname__}.upcast must return a DomainEvent")
    return upcast


def _rebuild(cls: type[E], key: JsonValue, rows: Iterable[Row]) -> E | None:
    """Replay ``rows`` (an optional snapshot row with ``part`` 0, then
    events with ``part`` 1, in seq order) through both barriers."""
    aggregate: E | None = None
    seq = 0
    try:
        for row in rows:
            if row.get("part", 1) == 0:
                aggregate = cls.from_snapshot(key, row["payload"])
                seq = row["seq"]
                continue
            if aggregate is None:
                aggregate = cls.genesis(key)
            if row["seq"] != seq + 1:
                raise HydrationFailed(
                    cls.NOUN, key, f"the log jumps from seq {seq} to {row['seq']}"
                )
            aggregate.apply(_current(cls, key, row))
            seq = row["seq"]
    except HydrationFailed:
        raise
    except Exception as exc:
        raise HydrationFailed(cls.NOUN, key, f"replay raised {exc!r}") from exc
    if aggregate is None:
        return None
    aggregate.clear_pending_events()
    aggregate._bind(key, seq)
    problem = aggregate.check_hydrated()
    if problem is not None:
        raise HydrationFailed(cls.NOUN, key, problem)
    return aggregate


def _decode_key(text: str) -> JsonValue:
    value: Any = json.loads(text)
    return tuple(value) if isinstance(value, list) else value


async def keys(
    conn: Conn,
    aggregate: type[EventSourced] | str,
    *,
    after: JsonValue | None = None,
    limit: int | None = None,
) -> list[JsonValue]:
    """The keys of a noun's aggregates (for a window populate), ordered by
    their canonical JSON text; page with ``after`` (the last key seen) and
    ``limit``. ``aggregate`` is the `EventSourced` class or its noun."""
    noun = aggregate if isinstance(aggregate, str) else aggregate.NOUN
    try:
        rows = await conn.fetch(
            """SELECT key FROM service_engine.event_log
                WHERE noun = $1 AND seq = 1 AND ($2::text IS NULL OR key > $2)
                ORDER BY key LIMIT $3""",
            noun, None if after is None else canonical_json(after), limit,
        )
    except DRIVER_ERRORS as exc:
        raise translate_db_error(exc, Stage.LOAD) from exc
    return [_decode_key(row["key"]) for row in rows]


async def erase(
    conn: Conn,
    aggregate: type[E],
    redactor: Redactor[P],
    person: P,
) -> list[JsonValue]:
    """Rewrite ``person``'s events of ``aggregate``'s noun in place, then
    re-snapshot each touched aggregate by replaying its whole rewritten log
    from genesis, all in the caller's transaction.

    ``redactor(event, person)`` sees every event (upcast to the current
    version) and returns the rewritten event, or ``None`` to keep it. Each
    touched aggregate is locked with the write pipeline's advisory lock
    before it is rewritten, so no command can snapshot a pre-erasure state
    over the erasure. Returns the touched keys. Raises `HydrationFailed`
    (failing the transaction) if a rewritten log no longer hydrates, and a
    `DatabaseError` for a database failure.
    """
    try:
        return await _erase(conn, aggregate, redactor, person)
    except DRIVER_ERRORS as exc:
        raise translate_db_error(exc, Stage.SAVE) from exc


async def _erase(
    conn: Conn, aggregate: type[E], redactor: Redactor[P], person: P
) -> list[JsonValue]:
    cls: type[E] = aggregate
    noun = cls.NOUN
    store_type = cls.Store.store_type
    # Pass 1 finds the touched keys without locking; pass 2 rewrites each
    # one under its lock, from a log no command can extend meanwhile.
    touched: list[str] = []
    async for record in conn.cursor(
        "SELECT key, seq, event_type, event_version, payload FROM service_engine.event_log "
        "WHERE noun = $1 ORDER BY key, seq",
        noun,
    ):
        key_text: str = record["key"]
        if touched and touched[-1] == key_text:
            continue
        event = _current(cls, _decode_key(key_text), as_row(record))
        if _rewrite(redactor, event, person) is not None:
            touched.append(key_text)

    for key_text in sorted(touched):
        key = _decode_key(key_text)
        await conn.execute("SELECT pg_advisory_xact_lock($1)", aggregate_lock_key(store_type, key))
        log = [as_row(r) for r in await conn.fetch(_LOG_OF, noun, key_text)]
        current = [_current(cls, key, row) for row in log]
        seqs: list[int] = []
        types: list[str] = []
        payloads: list[str] = []
        for row, event in zip(log, current, strict=True):
            rewritten = _rewrite(redactor, event, person)
            if rewritten is not None:
                seqs.append(row["seq"])
                types.append(rewritten.type)
                payloads.append(rewritten.data_json)
        await conn.execute(
            """UPDATE service_engine.event_log AS l
                  SET event_type = r.event_type, event_version = $3, payload = r.payload::jsonb
                 FROM unnest($4::bigint[], $5::text[], $6::text[]) AS r(seq, event_type, payload)
                WHERE l.noun = $1 AND l.key = $2 AND l.seq = r.seq""",
            noun, key_text, cls.EVENT_VERSION, seqs, types, payloads,
        )
        await _resnapshot(conn, cls, key, key_text)
    return [_decode_key(k) for k in sorted(touched)]


def _rewrite(redactor: Redactor[P], event: DomainEvent, person: P) -> DomainEvent | None:
    rewritten = redactor(event, person)
    if rewritten is None or rewritten == event:
        return None
    if not isinstance(rewritten, DomainEvent):
        raise DeclarationError(f"a redactor returns a DomainEvent or None, not {rewritten!r}")
    return rewritten


async def _resnapshot(conn: Conn, cls: type[E], key: JsonValue, key_text: str) -> None:
    """Replay the whole log from genesis; rewrite the snapshot at its own seq."""
    log = [as_row(r) for r in await conn.fetch(_LOG_OF, cls.NOUN, key_text)]
    snapshot_seq = await conn.fetchval(
        "SELECT seq FROM service_engine.event_snapshot WHERE noun = $1 AND key = $2",
        cls.NOUN, key_text,
    )
    head = _rebuild(cls, key, log)  # the whole log must still hydrate
    if snapshot_seq is None or head is None:
        return
    at_snapshot = _rebuild(cls, key, [row for row in log if row["seq"] <= snapshot_seq])
    if at_snapshot is None:
        raise HydrationFailed(cls.NOUN, key, f"the snapshot at {snapshot_seq} has no events")
    await conn.execute(
        """UPDATE service_engine.event_snapshot SET state = $3::text::jsonb, updated_at = now()
            WHERE noun = $1 AND key = $2""",
        cls.NOUN, key_text, _snapshot_json(at_snapshot),
    )
