"""A checked command compiled once into one generated PL/pgSQL function.

`compile_command` turns a `CheckedCommand` into a `CompiledCommand`: the
``CREATE OR REPLACE FUNCTION`` of one function in the engine's schema,
named after the command and a digest of its checked declaration (a changed
declaration is a new function, never an edit of a running one), and the
call that runs it (`run_compiled`). One call decides and writes the whole
command in the caller's transaction, exactly as the interpreter (`runner`)
does, so a command's run is BEGIN, the call, and COMMIT with the impacts'
NOTIFY (three round trips, whatever it declares)::

    advisory locks (the idempotency key's, then every binding's, in the one
    fixed order computed here from the inputs)
    idempotency record read -> a stored outcome answers at once
    bindings' exact reads (FOR UPDATE), absence / existence outcomes
    requirements, transitions, sets, deletes, creates' defaults
    row policies (create; update on the current and proposed rows; delete)
    delete proofs: restrict (one indexed probe), cascade (bounded scan, each
    child read in the one fixed order and judged by its delete policy)
    unique occupancy claims (in the one fixed order; a held value answers
    its declared outcome and takes back the claims made)
    cascaded deletes, inserts, updates (the revision counted), deletes,
    occupancy releases and transfers
    the idempotency record (with the outcome, answers included)

and answers the outcome as JSON (with the rows written and their causes,
for the impacts the caller stages with the commit).

Why a generated function and not one SQL statement: a command decides in
sequence with early answers that must write nothing (a requirement after a
read, a held unique value after the claims before it were made), and
data-modifying CTEs of one statement all run against one snapshot, none
seeing another's writes, none able to stop the rest; a statement would
repeat every earlier condition in every later CTE. A function says it in
order, is planned once per session, and is created by the schema's owner
(the app role only executes it).

Values are never written into the SQL: the inputs, the principal's facts
and the run's control values are the call's three parameters (``jsonb``)
and its lock keys the fourth (``bigint[]``). Identifiers (tables, columns,
fields) come only from the checked declaration and are quoted; constants of
the declaration are dollar-quoted JSON literals.

Expressions keep the interpreter's strict semantics: a value is ``jsonb``,
SQL ``NULL`` is `INVALID` (a missing field or fact, a mistyped operand), a
JSON ``null`` is ``None``; the helper functions (`PRELUDE`) never coerce.
Two bindings of one row share one image, as the interpreter's one
aggregate object.

Every clause compiles: a `Permit` is its rules over the bound rows, inputs
and declared facts; a `Record` inserts into its soft-EDA store's facts
table with the row's write; an `Emit` evaluates its declared fields over
the rows as written and the caller stages the event (`cx.emit`) with the
commit. Every entity needs a table whose columns are its fields
(``Entity.table``, else its store's ``TABLE``); `NotCompilable` (raised at
registration) names what is missing. Known differences outside what
registration types: a tuple constant compared with a list fact, ``True``
contained in ``[1]``, an instant's text in a returned field (Postgres's
ISO form) and a uuid compared with a text are each decided on their JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import asyncpg

from ..clock import Timestamp
from ..db.errors import Stage
from ..db.literals import dollar_quoted
from ..db.locks import aggregate_lock_key
from ..impacts.model import Cause, JsonValue, canonical_json
from ..persistence.base import Aggregate, store_of
from ..persistence.crud import quote_ident
from ..pipeline import Ops
from .declaration import (
    Cascade,
    Caused,
    Create,
    Delete,
    Emit,
    Entity,
    Mutate,
    Permit,
    Read,
    Record,
    Require,
    Restrict,
    Set,
    Transition,
)
from .errors import CommandNotInstalled, NotCompilable, ValueMissing
from .expr import (
    INVALID,
    Add,
    And,
    Const,
    Contains,
    Env,
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
    evaluate,
    principal_fact,
    references,
)
from .outcomes import CommandOutcome
from .plan import (
    InvalidInput,
    encode_value,
    input_digest,
    lock_identity,
    order_by_lock,
    seal,
    validate_inputs,
)
from .rows import IdempotencyRecord
from .typecheck import ValueType

if TYPE_CHECKING:
    from .checked import CheckedCommand

__all__ = [
    "PRELUDE", "CompiledCommand", "NotCompilable", "compile_command", "compiled", "run_compiled",
]

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
  SELECT CASE WHEN {SCHEMA}.cmd_kind(a, b) THEN to_jsonb(a = b) END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_ne(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN {SCHEMA}.cmd_kind(a, b) THEN to_jsonb(a <> b) END
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
  SELECT CASE WHEN jsonb_typeof(a) = 'boolean' THEN to_jsonb(a <> 'true'::jsonb) END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_and(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN jsonb_typeof(a) = 'boolean' AND jsonb_typeof(b) = 'boolean'
    THEN to_jsonb(a = 'true'::jsonb AND b = 'true'::jsonb) END
$f$;
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_or(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN jsonb_typeof(a) = 'boolean' AND jsonb_typeof(b) = 'boolean'
    THEN to_jsonb(a = 'true'::jsonb OR b = 'true'::jsonb) END
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
CREATE OR REPLACE FUNCTION {SCHEMA}.cmd_in(c jsonb, i jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
  SELECT CASE WHEN i IS NOT NULL AND jsonb_typeof(c) = 'array'
    THEN to_jsonb(EXISTS (SELECT 1 FROM jsonb_array_elements(c) e WHERE e = i)) END
$f$;
"""
"""The helper functions every compiled command calls (created once, before them)."""

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
        return f"{SCHEMA}.cmd_in({_expr(e.collection, scope)}, {_expr(e.item, scope)})"
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
    typed = " AND ".join(checks)
    null = f"jsonb_typeof({value}) = 'null'"
    return f"(({null} AND {str(target.optional).lower()}) OR (NOT {null} AND {typed}))"


