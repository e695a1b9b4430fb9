"""Field types derived from the aggregate dataclass, expression types and
Set proofs at registration (pure: no database)."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal

import pytest

from service_engine.commands import (
    INVALID,
    Add,
    And,
    BindingError,
    Catalog,
    Command,
    CommandDeclarationError,
    Const,
    Contains,
    Create,
    Entity,
    Eq,
    Fact,
    Field,
    Input,
    Lt,
    Mutate,
    Not,
    Or,
    Outcome,
    Require,
    Return,
    Set,
    Sub,
    TypeMismatch,
    UnknownName,
    UnprovenSet,
    Var,
)
from service_engine.commands.expr import Env, Expr, evaluate, show
from service_engine.commands.typecheck import (
    NULL,
    UNKNOWN,
    TypeScope,
    ValueType,
    admits,
    assignable,
    field_types,
    value_type,
)


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class _Store:
    TABLE = "rows"  # what the compiler writes into the generated function (no I/O here)

    async def load(self, conn: Any, key: Any) -> None:
        return None


@dataclass
class Account:
    org: str
    id: str
    owner: str
    balance: int
    limit: float = 0.0
    kind: Literal["basic", "gold"] = "basic"
    colour: Colour = Colour.RED
    opened: datetime | None = None
    ref: uuid.UUID | None = None
    tags: frozenset[str] = frozenset()
    version: int = 1
    Store: ClassVar[Any] = _Store()

    @property
    def label(self) -> str:
        return f"{self.org}/{self.id}"


ACCOUNT = Entity("Account", Account, key=("org", "id"), partition_by=("org",),
                 conflict_key=("id",), revision="version")
CATALOG = Catalog([ACCOUNT], facts={"org": str, "admin": bool, "teams": frozenset[str]})
ORG, ID = Input("org", str), Input("id", str)
MUTATE = Mutate("Account", (Var("org"), Var("id")), as_="acct", else_=Outcome("Missing"))


def command(*extra: Any) -> Command:
    return Command("Probe", ORG, ID, Input("amount", int), Input("rev", int), MUTATE, *extra,
                   Return("Done"))


def test_field_types_come_from_the_dataclass() -> None:
    """Field types come from the dataclass annotations (Literal and Enum domains, optionals,
    typed properties; no ClassVar); Any and unions are unknown."""
    types = field_types(Account)
    assert types["owner"] == ValueType(str)
    assert types["kind"] == ValueType(str, domain=frozenset({"basic", "gold"}))
    assert types["colour"] == ValueType(Colour, domain=frozenset(Colour))
    assert types["opened"] == ValueType(datetime, optional=True)
    assert types["tags"] == ValueType(frozenset)
    assert types["label"] == ValueType(str)  # a typed property
    assert "Store" not in types
    assert ACCOUNT.fields.keys() == {"owner", "balance", "limit", "kind", "colour", "opened",
                                     "ref", "tags", "label"}
    assert ACCOUNT.all_fields[:2] == ("org", "id") and ACCOUNT.all_fields[-1] == "version"
    assert value_type(Any) == UNKNOWN and value_type(None) == NULL
    assert value_type(int | str) == UNKNOWN
    assert value_type(Literal[1, "a"]).base is None


def test_the_store_key_is_the_complete_key() -> None:
    """The store key is every key value (a single-field key is its value alone), and a key field
    in neither the partition route nor the conflict key is refused."""
    assert ACCOUNT.key_of_values({"org": "acme", "id": "a1"}) == ["acme", "a1"]
    single = Entity("One", Account, key=("id",))
    assert single.key_of_values({"id": "a1"}) == "a1"
    # Every key field is in the route or the conflict key: no global-id mode.
    with pytest.raises(BindingError, match="neither partition_by"):
        Catalog([Entity("A", Account, key=("org", "id"), conflict_key=("id",))])


def test_an_entity_is_a_typed_dataclass() -> None:
    """An entity's aggregate must be a dataclass with typed key fields and an int revision;
    otherwise registration is refused."""
    class Plain:
        Store: ClassVar[Any] = _Store()

    with pytest.raises(CommandDeclarationError, match="must be a dataclass"):
        Catalog([Entity("P", Plain, key=("id",))])
    with pytest.raises(UnknownName, match="no typed field"):
        Catalog([Entity("A", Account, key=("org", "nope"), partition_by=("org",))])
    with pytest.raises(CommandDeclarationError, match="must be an int"):
        Catalog([Entity("A", Account, key=("org", "id"), partition_by=("org",),
                        revision="owner")])

    @dataclass
    class Loose:
        id: str
        version: int | None = None
        Store: ClassVar[Any] = _Store()

    # A row whose revision is NULL would have no next one.
    with pytest.raises(CommandDeclarationError,
                       match=r"the revision 'version' must be an int field, is int \| None"):
        Catalog([Entity("L", Loose, key=("id",), revision="version")])


def test_values_are_admitted_by_their_type() -> None:
    """A value is admitted by its exact type only: no bool as int nor int as bool, an int as a
    float, None only when optional, a Literal value only from its domain."""
    assert admits(ValueType(int), 1) and not admits(ValueType(int), True)
    assert admits(ValueType(bool), False) and not admits(ValueType(bool), 0)
    assert admits(ValueType(float), 1) and admits(ValueType(float), 1.5)
    assert not admits(ValueType(float), "1")
    assert admits(ValueType(str, optional=True), None) and not admits(ValueType(str), None)
    kind = field_types(Account)["kind"]
    assert admits(kind, "gold") and not admits(kind, "platinum")
    assert admits(UNKNOWN, object())
    assert not admits(ValueType(str), 5)


def test_assignability() -> None:
    """A type is assignable only where no value is lost: int into float but not back, no bool
    and int mixing, None or an optional only into an optional, a Literal only from its domain."""
    assert assignable(ValueType(str), ValueType(str)) is None
    assert assignable(ValueType(float), ValueType(int)) is None
    assert assignable(ValueType(int), ValueType(float)) is not None
    assert assignable(ValueType(int), ValueType(bool)) is not None
    assert assignable(ValueType(bool), ValueType(int)) is not None
    assert assignable(ValueType(str), NULL) is not None
    assert assignable(ValueType(str, optional=True), NULL) is None
    assert assignable(ValueType(str), ValueType(str, optional=True)) is not None
    assert assignable(ValueType(str, optional=True), ValueType(str, optional=True)) is None
    assert assignable(UNKNOWN, ValueType(int)) is None
    kind = field_types(Account)["kind"]
    assert assignable(kind, ValueType(str, domain=frozenset({"gold"}))) is None
    assert assignable(kind, ValueType(str)) is not None  # any string is not a kind
    assert assignable(kind, ValueType(str, domain=frozenset({"platinum"}))) is not None


def test_expressions_are_typed() -> None:
    """Well-typed predicates type as bool and arithmetic as its number; mismatched operands,
    non-boolean logic, an enum against its raw value and an unknown fact are refused."""
    scope = TypeScope({"n": ValueType(int), "s": ValueType(str)},
                      {"a": field_types(Account)}, CATALOG.facts)
    ok: list[Expr] = [
        Eq(Field("a", "balance"), Var("n")), Lt(Field("a", "limit"), Var("n")),
        Eq(Field("a", "kind"), Const("gold")), Contains(Fact("teams"), Var("s")),
        And(Fact("admin"), Not(Eq(Field("a", "owner"), Var("s")))),
        Or(Fact("admin"), Fact("admin")), Eq(Field("a", "opened"), Const(None)),
        Eq(Field("a", "colour"), Const(Colour.BLUE)),
    ]
    for expr in ok:
        assert scope.type_of(expr) == ValueType(bool), show(expr)
    assert scope.type_of(Add(Field("a", "balance"), Var("n"))) == ValueType(int)
    assert scope.type_of(Sub(Field("a", "limit"), Var("n"))) == ValueType(float)
    bad: list[Expr] = [
        Eq(Field("a", "balance"), Var("s")), Eq(Field("a", "kind"), Const("platinum")),
        Eq(Field("a", "colour"), Const("red")), Not(Field("a", "owner")),
        And(Fact("admin"), Field("a", "balance")), Or(Field("a", "owner"), Fact("admin")),
        Lt(Fact("admin"), Fact("admin")), Contains(Field("a", "owner"), Var("s")),
        Add(Field("a", "owner"), Var("n")), Add(Field("a", "opened"), Var("n")),
        Eq(Fact("admin"), Const(1)),
    ]
    for expr in bad:
        with pytest.raises(TypeError):
            scope.type_of(expr)
    with pytest.raises(LookupError, match="admn"):
        scope.type_of(Fact("admn"))


def test_arithmetic_evaluates_strictly() -> None:
    """Add and Sub evaluate numbers only (a bool, a string or a missing operand is INVALID),
    and show renders an expression as it reads."""
    env = Env({"n": 2, "b": True, "s": "x"}, {}, None, None)
    assert evaluate(Add(Const(40), Var("n")), env) == 42
    assert evaluate(Sub(Const(40), Var("n")), env) == 38
    assert evaluate(Add(Const(1.5), Var("n")), env) == 3.5
    assert evaluate(Add(Const(1), Var("b")), env) is INVALID
    assert evaluate(Add(Var("s"), Var("n")), env) is INVALID
    assert evaluate(Sub(Var("missing"), Var("n")), env) is INVALID
    assert show(And(Eq(Field("t", "state"), Const("q")), Not(Fact("admin")))) == (
        "((t.state == 'q') and not Fact('admin'))")


def test_set_proofs() -> None:
    """A Set on a mutate binding registers only with its own proof (a delta of its own field or
    a fence on the caller's revision); an unproven one is refused, naming its clause."""
    CATALOG.command(command(Set("acct", "balance", Add(Field("acct", "balance"), Var("amount")))))
    CATALOG.command(command(Set("acct", "balance", Sub(Field("acct", "balance"), Var("amount")))))
    CATALOG.command(command(Require("Current", Eq(Field("acct", "version"), Var("rev")),
                                    Outcome("Stale")),
                            Set("acct", "owner", Const("x"))))
    CATALOG.command(command(Require("Both", And(Fact("admin"), Eq(Var("rev"),
                                                                   Field("acct", "version"))),
                                    Outcome("Stale")),
                            Set("acct", "owner", Const("x"))))
    unproven = [
        Set("acct", "balance", Var("amount")),
        Set("acct", "balance", Add(Var("amount"), Field("acct", "balance"))),
        Set("acct", "balance", Add(Field("acct", "limit"), Var("amount"))),
        Set("acct", "balance", Add(Field("acct", "balance"), Field("acct", "balance"))),
    ]
    for clause in unproven:
        with pytest.raises((UnprovenSet, TypeMismatch)):
            CATALOG.command(command(clause))
    for fence in (Eq(Field("acct", "version"), Const(1)), Eq(Field("acct", "balance"), Var("rev")),
                  Not(Eq(Field("acct", "version"), Var("rev")))):
        with pytest.raises(UnprovenSet):
            CATALOG.command(command(Require("F", fence, Outcome("Stale")),
                                    Set("acct", "owner", Const("x"))))
    # Each Set carries its own proof: a proven one does not cover the next.
    for first in (Set("acct", "owner", Const("x"), overwrite=True),
                  Set("acct", "limit", Add(Field("acct", "limit"), Var("amount")))):
        with pytest.raises(UnprovenSet, match=r"set acct\.balance \(clause 7"):
            CATALOG.command(command(first, Set("acct", "balance", Var("amount"))))
    with pytest.raises(UnprovenSet, match=r"set acct\.balance \(clause 8"):
        CATALOG.command(command(
            Require("Open", Eq(Field("acct", "owner"), Const("x")), Outcome("Closed")),
            Set("acct", "owner", Const("y"), checked_by="Open"),
            Set("acct", "balance", Var("amount"))))
    with pytest.raises(CommandDeclarationError, match="overwrite is a bool"):
        CATALOG.command(command(Set("acct", "owner", Const("x"), overwrite=1)))  # type: ignore[arg-type]


def test_a_create_initialises_and_needs_no_other_proof() -> None:
    """A create needs no proof beyond setting every field without a default, and its key
    inputs must have the key fields' types."""
    CATALOG.command(Command(
        "Open", ORG, ID, Create("Account", (Var("org"), Var("id")), as_="acct",
                                else_=Outcome("Exists")),
        Set("acct", "owner", Fact("org")), Set("acct", "balance", Const(0)), Return("Opened"),
    ))
    with pytest.raises(BindingError, match="never set"):  # balance has no default
        CATALOG.command(Command(
            "Open", ORG, ID, Create("Account", (Var("org"), Var("id")), as_="acct",
                                    else_=Outcome("Exists")),
            Set("acct", "owner", Fact("org")), Return("Opened"),
        ))
    with pytest.raises(TypeMismatch, match=r"the key Account\.id"):
        CATALOG.command(Command("Open", ORG, Input("n", int),
                                Create("Account", (Var("org"), Var("n")), as_="acct",
                                       else_=Outcome("Exists")),
                                Set("acct", "owner", Fact("org")),
                                Set("acct", "balance", Const(0)), Return("Opened")))


@dataclass
class Flagged:
    org: str
    id: str
    flag: bool | None = None
    title: str = ""
    Store: ClassVar[Any] = _Store()


def test_a_row_policy_is_a_typed_boolean() -> None:
    """A row policy must be a boolean expression over declared facts: a str, optional bool or
    number predicate, a plain string, or an unknown fact is refused."""
    from service_engine.commands import Row, RowPolicy
    from service_engine.gates import Reason

    def entity(predicate: Any) -> Entity:
        return Entity("F", Flagged, key=("org", "id"), partition_by=("org",),
                      update_policy=RowPolicy(predicate, Reason("no")))

    Catalog([entity(Eq(Row("title"), Const("x")))])
    Catalog([entity(Const(True))])
    for predicate in (Row("title"), Row("flag"), Not(Row("flag")), Const(1)):
        with pytest.raises(TypeMismatch, match="update row policy"):
            Catalog([entity(predicate)])
    with pytest.raises(CommandDeclarationError, match="not an expression"):
        Catalog([entity("org == 'acme'")])
    with pytest.raises(UnknownName, match="admn"):
        Catalog([Entity("F", Flagged, key=("org", "id"), partition_by=("org",),
                        delete_row_policy=RowPolicy(Fact("admn"), Reason("no")))])
