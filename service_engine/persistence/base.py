"""The `Persistence` protocol every store implements, and the `Aggregate` naming it.

An aggregate class names its store in the class attribute ``Store``; the
write pipeline resolves ``cx.load(Board, key)``, ``cx.save(board)`` and
``cx.create(board)`` through it, with no registry, and never learns the
style behind it (CRUD, soft EDA or full EDA).

A store's reads are plain and non-locking: `Persistence.load` for one key,
`Persistence.read_many` for a batch (the render side's read). The pipeline
serialises concurrent commands on one aggregate itself, with a transaction
advisory lock taken before `Persistence.lock` and the load; ``lock`` is an
optimisation (the reference stores take ``SELECT ... FOR UPDATE`` to pin the
row image) and may be a no-op.

A store writes the state row (or snapshot) and its events (or facts) in the
one transaction the pipeline opened, so a constraint failure rolls both back
together. The command's events reach the store through
`Aggregate.pending_events` (empty for CRUD).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeAlias, TypeVar, cast

from ..db.types import Conn
from ..failures import ConfigError, DeclarationError, EngineError
from ..impacts.model import JsonValue, canonical_json

__all__ = [
    "Aggregate",
    "DomainEvent",
    "HoldsBlobs",
    "HydrationFailed",
    "NotFound",
    "Persistence",
    "RecordsEvents",
    "Row",
    "Style",
    "load_pinned",
    "qualified_name",
    "store_of",
]

A = TypeVar("A")
K = TypeVar("K")

Row: TypeAlias = Mapping[str, Any]
"""A fetched row as stores read it: columns by name (an asyncpg ``Record``)."""


def as_row(record: object) -> Row:
    """View a driver record as a `Row` (records index by column name)."""
    return cast(Row, record)


class Style(enum.Enum):
    """How a store persists its aggregate."""

    CRUD = "crud"
    """A state row."""
    SOFT_EDA = "soft_eda"
    """A state row plus facts written in the same transaction."""
    FULL_EDA = "full_eda"
    """An event log (with a lagging snapshot) is the state."""


class NotFound(EngineError):
    """``cx.load`` found no aggregate under the key.

    The pipeline answers it as the `MutationError` code ``not_found``.
    """

    code = "not_found"

    def __init__(self, store_type: str, key: object) -> None:
        super().__init__(f"no aggregate of {store_type} under key {key!r}")
        self.store_type = store_type
        self.key = key


class HydrationFailed(EngineError):
    """A stored aggregate failed to rebuild: a gap or a too-new event in its
    log, or its own ``check_hydrated`` refused the rebuilt state.

    The load is refused rather than a corrupt aggregate acted on; the
    pipeline answers ``hydration_failed`` and logs the detail at error.
    """

    code = "hydration_failed"

    def __init__(self, noun: str, key: object, problem: str) -> None:
        super().__init__(f"aggregate {noun} {key!r} failed hydration: {problem}")
        self.noun = noun
        self.key = key
        self.problem = problem


def _freeze(value: Any) -> JsonValue:
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    if isinstance(value, dict):
        return {name: _freeze(item) for name, item in value.items()}
    return value  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, init=False)
class DomainEvent:
    """One event (full EDA) or fact (soft EDA) a command produced.

    ``type`` names what happened (``"incremented"``); ``data`` is a JSON
    object. The data is encoded once at construction (canonical JSON), so a
    value JSON cannot carry, a `OneShot` secret included, is refused here
    with `TypeError`, before it could reach a log. Equality uses the
    canonical text; lists in ``data`` come back as tuples.
    """

    type: str
    data: Mapping[str, JsonValue] = field(compare=False)
    data_json: str = field(repr=False)

    def __init__(self, type: str, data: Mapping[str, JsonValue] | None = None) -> None:
        if not isinstance(type, str) or not type:
            raise ConfigError(f"an event type is a non-empty str, got {type!r}")
        payload = {} if data is None else data
        if not isinstance(payload, Mapping):
            raise DeclarationError(f"event data is a JSON object, got {payload.__class__.__name__}")
        try:
            text = canonical_json(payload)
        except (TypeError, ValueError) as exc:
            raise DeclarationError(f"event data of {type!r} must be JSON: {exc}") from exc
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "data", _freeze(json.loads(text)))
        object.__setattr__(self, "data_json", text)


class Persistence(Protocol[A, K]):
    """A store: how one aggregate type is read and written.

    ``STYLE`` names the style; ``store_type`` is the stable name the write
    pipeline's advisory lock is keyed on (with the JSON-encoded key), so it
    must be the same on every pod and distinct per table or noun. Keys are
    JSON values (a ``UUID`` is locked as its string).

    Every method runs on the connection it is given, inside the caller's
    transaction; none commits. Raise driver errors as they come: the
    pipeline translates them.
    """

    STYLE: ClassVar[Style]

    @property
    def store_type(self) -> str: ...

    def key_of(self, aggregate: A) -> K:
        """The key of ``aggregate``."""
        ...

    async def load(self, conn: Conn, key: K) -> A | None:
        """The aggregate under ``key``, or ``None``. A plain read: no lock."""
        ...

    async def read_many(self, conn: Conn, keys: Sequence[K]) -> list[A]:
        """The aggregates under ``keys`` that exist, in the order of ``keys``.

        Non-locking. The default loads key by key; a store over a table
        overrides it with one batched query (``WHERE id = ANY($1)``).
        """
        found: list[A] = []
        for key in keys:
            aggregate = await self.load(conn, key)
            if aggregate is not None:
                found.append(aggregate)
        return found

    async def lock(self, conn: Conn, key: K) -> None:
        """Optionally lock ``key``'s row before the load (default: nothing).

        The pipeline already holds the aggregate's advisory lock when it
        calls this; a ``SELECT ... FOR UPDATE`` here only pins the row image.
        """
        return None

    async def create(self, conn: Conn, aggregate: A) -> None:
        """Insert a new aggregate (and its pending events).

        An existing key must fail with the database's unique violation.
        """
        ...

    async def save(self, conn: Conn, aggregate: A) -> None:
        """Write a loaded aggregate's new state (and its pending events)."""
        ...

    async def delete(self, conn: Conn, aggregate: A) -> None:
        """Remove the aggregate."""
        ...


