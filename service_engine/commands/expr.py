"""Expressions of the command layer: pure values, evaluated strictly.

A requirement, a `set` effect, a row policy and a return field are small
expression trees built from these nodes::

    And(Eq(Field("post", "state"), Const("published")), Not(Field("post", "locked")))
    Contains(Fact("board_memberships"), Row("id"))

Evaluation never coerces: a missing field, a mistyped fact, an operand of
the wrong type, or a null in a comparison makes the result `INVALID`, and `truth` reads anything
but the boolean ``True`` as false (deny). `And` and `Or` are strict: an
invalid operand invalidates the whole expression even when the other side
would decide it. This module does no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeGuard

__all__ = [
    "INVALID",
    "Add",
    "And",
    "Const",
    "Contains",
    "Env",
    "Eq",
    "Expr",
    "Fact",
    "Field",
    "Ge",
    "Gt",
    "Le",
    "Lt",
    "Ne",
    "Not",
    "Or",
    "Row",
    "Sub",
    "Var",
    "evaluate",
    "references",
    "show",
    "truth",
]


class _Invalid(enum.Enum):
    INVALID = "invalid"

    def __repr__(self) -> str:
        return "INVALID"


INVALID = _Invalid.INVALID
"""The value of an expression over a missing field or mistyped operand."""


@dataclass(frozen=True, slots=True)
class Const:
    """A constant (str, int, bool, None, or a tuple of them)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Var:
    """A command input or service value, by name."""

    name: str


@dataclass(frozen=True, slots=True)
class Field:
    """A field of a bound entity (``Field("post", "state")``)."""

    binding: str
    name: str


@dataclass(frozen=True, slots=True)
class Row:
    """A field of the row a row policy is evaluated on."""

    name: str


@dataclass(frozen=True, slots=True)
class Fact:
    """A declared fact of the acting principal: its attribute ``name``, else
    ``principal.fact(name)``; missing when it has neither."""

    name: str


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr


@dataclass(frozen=True, slots=True)
class And:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Or:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Eq:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Ne:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Lt:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Le:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Gt:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Ge:
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Add:
    """``left + right`` over numbers (a same-field arithmetic `Set` proof)."""

    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Sub:
    """``left - right`` over numbers (a same-field arithmetic `Set` proof)."""

    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Contains:
    """``item`` is a member of ``collection`` (a set, frozenset, tuple or list)."""

    collection: Expr
    item: Expr


Expr: TypeAlias = (
    Const | Var | Field | Row | Fact | Not | And | Or | Eq | Ne | Lt | Le | Gt | Ge | Contains
    | Add | Sub
)

_LEAVES = (Const, Var, Field, Row, Fact)
_BINARY = (And, Or, Eq, Ne, Lt, Le, Gt, Ge, Add, Sub)


@dataclass(frozen=True, slots=True)
class Env:
    """What an expression can observe.

    ``values`` holds inputs and service values; ``bindings`` the bound
    entities (any object: fields are read as attributes); ``row`` the row a
    policy looks at (a mapping); ``principal`` the acting principal.
    """

    values: Mapping[str, Any]
    bindings: Mapping[str, object]
    row: Mapping[str, Any] | None = None
    principal: object = None


_MISSING = object()


def principal_fact(principal: object, name: str) -> Any:
    """The principal's fact ``name`` (an attribute, else ``fact(name)``), or `INVALID`."""
    if principal is None or name.startswith("_"):
        return INVALID
    value = getattr(principal, name, _MISSING)
    if value is not _MISSING and not callable(value):
        return value
    lookup = getattr(principal, "fact", None)
    if callable(lookup):
        try:
            return lookup(name)
        except (KeyError, LookupError):
            return INVALID
    return INVALID


def _same_kind(a: Any, b: Any) -> bool:
    # bool is an int in Python; here it is not comparable with one.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return True
    return type(a) is type(b) or a is None or b is None


def _ordered(op: Callable[[Any, Any], bool], a: Any, b: Any) -> Any:
    if a is None or b is None or not _same_kind(a, b):
        return INVALID
    try:
        return op(a, b)
    except TypeError:
        return INVALID


