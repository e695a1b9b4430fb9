"""Expressions and row policies evaluate strictly, and a policy gate is the
same function as the command's check (pure: no database)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from service_engine.commands import (
    INVALID,
    And,
    Const,
    Contains,
    Eq,
    Fact,
    Field,
    Ge,
    Gt,
    Le,
    Lt,
    Ne,
    Not,
    Or,
    Row,
    RowPolicy,
    Var,
    check_row,
    row_policy_gate,
)
from service_engine.commands.expr import Env, evaluate, truth
from service_engine.commands.policy import row_of
from service_engine.gates import Reason, affordances


@dataclass(frozen=True)
class Who:
    id: str
    org: Any = "acme"
    admin: Any = False
    facts: dict[str, frozenset[str]] = field(default_factory=dict)

    def fact(self, name: str) -> frozenset[str]:
        return self.facts.get(name, frozenset())


def ev(expr: Any, row: dict[str, Any] | None = None, principal: Any = None, **values: Any) -> Any:
    return evaluate(expr, Env(values, {}, row, principal))


def test_only_the_boolean_true_is_true() -> None:
    """Only the boolean True is true: truthy values, INVALID, None, False and 0 are not."""
    assert truth(True)
    for value in (1, "yes", [1], INVALID, None, False, 0):
        assert not truth(value)


def test_missing_fields_and_facts_are_invalid_never_coerced() -> None:
    """A missing row field, fact, input or binding, a private fact, or Not of a non-boolean
    evaluates to INVALID, never to a coerced value."""
    assert ev(Row("archived"), {}) is INVALID
    assert ev(Not(Row("archived")), {"archived": 0}) is INVALID
    assert ev(Not(Row("archived")), {"archived": False}) is True
    assert ev(Fact("org"), None, None) is INVALID
    assert ev(Fact("_secret"), None, Who("a")) is INVALID
    assert ev(Var("x")) is INVALID
    assert ev(Field("post", "state")) is INVALID


def test_comparisons_refuse_mixed_types() -> None:
    """A comparison mixing bool with int, str with int, or involving None is INVALID, while
    int and float compare as numbers."""
    assert ev(Eq(Const(1), Const(True))) is INVALID
    assert ev(Eq(Const("1"), Const(1))) is INVALID
    assert ev(Eq(Const(1), Const(1.0))) is True
    assert ev(Eq(Const(None), Const(None))) is INVALID
    assert ev(Ne(Const(None), Const("a"))) is INVALID
    assert ev(Ne(Const("a"), Const("b"))) is True
    assert ev(Lt(Const(1), Const(2))) is True
    assert ev(Le(Const("a"), Const(2))) is INVALID
    assert ev(Gt(Const(None), Const(2))) is INVALID
    assert ev(Ge(Const(3), Const(2))) is True


def test_and_or_are_strict_over_invalid_operands() -> None:
    """And and Or are INVALID when any operand is invalid or non-boolean, even when the other
    operand alone would decide."""
    assert ev(And(Const(False), Row("x")), {}) is INVALID
    assert ev(Or(Const(True), Row("x")), {}) is INVALID
    assert ev(Or(Const(False), Const(True))) is True
    assert ev(And(Const(True), Const(1))) is INVALID


def test_contains_reads_a_principal_fact_set() -> None:
    """Contains answers membership in a principal's fact set, and is INVALID when the fact is
    not a set or the element is missing."""
    who = Who("a", facts={"boards": frozenset({"b1"})})
    assert ev(Contains(Fact("boards"), Row("id")), {"id": "b1"}, who) is True
    assert ev(Contains(Fact("boards"), Row("id")), {"id": "b2"}, who) is False
    assert ev(Contains(Fact("org"), Row("id")), {"id": "b1"}, who) is INVALID
    assert ev(Contains(Fact("boards"), Row("id")), {}, who) is INVALID


POLICY = RowPolicy(And(Eq(Row("org"), Fact("org")), Or(Not(Row("locked")), Fact("admin"))),
                   Reason("thing.denied"))


@dataclass
class Thing:
    org: str
    locked: bool

    can_update = row_policy_gate("update", POLICY, ("org", "locked"))


def test_a_mistyped_fact_denies() -> None:
    """A row policy denies when a fact or row field it reads is mistyped or missing; a
    well-typed admin fact allows."""
    assert check_row(POLICY, {"org": "acme", "locked": True}, Who("a", admin="yes")).reason
    assert not check_row(POLICY, {"org": "acme", "locked": True}, Who("a", admin=True)).reason
    assert check_row(POLICY, {"org": "acme", "locked": False}, Who("a", org=None)).reason
    assert check_row(POLICY, {"locked": False}, Who("a")).reason


rows = st.fixed_dictionaries({}, optional={
    "org": st.sampled_from(["acme", "umbrella", 1, None]),
    "locked": st.sampled_from([True, False, 0, 1, "no", None]),
})
principals = st.builds(
    Who, st.just("p"), st.sampled_from(["acme", "umbrella", None, 7]),
    st.sampled_from([True, False, "yes", 1, None]),
)


@given(rows, principals)
def test_the_affordance_is_the_policy_check(row: dict[str, Any], who: Who) -> None:
    """For any row and principal, the gate the affordance pass runs answers
    exactly what the command's row check answers."""
    thing = Thing.__new__(Thing)
    for name, value in row.items():
        setattr(thing, name, value)
    offered = affordances(thing, who)["update"]  # type: ignore[index]
    assert offered == check_row(POLICY, row, who)
    if offered.allowed:
        assert row.get("org") == who.org and type(row.get("org")) is str
        assert row.get("locked") is False or who.admin is True


