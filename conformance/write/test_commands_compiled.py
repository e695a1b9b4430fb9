"""A declared command's compiled function against its interpreter (real Postgres).

For random declarations drawn from a small grammar (creates, mutates,
reads, requirements, permits, revision-checked transitions, sets, causes,
recorded facts of a soft-EDA store, emitted events, unique titles and
labels, create/update/delete row policies, deletes under a restrict or a
bounded cascade of child rows, idempotency keys), random stored rows,
principals (facts missing and mistyped included) and inputs, the compiled
function (`compile_command`, `run_compiled`) and the interpreter
(`runner.interpret`, the oracle no run path calls) run the same calls on
two partitions holding the same rows: each call answers the same outcome and
stages the same events and impacts; both keep equal rows, facts, occupancy and idempotency records.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from service_engine.commands import (
    INVALID_INPUT,
    TRANSACTION_TIME,
    UUID_V7,
    Add,
    And,
    Cascade,
    CascadeEdge,
    Catalog,
    Caused,
    CheckedCommand,
    Command,
    CommandConfig,
    CommandDeclarationError,
    CommandOutcome,
    Const,
    Contains,
    Create,
    Delete,
    Emit,
    Entity,
    Eq,
    Fact,
    Field,
    Ge,
    IdempotencyKey,
    IndexRef,
    Input,
    Lt,
    Mutate,
    Ne,
    NoInbound,
    Not,
    Or,
    Outcome,
    Permit,
    Read,
    Record,
    Relationship,
    Require,
    Restrict,
    Return,
    ReverseIndex,
    Row,
    RowPolicy,
    Service,
    Set,
    Sub,
    Transition,
    Unique,
    Unless,
    Var,
    Workflow,
    WorkflowTransition,
)
from service_engine.commands.compile import PRELUDE, CompiledCommand, compile_command, run_compiled
from service_engine.commands.plan import InvalidInput
from service_engine.commands.runner import interpret
from service_engine.db import connect_pool
from service_engine.embedded import ProvisionedDatabase
from service_engine.gates import Reason
from service_engine.impacts.model import canonical_json
from service_engine.persistence import Aggregate, RecordsEvents, SoftEdaStore
from service_engine.pipeline import MutationError, MutationExecutor

from ..support.sample_commands import OrgStore, executor_for

TABLE = Path(__file__).with_suffix(".sql").read_text()
"""The random comparison's tables (``test_commands_compiled.sql``)."""
IDS, PIDS, TITLES = ("i0", "i1", "i2"), ("i0", "p1", "p2"), ("t0", "t1", "t2", "t3")
"""Ids of items and parts (one id names an item and a part: two tables, two rows)."""
RETENTION = timedelta(days=1)


@dataclass
class Item(Aggregate):
    org: str
    id: str
    title: str
    n: int
    flag: bool = False
    state: Literal["a", "b", "c"] = "a"
    version: int = 1

    Store: ClassVar[ItemStore]


class ItemStore(OrgStore):
    TABLE = "cmp_item"
    COLUMNS = ("org", "id", "title", "n", "flag", "state", "version")

    def from_row(self, row: Any) -> Item:
        return Item(**dict(row))


Item.Store = ItemStore()


@dataclass
class Part(Aggregate):
    """An item's child: its delete is restricted by its parts or takes
    them (a bounded cascade); a label is unique per org."""

    org: str
    id: str
    item_id: str
    label: str
    pinned: bool = False
    version: int = 0  # a create still starts it at revision 1

    Store: ClassVar[PartStore]


class PartStore(OrgStore):
    TABLE = "cmp_part"
    COLUMNS = ("org", "id", "item_id", "label", "pinned", "version")

    def from_row(self, row: Any) -> Part:
        return Part(**dict(row))


Part.Store = PartStore()


@dataclass
class Note(RecordsEvents):
    """A soft-EDA aggregate (its facts appended by its store): one key, so
    each side's ids carry its partition's name."""

    id: str
    org: str
    text: str
    hits: int
    version: int = 1

    Store: ClassVar[NoteStore]


