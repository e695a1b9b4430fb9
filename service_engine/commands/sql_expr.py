"""The SQL of a declaration's expressions and constants, in the generated
function of a compiled command (`compile`).

An expression keeps the interpreter's strict semantics (`expr.evaluate`):
a value is ``jsonb``, SQL ``NULL`` is `INVALID` (a missing field or fact, a
mistyped operand), a JSON ``null`` is ``None``, and the helper functions
every compiled command calls (`PRELUDE`, created once in the engine's
schema before them) never coerce. A constant is a dollar-quoted JSON
literal, never a value spliced into the text; whether a field may hold a
value (`typecheck.admits`) is decided by `_admits_sql`.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..db.literals import dollar_quoted
from ..impacts.model import canonical_json
from .errors import NotCompilable
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
)
from .plan import encode_value
from .typecheck import ValueType

__all__ = ["PRELUDE", "SCHEMA"]

SCHEMA = "service_engine"


PRELUDE = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_canon(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE jsonb_typeof(v)
    WHEN 'array' THEN '[' || coalesce((SELECT string_agg({SCHEMA}.cmd_canon(e), ',' ORDER BY o)
                                       FROM jsonb_array_elements(v) WITH ORDINALITY x(e, o)), '')
                      || ']'
    WHEN 'object' THEN '{{' || coalesce((SELECT string_agg(to_jsonb(k)::text || ':'
                                         || {SCHEMA}.cmd_canon(e), ',' ORDER BY k COLLATE "C")
                                         FROM jsonb_each(v) x(k, e)), '') || '}}'
    ELSE v::text END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_kind(a jsonb, b jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $f$
  SELECT a IS NOT NULL AND b IS NOT NULL AND jsonb_typeof(a) <> 'null'
     AND jsonb_typeof(b) <> 'null' AND jsonb_typeof(a) = jsonb_typeof(b)
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_eq(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN {SCHEMA}.cmd_kind(a, b) THEN (a = b)::text::jsonb END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_ne(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN {SCHEMA}.cmd_kind(a, b) THEN (a <> b)::text::jsonb END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_cmp(a jsonb, b jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN NOT {SCHEMA}.cmd_kind(a, b) THEN NULL
    WHEN jsonb_typeof(a) = 'string' THEN
      CASE WHEN (a #>> '{{}}') COLLATE "C" < (b #>> '{{}}') COLLATE "C" THEN -1
           WHEN (a #>> '{{}}') = (b #>> '{{}}') THEN 0 ELSE 1 END
    WHEN jsonb_typeof(a) IN ('number', 'boolean') THEN
      CASE WHEN a < b THEN -1 WHEN a = b THEN 0 ELSE 1 END
    END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_not(a jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN jsonb_typeof(a) = 'boolean' THEN (a <> 'true'::jsonb)::text::jsonb END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_and(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN jsonb_typeof(a) = 'boolean' AND jsonb_typeof(b) = 'boolean'
    THEN (a = 'true'::jsonb AND b = 'true'::jsonb)::text::jsonb END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_or(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN jsonb_typeof(a) = 'boolean' AND jsonb_typeof(b) = 'boolean'
    THEN (a = 'true'::jsonb OR b = 'true'::jsonb)::text::jsonb END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_add(a jsonb, b jsonb, sign integer) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
  IF jsonb_typeof(a) = 'number' AND jsonb_typeof(b) = 'number' THEN
    RETURN to_jsonb(a::numeric + sign * b::numeric);
  END IF;
  RETURN NULL;
END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_int(a jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
  IF jsonb_typeof(a) = 'number' THEN
    RETURN a::numeric = trunc(a::numeric);
  END IF;
  RETURN false;
END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_fail(m text, d text, h text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
  IF h IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = m, DETAIL = d;
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = m, DETAIL = d, HINT = h;
END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_in(c jsonb, i jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN i IS NOT NULL AND jsonb_typeof(c) = 'array'
    THEN to_jsonb(EXISTS (SELECT 1 FROM jsonb_array_elements(c) e WHERE e = i)) END
$f$;
"""
"""The helper functions every compiled command calls (created once, before them).

``cmd_fail`` raises a run's typed error (its message, detail and hint) from
inside the expression that found it: a value's checks cost no statement of
their own.

The SQL ones are immutable through and through (a boolean becomes ``jsonb``
through its text, not the stable ``to_jsonb``), so Postgres inlines each
call without a subquery into the expression that makes it instead of
running it as a function of its own."""

_NUMERIC = (int, float)


def _lit(value: object) -> str:
    """A declaration's constant as a ``jsonb`` literal (dollar-quoted JSON);
    an enum member is its value (what its column holds). Raises
    `NotCompilable` for a constant JSON cannot carry."""
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        return f"{dollar_quoted(canonical_json(encode_value(value)))}::jsonb"
    except (TypeError, ValueError) as exc:
        raise NotCompilable(f"the constant {value!r} is not a JSON value: {exc}") from None