def test_a_policy_gate_built_at_run_time_is_the_check() -> None:
    """row_policy_gate's gate (built here, not at import) judges the named
    fields of the aggregate with the policy, for its action."""
    gate = row_policy_gate("archive", POLICY, ["org", "locked"])

    @dataclass
    class Box:
        org: str
        locked: bool
        colour: str = "red"

        can_archive = gate

    assert gate.__name__ == "can_archive"
    cases: list[tuple[dict[str, Any], Who]] = [
        ({"org": "acme", "locked": False}, Who("a")),
        ({"org": "acme", "locked": True}, Who("a")),
        ({"org": "acme", "locked": True}, Who("a", admin=True)),
        ({"org": "umbrella", "locked": False}, Who("a")),
    ]
    for row, who in cases:
        offered = affordances(Box(**row), who)["archive"]  # type: ignore[index]
        assert offered == check_row(POLICY, row, who)
    assert affordances(Box("acme", False), Who("a"))["archive"].allowed  # type: ignore[index]
    assert not affordances(Box("acme", True), Who("a"))["archive"].allowed  # type: ignore[index]


def test_orderings_refuse_a_boolean_against_a_number() -> None:
    """An ordering of a boolean against a number, or involving None, is INVALID; mixed int
    and float, and two strings, still order."""
    for op in (Lt, Le, Gt, Ge):
        assert ev(op(Const(True), Const(2))) is INVALID
        assert ev(op(Const(2), Const(False))) is INVALID
        assert ev(op(Const(None), Const(None))) is INVALID
        assert ev(op(Const(1), Const(None))) is INVALID
    assert ev(Lt(Const(1), Const(2.5))) is True
    assert ev(Gt(Const("b"), Const("a"))) is True


def test_a_row_policy_outside_a_catalog_denies_what_it_cannot_read() -> None:
    """A row policy built for a gate and never registered may name an input
    or a binding: evaluated on a row, those read as missing and deny."""
    for predicate in (Eq(Var("x"), Const(1)), Eq(Field("task", "org"), Row("org"))):
        policy = RowPolicy(predicate, Reason("nope"))
        assert check_row(policy, {"org": "acme"}, Who("a")).reason == Reason("nope")


def test_a_row_holds_only_the_fields_the_aggregate_has() -> None:
    """A policy's row is the named attributes the aggregate has: a missing
    one is absent (never None, which some predicates would read as a
    value) and a method is no field."""

    class Thing:
        kept = 1
        empty = None

        def method(self) -> int:
            return 2

    row = row_of(Thing(), ["kept", "empty", "method", "missing"])
    assert row == {"kept": 1, "empty": None}
    # Absent, a missing owner denies even under a negation.
    policy = RowPolicy(Not(Contains(Fact("banned"), Row("missing"))), Reason("banned"))
    who = Who("a", facts={"banned": frozenset({"x"})})
    assert check_row(policy, row, who).reason == Reason("banned")