class NoteStore(SoftEdaStore[Note, str]):
    TABLE = "cmp_note"
    COLUMNS = ("id", "org", "text", "hits", "version")
    FACTS_TABLE = "cmp_note_fact"
    FACT_KEY = "note_id"

    def to_row(self, note: Note) -> Mapping[str, object]:
        return {"id": note.id, "org": note.org, "text": note.text, "hits": note.hits,
                "version": note.version}

    def from_row(self, row: Mapping[str, Any]) -> Note:
        return Note(row["id"], row["org"], row["text"], row["hits"], row["version"])


Note.Store = NoteStore()


class NoteTouched(BaseModel):
    """The integration event a note's command emits."""

    AGGREGATE: ClassVar[str] = "note"
    FACT: ClassVar[str] = "touched"
    VERSION: ClassVar[int] = 1

    note_id: str
    hits: int
    version: int

    def sequence(self) -> None:
        return None
FACTS = {"org": str | None, "admin": bool, "level": int | None, "home": str}
LIFE = Workflow("Life", "Item", "state", ("a", "b", "c"),
                (WorkflowTransition("Go", ("a",), "b"), WorkflowTransition("End", ("a", "b"), "c")))


@dataclass(frozen=True)
class Principal:
    id: str
    org: Any = None
    admin: Any = False
    level: Any = None
    home: Any = None


