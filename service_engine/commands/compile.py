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

and answers the outcome as JSON: its name and data, and with a success
what only the run knows of its impacts (each cause's data, the rows a
cascade deleted); the call completes it with what it computed itself (the
written bindings' keys, the causes' nouns and names: `completed`) and
stages the impacts with the commit. `function_body` writes that body (as
few statements as the command's order allows: Postgres sets each statement
up again in every transaction), `sql_expr` the SQL of its expressions and
the helper functions they call (`PRELUDE`); this module names, creates and
calls it.

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
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import asyncpg

from ..clock import Timestamp
from ..db.errors import Stage
from ..db.locks import aggregate_lock_key
from ..impacts.model import Cause, JsonValue, canonical_json
from ..persistence.base import Aggregate, store_of
from ..pipeline import Ops
from .declaration import Cascade, Caused, Emit, Record
from .errors import CommandNotInstalled, NotCompilable, ValueMissing
from .expr import INVALID, Env, evaluate, principal_fact
from .function_body import _Generator
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
from .sql_expr import PRELUDE, SCHEMA

if TYPE_CHECKING:
    from .checked import CheckedCommand

__all__ = [
    "PRELUDE", "CompiledCommand", "NotCompilable", "compile_command", "compiled", "run_compiled",
]


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
    marks: tuple[str, ...] = ()
    """The bindings whose rows a successful run writes, in order: their
    keys are the call's, so the answer does not carry them."""

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
            if any(p is INVALID or p is None for p in parts) or not entity.admits_key(parts):
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

    def completed(
        self, answer: Mapping[str, Any], control: Mapping[str, Any],
    ) -> Mapping[str, Any]:
        """The function's answer with what the call already knew put back:
        a success's ``written`` (the rows a cascade deleted, then each
        written binding under the key the call computed) and its
        ``causes`` (binding -> noun -> the cause, each cause's data as the
        answer's ``c<j>``; a later cause of one noun replaces an earlier)."""
        if not answer.get("ok") or "replay" in answer:
            return answer
        written = [*(answer.get("written") or ()), *(
            {"b": name, "e": self.command.entities[name].name, "k": control["keys"][name]}
            for name in self.marks)]
        causes: dict[str, dict[str, Any]] = {}
        caused = [e for e in self.command.effects if isinstance(e, Caused)]
        for j, clause in enumerate(caused):
            causes.setdefault(clause.binding, {})[clause.noun] = {
                "name": clause.name, "data": answer.get(f"c{j}") or {}}
        return {**answer, "written": written, "causes": causes}

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
                           gen.described, gen.marks)


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

    answer = compiled.completed(_decode(await tx.run(Stage.SAVE, call)), control)
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
