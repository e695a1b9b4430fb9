"""Value types of the command layer, derived from the aggregate's own class
(pure: no I/O).

An entity's field types are its aggregate dataclass's annotations (a key
field may also be a typed property), never a second list: `field_types`
reads them once. A `ValueType` is a base type, whether ``None`` is
admitted, and, for an enum-like field (a ``Literal``, an ``Enum``, a
workflow's states), its closed domain. Registration types every expression
(`TypeScope.type_of`) and refuses a comparison, a `Set` value or a
transition the types cannot hold, naming the declaration.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Union, get_args, get_origin

from .expr import (
    Add,
    And,
    Const,
    Contains,
    Eq,
    Expr,
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
    Sub,
    Var,
    show,
)

__all__ = [
    "BOOL",
    "NULL",
    "UNKNOWN",
    "TypeScope",
    "ValueType",
    "admits",
    "assignable",
    "field_types",
    "value_type",
]

_COLLECTIONS: tuple[type, ...] = (set, frozenset, tuple, list)


@dataclass(frozen=True, slots=True)
class ValueType:
    """``base`` (``None``: not checked), whether ``None`` is admitted, and
    the closed ``domain`` of an enum-like value."""

    base: type | None
    optional: bool = False
    domain: frozenset[Any] | None = None

    def describe(self) -> str:
        if self.base is None:
            return "any"
        name = "None" if self.base is type(None) else self.base.__name__
        if self.domain is not None and len(self.domain) == 1:
            name = f"{_listed(self.domain)[1:-1]} ({name})"
        elif self.domain is not None:
            name = f"{name} in {_listed(self.domain)}"
        return f"{name} | None" if self.optional and self.base is not type(None) else name

    def with_domain(self, domain: frozenset[Any]) -> ValueType:
        return ValueType(self.base, self.optional, domain)


def _listed(values: frozenset[Any]) -> str:
    return "{" + ", ".join(sorted(map(repr, values))) + "}"


UNKNOWN = ValueType(None)
BOOL = ValueType(bool)
NULL = ValueType(type(None), optional=True)


def value_type(annotation: Any) -> ValueType:
    """The `ValueType` of a (resolved) annotation; `UNKNOWN` for one this
    layer does not check (a mapping, a class of the service's own)."""
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        args = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(args) < len(get_args(annotation))
        inner = value_type(args[0]) if len(args) == 1 else UNKNOWN
        return ValueType(inner.base, optional or inner.optional, inner.domain)
    if origin is Literal:
        values = get_args(annotation)
        kinds = {type(v) for v in values}
        base = kinds.pop() if len(kinds) == 1 else None
        return ValueType(base, domain=frozenset(values))
    if origin is not None:
        return ValueType(origin) if isinstance(origin, type) else UNKNOWN
    if annotation is Any or annotation is object:
        return UNKNOWN
    if annotation is None or annotation is type(None):
        return NULL
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return ValueType(annotation, domain=frozenset(annotation))
        return ValueType(annotation)
    return UNKNOWN


def field_types(aggregate: type) -> dict[str, ValueType]:
    """The typed fields of an aggregate dataclass, by name (its public
    init fields, then its typed properties)."""
    if not dataclasses.is_dataclass(aggregate):
        raise TypeError(f"{aggregate!r} is not a dataclass")
    hints = typing.get_type_hints(aggregate)
    found: dict[str, ValueType] = {}
    for f in dataclasses.fields(aggregate):
        if f.init and not f.name.startswith("_"):
            found[f.name] = value_type(hints.get(f.name, Any))
    for name in dir(aggregate):
        member = getattr(aggregate, name, None)
        if isinstance(member, property) and not name.startswith("_") and name not in found:
            returns = typing.get_type_hints(member.fget).get("return") if member.fget else None
            if returns is not None:
                found[name] = value_type(returns)
    return found


def _numeric(t: ValueType) -> bool:
    return t.base is not None and t.base is not bool and issubclass(t.base, int | float)


def comparable(a: ValueType, b: ValueType) -> bool:
    """Whether a comparison of values of these types can ever be valid."""
    if a.base is None or b.base is None or type(None) in (a.base, b.base):
        return True
    if (a.base is bool) != (b.base is bool):
        return False
    if _numeric(a) and _numeric(b):
        return True
    return issubclass(a.base, b.base) or issubclass(b.base, a.base)


def assignable(target: ValueType, value: ValueType) -> str | None:
    """Why ``value`` cannot be stored in a field of type ``target`` (``None``: it can)."""
    if value.base is type(None) or value.optional:
        if not target.optional:
            return f"may be None, the field is {target.describe()}"
        if value.base is type(None):
            return None
    if target.base is None or value.base is None:
        return None
    if (target.base is bool) != (value.base is bool):
        return f"is {value.describe()}, the field is {target.describe()}"
    if not (
        issubclass(value.base, target.base) or (target.base is float and _numeric(value))
    ):
        return f"is {value.describe()}, the field is {target.describe()}"
    if target.domain is not None and (value.domain is None or not value.domain <= target.domain):
        return (f"is {value.describe()}, the field holds only {_listed(target.domain)}"
                " (assign a declared constant)")
    return None


def admits(target: ValueType, value: object) -> bool:
    """Whether a field of type ``target`` may hold ``value`` (the run-time check)."""
    if value is None:
        return target.optional
    if target.domain is not None and value not in target.domain:
        return False
    base = target.base
    if base is None:
        return True
    if base is bool or isinstance(value, bool):
        return type(value) is base
    if base is float:
        return isinstance(value, int | float)
    return isinstance(value, base)


def const_type(value: object) -> ValueType:
    if value is None:
        return NULL
    if isinstance(value, _COLLECTIONS):
        return ValueType(type(value))
    return ValueType(type(value), domain=frozenset({value}))


class TypeScope:
    """What an expression may observe, typed: inputs and service values
    (``values``), bindings' fields (``bindings``), a row policy's row
    (``row``) and the declared principal facts (``facts``). ``type_of``
    answers an expression's type or the reason it is mistyped."""

    def __init__(
        self,
        values: Mapping[str, ValueType],
        bindings: Mapping[str, Mapping[str, ValueType]],
        facts: Mapping[str, ValueType],
        row: Mapping[str, ValueType] | None = None,
    ) -> None:
        self.values = values
        self.bindings = bindings
        self.facts = facts
        self.row = row

    def type_of(self, expr: Expr) -> ValueType:
        """The type of ``expr``; raises `TypeError` naming the mistyped part."""
        if isinstance(expr, Const):
            return const_type(expr.value)
        if isinstance(expr, Var):
            return self.values.get(expr.name, UNKNOWN)
        if isinstance(expr, Field):
            return self.bindings.get(expr.binding, {}).get(expr.name, UNKNOWN)
        if isinstance(expr, Row):
            return UNKNOWN if self.row is None else self.row.get(expr.name, UNKNOWN)
        if isinstance(expr, Fact):
            found = self.facts.get(expr.name)
            if found is None:
                raise LookupError(
                    f"Fact({expr.name!r}) is not a declared principal fact (declared: "
                    f"{sorted(self.facts)})"
                )
            return found
        if isinstance(expr, Not):
            self._boolean(expr.operand, expr)
            return BOOL
        if isinstance(expr, And | Or):
            self._boolean(expr.left, expr)
            self._boolean(expr.right, expr)
            return BOOL
        if isinstance(expr, Contains):
            collection = self.type_of(expr.collection)
            self.type_of(expr.item)
            if collection.base is not None and not issubclass(collection.base, _COLLECTIONS):
                raise TypeError(f"{show(expr)}: {collection.describe()} is not a collection")
            return BOOL
        if isinstance(expr, Add | Sub):
            left, right = self.type_of(expr.left), self.type_of(expr.right)
            for side in (left, right):
                if side.base is not None and not _numeric(side):
                    raise TypeError(f"{show(expr)}: arithmetic on {side.describe()}")
            if left.optional or right.optional:
                raise TypeError(f"{show(expr)}: arithmetic on a value that may be None")
            if left.base is int and right.base is int:
                return ValueType(int)
            return ValueType(float) if _numeric(left) and _numeric(right) else UNKNOWN
        left, right = self.type_of(expr.left), self.type_of(expr.right)
        if not comparable(left, right):
            raise TypeError(f"{show(expr)} compares {left.describe()} with {right.describe()}")
        if isinstance(expr, Lt | Le | Gt | Ge) and BOOL.base in (left.base, right.base):
            raise TypeError(f"{show(expr)} orders booleans")
        if isinstance(expr, Eq | Ne | Lt | Le | Gt | Ge):
            for one, other in ((left, right), (right, left)):
                if (
                    one.domain is not None and other.domain is not None
                    and isinstance(expr, Eq | Ne) and not one.domain & other.domain
                    and len(other.domain) == 1
                ):
                    raise TypeError(
                        f"{show(expr)}: {_listed(other.domain)[1:-1]} is not one of "
                        f"{_listed(one.domain)}"
                    )
        return BOOL

    def _boolean(self, operand: Expr, parent: Expr) -> None:
        found = self.type_of(operand)
        if found.base is not None and (found.base is not bool or found.optional):
            raise TypeError(f"{show(parent)}: {show(operand)} is {found.describe()}, not a bool")


def input_type(kind: type, optional: bool) -> ValueType:
    """An input's type (`uuid.UUID` and `datetime` included)."""
    return ValueType(kind, optional)


SERVICE_TYPES: Mapping[str, ValueType] = {
    "transaction_time": ValueType(datetime),
    "uuid_v7": ValueType(uuid.UUID),
}