@dataclass(frozen=True, slots=True)
class CompiledCommand:
    """One checked command's generated function: its name, its ``CREATE``
    statement and what the call needs computed from the inputs."""

    command: CheckedCommand
    function: str
    """The function's quoted, schema-qualified name."""
    name: str
    """The function's own name (in the ``service_engine`` schema)."""
    ddl: str
    """``CREATE OR REPLACE FUNCTION ...`` (run once, as the schema's owner)."""
    facts: tuple[str, ...]
    """The principal facts the function reads."""
    described: Mapping[str, str]
    """Each set (``set binding.field``) -> its field's type, described (for
    the `InvalidInput` of a value the field cannot hold)."""

    @property
    def call(self) -> str:
        return f"SELECT {self.function}($1::jsonb, $2::jsonb, $3::jsonb, $4::bigint[])"

    def arguments(
        self, principal: Any, values: Mapping[str, object], now: datetime, retention: timedelta,
    ) -> tuple[dict[str, JsonValue], dict[str, JsonValue], dict[str, JsonValue], list[int]]:
        """The call's parameters for a run as ``principal`` with the validated
        ``values`` (service values sealed here): inputs, facts, control, locks."""
        command = self.command
        key = None if command.idempotency_key is None else str(values[command.idempotency_key])
        digest = "" if key is None else input_digest(command, values)
        run_values = dict(values)
        sealed: dict[str, JsonValue] = {}
        if command.services:
            sealed_values = seal(command.services, Timestamp(now))
            run_values.update(sealed_values)
            sealed = {name: encode_value(v) for name, v in sealed_values.items()}
        inputs = {name: encode_value(v) for name, v in run_values.items()}
        facts: dict[str, JsonValue] = {}
        for name in self.facts:
            value = principal_fact(principal, name)
            if value is not INVALID:
                with contextlib.suppress(TypeError):  # a fact JSON cannot carry: missing
                    facts[name] = encode_value(value)
        key_env = Env(run_values, {}, None, principal)
        keys: dict[str, JsonValue] = {}
        alias: dict[str, JsonValue] = {}
        pending: list[tuple[tuple[str, str], int]] = []
        for binding in command.bindings:
            entity = command.entities[binding.as_]
            parts = [evaluate(e, key_env) for e in binding.key]
            if any(p is INVALID or p is None for p in parts):
                keys[binding.as_] = None
                continue
            store_key = entity.key_of_values(dict(zip(entity.key, parts, strict=True)))
            keys[binding.as_] = {f: encode_value(p) for f, p in zip(entity.key, parts,
                                                                    strict=True)}
            store_type = store_of(entity.aggregate).store_type
            identity = lock_identity(store_type, store_key)
            alias[binding.as_] = canonical_json(list(identity))
            pending.append((identity, aggregate_lock_key(store_type, encode_value(store_key))))
        locks = [lock for _, lock in order_by_lock(pending, lambda p: p[0])]
        control: dict[str, JsonValue] = {"keys": keys, "alias": alias, "sealed": sealed}
        if key is not None:
            scope = _scope(principal)
            record_key = [command.name, scope, key]
            store_type = IdempotencyRecord.Store.store_type
            locks.insert(0, aggregate_lock_key(store_type, record_key))
            control.update(scope=scope, key=key, digest=digest, now=now.isoformat(),
                           since=(now - retention).isoformat())
        return inputs, facts, control, locks

    def outcome(self, answer: Mapping[str, Any], sealed: Mapping[str, JsonValue]) -> CommandOutcome:
        """The typed outcome of the function's answer."""
        if "replay" in answer:
            return CommandOutcome.from_record(self.command.name, answer["replay"],
                                              answer.get("sealed") or {})
        if answer.get("conflict"):
            return CommandOutcome(self.command.name, answer["name"], False)
        return CommandOutcome(self.command.name, answer["name"], bool(answer["ok"]),
                              dict(answer.get("data") or {}), dict(sealed))

    def events(self, answer: Mapping[str, Any]) -> list[Any]:
        """The integration events a successful run emits, built from the
        fields the function evaluated, in the declaration's order."""
        if not answer.get("ok"):
            return []  # a declared outcome, a replay: nothing is emitted
        emits = [e for e in self.command.effects if isinstance(e, Emit)]
        return [clause.event(**fields)
                for clause, fields in zip(emits, answer.get("emits") or (), strict=True)]

    def rows(self, answer: Mapping[str, Any]) -> list[tuple[type[Aggregate], JsonValue]]:
        """``(aggregate class, store key)`` of every row the run wrote (each
        row a cascade deleted, then each written binding): what the offers
        carrying them re-publish, as the pipeline's own writes mark them."""
        catalog = self.command.catalog
        found: list[tuple[type[Aggregate], JsonValue]] = []
        for written in answer.get("written") or ():
            entity = catalog.entities[written["e"]]
            parts = [written["k"][f] for f in entity.key]
            found.append((cast(type[Aggregate], entity.aggregate),
                          parts[0] if len(parts) == 1 else parts))
        return found

    def impacts(self, answer: Mapping[str, Any]) -> list[tuple[str, JsonValue, Cause | None]]:
        """``(noun, key, cause)`` of every impact the run stages: each row a
        cascade deleted, then each written binding, under its entity's nouns,
        keyed by its store key."""
        staged: list[tuple[str, JsonValue, Cause | None]] = []
        causes = answer.get("causes") or {}
        catalog = self.command.catalog
        for written in answer.get("written") or ():
            name, key_values = written.get("b"), written["k"]
            entity = catalog.entities[written["e"]]
            parts = [key_values[f] for f in entity.key]
            store_key: JsonValue = parts[0] if len(parts) == 1 else parts
            for noun in entity.nouns:
                cause = None if name is None else causes.get(name, {}).get(noun)
                staged.append((noun, store_key, None if cause is None else
                               Cause(cause["name"], cause["data"])))
        return staged


def _scope(principal: object) -> str:
    ident = getattr(principal, "id", None)
    return "" if ident is None else str(ident)


def _digest(body: str) -> str:
    """A digest of the function's text: a changed declaration, table or
    policy is a new function, never an edit of one a running pod calls."""
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def _snake(name: str) -> str:
    out = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return "".join(c for c in out if c.isalnum() or c == "_")[:40]