class Grammar:
    """Random expressions and declarations (each may fail registration: skipped)."""

    def __init__(self, rnd: random.Random) -> None:
        self.r = rnd
        self.cascade = False
        """Whether the catalog drawn last cascades an item's delete to its parts."""

    def ints(self, fields: list[Any], depth: int = 0, facts: bool = True) -> Any:
        leaves = [Const(self.r.randint(-2, 3)), *fields]
        if facts:
            leaves.append(Fact("level"))
        if depth < 2 and self.r.random() < 0.3:
            op = self.r.choice([Add, Sub])
            return op(self.ints(fields, depth + 1, facts), self.ints(fields, depth + 1, facts))
        return self.r.choice(leaves)

    def bools(self, ints: list[Any], flags: list[Any], titles: list[Any], depth: int = 0) -> Any:
        r = self.r
        pick = r.randrange(9 if depth < 2 else 5)
        if pick == 0:
            return Const(r.random() < 0.7)
        if pick == 1:
            return Fact("admin")
        if pick == 2 and flags:
            return r.choice(flags)
        if pick == 3 and titles:
            return r.choice([Eq, Ne])(r.choice(titles), Const(r.choice(TITLES)))
        if pick == 4 and titles:
            return Contains(Const(tuple(r.sample(TITLES, 2))), r.choice(titles))
        if pick in (0, 1, 2, 3, 4):
            return Const(True)
        if pick == 5:
            return Not(self.bools(ints, flags, titles, depth + 1))
        if pick == 6:
            return r.choice([And, Or])(self.bools(ints, flags, titles, depth + 1),
                                       self.bools(ints, flags, titles, depth + 1))
        return r.choice([Eq, Lt, Ge])(self.ints(ints, depth + 1), self.ints(ints, depth + 1))

    def policy(self, code: str = "item.denied") -> RowPolicy | None:
        if self.r.random() < 0.4:
            return None
        pred = self.bools([Row("n"), Row("version")], [Row("flag")], [Row("title")])
        if self.r.random() < 0.5:
            pred = And(Eq(Row("org"), Fact("org")), pred)
        return RowPolicy(pred, Reason(code, "denied"))

    def part_policy(self) -> RowPolicy | None:
        if self.r.random() < 0.4:
            return None
        pred = self.bools([Row("version")], [Row("pinned")], [Row("label")])
        if self.r.random() < 0.5:
            pred = And(Eq(Row("org"), Fact("org")), pred)
        return RowPolicy(pred, Reason("part.denied", "denied"))

    def catalog(self) -> tuple[Catalog, Entity]:
        self.cascade = self.r.random() < 0.6
        deletes: Any = (
            Cascade((CascadeEdge("Part", "item", "by_item", self.r.randint(1, 2)),))
            if self.cascade else Restrict((IndexRef("Part", "by_item"),))
        )
        item = Entity(
            "Item", Item, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
            revision="version", unique=(Unique("by_title", ("org", "title")),),
            delete_policy=deletes, create_policy=self.policy(), update_policy=self.policy(),
            delete_row_policy=self.policy("item.delete_denied") if self.r.random() < 0.5
            else None,
            nouns=("cmp_item",),
        )
        part = Entity(
            "Part", Part, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
            revision="version", unique=(Unique("by_label", ("org", "label")),),
            relationships=(Relationship("item", "Item", ("org", "item_id")),),
            indexes=(ReverseIndex("by_item", ("org", "item_id"), table="cmp_part"),),
            delete_policy=NoInbound(), delete_row_policy=self.part_policy(),
            nouns=("cmp_part",) if self.r.random() < 0.7 else (),
        )
        note = Entity("Note", Note, key=("id",), revision="version", nouns=("cmp_note",))
        return Catalog([item, part, note], [LIFE], FACTS), item

    def permit(self, fields: list[Any], flags: list[Any], titles: list[Any]) -> Permit:
        """A permit of one to three rules, each of one or two conditions."""
        rules = [
            Unless(Reason(f"item.rule{n}", "no"),
                   *(self.bools(fields, flags, titles) for _ in range(self.r.randint(1, 2))))
            for n in range(self.r.randint(1, 3))
        ]
        return Permit(self.r.choice(["edit", "touch"]), *rules)

    def note(self, name: str) -> Command:
        """A create or a mutate of a note under a permit, recording facts
        and emitting an event."""
        r = self.r
        fields = [Field("note", "hits"), Field("note", "version"), Var("n")]
        # The caller's own note (a key read from a fact the principal may
        # lack or hold mistyped: the binding's else outcome) or a given one.
        key = Fact("home") if r.random() < 0.3 else Var("nid")
        sets = True
        if r.random() < 0.4:
            clauses: list[Any] = [Create("Note", (key,), as_="note",
                                         else_=Outcome("NoteExists"))]
            if r.random() < 0.6:
                clauses.append(self.permit([Var("n")], [Var("flag")], [Var("title")]))
            clauses += [Set("note", "org", Var("org")), Set("note", "text", Var("title")),
                        Set("note", "hits", Var("n"))]
        else:
            clauses = [Mutate("Note", (key,), as_="note", else_=Outcome("NoteMissing"))]
            if r.random() < 0.7:
                clauses.append(self.permit(fields, [Var("flag")], [Field("note", "text")]))
            # A mutate may only record facts (its row saved for them alone).
            sets = r.random() < 0.6
            if sets:
                clauses.append(Set("note", "hits", Add(Field("note", "hits"), Var("n"))))
            if sets and r.random() < 0.5:
                clauses.append(Set("note", "text", Var("title"), overwrite=True))
        for n in range(r.randint(0 if sets else 1, 2)):
            at: Any = r.choice([Var("title"), Field("note", "hits")])
            data = {"n": Var("n"), "at": at}
            clauses.append(Record("note", f"note.fact{n}", data))
        if r.random() < 0.5:
            clauses.append(Caused("note", "cmp_note", "note.touched", {"n": Var("n")}))
        if r.random() < 0.7:
            clauses.append(Emit(NoteTouched, note_id=Field("note", "id"),
                                hits=Field("note", "hits"), version=Field("note", "version")))
        clauses.append(Return("Touched", v=Field("note", "version"), h=Field("note", "hits")))
        return self.keyed(name, clauses)

    def parts(self, name: str, shape: str) -> Command:
        """A delete of an item (its parts restricting it or cascaded), a
        part added to an item, or a part deleted."""
        r = self.r
        clauses: list[Any]
        if shape == "delete":
            clauses = [Mutate("Item", (Var("org"), Var("id")), as_="item",
                              else_=Outcome("Missing"))]
            # A delete and a create in one command: a title the deleted row
            # frees may be claimed by the created one.
            replace = r.random() < 0.5
            if replace:
                clauses.append(Create("Item", (Var("org"), Var("other")), as_="new",
                                      else_=Outcome("Exists"),
                                      taken={"by_title": Outcome("TitleTaken")}))
            if r.random() < 0.4:
                clauses.append(Require("Ok", self.bools(
                    [Field("item", "n"), Var("n")], [Field("item", "flag")],
                    [Field("item", "title")]), Outcome("NotOk")))
            clauses.append(Delete("item", too_many=Outcome("TooMany")) if self.cascade
                           else Delete("item", referenced=Outcome("Referenced")))
            if replace:
                clauses += [Set("new", "title", Var("title")), Set("new", "n", Var("n")),
                            Set("new", "flag", Var("flag"))]
            if r.random() < 0.5:
                clauses.append(Caused("item", "cmp_item", "item.deleted", {"n": Var("n")}))
            clauses.append(Return("Deleted", n=Var("n")))
        elif shape == "part":
            clauses = [Read("Item", (Var("org"), Var("id")), as_="item",
                            else_=Outcome("ItemMissing")),
                       # A part named by its item's id (two tables, one key) or its own.
                       Create("Part", (Var("org"), r.choice([Var("pid"), Var("id")])),
                              as_="part",
                              else_=Outcome("PartExists"),
                              taken={"by_label": Outcome("LabelTaken")}),
                       Set("part", "item_id", Var("id")), Set("part", "label", Var("title"))]
            if r.random() < 0.5:
                clauses.append(Set("part", "pinned", Var("flag")))
            clauses.append(Return("Added", v=Field("part", "version")))
        else:
            clauses = [Mutate("Part", (Var("org"), Var("pid")), as_="part",
                              else_=Outcome("PartMissing"),
                              taken={"by_label": Outcome("LabelTaken")})]
            if r.random() < 0.5:
                clauses.append(Delete("part"))
                clauses.append(Return("Dropped", n=Var("n")))
            else:
                clauses.append(Set("part", "label", Var("title"), overwrite=True))
                clauses.append(Return("Relabelled", v=Field("part", "version")))
        return self.keyed(name, clauses)

    def keyed(self, name: str, clauses: list[Any]) -> Command:
        head: list[Any] = [Input("org", str), Input("id", str), Input("other", str),
                           Input("title", str), Input("n", int), Input("rev", int),
                           Input("flag", bool), Input("nid", str), Input("pid", str)]
        if self.r.random() < 0.5:
            head += [Input("key", str, max_length=8), Service("at", TRANSACTION_TIME),
                     Service("made", UUID_V7), IdempotencyKey("key")]
        return Command(name, *head, *clauses)

    def command(self, name: str) -> Command:
        r = self.r
        shape = r.choice(["create", "mutate", "pair", "swap", "note", "delete", "part",
                          "drop"])
        if shape == "note":
            return self.note(name)
        if shape in ("delete", "part", "drop"):
            return self.parts(name, shape)
        taken = {"by_title": Outcome("TitleTaken")}
        if shape == "create":
            clauses: list[Any] = [Create("Item", (Var("org"), Var("id")), as_="item",
                                         else_=Outcome("Exists"), taken=taken)]
            if r.random() < 0.4:
                clauses.append(Require("Ok", self.bools([Var("n")], [Var("flag")],
                                                        [Var("title")]), Outcome("NotOk")))
            clauses += [Set("item", "title", Var("title")),
                        Set("item", "n", self.ints([Var("n")], facts=False)),
                        Set("item", "flag", self.bools([Var("n")], [Var("flag")], []))]
            if r.random() < 0.5:
                clauses.append(Set("item", "state", Const(r.choice(["a", "b"]))))
            if r.random() < 0.5:
                clauses.append(Caused("item", "cmp_item", "item.created", {"t": Var("title")}))
            clauses.append(Return("Created", v=Field("item", "version"), n=Field("item", "n")))
            return self.keyed(name, clauses)
        if shape == "mutate":
            fields = [Field("item", "n"), Field("item", "version"), Var("n")]
            clauses = [Mutate("Item", (Var("org"), Var("id")), as_="item",
                              else_=Outcome("Missing"), taken=taken)]
            if r.random() < 0.5:
                clauses.append(Require("Ok", self.bools(fields, [Field("item", "flag")],
                                                        [Field("item", "title")]),
                                       Outcome("NotOk")))
            if r.random() < 0.4:
                clauses.append(self.permit(fields, [Field("item", "flag")],
                                           [Field("item", "title")]))
            if r.random() < 0.4:
                clauses.append(Transition(f"Life.{r.choice(['Go', 'End'])}", on="item",
                                          revision=Var("rev"), stale=Outcome("Stale"),
                                          illegal=Outcome("Illegal")))
            if r.random() < 0.6:
                clauses.append(Set("item", "title", Var("title"), overwrite=True))
            if r.random() < 0.5:
                clauses.append(Set("item", "n", Add(Field("item", "n"), Var("n"))))
            if r.random() < 0.4:
                clauses.append(Set("item", "flag", Var("flag"), overwrite=True))
            if r.random() < 0.5:
                clauses.append(Caused("item", "cmp_item", "item.changed",
                                      {"n": Field("item", "n")}))
            clauses.append(Return("Done", v=Field("item", "version"), s=Field("item", "state"),
                                  t=Field("item", "title")))
            return self.keyed(name, clauses)
        if shape == "pair":
            clauses = [Read("Item", (Var("org"), Var("other")), as_="src",
                            else_=Outcome("SrcMissing")),
                       Mutate("Item", (Var("org"), Var("id")), as_="item",
                              else_=Outcome("Missing"), taken=taken)]
            if r.random() < 0.5:
                clauses.append(Require("Ok", self.bools(
                    [Field("src", "n"), Field("item", "n"), Var("n")], [Field("src", "flag")],
                    [Field("src", "title")]), Outcome("NotOk")))
            if r.random() < 0.6:
                clauses.append(Set("item", "title", Field("src", "title"), overwrite=True))
            else:
                clauses.append(Set("item", "n", Add(Field("item", "n"), Field("src", "n")),
                                   overwrite=True))
            clauses.append(Return("Copied", t=Field("item", "title"), n=Field("src", "n")))
            return self.keyed(name, clauses)
        clauses = [Mutate("Item", (Var("org"), Var("id")), as_="a", else_=Outcome("AMissing"),
                          taken={"by_title": Outcome("ATaken")}),
                   Mutate("Item", (Var("org"), Var("other")), as_="b",
                          else_=Outcome("BMissing"), taken={"by_title": Outcome("BTaken")}),
                   Set("a", "title", Field("b", "title"), overwrite=True),
                   Set("b", "title", Field("a", "title"), overwrite=True),
                   Return("Swapped", a=Field("a", "version"), b=Field("b", "version"))]
        return self.keyed(name, clauses)

    def principal(self, side: str, org: str) -> Principal:
        r = self.r
        return Principal(
            f"p-{side}", org=r.choice([org, org, org, None, "zz"]),
            admin=r.choice([True, False, False, "yes"]), level=r.choice([0, 5, None, "x"]),
            home=r.choice([f"{org}-n0", f"{org}-n1", None]),
        )

    def inputs(self, org: str, keyed: bool) -> dict[str, Any]:
        r = self.r
        values: dict[str, Any] = {
            "org": org, "id": r.choice(IDS), "other": r.choice(IDS), "title": r.choice(TITLES),
            "n": r.randint(-2, 3), "rev": r.randint(1, 3), "flag": r.random() < 0.5,
            "nid": f"{org}-n{r.randrange(2)}", "pid": r.choice(PIDS),
        }
        if keyed:
            values["key"] = r.choice(["k0", "k1"])
        return values


