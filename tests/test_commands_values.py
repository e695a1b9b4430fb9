"""The runner's pure values pinned exactly: input checks and their messages,
the stored input digest, occupancy keys, and expression evaluation (no
database). Each test holds a property a service author relies on that a
small change of the code would break."""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from service_engine.commands import (
    UUID_V7,
    Catalog,
    Command,
    Create,
    Entity,
    IdempotencyKey,
    Input,
    InvalidInput,
    Outcome,
    Return,
    Service,
    Set,
    Unique,
    Var,
)
from service_engine.commands.expr import (
    INVALID,
    Const,
    Env,
    Eq,
    Field,
    Ge,
    Gt,
    Le,
    Lt,
    Ne,
    evaluate,
    principal_fact,
    references,
)
from service_engine.commands.plan import (
    OccupancyKey,
    encode_value,
    input_digest,
    lock_identity,
    occupancy_keys,
    order_by_lock,
    uuid_v7,
    validate_inputs,
)


class _Store:
    async def load(self, conn: Any, key: Any) -> None:
        return None


@dataclass
class Gadget:
    org: str
    id: str
    name: str
    code: str | None = None
    size: int = 0
    Store: ClassVar[Any] = _Store()


GADGET = Entity(
    "Gadget", Gadget, key=("org", "id"), partition_by=("org",), conflict_key=("id",),
    unique=(Unique("by_code", ("org", "code")), Unique("by_name", ("org", "name"))),
    table="gadget",
)
CATALOG = Catalog([GADGET])
MAKE = CATALOG.command(Command(
    "MakeGadget",
    Input("key", str, max_length=4), Input("org", str), Input("id", str), Input("name", str),
    Input("size", int), Input("code", str, optional=True),
    Input("ratio", float, optional=True), Input("ref", uuid.UUID, optional=True),
    Input("at", datetime, optional=True),
    Service("made", UUID_V7),
    IdempotencyKey("key"),
    Create("Gadget", (Var("org"), Var("id")), as_="gadget", else_=Outcome("Exists"),
           taken={"by_code": Outcome("CodeTaken"), "by_name": Outcome("NameTaken")}),
    Set("gadget", "name", Var("name")),
    Set("gadget", "size", Var("size")),
    Set("gadget", "code", Var("code")),
    Return("Made"),
))
GOOD = {"key": "k", "org": "acme", "id": "g1", "name": "n", "size": 3}


def test_an_int_input_is_accepted_and_a_bool_or_float_refused() -> None:
    """An int input takes an int as it is and refuses a bool, a float or
    text, naming the input and both types."""
    assert validate_inputs(MAKE, GOOD)["size"] == 3
    for bad, got in ((True, "bool"), (3.0, "float"), ("3", "str")):
        with pytest.raises(InvalidInput, match=rf"^input size must be a int, got {got}$"):
            validate_inputs(MAKE, {**GOOD, "size": bad})


def test_a_missing_required_input_is_named() -> None:
    """A required input left out (or given as None) is refused with its name."""
    for raw in ({k: v for k, v in GOOD.items() if k != "name"}, {**GOOD, "name": None}):
        with pytest.raises(InvalidInput, match=r"^input name is required$"):
            validate_inputs(MAKE, raw)
    assert validate_inputs(MAKE, GOOD)["code"] is None


def test_each_refused_input_says_what_is_wrong() -> None:
    """Every refusal names the input and what is wrong with it: a uuid that
    does not parse, a string over its bound, a value of another type, a
    service value, an input the command does not declare."""
    cases: list[tuple[dict[str, object], str]] = [
        ({"ref": "nope"}, r"^input ref is not a uuid$"),
        ({"key": "abcde"}, r"^input key is longer than 4$"),
        ({"ratio": "1.5"}, r"^input ratio must be a float, got str$"),
        ({"ratio": True}, r"^input ratio must be a float, got bool$"),
        ({"at": "2026-01-01"}, r"^input at must be a datetime, got str$"),
        ({"at": datetime(2026, 1, 1)},
         r"^input at must be a datetime with a time zone, got one without$"),
        ({"made": "x"}, r"^made is a service value: the engine samples it, never the caller$"),
        ({"extra": 1}, r"^MakeGadget has no input 'extra'$"),
    ]
    for change, message in cases:
        with pytest.raises(InvalidInput, match=message):
            validate_inputs(MAKE, {**GOOD, **change})


