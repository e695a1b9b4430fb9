"""The counter sample: one aggregate in all three persistence styles.

A counter has a value, a frozen flag, the last actor who changed it and an
optional group (an FK, for the table styles). Its gated actions:

* ``increment``: needs the ``writer`` role; refused while frozen;
* ``freeze``: needs ``admin``; refused when already frozen;
* ``unfreeze``: needs ``admin``; refused when not frozen.

`CrudCounter` (a state row), `SoftCounter` (state row + facts) and
`EdaCounter` (the full-EDA kit, ``SNAPSHOT_EVERY = 3``, events at version 2
with a version-1 ``incremented`` shape upcast at read) share the domain and
the gates; the ``*NoLock`` variants keep the store's ``lock`` a no-op. The
handlers are style-agnostic: they take the counter class as an argument.

Also here: `ImpactProbe`, which LISTENs on the impact channel over a
dedicated connection and reassembles committed groups, and `executor_for`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Self

import asyncpg

from service_engine import Database, EngineConfig
from service_engine.gates import Gate, Reason, gated
from service_engine.impacts import Cause, Impact, Reassembler, parse_frame
from service_engine.impacts.model import JsonValue
from service_engine.impacts.transport import CHANNEL
from service_engine.metrics import Metrics
from service_engine.persistence import (
    Aggregate,
    CrudStore,
    DomainEvent,
    EventSourced,
    FullEda,
    RecordsEvents,
    SoftEdaStore,
)
from service_engine.persistence.base import Row
from service_engine.pipeline import Bulk, Mutation, MutationExecutor, OneShot

NOUN = "counter"
MAX_VALUE = 1_000_000

FORBIDDEN = Reason("forbidden")
FROZEN = Reason("counter.frozen")
ALREADY_FROZEN = Reason("counter.already_frozen")
NOT_FROZEN = Reason("counter.not_frozen")


@dataclass(frozen=True)
class Principal:
    id: str
    roles: frozenset[str] = field(default_factory=frozenset)


WRITER = Principal("alice", frozenset({"writer"}))
ADMIN = Principal("root", frozenset({"writer", "admin"}))
NOBODY = Principal("mallory")


class CounterBase:
    """The counter's domain and gates, shared by the three styles."""

    def __init__(
        self,
        key: str,
        value: int = 0,
        frozen: bool = False,
        last_actor: str | None = None,
        group_id: str | None = None,
    ) -> None:
        self.key = key
        self.value = value
        self.frozen = frozen
        self.last_actor = last_actor
        self.group_id = group_id

    def observed(self) -> tuple[str, int, bool, str | None]:
        """What the contract compares across styles."""
        return (self.key, self.value, self.frozen, self.last_actor)

    @gated("increment")
    def can_increment(self, principal: Principal) -> Gate:
        if "writer" not in principal.roles:
            return Gate.deny(FORBIDDEN)
        if self.frozen:
            return Gate.deny(FROZEN)
        return Gate.allow()

    @gated("freeze")
    def can_freeze(self, principal: Principal) -> Gate:
        if "admin" not in principal.roles:
            return Gate.deny(FORBIDDEN)
        if self.frozen:
            return Gate.deny(ALREADY_FROZEN)
        return Gate.allow()

    @gated("unfreeze")
    def can_unfreeze(self, principal: Principal) -> Gate:
        if "admin" not in principal.roles:
            return Gate.deny(FORBIDDEN)
        if not self.frozen:
            return Gate.deny(NOT_FROZEN)
        return Gate.allow()

    # The domain commands each style implements.
    @classmethod
    def new(cls, key: str, actor: str) -> Self:
        raise NotImplementedError

    def increment(self, by: int, actor: str) -> None:
        raise NotImplementedError

    def set_frozen(self, frozen: bool, actor: str) -> None:
        raise NotImplementedError


# -- CRUD ---------------------------------------------------------------------

_COLUMNS = ("id", "value", "frozen", "last_actor", "group_id")


def _row_of(counter: CounterBase) -> dict[str, object]:
    return {
        "id": counter.key, "value": counter.value, "frozen": counter.frozen,
        "last_actor": counter.last_actor, "group_id": counter.group_id,
    }


class CrudCounterStore(CrudStore["CrudCounter", str]):
    TABLE = "sample_counter_crud"
    COLUMNS = _COLUMNS

    def __init__(self, cls: type[CrudCounter], *, lock_rows: bool = True) -> None:
        super().__init__(lock_rows=lock_rows)
        self.cls = cls

    def to_row(self, aggregate: CrudCounter) -> Mapping[str, object]:
        return _row_of(aggregate)

    def from_row(self, row: Row) -> CrudCounter:
        return self.cls(row["id"], row["value"], row["frozen"], row["last_actor"], row["group_id"])