def _name_lit(text: str) -> str:
    return dollar_quoted(text)


def _canon(value: str) -> str:
    """The canonical JSON text of the ``jsonb`` ``value`` (`canonical_json`):
    a scalar's own text, a collection through ``cmd_canon``."""
    return (f"CASE WHEN jsonb_typeof({value}) IN ('array', 'object')"
            f" THEN {SCHEMA}.cmd_canon({value}) ELSE ({value})::text END")


def _canon_list(values: Sequence[str]) -> str:
    """The canonical JSON text of the list of the ``jsonb`` ``values``."""
    if not values:
        return "'[]'"
    return "'[' || " + " || ',' || ".join(_canon(v) for v in values) + " || ']'"


@dataclass(frozen=True, slots=True)
class _Scope:
    """How an expression's leaves read in the generated code."""

    bindings: Mapping[str, str]
    """Binding name -> the variable its field reads come from."""
    row: str | None = None


def _expr(e: Expr, scope: _Scope) -> str:
    if isinstance(e, Const):
        return _lit(e.value)
    if isinstance(e, Var):
        return f"inp -> {_name_lit(e.name)}"
    if isinstance(e, Fact):
        return "NULL::jsonb" if e.name.startswith("_") else f"facts -> {_name_lit(e.name)}"
    if isinstance(e, Field):
        var = scope.bindings.get(e.binding)
        if var is None or e.name.startswith("_"):
            return "NULL::jsonb"
        return f"{var} -> {_name_lit(e.name)}"
    if isinstance(e, Row):
        return "NULL::jsonb" if scope.row is None else f"{scope.row} -> {_name_lit(e.name)}"
    if isinstance(e, Not):
        return f"{SCHEMA}.cmd_not({_expr(e.operand, scope)})"
    if isinstance(e, Contains):
        collection, item = _expr(e.collection, scope), _expr(e.item, scope)
        if _scalar(e.item):
            # `cmd_in` inline (a call of it is not: it reads the elements):
            # an array holds a scalar exactly when it contains it.
            return (f"CASE WHEN ({item}) IS NOT NULL AND jsonb_typeof({collection}) = 'array'"
                    f" THEN (({collection}) @> jsonb_build_array({item}))::text::jsonb END")
        return f"{SCHEMA}.cmd_in({collection}, {item})"
    left, right = _expr(e.left, scope), _expr(e.right, scope)
    if isinstance(e, And):
        return f"{SCHEMA}.cmd_and({left}, {right})"
    if isinstance(e, Or):
        return f"{SCHEMA}.cmd_or({left}, {right})"
    if isinstance(e, Eq):
        return f"{SCHEMA}.cmd_eq({left}, {right})"
    if isinstance(e, Ne):
        return f"{SCHEMA}.cmd_ne({left}, {right})"
    if isinstance(e, Add | Sub):
        return f"{SCHEMA}.cmd_add({left}, {right}, {1 if isinstance(e, Add) else -1})"
    op = {Lt: "< 0", Le: "<= 0", Gt: "> 0", Ge: ">= 0"}[type(e)]
    return f"to_jsonb({SCHEMA}.cmd_cmp({left}, {right}) {op})"


def _scalar(e: Expr) -> bool:
    """Whether ``e`` is never an array or an object: an input or service
    value (each a scalar type), a scalar constant."""
    if isinstance(e, Var):
        return True
    if isinstance(e, Const):
        value = e.value.value if isinstance(e.value, enum.Enum) else e.value
        return value is None or type(value) in (str, int, float, bool)
    return False


def _admits_sql(value: str, target: ValueType) -> str:
    """SQL true when a field of ``target`` may hold ``value`` (`admits`)."""
    checks: list[str] = []
    base = target.base
    if base is bool:
        checks.append(f"jsonb_typeof({value}) = 'boolean'")
    elif base is int:
        checks.append(f"{SCHEMA}.cmd_int({value})")
    elif base is float:
        checks.append(f"jsonb_typeof({value}) = 'number'")
    elif base is str:
        checks.append(f"jsonb_typeof({value}) = 'string'")
    elif base is not None and base not in (uuid.UUID, datetime):
        checks.append(f"jsonb_typeof({value}) NOT IN ('null')")
    else:
        checks.append(f"jsonb_typeof({value}) = 'string'")
    if target.domain is not None:
        domain = ", ".join(_lit(v) for v in sorted(target.domain, key=repr))
        checks.append(f"{value} IN ({domain})")
    typed = " AND ".join(checks)  # each false for a JSON null
    if target.optional:
        return f"(jsonb_typeof({value}) = 'null' OR ({typed}))"
    return f"({typed})"