def evaluate(expr: Expr, env: Env) -> Any:
    """The value of ``expr`` in ``env``; `INVALID` where something is missing
    or mistyped. Never raises for a well-formed expression."""
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Var):
        return env.values.get(expr.name, INVALID)
    if isinstance(expr, Field):
        bound = env.bindings.get(expr.binding, _MISSING)
        if bound is _MISSING or bound is None or expr.name.startswith("_"):
            return INVALID
        if isinstance(bound, Mapping):
            return bound.get(expr.name, INVALID)
        value = getattr(bound, expr.name, _MISSING)
        return INVALID if value is _MISSING or callable(value) else value
    if isinstance(expr, Row):
        if env.row is None:
            return INVALID
        return env.row.get(expr.name, INVALID)
    if isinstance(expr, Fact):
        return principal_fact(env.principal, expr.name)
    if isinstance(expr, Not):
        value = evaluate(expr.operand, env)
        return (not value) if isinstance(value, bool) else INVALID
    if isinstance(expr, And | Or):
        left, right = evaluate(expr.left, env), evaluate(expr.right, env)
        if not isinstance(left, bool) or not isinstance(right, bool):
            return INVALID
        return (left and right) if isinstance(expr, And) else (left or right)
    if isinstance(expr, Contains):
        collection, item = evaluate(expr.collection, env), evaluate(expr.item, env)
        if item is INVALID or not isinstance(collection, set | frozenset | tuple | list):
            return INVALID
        try:
            return item in collection
        except TypeError:
            return INVALID
    left, right = evaluate(expr.left, env), evaluate(expr.right, env)
    if left is INVALID or right is INVALID:
        return INVALID
    if isinstance(expr, Add | Sub):
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right)):
            return INVALID
        return left + right if isinstance(expr, Add) else left - right
    if isinstance(expr, Eq | Ne):
        # A null compares as unknown (as in SQL): a fact or field that is
        # None never proves an equality.
        if left is None or right is None or not _same_kind(left, right):
            return INVALID
        return (left == right) if isinstance(expr, Eq) else (left != right)
    if isinstance(expr, Lt):
        return _ordered(lambda a, b: a < b, left, right)
    if isinstance(expr, Le):
        return _ordered(lambda a, b: a <= b, left, right)
    if isinstance(expr, Gt):
        return _ordered(lambda a, b: a > b, left, right)
    return _ordered(lambda a, b: a >= b, left, right)


def truth(value: Any) -> bool:
    """Only the boolean ``True`` is true; everything else (``INVALID``, a
    truthy non-boolean) denies."""
    return value is True


def references(expr: Expr) -> Iterator[Const | Var | Field | Row | Fact]:
    """Every leaf of ``expr``, left to right (what registration checks)."""
    if isinstance(expr, _LEAVES):
        yield expr
    elif isinstance(expr, Not):
        yield from references(expr.operand)
    elif isinstance(expr, Contains):
        yield from references(expr.collection)
        yield from references(expr.item)
    elif isinstance(expr, _BINARY):
        yield from references(expr.left)
        yield from references(expr.right)
    else:
        raise TypeError(f"not a command expression: {expr!r}")


def is_expr(value: object) -> TypeGuard[Expr]:
    """Whether ``value`` is an expression node."""
    return isinstance(value, (*_LEAVES, Not, Contains, *_BINARY))


_OPERATORS: dict[type, str] = {
    And: "and", Or: "or", Eq: "==", Ne: "!=", Lt: "<", Le: "<=", Gt: ">", Ge: ">=", Add: "+",
    Sub: "-",
}


def show(expr: object) -> str:
    """``expr`` as a reader writes it (``task.state == 'queued'``), for diagnostics."""
    if isinstance(expr, Const):
        return repr(expr.value)
    if isinstance(expr, Var):
        return expr.name
    if isinstance(expr, Field):
        return f"{expr.binding}.{expr.name}"
    if isinstance(expr, Row):
        return f"row.{expr.name}"
    if isinstance(expr, Fact):
        return f"Fact({expr.name!r})"
    if isinstance(expr, Not):
        return f"not {show(expr.operand)}"
    if isinstance(expr, Contains):
        return f"{show(expr.item)} in {show(expr.collection)}"
    if isinstance(expr, _BINARY):
        return f"({show(expr.left)} {_OPERATORS[type(expr)]} {show(expr.right)})"
    return repr(expr)