class CrudCounter(CounterBase, Aggregate):
    Store: ClassVar[CrudCounterStore]

    @classmethod
    def new(cls, key: str, actor: str) -> Self:
        return cls(key, last_actor=actor)

    def increment(self, by: int, actor: str) -> None:
        self.value += by
        self.last_actor = actor

    def set_frozen(self, frozen: bool, actor: str) -> None:
        self.frozen = frozen
        self.last_actor = actor


class CrudCounterNoLock(CrudCounter):
    pass


CrudCounter.Store = CrudCounterStore(CrudCounter)
CrudCounterNoLock.Store = CrudCounterStore(CrudCounterNoLock, lock_rows=False)


# -- soft EDA -------------------------------------------------------------------


class SoftCounterStore(SoftEdaStore["SoftCounter", str]):
    TABLE = "sample_counter_soft"
    COLUMNS = _COLUMNS
    FACTS_TABLE = "sample_counter_soft_fact"
    FACT_KEY = "counter_id"

    def __init__(self, cls: type[SoftCounter], *, lock_rows: bool = True) -> None:
        super().__init__(lock_rows=lock_rows)
        self.cls = cls

    def to_row(self, aggregate: SoftCounter) -> Mapping[str, object]:
        return _row_of(aggregate)

    def from_row(self, row: Row) -> SoftCounter:
        return self.cls(row["id"], row["value"], row["frozen"], row["last_actor"], row["group_id"])


class SoftCounter(CounterBase, RecordsEvents, Aggregate):
    Store: ClassVar[SoftCounterStore]

    @classmethod
    def new(cls, key: str, actor: str) -> Self:
        counter = cls(key, last_actor=actor)
        counter.record(DomainEvent("created", {"actor": actor}))
        return counter

    def increment(self, by: int, actor: str) -> None:
        self.value += by
        self.last_actor = actor
        self.record(DomainEvent("incremented", {"by": by, "actor": actor}))

    def set_frozen(self, frozen: bool, actor: str) -> None:
        self.frozen = frozen
        self.last_actor = actor
        self.record(DomainEvent("frozen" if frozen else "unfrozen", {"actor": actor}))


class SoftCounterNoLock(SoftCounter):
    pass


SoftCounter.Store = SoftCounterStore(SoftCounter)
SoftCounterNoLock.Store = SoftCounterStore(SoftCounterNoLock, lock_rows=False)


# -- full EDA -------------------------------------------------------------------


class EdaCounter(CounterBase, EventSourced):
    """Events at version 2; version 1 spelt ``incremented`` as ``{"n": ...}``."""

    NOUN = "sample_counter"
    EVENT_VERSION = 2
    SNAPSHOT_EVERY = 3
    Store: ClassVar[FullEda[EdaCounter]] = FullEda()

    @classmethod
    def genesis(cls, key: JsonValue) -> Self:
        return cls(str(key))

    def apply(self, event: DomainEvent) -> None:
        data = event.data
        actor = data.get("actor")
        self.last_actor = actor if isinstance(actor, str) else None
        match event.type:
            case "created":
                pass
            case "incremented":
                by = data["by"]
                assert isinstance(by, int)
                self.value += by
            case "frozen":
                self.frozen = True
            case "unfrozen":
                self.frozen = False
            case other:
                raise ValueError(f"unknown counter event {other!r}")

    def to_snapshot(self) -> Mapping[str, JsonValue]:
        return {"value": self.value, "frozen": self.frozen, "last_actor": self.last_actor}

    @classmethod
    def from_snapshot(cls, key: JsonValue, state: Mapping[str, Any]) -> Self:
        return cls(str(key), state["value"], state["frozen"], state["last_actor"])

    def check_hydrated(self) -> str | None:
        if not 0 <= self.value <= MAX_VALUE:
            return f"value {self.value} outside 0..{MAX_VALUE}"
        return None

    @classmethod
    def upcast(cls, event: DomainEvent, version: int) -> DomainEvent:
        if version == 1 and event.type == "incremented":
            return DomainEvent("incremented", {"by": event.data["n"], "actor": event.data["actor"]})
        if version == 1:
            return event
        return super().upcast(event, version)

    @classmethod
    def new(cls, key: str, actor: str) -> Self:
        counter = cls.start(key)
        counter.record(DomainEvent("created", {"actor": actor}))
        return counter

    def increment(self, by: int, actor: str) -> None:
        self.record(DomainEvent("incremented", {"by": by, "actor": actor}))

    def set_frozen(self, frozen: bool, actor: str) -> None:
        self.record(DomainEvent("frozen" if frozen else "unfrozen", {"actor": actor}))


class EdaCounterNoLock(EdaCounter):
    Store: ClassVar[FullEda[Any]] = FullEda(lock_rows=False)


def redact_person(event: DomainEvent, person: str) -> DomainEvent | None:
    """The sample's erasure redactor: the person's actor fields become ``erased``."""
    if event.data.get("actor") != person:
        return None
    return DomainEvent(event.type, {**event.data, "actor": "erased"})


Counter = CrudCounter | SoftCounter | EdaCounter
STYLES: tuple[type[Any], ...] = (CrudCounter, SoftCounter, EdaCounter)