def _defaults(entity: Entity) -> dict[str, object]:
    """The dataclass defaults of ``entity``'s fields (what a create leaves unset)."""
    found: dict[str, object] = {}
    if dataclasses.is_dataclass(entity.aggregate):
        for f in dataclasses.fields(entity.aggregate):
            if f.default is not dataclasses.MISSING:
                found[f.name] = f.default
    return found


def compile_command(
    command: CheckedCommand, tables: Mapping[str, str] | None = None,
) -> CompiledCommand:
    """``command``'s generated function; ``tables`` maps an entity name to
    the table holding its rows (one column per field, named as the field;
    default: each entity's `Entity.table_name`). Raises `NotCompilable` for
    what the compiler does not translate."""
    involved = list(command.entities.values())
    for step in command.deletes.values():
        policy = step.entity.delete_policy
        if isinstance(policy, Cascade):
            involved += [command.catalog.entities[edge.entity] for edge in policy.edges]
    known = dict(tables or {})
    for entity in involved:
        if entity.name in known:
            continue
        table = entity.table_name
        if table is None:
            raise NotCompilable(
                f"command {command.name}: entity {entity.name} names no table: declare "
                "Entity(table=...) or give its store a TABLE (one column per field)"
            )
        known[entity.name] = table
    for clause in command.effects:
        if isinstance(clause, Record) and command.entities[clause.binding].fact_log is None:
            raise NotCompilable(f"command {command.name}: record on {clause.binding}: its "
                                "store keeps no facts table")
    gen = _Generator(command, known)
    body = gen.body()
    name = f"cmd_{_snake(command.name)}_{_digest(body)}"
    function = f'{SCHEMA}."{name}"'
    ddl = (
        f"CREATE OR REPLACE FUNCTION {function}(inp jsonb, facts jsonb, ctl jsonb, locks bigint[])"
        f" RETURNS jsonb LANGUAGE plpgsql VOLATILE SET timezone = 'UTC' AS $body$\n{body}\n$body$"
    )
    return CompiledCommand(command, function, name, ddl, tuple(sorted(gen.facts)),
                           gen.described)


_COMPILED: dict[int, tuple[CheckedCommand, CompiledCommand]] = {}


def compiled(command: CheckedCommand) -> CompiledCommand:
    """``command``'s function over its entities' own tables, compiled on
    first use (registration compiles every command, so a declaration the
    compiler refuses fails boot; declarations live for the process)."""
    found = _COMPILED.get(id(command))
    if found is not None and found[0] is command:
        return found[1]
    made = compile_command(command)
    _COMPILED[id(command)] = (command, made)
    return made