def _normal(value: Any, org: str) -> Any:
    """``value`` with the partition's name taken out (the two sides compare)."""
    if isinstance(value, str):
        return value.replace(org, "ORG")
    if isinstance(value, list | tuple):
        return [_normal(v, org) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v, org) for k, v in value.items()}
    return value


def _unsealed(data: Any, sealed: Any) -> Any:
    """``data`` with each sealed service value named instead (sampled per run)."""
    names = {v: f"<{k}>" for k, v in (sealed or {}).items()}
    return {k: names.get(v, v) if isinstance(v, str) else v for k, v in data.items()}


def _answer(result: Any, org: str) -> Any:
    if isinstance(result, CommandOutcome):
        data = _unsealed(dict(result.data), result.sealed)
        return ("outcome", result.command, result.name, result.ok, _normal(data, org),
                result.replayed, sorted(result.sealed))
    if isinstance(result, MutationError):
        return ("error", result.code)
    if isinstance(result, TypeError) and "evaluated to nothing" in str(result):
        # A value that evaluated to nothing: the compiled function raises the
        # typed `ValueMissing`, the interpreter a plain `TypeError` (each
        # naming the clause in its own words).
        return ("raised", "value_missing")
    return ("raised", type(result).__name__)


def _emitted(cx: Any, into: list[Any] | None) -> None:
    """The events ``cx`` staged (subject and payload) and its impacts (noun,
    key, cause), kept in ``into``."""
    if into is not None:
        into.extend((m.subject, m.body.get("payload")) for m in cx._messages)
        into.extend((i.noun, i.key, None if i.cause is None else (i.cause.name, i.cause.data))
                    for i in cx._impacts)