# -- invites (a OneShot secret) ---------------------------------------------


class InviteStore(CrudStore["Invite", str]):
    TABLE = "sample_counter_invite"
    KEY = "token_hash"
    COLUMNS = ("token_hash", "counter_id")

    def to_row(self, aggregate: Invite) -> Mapping[str, object]:
        return {"token_hash": aggregate.token_hash, "counter_id": aggregate.counter_id}

    def from_row(self, row: Row) -> Invite:
        return Invite(row["token_hash"], row["counter_id"])


@dataclass
class Invite(Aggregate):
    token_hash: str
    counter_id: str
    Store: ClassVar[InviteStore] = InviteStore()


# -- handlers (style-agnostic) --------------------------------------------------


async def create_counter(cx: Mutation[Principal], style: type[Any], key: str) -> None:
    await cx.create(style.new(key, cx.principal.id))
    cx.impact(NOUN, key)


async def increment(cx: Mutation[Principal], style: type[Any], key: str, by: int = 1) -> None:
    counter = await cx.load(style, key)
    cx.require(counter.can_increment)
    counter.increment(by, cx.principal.id)
    await cx.save(counter)
    cx.impact_caused(NOUN, key, Cause("counter.incremented", {"by": by}))


async def freeze(cx: Mutation[Principal], style: type[Any], key: str) -> None:
    counter = await cx.load(style, key)
    cx.require(counter.can_freeze)
    counter.set_frozen(True, cx.principal.id)
    await cx.save(counter)
    cx.impact(NOUN, key)


async def unfreeze(cx: Mutation[Principal], style: type[Any], key: str) -> None:
    counter = await cx.load(style, key)
    cx.require(counter.can_unfreeze)
    counter.set_frozen(False, cx.principal.id)
    await cx.save(counter)
    cx.impact(NOUN, key)


async def delete_counter(cx: Mutation[Principal], style: type[Any], key: str) -> None:
    counter = await cx.load(style, key)
    await cx.delete(counter)
    cx.impact(NOUN, key)


async def assign_group(cx: Mutation[Principal], style: type[Any], key: str, group: str) -> None:
    counter = await cx.load(style, key)
    counter.group_id = group
    await cx.save(counter)
    cx.impact(NOUN, key)


async def invite(cx: Mutation[Principal], style: type[Any], key: str) -> OneShot[str]:
    """Mint an invite to ``key``: the store keeps a hash, the caller the secret."""
    await cx.load(style, key)
    token = secrets.token_urlsafe(24)
    await cx.create(Invite(hashlib.sha256(token.encode()).hexdigest(), key))
    cx.impact(NOUN, key)
    return OneShot(token)


async def import_counters(cx: Bulk[Principal], style: type[Any], keys: list[str]) -> None:
    """A bulk import: one projector reset instead of one impact per key."""
    for key in keys:
        await cx.create(style.new(key, cx.principal.id))
        cx.impact(NOUN, key)
    cx.impact_all(NOUN)


ACTIONS = {"increment": increment, "freeze": freeze, "unfreeze": unfreeze}
"""Every gated action of the sample, by action name, with its handler."""


# -- test support -----------------------------------------------------------------


def executor_for(db: Database, **config: Any) -> MutationExecutor:
    """An executor over ``db`` with its own metrics (config overrides applied)."""
    settings = {"service": "sample", "lock_timeout": timedelta(seconds=2), **config}
    engine_config = EngineConfig(**settings)
    return MutationExecutor(db, engine_config, Metrics("sample", "pod-1"))


class ImpactProbe:
    """Committed impact groups, as a listening pod sees them over NOTIFY."""

    def __init__(self) -> None:
        self.groups: asyncio.Queue[tuple[str, list[Impact]]] = asyncio.Queue()
        self.payloads: list[str] = []
        self._reassembler = Reassembler()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        text = str(payload)
        self.payloads.append(text)
        frame = parse_frame(text)
        group = self._reassembler.feed(frame)
        if group is not None:
            self.groups.put_nowait((frame.group_id, group))

    async def next(self, timeout: float = 5.0) -> list[Impact]:
        """The next committed group's impacts (fails past ``timeout``)."""
        _, impacts = await asyncio.wait_for(self.groups.get(), timeout)
        return impacts

    async def assert_quiet(self, within: float = 0.3) -> None:
        """No group arrives within the bound."""
        try:
            item = await asyncio.wait_for(self.groups.get(), within)
        except TimeoutError:
            return
        raise AssertionError(f"expected no impacts, got {item!r}")


@contextlib.asynccontextmanager
async def listen_impacts(db: Database) -> AsyncIterator[ImpactProbe]:
    probe = ImpactProbe()
    conn: asyncpg.Connection[Any] = await db.connect_dedicated()
    try:
        await conn.add_listener(CHANNEL, probe._on_notify)
        yield probe
    finally:
        await conn.close()