class _Generator:
    def __init__(self, command: CheckedCommand, tables: Mapping[str, str]) -> None:
        self.command = command
        self.tables = tables
        self.index = {b.as_: i for i, b in enumerate(command.bindings)}
        self.facts: set[str] = set()
        self.described: dict[str, str] = {}
        """Each set's ``what`` -> its field's type, described."""

    def var(self, name: str, kind: str) -> str:
        return f"{kind}{self.index[name]}"

    def scope(self, *, after: bool = False, row: str | None = None) -> _Scope:
        views: dict[str, str] = {}
        for b in self.command.bindings:
            if isinstance(b, Create) or after:
                views[b.as_] = self.var(b.as_, "n")
            else:
                views[b.as_] = self.var(b.as_, "r")
        return _Scope(views, row)

    def expr(self, e: Expr, scope: _Scope) -> str:
        for leaf in references(e):
            if isinstance(leaf, Fact):
                self.facts.add(leaf.name)
        return _expr(e, scope)

    def sync(self, name: str) -> str:
        """After ``name``'s aggregate changed: the bindings bound to the same
        row (the same entity and key: the interpreter's one aggregate object)
        see the change."""
        i = self.index[name]
        entity = self.command.entities[name].name
        lines = [f" IF ctl -> 'alias' ->> {_name_lit(name)} = ctl -> 'alias' ->> {_name_lit(b.as_)}"
                 f" THEN n{self.index[b.as_]} := n{i}; END IF;"
                 for b in self.command.bindings
                 if b.as_ != name and self.command.entities[b.as_].name == entity]
        return "".join(lines)

    def table(self, entity: Entity) -> str:
        return quote_ident(self.tables[entity.name])

    def body(self) -> str:
        c = self.command
        decl = ["DECLARE", "  l bigint;", "  rec record;", "  v jsonb;", "  ok boolean;",
                "  out_name text;", "  out_ok boolean := false;", "  out_data jsonb := '{}';",
                "  written jsonb := '[]';", "  causes jsonb := '{}';",
                "  claims jsonb := '[]';", "  releases jsonb := '[]';", "  made jsonb := '[]';",
                "  transfers jsonb := '[]';", "  claim jsonb;", "  children jsonb := '[]';",
                "  taken jsonb := '[]';", "  emits jsonb := '[]';"]
        for b in c.bindings:
            i = self.index[b.as_]
            decl += [f"  r{i} jsonb;", f"  n{i} jsonb;", f"  ch{i} boolean := false;",
                     f"  d{i} boolean := false;", f"  f{i} jsonb := '[]';",
                     f"  k{i} jsonb := ctl -> 'keys' -> {_name_lit(b.as_)};"]
        s: list[str] = ["BEGIN", "  FOREACH l IN ARRAY locks LOOP",
                        "    PERFORM pg_advisory_xact_lock(l);", "  END LOOP;"]
        if c.idempotency_key is not None:
            s += [
                "  SELECT input_digest, outcome, sealed, recorded_at INTO rec"
                " FROM service_engine.command_idempotency"
                f" WHERE command = {_name_lit(c.name)} AND scope = ctl ->> 'scope'"
                " AND key = ctl ->> 'key';",
                "  IF FOUND AND rec.recorded_at >= (ctl ->> 'since')::timestamptz THEN",
                "    IF rec.input_digest <> ctl ->> 'digest' THEN",
                "      RETURN jsonb_build_object('name', 'IdempotencyConflict', 'ok', false,"
                " 'conflict', true);",
                "    END IF;",
                "    RETURN jsonb_build_object('replay', rec.outcome, 'sealed', rec.sealed);",
                "  END IF;",
            ]
        s += ["  <<decide>>", "  BEGIN"]
        s += self.bind()
        s += self.require()
        s += self.effects()
        s += self.construct()
        s += self.policies()
        s += self.delete_proofs()
        s += self.occupancy()
        s += self.write()
        s += self.returns()
        s += ["  END decide;"]
        if c.idempotency_key is not None:
            s += [
                "  WITH swept AS (DELETE FROM service_engine.command_idempotency WHERE ctid IN ("
                " SELECT ctid FROM service_engine.command_idempotency"
                " WHERE recorded_at < (ctl ->> 'since')::timestamptz"
                " ORDER BY recorded_at LIMIT 2 FOR UPDATE SKIP LOCKED))"
                " INSERT INTO service_engine.command_idempotency"
                " (command, scope, key, input_digest, outcome, sealed, recorded_at)"
                f" VALUES ({_name_lit(c.name)}, ctl ->> 'scope', ctl ->> 'key',"
                " ctl ->> 'digest', jsonb_build_object('name', out_name, 'ok', out_ok,"
                " 'data', out_data), ctl -> 'sealed', (ctl ->> 'now')::timestamptz)"
                " ON CONFLICT (command, scope, key) DO UPDATE SET"
                " input_digest = EXCLUDED.input_digest, outcome = EXCLUDED.outcome,"
                " sealed = EXCLUDED.sealed, recorded_at = EXCLUDED.recorded_at;",
            ]
        s += ["  RETURN jsonb_build_object('name', out_name, 'ok', out_ok, 'data', out_data,"
              " 'written', CASE WHEN out_ok THEN written ELSE '[]' END, 'causes', causes,"
              " 'emits', CASE WHEN out_ok THEN emits ELSE '[]' END);",
              "END"]
        return "\n".join(decl + s)

    @staticmethod
    def answer(name: str, data: str = "'{}'::jsonb", indent: str = "    ") -> list[str]:
        return [f"{indent}out_name := {_name_lit(name)}; out_data := {data};",
                f"{indent}EXIT decide;"]

    def bind(self) -> list[str]:
        c = self.command
        s: list[str] = []
        # Reads in the lock order the call's arguments computed (each row
        # locked as it is read): a binding whose key was invalid reads nothing.
        for b in c.bindings:
            i = self.index[b.as_]
            entity = c.entities[b.as_]
            cols = ", ".join(f"p.{quote_ident(f)}" for f in entity.key)
            match = ", ".join(f"t.{quote_ident(f)}" for f in entity.key)
            s += [f"    IF k{i} IS NOT NULL AND jsonb_typeof(k{i}) = 'object' THEN",
                  f"      SELECT to_jsonb(t) INTO r{i} FROM {self.table(entity)} t"
                  f" WHERE ({match}) = (SELECT {cols} FROM jsonb_populate_record("
                  f"NULL::{self.table(entity)}, k{i}) p) FOR UPDATE;",
                  "    END IF;"]
        for b in c.bindings:
            i = self.index[b.as_]
            s += [f"    IF k{i} IS NULL OR jsonb_typeof(k{i}) <> 'object' THEN",
                  *self.answer(b.else_.name, indent="      "), "    END IF;"]
            if isinstance(b, Create):
                s += [f"    IF r{i} IS NOT NULL THEN", *self.answer(b.else_.name, indent="      "),
                      "    END IF;", f"    n{i} := k{i};"]
            else:
                s += [f"    IF r{i} IS NULL THEN", *self.answer(b.else_.name, indent="      "),
                      "    END IF;", f"    n{i} := r{i};"]
        return s

    def require(self) -> list[str]:
        s: list[str] = []
        for clause in self.command.requirements:
            if isinstance(clause, Require):
                pred = self.expr(clause.predicate, self.scope())
                s += [f"    IF ({pred}) IS DISTINCT FROM 'true'::jsonb THEN",
                      *self.answer(clause.else_.name, indent="      "), "    END IF;"]
                continue
            assert isinstance(clause, Permit)
            for rule in clause.rules:
                # Any condition true passes; each is judged on its own.
                passes = " OR ".join(
                    f"({self.expr(condition, self.scope())}) IS NOT DISTINCT FROM 'true'::jsonb"
                    for condition in rule.conditions
                )
                data = (f"jsonb_build_object('reason', {_name_lit(rule.reason.code)},"
                        f" 'action', {_name_lit(clause.action)})")
                s += [f"    IF NOT ({passes}) THEN",
                      *self.answer("Refused", data, indent="      "), "    END IF;"]
        return s

    def effects(self) -> list[str]:
        c = self.command
        s: list[str] = []
        scope = self.scope()
        for clause in c.effects:
            if isinstance(clause, Transition):
                step = c.transitions[clause.on]
                i = self.index[clause.on]
                entity = c.entities[clause.on]
                revision = _name_lit(entity.revision or "")
                expected = self.expr(clause.revision, scope)
                sources = ", ".join(_lit(v) for v in step.move.sources)
                state = _name_lit(step.workflow.state)
                s += [f"    v := {expected};",
                      f"    IF NOT coalesce({SCHEMA}.cmd_int(v) AND"
                      f" jsonb_typeof(r{i} -> {revision}) = 'number' AND v = r{i} -> {revision},"
                      " false) THEN",
                      *self.answer(clause.stale.name, indent="      "), "    END IF;",
                      f"    IF (n{i} -> {state}) IS NULL OR (n{i} -> {state}) NOT IN ({sources})"
                      " THEN", *self.answer(clause.illegal.name, indent="      "), "    END IF;",
                      f"    n{i} := n{i} || jsonb_build_object({state}, {_lit(step.move.to)});"
                      + self.sync(clause.on),
                      f"    ch{i} := true;"]
            elif isinstance(clause, Set):
                i = self.index[clause.binding]
                entity = c.entities[clause.binding]
                value = self.expr(clause.value, scope)
                what = f"set {clause.binding}.{clause.field}"
                self.described[what] = entity.fields[clause.field].describe()
                s += [f"    v := {value};",
                      "    IF v IS NULL THEN RAISE EXCEPTION USING ERRCODE = 'P0001',"
                      f" MESSAGE = 'service_engine.command_invalid', DETAIL = {_name_lit(what)};"
                      " END IF;",
                      f"    IF NOT {_admits_sql('v', entity.fields[clause.field])} THEN"
                      " RAISE EXCEPTION USING ERRCODE = 'P0001',"
                      f" MESSAGE = 'service_engine.command_input', DETAIL = {_name_lit(what)},"
                      " HINT = v::text; END IF;",
                      f"    n{i} := n{i} || jsonb_build_object({_name_lit(clause.field)}, v);"
                      + self.sync(clause.binding)]
                if not isinstance(c.bindings[i], Create):
                    s.append(f"    ch{i} := true;")
            elif isinstance(clause, Delete):
                s.append(f"    d{self.index[clause.binding]} := true;")
            elif isinstance(clause, Record):
                i = self.index[clause.binding]
                s.append("    v := '{}'::jsonb;")
                for k, e in clause.data.items():
                    s += self.valued(f"v := v || jsonb_build_object({_name_lit(k)}, claim);",
                                     self.expr(e, scope), k)
                s += [f"    f{i} := f{i} || jsonb_build_array(jsonb_build_object('t',"
                      f" {_name_lit(clause.type)}, 'd', v));"]
                if not isinstance(c.bindings[i], Create):
                    s.append(f"    ch{i} := true;")
            elif isinstance(clause, Caused):
                s.append("    v := '{}'::jsonb;")
                for k, e in clause.data.items():
                    s += self.valued(f"v := v || jsonb_build_object({_name_lit(k)}, claim);",
                                     self.expr(e, scope), f"caused {clause.name}: {k}")
                s += [f"    causes := jsonb_set(causes, ARRAY[{_name_lit(clause.binding)}],"
                      f" coalesce(causes -> {_name_lit(clause.binding)}, '{{}}') ||"
                      f" jsonb_build_object({_name_lit(clause.noun)}, jsonb_build_object("
                      f"'name', {_name_lit(clause.name)}, 'data', v)));"]
        return s

    def construct(self) -> list[str]:
        s: list[str] = []
        for b in self.command.bindings:
            if not isinstance(b, Create):
                continue
            i = self.index[b.as_]
            entity = self.command.entities[b.as_]
            defaults = _defaults(entity)
            if entity.revision is not None:
                defaults.setdefault(entity.revision, 1)
            for name in entity.all_fields:
                if name in defaults:
                    s.append(f"    IF NOT n{i} ? {_name_lit(name)} THEN n{i} := n{i} ||"
                             f" jsonb_build_object({_name_lit(name)}, {_lit(defaults[name])});"
                             " END IF;")
                else:
                    s.append(f"    IF NOT n{i} ? {_name_lit(name)} THEN RAISE EXCEPTION USING"
                             " ERRCODE = 'P0001', MESSAGE = 'service_engine.command_invalid',"
                             f" DETAIL = {_name_lit(f'create {b.as_}: {name} unset')}; END IF;")
        return s

    def refuse(self, policy: Any, row: str, action: str, when: str = "") -> list[str]:
        pred = self.expr(policy.predicate, _Scope({}, row))
        data = (f"jsonb_build_object('reason', {_name_lit(policy.reason.code)},"
                f" 'action', {_name_lit(action)})")
        return [f"    IF {when}({pred}) IS DISTINCT FROM 'true'::jsonb THEN",
                *self.answer("Refused", data, indent="      "), "    END IF;"]

    def policies(self) -> list[str]:
        s: list[str] = []
        for b in self.command.bindings:
            i = self.index[b.as_]
            entity = self.command.entities[b.as_]
            checks: list[str] = []
            if isinstance(b, Create) and entity.create_policy is not None:
                checks += self.refuse(entity.create_policy, f"n{i}", "create")
            elif isinstance(b, Mutate) and entity.update_policy is not None:
                checks += self.refuse(entity.update_policy, f"r{i}", "update", f"ch{i} AND ")
                checks += self.refuse(entity.update_policy, f"n{i}", "update", f"ch{i} AND ")
            if b.as_ in self.command.deletes:
                # The row as it is (what the delete affordance judged).
                check = entity.delete_check
                s += [f"    IF d{i} THEN",
                      *(self.refuse(check, f"r{i}", "delete") if check is not None else []),
                      "    ELSE", *checks, "    END IF;"]
            else:
                s += checks
        return s

    def typed(self, table: str, columns: Sequence[str], values: Sequence[str]) -> str:
        """The ``columns`` of ``table`` holding the ``jsonb`` ``values``, typed
        as the table types them (a row of ``jsonb_populate_record``)."""
        pairs = ", ".join(f"{_name_lit(c)}, {v}" for c, v in zip(columns, values, strict=True))
        cols = ", ".join(f"p.{quote_ident(c)}" for c in columns)
        return (f"(SELECT {cols} FROM jsonb_populate_record(NULL::{table},"
                f" jsonb_build_object({pairs})) p)")

    def delete_proofs(self) -> list[str]:
        c = self.command
        catalog = c.catalog
        s: list[str] = []
        for name, step in c.deletes.items():
            i = self.index[name]
            policy = step.entity.delete_policy
            target = [f"k{i} -> {_name_lit(f)}" for f in step.entity.key]
            if isinstance(policy, Restrict):
                for ref in policy.indexes:
                    child = catalog.entities[ref.entity]
                    index = child.index(ref.index)
                    assert index is not None and step.clause.referenced is not None
                    t = quote_ident(index.table)
                    cols = index.sql_columns[: len(target)]
                    match = ", ".join(f"t.{quote_ident(col)}" for col in cols)
                    s += [f"    IF d{i} AND EXISTS (SELECT 1 FROM {t} t WHERE ({match}) ="
                          f" {self.typed(t, cols, target)}) THEN",
                          *self.answer(step.clause.referenced.name, indent="      "),
                          "    END IF;"]
            elif isinstance(policy, Cascade):
                for edge in policy.edges:
                    child = catalog.entities[edge.entity]
                    index = child.index(edge.index)
                    assert index is not None and step.clause.too_many is not None
                    t = quote_ident(index.table)
                    cols = index.sql_columns[: len(target)]
                    match = ", ".join(f"t.{quote_ident(col)}" for col in cols)
                    key_columns = index.key_columns if index.key_columns is not None else (
                        child.key)
                    found = ", ".join(f"{_name_lit(f)}, to_jsonb(t.{quote_ident(col)})"
                                      for f, col in zip(child.key, key_columns, strict=True))
                    order = ", ".join(f"t.{quote_ident(col)}" for col in key_columns)
                    store_type = store_of(child.aggregate).store_type
                    key_text = (_canon("x -> " + _name_lit(child.key[0])) if len(child.key) == 1
                                else _canon_list([f"x -> {_name_lit(f)}" for f in child.key]))
                    data = f"jsonb_build_object('maximum', {edge.maximum:d})"
                    s += [f"    IF d{i} THEN",
                          "      SELECT coalesce(jsonb_agg(x), '[]') INTO v FROM (SELECT"
                          f" jsonb_build_object({found}) x FROM {t} t WHERE ({match}) ="
                          f" {self.typed(t, cols, target)} ORDER BY {order}"
                          f" LIMIT {edge.maximum + 1:d}) q;",
                          f"      IF jsonb_array_length(v) > {edge.maximum:d} THEN",
                          *self.answer(step.clause.too_many.name, data, indent="        "),
                          "      END IF;",
                          "      children := children || (SELECT coalesce(jsonb_agg("
                          f"jsonb_build_object('e', {_name_lit(child.name)}, 'k', x, 's',"
                          f" to_jsonb({_name_lit(store_type)} || chr(1) ||"
                          f" ({key_text})))), '[]') FROM jsonb_array_elements(v) q(x));",
                          "    END IF;"]
        s += self.children()
        return s

    def child_entities(self) -> list[Entity]:
        found: dict[str, Entity] = {}
        for step in self.command.deletes.values():
            policy = step.entity.delete_policy
            if isinstance(policy, Cascade):
                for edge in policy.edges:
                    found.setdefault(edge.entity, self.command.catalog.entities[edge.entity])
        return list(found.values())

    def children(self) -> list[str]:
        """Every row a cascade takes, read (locked) in the one fixed order and
        judged by its own delete row policy; a row gone since is skipped."""
        entities = self.child_entities()
        if not entities:
            return []
        s = ["    FOR claim IN SELECT y.x FROM (SELECT DISTINCT ON (x ->> 's') x, x ->> 's' AS s"
             " FROM jsonb_array_elements(children) WITH ORDINALITY q(x, n)"
             " ORDER BY x ->> 's', n) y ORDER BY y.s COLLATE \"C\" LOOP"]
        for child in entities:
            t = quote_ident(self.tables[child.name])
            match = ", ".join(f"t.{quote_ident(f)}" for f in child.key)
            keys = ", ".join(f"q.{quote_ident(f)}" for f in child.key)
            s += [f"      IF claim ->> 'e' = {_name_lit(child.name)} THEN",
                  f"        SELECT to_jsonb(t) INTO v FROM {t} t WHERE ({match}) = (SELECT {keys}"
                  f" FROM jsonb_populate_record(NULL::{t}, claim -> 'k') q) FOR UPDATE;",
                  "        CONTINUE WHEN v IS NULL;"]
            check = child.delete_check
            if check is not None:
                s += ["  " + line for line in self.refuse(check, "v", "delete")]
            s += ["        taken := taken || jsonb_build_array(claim ||"
                  " jsonb_build_object('r', v));",
                  "      END IF;"]
        return [*s, "    END LOOP;"]

    def occupancy(self) -> list[str]:
        c = self.command
        s: list[str] = []
        for b in c.bindings:
            entity = c.entities[b.as_]
            if not entity.unique or isinstance(b, Read):
                continue
            i = self.index[b.as_]
            route = len(entity.partition_by)
            key_values = [f"k{i} -> {_name_lit(f)}" for f in entity.key]
            owner = (_canon(key_values[0]) if len(entity.key) == 1 else _canon_list(key_values))
            taken = b.taken if isinstance(b, Mutate | Create) else {}
            for unique in entity.unique:
                def occ(
                    row: str, unique: Any = unique, route: int = route
                ) -> tuple[str, str, str]:
                    values = [f"{row} -> {_name_lit(f)}" for f in unique.fields]
                    present = " AND ".join(f"jsonb_typeof({v}) IS DISTINCT FROM 'null'"
                                           f" AND {v} IS NOT NULL" for v in values)
                    part = f"({_canon_list(values[:route])})"
                    val = f"({_canon_list(values[route:])})"
                    return present, part, val

                a_present, a_part, a_val = occ(f"n{i}")
                outcome = taken.get(unique.name)
                entry = (f"jsonb_build_object('e', {_name_lit(entity.name)}, 'i',"
                         f" {_name_lit(unique.name)}, 'p', {a_part}, 'v', {a_val}")
                if isinstance(b, Create):
                    s += [f"    IF {a_present} THEN",
                          f"      claims := claims || jsonb_build_array({entry}, 'o',"
                          f" {_name_lit(outcome.name if outcome else '')}, 'w', {owner}));",
                          "    END IF;"]
                    continue
                b_present, b_part, b_val = occ(f"r{i}")
                before = (f"jsonb_build_object('e', {_name_lit(entity.name)}, 'i',"
                          f" {_name_lit(unique.name)}, 'p', {b_part}, 'v', {b_val})")
                release = (f"IF {b_present} THEN releases := releases ||"
                           f" jsonb_build_array({before}); END IF;")
                if b.as_ in c.deletes:
                    # A deleted row gives up its values, claims none.
                    s += [f"    IF d{i} THEN {release}", "    ELSE"]
                s += [f"    IF {a_present} AND NOT (({b_present}) AND {a_part} = {b_part}"
                      f" AND {a_val} = {b_val}) THEN",
                      f"      claims := claims || jsonb_build_array({entry}, 'o',"
                      f" {_name_lit(outcome.name if outcome else '')}, 'w', {owner}));",
                      f"      {release}",
                      "    END IF;"]
                if b.as_ in c.deletes:
                    s.append("    END IF;")
        # Children a cascade removes give up their unique values too.
        for child in self.child_entities():
            route = len(child.partition_by)
            for unique in child.unique:
                values = [f"x -> 'r' -> {_name_lit(f)}" for f in unique.fields]
                present = " AND ".join(f"jsonb_typeof({v}) IS DISTINCT FROM 'null'"
                                       f" AND {v} IS NOT NULL" for v in values)
                s.append(
                    "    releases := releases || (SELECT coalesce(jsonb_agg(jsonb_build_object("
                    f"'e', {_name_lit(child.name)}, 'i', {_name_lit(unique.name)}, 'p',"
                    f" ({_canon_list(values[:route])}), 'v', ({_canon_list(values[route:])}))),"
                    f" '[]') FROM jsonb_array_elements(taken) q(x) WHERE x ->> 'e' ="
                    f" {_name_lit(child.name)} AND {present});")
        if not s:
            return s
        # Claims in the one fixed order (the canonical text of each value's
        # key, as the interpreter's lock order sorts it), the first of
        # equal values kept.
        s += [
            "    FOR claim IN SELECT x.c FROM (SELECT DISTINCT ON (t.id) t.c, t.id FROM"
            " (SELECT e AS c,"
            " ('[' || (e -> 'e')::text || ',' || (e -> 'i')::text || ',' || (e -> 'p')::text"
            " || ',' || (e -> 'v')::text || ']')"
            " COLLATE \"C\" AS id, n FROM jsonb_array_elements(claims) WITH ORDINALITY q(e, n)) t"
            " ORDER BY t.id, t.n) x ORDER BY x.id LOOP",
            "      INSERT INTO service_engine.command_occupancy"
            " (entity, index_name, partition, value, owner) VALUES (claim ->> 'e', claim ->> 'i',"
            " claim ->> 'p', claim ->> 'v', claim ->> 'w') ON CONFLICT DO NOTHING"
            " RETURNING true INTO ok;",
            "      IF ok THEN made := made || jsonb_build_array(claim); CONTINUE; END IF;",
            "      IF releases @> jsonb_build_array(jsonb_build_object('e', claim -> 'e', 'i',"
            " claim -> 'i', 'p', claim -> 'p', 'v', claim -> 'v')) THEN",
            "        transfers := transfers || jsonb_build_array(claim); CONTINUE;",
            "      END IF;",
            "      IF (SELECT owner FROM service_engine.command_occupancy WHERE entity ="
            " claim ->> 'e' AND index_name = claim ->> 'i' AND partition = claim ->> 'p'"
            " AND value = claim ->> 'v') IS NOT DISTINCT FROM claim ->> 'w' THEN CONTINUE;"
            " END IF;",
            "      DELETE FROM service_engine.command_occupancy o USING"
            " jsonb_array_elements(made) m WHERE o.entity = m ->> 'e' AND o.index_name ="
            " m ->> 'i' AND o.partition = m ->> 'p' AND o.value = m ->> 'v';",
            "      out_name := claim ->> 'o'; out_data := '{}';",
            "      EXIT decide;",
            "    END LOOP;",
        ]
        return s

    def write(self) -> list[str]:
        c = self.command
        s: list[str] = []
        for child in self.child_entities():
            t = quote_ident(self.tables[child.name])
            match = ", ".join(f"t.{quote_ident(f)}" for f in child.key)
            keys = ", ".join(f"q.{quote_ident(f)}" for f in child.key)
            s += [f"    DELETE FROM {t} t USING jsonb_array_elements(taken) x WHERE x ->> 'e' ="
                  f" {_name_lit(child.name)} AND ({match}) = (SELECT {keys} FROM"
                  f" jsonb_populate_record(NULL::{t}, x -> 'k') q);",
                  "    written := written || (SELECT coalesce(jsonb_agg(jsonb_build_object("
                  "'e', x -> 'e', 'k', x -> 'k')), '[]') FROM jsonb_array_elements(taken) x"
                  f" WHERE x ->> 'e' = {_name_lit(child.name)});"]
        for b in c.bindings:
            if isinstance(b, Read):
                continue
            i = self.index[b.as_]
            entity = c.entities[b.as_]
            t = self.table(entity)
            cols = ", ".join(quote_ident(f) for f in entity.all_fields)
            picked = ", ".join(f"p.{quote_ident(f)}" for f in entity.all_fields)
            mark = ("    written := written || jsonb_build_array(jsonb_build_object('b',"
                    f" {_name_lit(b.as_)}, 'e', {_name_lit(entity.name)}, 'k', k{i}));")
            log = entity.fact_log
            if log is not None and any(isinstance(e, Record) and e.binding == b.as_
                                       for e in c.effects):
                # The facts recorded, in order, with the row's write (as the
                # soft-EDA store writes them).
                table, key_column, type_column, payload_column = log
                key = quote_ident(entity.key[0])
                mark += (f" INSERT INTO {quote_ident(table)} ({quote_ident(key_column)},"
                         f" {quote_ident(type_column)}, {quote_ident(payload_column)})"
                         f" SELECT (SELECT q.{key} FROM jsonb_populate_record(NULL::{t},"
                         f" k{i}) q), x ->> 't', x -> 'd' FROM jsonb_array_elements(f{i})"
                         " WITH ORDINALITY y(x, o) ORDER BY o;")
            if isinstance(b, Create):
                s += [f"    INSERT INTO {t} ({cols}) SELECT {picked} FROM"
                      f" jsonb_populate_record(NULL::{t}, n{i}) p;", mark]
                continue
            if b.as_ in c.deletes:
                match = ", ".join(f"t.{quote_ident(f)}" for f in entity.key)
                keys = ", ".join(f"q.{quote_ident(f)}" for f in entity.key)
                s += [f"    IF d{i} THEN",
                      f"      DELETE FROM {t} t WHERE ({match}) = (SELECT {keys} FROM"
                      f" jsonb_populate_record(NULL::{t}, k{i}) q);", "  " + mark,
                      f"    ELSIF ch{i} THEN"]
            else:
                s.append(f"    IF ch{i} THEN")
            if entity.revision is not None:
                rev = _name_lit(entity.revision)
                s.append(f"      IF jsonb_typeof(r{i} -> {rev}) = 'number' THEN n{i} := n{i} ||"
                         f" jsonb_build_object({rev}, to_jsonb((r{i} ->> {rev})::numeric + 1));"
                         " END IF;" + self.sync(b.as_))
            match = ", ".join(f"t.{quote_ident(f)}" for f in entity.key)
            keys = ", ".join(f"q.{quote_ident(f)}" for f in entity.key)
            s += [f"      UPDATE {t} t SET ({cols}) = (SELECT {picked} FROM"
                  f" jsonb_populate_record(NULL::{t}, n{i}) p)"
                  f" WHERE ({match}) = (SELECT {keys} FROM"
                  f" jsonb_populate_record(NULL::{t}, k{i}) q);",
                  "  " + mark, "    END IF;"]
        if any(c.entities[b.as_].unique for b in c.bindings if not isinstance(b, Read)) or any(
            child.unique for child in self.child_entities()
        ):
            s += [
                "    DELETE FROM service_engine.command_occupancy o USING"
                " jsonb_array_elements(releases) r WHERE o.entity = r ->> 'e' AND o.index_name ="
                " r ->> 'i' AND o.partition = r ->> 'p' AND o.value = r ->> 'v'"
                " AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(transfers) x WHERE"
                " x ->> 'e' = r ->> 'e' AND x ->> 'i' = r ->> 'i' AND x ->> 'p' = r ->> 'p'"
                " AND x ->> 'v' = r ->> 'v');",
                "    UPDATE service_engine.command_occupancy o SET owner = x ->> 'w' FROM"
                " jsonb_array_elements(transfers) x WHERE o.entity = x ->> 'e' AND"
                " o.index_name = x ->> 'i' AND o.partition = x ->> 'p' AND o.value = x ->> 'v';",
            ]
        return s

    @staticmethod
    def valued(then: str, value: str, what: str) -> list[str]:
        """``then`` with ``claim`` holding ``value``, which must not be `INVALID`."""
        return [f"    claim := {value};",
                "    IF claim IS NULL THEN RAISE EXCEPTION USING ERRCODE = 'P0001',"
                f" MESSAGE = 'service_engine.command_invalid', DETAIL = {_name_lit(what)};"
                " END IF;", f"    {then}"]

    def returns(self) -> list[str]:
        ret = self.command.returns
        scope = self.scope(after=True)
        s = ["    out_data := '{}';"]
        for k, e in ret.fields.items():
            s += self.valued(f"out_data := out_data || jsonb_build_object({_name_lit(k)}, claim);",
                             self.expr(e, scope), f"return {k}")
        for clause in self.command.effects:
            if not isinstance(clause, Emit):
                continue
            s.append("    v := '{}'::jsonb;")
            for k, e in clause.fields.items():
                s += self.valued(f"v := v || jsonb_build_object({_name_lit(k)}, claim);",
                                 self.expr(e, scope), f"emit {clause.event.__qualname__}.{k}")
            s.append("    emits := emits || jsonb_build_array(v);")
        return [*s, f"    out_name := {_name_lit(ret.name)}; out_ok := true;"]