async def _compiled(
    executor: MutationExecutor, compiled: CompiledCommand, principal: Any, inputs: Any,
    events: list[Any] | None = None,
) -> Any:
    async def handler(cx: Any) -> CommandOutcome:
        outcome = await run_compiled(cx, compiled, cx.principal, inputs, RETENTION)
        _emitted(cx, events)
        return outcome

    try:
        return await executor.execute(principal, handler)
    except InvalidInput as exc:
        return MutationError(INVALID_INPUT, str(exc))


async def _interpreted(
    executor: MutationExecutor, command: CheckedCommand, principal: Any, inputs: Any,
    events: list[Any] | None = None,
) -> Any:
    async def handler(cx: Any) -> CommandOutcome:
        outcome = await interpret(cx, command, inputs, principal=cx.principal,
                                  config=CommandConfig(idempotency_retention=RETENTION))
        _emitted(cx, events)
        return outcome

    try:
        return await executor.execute(principal, handler)
    except InvalidInput as exc:
        return MutationError(INVALID_INPUT, str(exc))


async def _state(conn: Any, org: str, scope: str) -> Any:
    rows = await conn.fetch("SELECT id, title, n, flag, state, version FROM cmp_item"
                            " WHERE org = $1 ORDER BY id", org)
    occupied = await conn.fetch(
        "SELECT entity, value, owner FROM service_engine.command_occupancy"
        " WHERE entity IN ('Item', 'Part') AND partition = $1 ORDER BY entity, value",
        canonical_json([org]))
    records = await conn.fetch(
        "SELECT command, key, outcome FROM service_engine.command_idempotency"
        " WHERE scope = $1 ORDER BY command, key", scope)
    notes = await conn.fetch("SELECT id, org, text, hits, version FROM cmp_note"
                             " WHERE org = $1 ORDER BY id", org)
    facts = await conn.fetch("SELECT note_id, fact_type, payload FROM cmp_note_fact"
                             " WHERE note_id LIKE $1 || '-%' ORDER BY seq", org)
    parts = await conn.fetch("SELECT id, item_id, label, pinned, version FROM cmp_part"
                             " WHERE org = $1 ORDER BY id", org)
    return ([tuple(r) for r in rows], [tuple(r) for r in parts],
            [(r["entity"], r["value"], _normal(r["owner"], org)) for r in occupied],
            [(r["command"], r["key"], _normal(r["outcome"], org)) for r in records],
            [_normal(tuple(r), org) for r in notes], [_normal(tuple(r), org) for r in facts])