class Aggregate(Protocol):
    """An aggregate: names its ``Store``; hands its command's events to it.

    ``Store`` is an instance of the aggregate's `Persistence`. Subclass
    `Aggregate` explicitly to inherit the default `pending_events` (none,
    as for CRUD), or use `RecordsEvents`.
    """

    # Typed Any: a protocol's class attribute is matched invariantly, so a
    # precisely typed store (``FullEda[Ledger]``, ``BoardStore``) would not
    # satisfy ``Persistence[Any, Any]``. `store_of` checks it at runtime.
    # None until assigned: an aggregate may name its store after its class
    # body (``Note.Store = CrudStore.of(Note, "note")``).
    Store: ClassVar[Any] = None

    def pending_events(self) -> Sequence[DomainEvent]:
        """The events the current command produced, not yet saved."""
        return ()


class HoldsBlobs(Protocol):
    """An aggregate that holds blob references declares ``blob_refs``.

    Optional: an aggregate without the method holds none (the default). The
    pipeline diffs the references between load and save: one dropped or
    repointed, or held by a deleted aggregate, is released in the same
    transaction; ``Engine.download`` presigns only a reference the loaded
    aggregate still lists. (Not a member of `Aggregate`: a protocol member
    would be required of every aggregate.)
    """

    def blob_refs(self) -> Sequence[str]:
        """The blob references this aggregate holds now."""
        ...


class RecordsEvents:
    """Mixin: an aggregate that records events (soft-EDA facts, full-EDA events).

    `record` appends to the pending events the store writes on save; the
    store calls `clear_pending_events` once they are written.
    """

    _pending: tuple[DomainEvent, ...] = ()

    def record(self, event: DomainEvent) -> None:
        """Add ``event`` to what the next save writes."""
        if not isinstance(event, DomainEvent):
            raise DeclarationError(f"record takes a DomainEvent, got {event!r}")
        self._pending = (*self._pending, event)

    def pending_events(self) -> Sequence[DomainEvent]:
        return self._pending

    def clear_pending_events(self) -> None:
        """Called by the store after the pending events were written."""
        self._pending = ()


def store_of(aggregate_type: type) -> Persistence[Any, Any]:
    """The `Persistence` an aggregate class names in ``Store``.

    Raises `TypeError` when the class names none.
    """
    store = getattr(aggregate_type, "Store", None)
    if store is None or not callable(getattr(store, "load", None)):
        raise DeclarationError(
            f"{aggregate_type.__qualname__} names no Store: set Store = <its Persistence> "
            "in the class body"
        )
    return cast(Persistence[Any, Any], store)


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class: the default ``store_type``."""
    return f"{cls.__module__}.{cls.__qualname__}"


async def load_pinned(store: Persistence[A, K], conn: Conn, key: K) -> A | None:
    """The pipeline's load of ``key`` under its advisory lock: the store's
    own ``load_locked(conn, key)`` when it has one (`CrudStore`: one
    ``SELECT ... FOR UPDATE``), else `lock` then `load`. Not a protocol
    member, so every store that implements the protocol structurally
    (`FullEda`, a slice's own) keeps conforming."""
    locked = getattr(store, "load_locked", None)
    if locked is not None:
        return cast("A | None", await locked(conn, key))
    await store.lock(conn, key)
    return await store.load(conn, key)