def _decode(answer: object) -> Mapping[str, Any]:
    """The function's answer as a mapping (the pool's codec decodes ``jsonb``)."""
    if isinstance(answer, str):
        decoded: Mapping[str, Any] = json.loads(answer)
        return decoded
    assert isinstance(answer, Mapping)
    return answer


async def run_compiled(
    cx: Ops, compiled: CompiledCommand, principal: Any, inputs: Mapping[str, object],
    retention: timedelta,
) -> CommandOutcome:
    """Run ``compiled`` in the transaction ``cx`` holds, as ``principal``:
    one call (after BEGIN, in a round trip of its own: the call takes
    parameters, and asyncpg sends such a statement alone), its impacts,
    offer marks and emitted events staged for the commit. Raises
    `InvalidInput` for inputs (or a set value) the declaration refuses,
    `ValueMissing` (a `TypeError`, as the interpreter raises) for a set,
    cause or return that evaluates to nothing, `CommandNotInstalled` when
    its function is missing."""
    values = validate_inputs(compiled.command, inputs)
    inputs_json, facts, control, locks = compiled.arguments(
        principal, values, cx.now().value, retention
    )
    tx = cx._tx

    async def call() -> object:
        try:
            return await tx.conn.fetchval(compiled.call, inputs_json, facts, control, locks)
        except asyncpg.UndefinedFunctionError:
            raise CommandNotInstalled(
                f"command {compiled.command.name}: its function {compiled.name} is not "
                "installed: the schema owner installs the registered commands "
                "(`service-engine migrate --commands`, or `install_commands`)"
            ) from None
        except asyncpg.RaiseError as exc:
            detail = getattr(exc, "detail", "") or ""
            if exc.args and "service_engine.command_input" in str(exc):
                value = json.loads(getattr(exc, "hint", None) or "null")
                raise InvalidInput(f"{detail}: {value!r} is not a "
                                   f"{compiled.described.get(detail, 'value of the field')}"
                                   ) from None
            if exc.args and "service_engine.command_invalid" in str(exc):
                raise ValueMissing(f"{detail} evaluated to nothing (a missing field or "
                                   "mistyped value)") from None
            raise

    answer = _decode(await tx.run(Stage.SAVE, call))
    for noun, key, cause in compiled.impacts(answer):
        if cause is None:
            cx.impact(noun, key)
        else:
            cx.impact_caused(noun, key, cause)
    for aggregate_type, store_key in compiled.rows(answer):
        cx.dirty_offer(aggregate_type, store_key)
    for event in compiled.events(answer):
        cx.emit(event)
    sealed = control["sealed"]
    assert isinstance(sealed, dict)
    return compiled.outcome(answer, sealed)