async def _example(database: ProvisionedDatabase, seed: int) -> None:
    rnd = random.Random(seed)
    grammar = Grammar(rnd)
    while True:
        try:
            catalog, _ = grammar.catalog()
            break
        except CommandDeclarationError:
            continue  # a policy registration refuses: draw another
    suffix = secrets.token_hex(3)
    commands: list[CheckedCommand] = []
    for n in range(4):
        try:
            commands.append(catalog.command(grammar.command(f"C{n}x{suffix}")))
        except CommandDeclarationError:
            continue  # a draw registration refuses (an unproven set, a type): skipped
    if not commands:
        return
    compiled = {c.name: compile_command(c, {"Item": "cmp_item", "Part": "cmp_part"})
                for c in commands}
    owner = await asyncpg.connect(database.owner_url)
    try:
        await owner.execute(TABLE)
        await owner.execute(PRELUDE)
        for c in compiled.values():
            await owner.execute(c.ddl)
    finally:
        await owner.close()
    db = await connect_pool(database.app_url, max_size=4)
    try:
        orgs = {"i": f"oi{suffix}", "c": f"oc{suffix}"}
        rows = []
        for ident, title in zip(IDS, rnd.sample(TITLES, len(IDS)), strict=False):
            if rnd.random() < 0.7:
                rows.append((ident, title, rnd.randint(-2, 3), rnd.random() < 0.5,
                             rnd.choice(["a", "b", "c"]), rnd.randint(1, 3)))
        parts = [(ident, rnd.choice(IDS[:2]), label, rnd.random() < 0.5, rnd.randint(1, 3))
                 for ident, label in zip(PIDS, rnd.sample(TITLES, len(PIDS)), strict=False)
                 if rnd.random() < 0.6]
        for org in orgs.values():
            for ident, title, n, flag, state, version in rows:
                await db.pool.execute(
                    "INSERT INTO cmp_item VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    org, ident, title, n, flag, state, version)
                await db.pool.execute(
                    "INSERT INTO service_engine.command_occupancy"
                    " (entity, index_name, partition, value, owner) VALUES"
                    " ('Item', 'by_title', $1, $2, $3)",
                    canonical_json([org]), canonical_json([title]), canonical_json([org, ident]))
            for ident, item_id, label, pinned, version in parts:
                await db.pool.execute("INSERT INTO cmp_part VALUES ($1, $2, $3, $4, $5, $6)",
                                      org, ident, item_id, label, pinned, version)
                await db.pool.execute(
                    "INSERT INTO service_engine.command_occupancy"
                    " (entity, index_name, partition, value, owner) VALUES"
                    " ('Part', 'by_label', $1, $2, $3)",
                    canonical_json([org]), canonical_json([label]), canonical_json([org, ident]))
            # One stored note per side (a mutate of a note finds one).
            await db.pool.execute("INSERT INTO cmp_note VALUES ($1, $2, 'x', 1, 1)",
                                  f"{org}-n0", org)
        executor = executor_for(db, lock_timeout=timedelta(seconds=5))
        command = commands[0]
        principals: dict[str, Principal] = {}
        inputs: dict[str, dict[str, Any]] = {}
        for _ in range(12):
            if not inputs or rnd.random() < 0.7:
                # A new call (else the last one again: a retry).
                command = rnd.choice(commands)
                keyed = command.idempotency_key is not None
                draws = rnd.getstate()
                for side, org in orgs.items():
                    rnd.setstate(draws)  # the same draws on both sides
                    principals[side] = grammar.principal(side, org)
                    inputs[side] = grammar.inputs(org, keyed)
            answers = {}
            events: dict[str, list[Any]] = {"i": [], "c": []}
            for side, call in (
                ("i", _interpreted(executor, command, principals["i"], inputs["i"],
                                   events["i"])),
                ("c", _compiled(executor, compiled[command.name], principals["c"], inputs["c"],
                                events["c"])),
            ):
                try:
                    result: Any = await call
                except Exception as exc:  # the interpreter's own failures compare too
                    result = exc
                answers[side] = (_answer(result, orgs[side]), _normal(events[side], orgs[side]))
            assert answers["i"] == answers["c"], (command.declaration, inputs, principals)
        async with db.pool.acquire() as conn:
            interpreted = await _state(conn, orgs["i"], "p-i")
            compiled_state = await _state(conn, orgs["c"], "p-c")
        assert interpreted == compiled_state, [c.declaration for c in commands]
    finally:
        await db.aclose()


@pytest.mark.slow
def test_compiled_command_equals_interpreter(database: ProvisionedDatabase) -> None:
    """For random declarations, stored rows, principals and inputs, the
    compiled function answers every call as the interpreter does and leaves
    the same rows, occupancy and idempotency records."""

    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.integers(0, 2**32 - 1))
    def check(seed: int) -> None:
        asyncio.run(_example(database, seed))

    check()

