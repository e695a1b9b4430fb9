"""The persistence kit's pure parts: events, store binding, SQL identifiers, replay."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar, Self

import pytest

from service_engine.impacts import JsonValue
from service_engine.persistence import (
    Aggregate,
    CrudStore,
    DomainEvent,
    EventSourced,
    FullEda,
    HydrationFailed,
    RecordsEvents,
    Style,
    store_of,
)
from service_engine.persistence.base import Row
from service_engine.persistence.crud import quote_ident
from service_engine.persistence.full_eda import _rebuild


class Tally(EventSourced):
    NOUN = "tally"
    EVENT_VERSION = 2
    SNAPSHOT_EVERY = 2
    Store: ClassVar[FullEda[Tally]] = FullEda()

    def __init__(self, key: str, total: int = 0) -> None:
        self.key = key
        self.total = total

    @classmethod
    def genesis(cls, key: JsonValue) -> Self:
        return cls(str(key))

    def apply(self, event: DomainEvent) -> None:
        amount = event.data["amount"]
        assert isinstance(amount, int)
        self.total += amount

    def to_snapshot(self) -> Mapping[str, JsonValue]:
        return {"total": self.total}

    @classmethod
    def from_snapshot(cls, key: JsonValue, state: Mapping[str, Any]) -> Self:
        return cls(str(key), state["total"])

    def check_hydrated(self) -> str | None:
        return None if self.total < 100 else "total too high"

    @classmethod
    def upcast(cls, event: DomainEvent, version: int) -> DomainEvent:
        if version == 1:
            return DomainEvent(event.type, {"amount": event.data["n"]})
        return super().upcast(event, version)


def event_row(seq: int, amount: int, version: int = 2) -> Row:
    payload = {"amount": amount} if version == 2 else {"n": amount}
    return {"part": 1, "seq": seq, "event_type": "added", "event_version": version,
            "payload": payload}


def test_domain_events_are_canonical_json() -> None:
    """A domain event's data is canonical JSON, frozen (lists as tuples) and compared by value; an
    empty type, data JSON cannot carry and non-object data are refused."""
    a = DomainEvent("moved", {"b": [1, 2], "a": "x"})
    assert a.data_json == '{"a":"x","b":[1,2]}'
    assert a.data == {"a": "x", "b": (1, 2)}
    assert a == DomainEvent("moved", {"a": "x", "b": (1, 2)})
    assert DomainEvent("empty").data_json == "{}"
    with pytest.raises(ValueError):
        DomainEvent("", {})
    with pytest.raises(TypeError):
        DomainEvent("bad", {"x": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        DomainEvent("bad", {"x": float("nan")})
    with pytest.raises(TypeError):
        DomainEvent("bad", [1, 2])  # type: ignore[arg-type]


def test_records_events_until_cleared() -> None:
    """An aggregate records domain events in order until cleared, and refuses anything but a
    DomainEvent."""
    agg = RecordsEvents()
    agg.record(DomainEvent("one"))
    agg.record(DomainEvent("two"))
    assert [e.type for e in agg.pending_events()] == ["one", "two"]
    agg.clear_pending_events()
    assert agg.pending_events() == ()
    with pytest.raises(TypeError):
        agg.record("three")  # type: ignore[arg-type]


def test_store_of_resolves_the_named_store() -> None:
    """store_of finds an aggregate's declared Store (its style and store type); an aggregate naming
    none is refused."""
    assert store_of(Tally) is Tally.Store
    assert store_of(Tally).STYLE is Style.FULL_EDA
    assert Tally.Store.store_type == "service_engine.full_eda/tally"

    class Orphan(Aggregate):
        pass

    with pytest.raises(TypeError, match="names no Store"):
        store_of(Orphan)


def define_refused(name: str, bases: tuple[type, ...], body: dict[str, Any]) -> str:
    """Define a class whose FullEda binding must be refused; the reason.

    Python 3.11 wraps an error raised by ``__set_name__`` in RuntimeError.
    """
    with pytest.raises((TypeError, RuntimeError)) as refused:
        type(name, bases, body)
    error = refused.value
    cause = error.__cause__ if isinstance(error, RuntimeError) else error
    assert isinstance(cause, TypeError)
    return str(cause)


def test_full_eda_binds_to_its_class_and_checks_it() -> None:
    """A FullEda store binds to its class and refuses an empty noun, a zero snapshot cadence, a
    class that is not EventSourced, and serving two classes."""
    assert "NOUN" in define_refused("NoNoun", (Tally,), {"NOUN": "", "Store": FullEda()})
    assert "SNAPSHOT_EVERY" in define_refused(
        "NoCadence", (Tally,), {"SNAPSHOT_EVERY": 0, "Store": FullEda()}
    )
    assert "EventSourced" in define_refused("NotEs", (), {"Store": FullEda()})
    shared: FullEda[Any] = FullEda()
    type("First", (Tally,), {"Store": shared})
    assert "already serves" in define_refused("Second", (Tally,), {"Store": shared})
    with pytest.raises(TypeError, match="class body"):
        _ = FullEda().noun


def test_start_binds_the_stream() -> None:
    """start(key) binds a new aggregate to its stream at seq 0; an aggregate built otherwise has no
    stream key."""
    tally = Tally.start("t1")
    assert (tally.stream_key, tally.stream_seq) == ("t1", 0)
    tally.record(DomainEvent("added", {"amount": 3}))
    assert tally.total == 3 and len(tally.pending_events()) == 1
    with pytest.raises(TypeError, match=r"start\(key\)"):
        _ = Tally("loose").stream_key


def test_replay_from_genesis_snapshot_and_upcast() -> None:
    """Hydration replays from genesis or from the latest snapshot, upcasting old event versions, and
    leaves nothing pending; no rows is no aggregate."""
    from_genesis = _rebuild(Tally, "t", [event_row(1, 2), event_row(2, 3, version=1)])
    assert from_genesis is not None
    assert (from_genesis.total, from_genesis.stream_seq) == (5, 2)
    snapshot: Row = {"part": 0, "seq": 4, "event_type": None, "event_version": None,
                     "payload": {"total": 10}}
    from_snapshot = _rebuild(Tally, "t", [snapshot, event_row(5, 1)])
    assert from_snapshot is not None
    assert (from_snapshot.total, from_snapshot.stream_seq) == (11, 5)
    assert from_snapshot.pending_events() == ()
    assert _rebuild(Tally, "t", []) is None


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ([event_row(1, 1), event_row(3, 1)], "jumps from seq 1 to 3"),
        ([event_row(2, 1)], "jumps from seq 0 to 2"),
        ([event_row(1, 1, version=3)], "newer than this code"),
        ([event_row(1, 150)], "total too high"),
        ([{**event_row(1, 1), "payload": {}}], "replay raised"),
    ],
    ids=["gap", "missing_start", "future_version", "check_hydrated", "apply_raises"],
)
def test_replay_barriers_refuse(rows: list[Row], problem: str) -> None:
    """Hydration refuses a sequence gap, a missing start, an event newer than the code, a failed
    hydrated check and a raising apply, naming the noun and key."""
    with pytest.raises(HydrationFailed, match=problem) as failed:
        _rebuild(Tally, "t", rows)
    assert failed.value.noun == "tally" and failed.value.key == "t"


def test_an_old_version_without_an_upcast_refuses() -> None:
    """An old event version with no upcast refuses hydration, naming the event and version."""
    class Plain(EventSourced):
        NOUN = "plain"
        EVENT_VERSION = 2
        Store: ClassVar[FullEda[Plain]] = FullEda()

        @classmethod
        def genesis(cls, key: JsonValue) -> Self:
            return cls()

        def apply(self, event: DomainEvent) -> None:
            pass

        def to_snapshot(self) -> Mapping[str, JsonValue]:
            return {}

        @classmethod
        def from_snapshot(cls, key: JsonValue, state: Mapping[str, Any]) -> Self:
            return cls()

    with pytest.raises(HydrationFailed, match="no upcast of 'added' from version 1"):
        _rebuild(Plain, "p", [event_row(1, 1, version=1)])


def test_sql_identifiers_are_plain() -> None:
    """SQL identifiers are quoted only when plain (optionally schema-qualified); anything else is
    refused."""
    assert quote_ident("board") == '"board"'
    assert quote_ident("app.board_card") == '"app"."board_card"'
    for bad in ("", "a b", 'x"; DROP TABLE y; --', "a.b.c", "1x", "a-b"):
        with pytest.raises(ValueError):
            quote_ident(bad)


def test_crud_store_checks_its_declaration() -> None:
    """A CrudStore whose columns lack its key, or whose table is not a plain identifier, is refused
    at construction."""
    class Thing(Aggregate):
        Store: ClassVar[Any] = None

    class NoKey(CrudStore[Thing, str]):
        TABLE = "thing"
        COLUMNS = ("name",)

        def to_row(self, aggregate: Thing) -> Mapping[str, object]:
            return {}

        def from_row(self, row: Row) -> Thing:
            return Thing()

    with pytest.raises(ValueError, match="KEY 'id'"):
        NoKey()

    class BadTable(NoKey):
        TABLE = "thing; drop"
        COLUMNS = ("id",)

    with pytest.raises(ValueError, match="identifier"):
        BadTable()


def test_a_crud_save_inlines_its_row_as_one_json_literal() -> None:
    """`CrudStore.save_inlined`: one UPDATE without parameters whose row is
    one dollar-quoted JSON literal (quotes inside the values stay inside
    it); None for a value without an exact JSON text and for a store with
    its own `save`; `save_later` keeps both forms of the values as they
    were at the save."""
    class Note:
        def __init__(self, id: str, body: object) -> None:
            self.id, self.body = id, body

    class NoteStore(CrudStore[Note, str]):
        TABLE = "app.note"
        COLUMNS = ("id", "body")

        def to_row(self, note: Note) -> Mapping[str, object]:
            return {"id": note.id, "body": note.body}

        def from_row(self, row: Row) -> Note:
            return Note(row["id"], row["body"])

    class OwnSave(NoteStore):
        async def save(self, conn: Any, aggregate: Note) -> None:
            raise NotImplementedError

    sql = NoteStore().save_inlined(Note("n1", "it's $m0$ \"quoted\""))
    assert sql is not None and "$1" not in sql
    assert sql.startswith('UPDATE "app"."note" AS __t SET "body" = __r."body" FROM '
                          'json_populate_record(NULL::"app"."note", $m1$')
    assert '"body":"it\'s $m0$ \\"quoted\\""' in sql and sql.endswith(
        'AS __r WHERE __t."id" = __r."id"')
    assert NoteStore().save_inlined(Note("n1", datetime(2026, 1, 1))) is None
    assert NoteStore().save_inlined(Note("n1", float("inf"))) is None
    assert NoteStore().save_inlined(Note("n1", object())) is None
    assert OwnSave().save_inlined(Note("n1", "x")) is None
    note = Note("n1", "x")
    later = NoteStore().save_later(note)
    note.body = "changed after the save"  # the save keeps the values it was given
    assert later is not None and (later.table, later.values) == ("note", ("n1", "x"))
    assert later.statement == 'UPDATE "app"."note" SET "body" = $2 WHERE "id" = $1'
    assert '"body":"x"' in later.inlined
    assert NoteStore().save_later(Note("n1", datetime(2026, 1, 1))) is None