def test_inputs_at_their_bounds_are_taken_as_their_declared_type() -> None:
    """A string exactly at its bound, an aware instant and a uuid (or its
    text) are accepted; an int given for a float input becomes a float."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    ref = uuid.UUID(int=7)
    values = validate_inputs(MAKE, {**GOOD, "key": "abcd", "ratio": 2, "ref": str(ref),
                                    "at": at})
    assert values["key"] == "abcd" and values["at"] == at and values["ref"] == ref
    assert type(values["ratio"]) is float and values["ratio"] == 2.0
    assert type(validate_inputs(MAKE, {**GOOD, "ratio": 0.5})["ratio"]) is float


def test_the_input_digest_is_stable_across_releases() -> None:
    """The digest stored with an idempotency record is a fixed function of
    the command name and the inputs (a record written by one release answers
    a retry after an upgrade): its value for known inputs is pinned."""
    values = validate_inputs(MAKE, GOOD)
    text = ('{"command":"MakeGadget","inputs":{"at":null,"code":null,"id":"g1","name":"n",'
            '"org":"acme","ratio":null,"ref":null,"size":3}}')
    assert input_digest(MAKE, values) == hashlib.sha256(text.encode()).hexdigest()


def test_every_unique_key_is_kept_after_one_that_occupies_nothing() -> None:
    """A unique key with a missing value occupies nothing, and the unique
    keys after it still occupy theirs."""
    found = occupancy_keys(GADGET, {"org": "acme", "id": "g1", "name": "n", "code": None})
    assert found == {"by_name": OccupancyKey("Gadget", "by_name", '["acme"]', '["n"]')}


def test_an_occupancy_names_its_entity_and_unique_key() -> None:
    """One value under two unique keys (or two entities) is two occupancies:
    the key names the entity and the unique key."""
    found = occupancy_keys(GADGET, {"org": "acme", "id": "g1", "name": "x", "code": "x"})
    assert found == {
        "by_code": OccupancyKey("Gadget", "by_code", '["acme"]', '["x"]'),
        "by_name": OccupancyKey("Gadget", "by_name", '["acme"]', '["x"]'),
    }
    assert found["by_code"].as_key() == ["Gadget", "by_code", '["acme"]', '["x"]']


@dataclass
class Card:
    title: str
    note: str | None = None
    _secret: str = "s"

    def shout(self) -> str:
        return self.title.upper()


def field_of(bindings: dict[str, object], binding: str, name: str) -> Any:
    return evaluate(Field(binding, name), Env({}, bindings))


def test_a_field_reads_its_binding_and_nothing_else() -> None:
    """A field reads the named binding's attribute (an aggregate) or key (a
    create's fields so far), a present None included; a missing binding,
    an absent binding (None), a missing or private field or a method is
    INVALID."""
    card = Card("t")
    assert field_of({"card": card}, "card", "title") == "t"
    assert field_of({"card": card}, "card", "note") is None
    assert field_of({"card": {"title": "new", "note": None}}, "card", "title") == "new"
    assert field_of({"card": {"title": "new", "note": None}}, "card", "note") is None
    absent: tuple[tuple[dict[str, object], str], ...] = (
        ({"other": card}, "title"),
        ({"card": None}, "title"),
        ({"card": card}, "missing"),
        ({"card": card}, "_secret"),
        ({"card": card}, "shout"),
        ({"card": {"title": "new"}}, "missing"),
        ({"card": {"_secret": "s"}}, "_secret"),
    )
    for bindings, name in absent:
        assert field_of(bindings, "card", name) is INVALID, (bindings, name)


@dataclass(frozen=True)
class Member:
    id: str

    def boards(self) -> frozenset[str]:
        return frozenset({"method"})

    def fact(self, name: str) -> frozenset[str]:
        if name == "boards":
            return frozenset({"b1"})
        raise KeyError(name)


@dataclass(frozen=True)
class Bare:
    id: str


def test_a_fact_is_an_attribute_value_else_the_fact_lookup() -> None:
    """A principal's fact is a plain attribute's value; a method of that
    name is not a fact (the `fact` lookup answers instead); a principal
    without a `fact` lookup has only its attributes."""
    member = Member("m")
    assert principal_fact(member, "id") == "m"
    assert principal_fact(member, "boards") == frozenset({"b1"})
    assert principal_fact(member, "admin") is INVALID
    assert principal_fact(Bare("b"), "id") == "b"
    assert principal_fact(Bare("b"), "boards") is INVALID


def test_booleans_compare_only_with_booleans() -> None:
    """Two booleans compare as booleans (equal or not); a boolean against a
    number is INVALID."""
    env = Env({}, {})
    assert evaluate(Eq(Const(True), Const(True)), env) is True
    assert evaluate(Eq(Const(False), Const(True)), env) is False
    assert evaluate(Ne(Const(False), Const(True)), env) is True
    assert evaluate(Ne(Const(1), Const(True)), env) is INVALID


def test_a_non_expression_is_named_in_its_refusal() -> None:
    """Walking something that is not an expression raises TypeError naming it."""
    with pytest.raises(TypeError, match=r"^not a command expression: 5$"):
        list(references(5))  # type: ignore[arg-type]


def test_orderings_are_strict_or_inclusive_as_named() -> None:
    """Lt and Gt are strict, Le and Ge inclusive, over numbers and strings."""
    env = Env({}, {})
    table: dict[type[Lt | Le | Gt | Ge], tuple[bool, bool, bool]] = {
        Lt: (True, False, False), Le: (True, True, False),
        Gt: (False, False, True), Ge: (False, True, True),
    }
    for op, expected in table.items():
        got = tuple(evaluate(op(Const(a), Const(2)), env) for a in (1, 2, 3))
        assert got == expected, op
        assert evaluate(op(Const("b"), Const("b")), env) is expected[1], op


def test_encoded_values_are_the_json_of_their_contents() -> None:
    """A set encodes as its members' JSON in canonical order (mixed types
    too), a mapping with text keys and encoded values; anything else is
    refused by name."""
    ref = uuid.UUID(int=1)
    assert encode_value(frozenset({2, "a", 1})) == ["a", 1, 2]
    assert encode_value({ref}) == [str(ref)]
    assert encode_value({1: ref, "k": (True,)}) == {"1": str(ref), "k": [True]}
    with pytest.raises(TypeError, match=r"^not a command value: b'x'$"):
        encode_value(b"x")


def test_uuid_v7_carries_the_given_bytes_or_the_clock() -> None:
    """uuid_v7 keeps the random bytes it is given (but the version and
    variant bits), defaults to the current millisecond and fresh bytes, and
    refuses milliseconds beyond 48 bits or other than 10 bytes."""
    rand = bytes(range(1, 11))
    value = uuid_v7(5, rand)
    assert value.int >> 80 == 5
    low = int.from_bytes(rand, "big")
    mask = ~((0xF << 76) | (0x3 << 62)) & ((1 << 80) - 1)
    assert value.int & mask == low & mask
    before = int(time.time() * 1000)
    fresh = uuid_v7()
    after = int(time.time() * 1000)
    assert before <= fresh.int >> 80 <= after and fresh.version == 7
    assert uuid_v7() != uuid_v7()
    assert uuid_v7((1 << 48) - 1, rand).int >> 80 == (1 << 48) - 1
    for ms, random_bytes in ((1 << 48, rand), (-1, rand), (0, bytes(9))):
        with pytest.raises(
            ValueError, match=r"^uuid_v7 needs 48-bit milliseconds and 10 random bytes$"
        ):
            uuid_v7(ms, random_bytes)


def test_lock_order_answers_the_items_themselves() -> None:
    """Ordering by lock answers the first of each lock's items, sorted by
    lock, never a placeholder."""
    items = [("t", "b", 1), ("t", "a", 2), ("t", "b", 3)]
    assert order_by_lock(items, lambda i: lock_identity(i[0], i[1])) == [
        ("t", "a", 2), ("t", "b", 1)]
