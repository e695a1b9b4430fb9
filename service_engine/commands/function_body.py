"""The body of a compiled command's generated PL/pgSQL function, clause by
clause (`compile` names, creates and calls it).

`_Generator` writes the body in the order the `compile` module's docstring
lays out: the advisory locks and the idempotency record, the bindings'
exact reads, the requirements and effects, the creates' defaults, the row
policies, the delete proofs and cascades, the unique occupancy claims, the
writes and the idempotency record, each declared outcome answered early
with nothing written. Every value reads through `sql_expr`; identifiers
come only from the checked declaration, quoted. Three parts are written
apart, each called from here: `function_idempotency` (the record looked up
and written), `function_deletes` (the delete proofs and cascades) and
`function_occupancy` (the unique claims and releases).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..persistence.crud import quote_ident
from .declaration import (
    Caused,
    Create,
    Emit,
    Entity,
    Mutate,
    Permit,
    Read,
    Record,
    Require,
    Set,
    Transition,
)
from .expr import Const, Expr, Fact, Field, Var, references
from .function_deletes import _Deletes, cascade_children
from .function_idempotency import recorded, replayed
from .function_occupancy import _Occupancy
from .sql_expr import (
    SCHEMA,
    _admits_sql,
    _expr,
    _lit,
    _name_lit,
    _Scope,
)
from .typecheck import ValueType, admits

if TYPE_CHECKING:
    from .checked import CheckedCommand


def _defaults(entity: Entity) -> dict[str, object]:
    """The dataclass defaults of ``entity``'s fields (what a create leaves unset)."""
    found: dict[str, object] = {}
    if dataclasses.is_dataclass(entity.aggregate):
        for f in dataclasses.fields(entity.aggregate):
            if f.default is not dataclasses.MISSING:
                found[f.name] = f.default
    return found



def _identifiers(body: str) -> set[str]:
    """The bare words of ``body`` outside its literals and quoted names
    (which variables a body reads)."""
    bare = _QUOTED.sub(" ", body)
    return set(re.findall(r"[a-z_][a-z0-9_]*", bare))


_QUOTED = re.compile(r"(\$m(\d+)\$.*?\$m\2\$)|('(?:[^']|'')*')|(\"(?:[^\"]|\"\")*\")", re.S)
"""A dollar-quoted literal, a string literal or a quoted identifier."""


def _fail(message: str, what: str, hint: str = "NULL") -> str:
    """The call that raises a run's typed error (``message``, its detail
    ``what``) where an expression is evaluated."""
    return f"{SCHEMA}.cmd_fail({_name_lit(message)}, {_name_lit(what)}, {hint})"


def _present(value: str, what: str) -> str:
    """``value``, raising `ValueMissing` (``what``) where it is `INVALID`."""
    return (f"CASE WHEN ({value}) IS NULL THEN {_fail(_INVALID, what)} ELSE {value} END")


def _merged(lines: list[str]) -> list[str]:
    """``lines`` with a row's start (``n0 := k0;``) folded into its first
    set (``n0 := n0 || ...``) where no line between them reads the row:
    one assignment instead of two."""
    out = list(lines)
    for at, line in enumerate(lines):
        start = re.fullmatch(r"( +)(n\d+) := ([kr]\d+);", line)
        if start is None:
            continue
        row = start[2]
        for later in range(at + 1, len(out)):
            grown = f"{row} := {row} || "
            if out[later].startswith(start[1] + grown):
                out[later] = out[later].replace(grown, f"{row} := {start[3]} || ", 1)
                out[at] = ""
                break
            if re.search(rf"\b{row}\b", out[later]):
                break
    # A create's defaults put under the assignment just before it.
    for at in range(1, len(out)):
        under = re.fullmatch(r"( +)(n\d+) := (\$m\d+\$[^$]*\$m\d+\$::jsonb) \|\| \2;", out[at])
        if under is None:
            continue
        last = re.fullmatch(rf"{under[1]}{under[2]} := ([^;]*);", out[at - 1])
        if last is not None:
            out[at - 1] = f"{under[1]}{under[2]} := {under[3]} || ({last[1]});"
            out[at] = ""
    return [line for line in out if line]


def _plain(value: object) -> object:
    """An enum member as its value (what its column holds)."""
    return value.value if isinstance(value, enum.Enum) else value



_INVALID = "service_engine.command_invalid"
_INPUT = "service_engine.command_input"


class _Generator:
    """One command's function body.

    The body is as few PL/pgSQL statements as the command's order allows:
    each statement is planned once per session but set up again in every
    transaction, so a statement saved is Postgres CPU saved on every call.
    What the declaration fixes is decided here, not at run time: which
    bindings a run changes or deletes (every effect runs unless an outcome
    answered first), how many locks and unique claims it can take; a run of
    sets on one binding is one assignment (each value checked where it is
    evaluated, the first invalid one raising, in the declared order); an
    answer without an idempotency record to write returns at once."""

    def __init__(self, command: CheckedCommand, tables: Mapping[str, str]) -> None:
        self.command = command
        self.tables = tables
        self.index = {b.as_: i for i, b in enumerate(command.bindings)}
        self.facts: set[str] = set()
        self.described: dict[str, str] = {}
        """Each set's ``what`` -> its field's type, described."""
        self.keyed = command.idempotency_key is not None
        self.changed: set[int] = set()
        """The bindings a run changes (every effect runs unless an answer
        came first, so this is known here)."""
        self.deleted = {self.index[name] for name in command.deletes}
        for clause in command.effects:
            if isinstance(clause, Transition):
                self.changed.add(self.index[clause.on])
            elif isinstance(clause, Set | Record) and not isinstance(
                command.bindings[self.index[clause.binding]], Create
            ):
                self.changed.add(self.index[clause.binding])
        self.caused = [e for e in command.effects if isinstance(e, Caused)]
        """The causes, each answered as ``c<j>`` (its data) with a success."""
        self.emits = any(isinstance(e, Emit) for e in command.effects)
        self.inputs = {i.name: i for i in command.inputs}
        self.values = set(self.inputs) | {v.name for v in command.services}
        """What ``inp`` always holds: every input (a missing optional one as
        JSON null) and every service value."""
        self.set_fields: dict[int, set[str]] = {}
        """The fields each binding's sets give a value (every set runs)."""
        for clause in command.effects:
            if isinstance(clause, Set):
                self.set_fields.setdefault(self.index[clause.binding], set()).add(clause.field)
        self.cascaded = cascade_children(command)
        """The entities whose rows a cascade removes."""
        self.deletes = _Deletes(command, tables, self.index, self.cascaded, self.finish,
                                self.refuse)
        self.occupancy = _Occupancy(command, self.index, self.deleted, self.cascaded,
                                    self.finish)


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
        s: list[str] = ["BEGIN"]
        s += self.locks()
        if self.keyed:
            s += replayed(c.name)
        s += ["  <<decide>>", "  BEGIN"]
        s += self.bind()
        s += self.require()
        s += self.effects()
        s += self.construct()
        s += self.policies()
        s += self.deletes.proofs()
        s += self.occupancy.claims()
        s += self.write()
        s += self.returns()
        s += ["  END decide;"]
        if self.keyed:
            s += recorded(c.name, self.carried(), self.emits)
        s.append("END")
        s = _merged(s)
        return "\n".join(self.declarations("\n".join(s)) + s)

    def declarations(self, statements: str) -> list[str]:
        """The variables ``statements`` read, declared (an initial value is
        an expression every call evaluates: only those used)."""
        c = self.command
        decl = [("l", "bigint"), ("rec", "record"), ("ok", "boolean"),
                ("out_name", "text"), ("out_ok", "boolean := false"),
                ("out_data", "jsonb := '{}'"), ("written", "jsonb := '[]'"),
("claims", "jsonb := '[]'"),
                ("releases", "jsonb := '[]'"), ("made", "jsonb := '[]'"),
                ("transfers", "jsonb := '[]'"), ("claim", "jsonb"), ("released", "boolean"),
                ("children", "jsonb := '[]'"), ("taken", "jsonb := '[]'"),
                ("emits", "jsonb := '[]'"), ("j", "integer"), ("v", "jsonb")]
        for b in c.bindings:
            i = self.index[b.as_]
            # The key and the row typed as the table types them (its row
            # type: `install` creates the function without resolving it).
            table = self.table(c.entities[b.as_])
            decl += [(f"r{i}", "jsonb"), (f"n{i}", "jsonb"), (f"kt{i}", table),
                     (f"nt{i}", table), (f"f{i}", "jsonb := '[]'"),
                     (f"k{i}", f"jsonb := ctl -> 'keys' -> {_name_lit(b.as_)}")]
        decl += [(f"c{j}", "jsonb") for j in range(len(self.caused))]
        used = _identifiers(statements)
        return ["DECLARE", *(f"  {name} {typ};" for name, typ in decl if name in used)]

    def locks(self) -> list[str]:
        """The advisory locks in the order the call's arguments computed:
        one expression takes them all (a missing one is NULL: no lock)."""
        most = len(self.command.bindings) + (1 if self.keyed else 0)
        if most == 0:
            return []
        taken = ", ".join(f"pg_advisory_xact_lock(locks[{n}])" for n in range(1, most + 1))
        return [f"  PERFORM {taken};" if most == 1 else f"  PERFORM concat({taken});"]

    def finish(self, name: str, data: str, indent: str) -> list[str]:
        """Answer the outcome ``name`` (SQL text) with ``data`` now, having
        written nothing: at once, or through the idempotency record."""
        if self.keyed:
            return [f"{indent}out_name := {name}; out_data := {data};", f"{indent}EXIT decide;"]
        return [f"{indent}RETURN jsonb_build_object('name', {name}, 'ok', false,"
                f" 'data', {data});"]

    def answer(self, name: str, data: str = "'{}'::jsonb", indent: str = "    ") -> list[str]:
        return self.finish(_name_lit(name), data, indent)

    def bind(self) -> list[str]:
        c = self.command
        s: list[str] = []
        # Reads in the lock order the call's arguments computed (each row
        # locked as it is read): a binding whose key was invalid reads nothing.
        for b in c.bindings:
            i = self.index[b.as_]
            entity = c.entities[b.as_]
            match = ", ".join(f"t.{quote_ident(f)}" for f in entity.key)
            s += [f"    IF jsonb_typeof(k{i}) = 'object' THEN",
                  f"      kt{i} := jsonb_populate_record(NULL::{self.table(entity)}, k{i});",
                  f"      SELECT to_jsonb(t) INTO r{i} FROM {self.table(entity)} t"
                  f" WHERE ({match}) = ({self.typed_key(i, entity)}) FOR UPDATE;",
                  "    END IF;"]
        for b in c.bindings:
            i = self.index[b.as_]
            # An invalid key reads nothing: absent, which a create answers too.
            if isinstance(b, Create):
                s += [f"    IF jsonb_typeof(k{i}) IS DISTINCT FROM 'object' OR r{i} IS NOT NULL"
                      " THEN", *self.answer(b.else_.name, indent="      "), "    END IF;",
                      f"    n{i} := k{i};"]
            else:
                s += [f"    IF r{i} IS NULL THEN", *self.answer(b.else_.name, indent="      "),
                      "    END IF;", f"    n{i} := r{i};"]
        return s

    @staticmethod
    def typed_key(i: int, entity: Entity) -> str:
        """The binding's key, typed as its table's columns (``kt<i>``, set
        from the key by the binding's read)."""
        return ", ".join(f"kt{i}.{quote_ident(f)}" for f in entity.key)

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

    def fields(self, items: Sequence[tuple[str, Expr]], scope: _Scope, what: str,
               *, settled: bool = False) -> str:
        """A ``jsonb`` object of ``items`` evaluated in order, the first
        `INVALID` one raising `ValueMissing` (``what``: the field's name)."""
        pairs = ", ".join(
            f"{_name_lit(k)}, " + (self.expr(e, scope) if self.never_invalid(e, settled=settled)
                                   else _present(self.expr(e, scope), what + k))
            for k, e in items)
        return f"jsonb_build_object({pairs})" if items else "'{}'::jsonb"

    def never_invalid(self, e: Expr, *, settled: bool) -> bool:
        """Whether ``e`` always has a value here, so its check is left out:
        a constant, an input or service value, a field of a row as read or
        a key field (``settled``: after the creates' rows were completed,
        any field of a bound row)."""
        if isinstance(e, Const):
            return True
        if isinstance(e, Var):
            return e.name in self.values
        if isinstance(e, Field) and e.binding in self.index and not e.name.startswith("_"):
            b = self.command.bindings[self.index[e.binding]]
            entity = self.command.entities[b.as_]
            return e.name in entity.all_fields and (
                settled or not isinstance(b, Create) or e.name in entity.key)
        return False

    def admitted(self, e: Expr, target: ValueType) -> bool:
        """Whether a field of ``target`` always admits ``e``'s value here (a
        constant it admits, an input of its very type), so its check is
        left out."""
        plain = (str, int, float, bool, type(None))
        if target.base is None:
            return False
        if isinstance(e, Const):
            value = e.value
            return type(value) in plain and admits(target, value) and (
                target.domain is None or all(type(v) in plain for v in target.domain))
        if target.domain is not None:
            return False
        if isinstance(e, Var) and e.name in self.inputs:
            declared = self.inputs[e.name]
            return (target.optional or not declared.optional) and target.base is declared.type
        return False

    def effects(self) -> list[str]:
        c = self.command
        s: list[str] = []
        scope = self.scope()
        # A run of changes to one row, each ``field, value`` (SQL), applied
        # by one assignment.
        row: list[str] = []
        pairs: list[str] = []
        touched: set[str] = set()
        """The entities whose rows changed so far (a row's alias included)."""

        def flush() -> None:
            if pairs:
                i = self.index[row[0]]
                touched.add(c.entities[row[0]].name)
                s.append(f"    n{i} := n{i} || jsonb_build_object({', '.join(pairs)});"
                         + self.sync(row[0]))
            row.clear()
            pairs.clear()

        for clause in c.effects:
            if isinstance(clause, Set):
                if row and (clause.binding != row[0]
                            or self.reads_own(clause.value, clause.binding)):
                    flush()
                row[:] = [clause.binding]
                pairs.append(self.set_value(clause, scope))
                continue
            flush()
            if isinstance(clause, Transition):
                step = c.transitions[clause.on]
                i = self.index[clause.on]
                entity = c.entities[clause.on]
                revision = _name_lit(entity.revision or "")
                expected = self.expr(clause.revision, scope)
                sources = ", ".join(_lit(v) for v in step.move.sources)
                state = _name_lit(step.workflow.state)
                # The row's state as changed so far: as read, if unchanged.
                now = (f"n{i}" if entity.name in touched
                       or isinstance(c.bindings[i], Create) else f"r{i}")
                s += [f"    IF NOT coalesce({SCHEMA}.cmd_int({expected}) AND"
                      f" jsonb_typeof(r{i} -> {revision}) = 'number' AND ({expected}) ="
                      f" r{i} -> {revision}, false) THEN",
                      *self.answer(clause.stale.name, indent="      "), "    END IF;",
                      f"    IF ({now} -> {state}) IS NULL OR ({now} -> {state}) NOT IN ({sources})"
                      " THEN", *self.answer(clause.illegal.name, indent="      "), "    END IF;"]
                # The move opens the row's next run of changes.
                row[:] = [clause.on]
                pairs.append(f"{state}, {_lit(step.move.to)}")
            elif isinstance(clause, Record):
                i = self.index[clause.binding]
                data = self.fields(list(clause.data.items()), scope, "")
                s.append(f"    f{i} := f{i} || jsonb_build_array(jsonb_build_object('t',"
                         f" {_name_lit(clause.type)}, 'd', {data}));")
            elif isinstance(clause, Caused) and clause.data:
                # Its data, evaluated (and checked) here; the answer names it.
                j = next(n for n, c in enumerate(self.caused) if c is clause)
                data = self.fields(list(clause.data.items()), scope, f"caused {clause.name}: ")
                s.append(f"    c{j} := {data};")
        flush()
        return s

    def set_value(self, clause: Set, scope: _Scope) -> str:
        """``field, value`` of ``clause``: the value checked where it is
        evaluated (`ValueMissing` if it is `INVALID`, `InvalidInput` if its
        field cannot hold it) unless it cannot fail."""
        name = clause.binding
        what = f"set {name}.{clause.field}"
        field = self.command.entities[name].fields[clause.field]
        self.described[what] = field.describe()
        value = self.expr(clause.value, scope)
        if self.admitted(clause.value, field) and self.never_invalid(clause.value, settled=False):
            return f"{_name_lit(clause.field)}, {value}"
        return (f"{_name_lit(clause.field)}, CASE WHEN ({value}) IS NULL THEN"
                f" {_fail(_INVALID, what)} WHEN NOT {_admits_sql(f'({value})', field)}"
                f" THEN {_fail(_INPUT, what, f'({value})::text')} ELSE {value} END")

    def reads_own(self, value: Expr, binding: str) -> bool:
        """Whether ``value`` reads a row a set on ``binding`` changes (a
        created binding of its entity: the sets before it must apply first)."""
        entity = self.command.entities[binding].name
        for leaf in references(value):
            if isinstance(leaf, Field) and leaf.binding in self.index:
                read = self.command.bindings[self.index[leaf.binding]]
                if isinstance(read, Create) and self.command.entities[read.as_].name == entity:
                    return True
        return False

    def construct(self) -> list[str]:
        """Each create's row completed: a field it left unset takes its
        default, one without a default raises (in the fields' order)."""
        s: list[str] = []
        for b in self.command.bindings:
            if not isinstance(b, Create):
                continue
            i = self.index[b.as_]
            entity = self.command.entities[b.as_]
            defaults = _defaults(entity)
            if entity.revision is not None:
                # A created row is at revision 1, whatever the dataclass defaults to.
                defaults[entity.revision] = 1
            # The key's fields and those its sets gave are there already.
            done = {*entity.key, *self.set_fields.get(i, ())}
            unset = [f"WHEN NOT n{i} ? {_name_lit(name)} THEN"
                     f" {_fail(_INVALID, f'create {b.as_}: {name} unset')}"
                     for name in entity.all_fields if name not in defaults and name not in done]
            given = {name: _plain(defaults[name]) for name in entity.all_fields
                     if name in defaults and name not in done}
            # The defaults under the row: a field it set wins.
            row = f"{_lit(given)} || n{i}" if given else f"n{i}"
            if unset:
                s.append(f"    n{i} := CASE {' '.join(unset)} ELSE {row} END;")
            elif given:
                s.append(f"    n{i} := {row};")
        return s

    def refuse(self, policy: Any, row: str, action: str) -> list[str]:
        pred = self.expr(policy.predicate, _Scope({}, row))
        data = (f"jsonb_build_object('reason', {_name_lit(policy.reason.code)},"
                f" 'action', {_name_lit(action)})")
        return [f"    IF ({pred}) IS DISTINCT FROM 'true'::jsonb THEN",
                *self.answer("Refused", data, indent="      "), "    END IF;"]

    def policies(self) -> list[str]:
        s: list[str] = []
        for b in self.command.bindings:
            i = self.index[b.as_]
            entity = self.command.entities[b.as_]
            if i in self.deleted:
                # The row as it is (what the delete affordance judged).
                if entity.delete_check is not None:
                    s += self.refuse(entity.delete_check, f"r{i}", "delete")
            elif isinstance(b, Create) and entity.create_policy is not None:
                s += self.refuse(entity.create_policy, f"n{i}", "create")
            elif (isinstance(b, Mutate) and entity.update_policy is not None
                  and i in self.changed):
                s += self.refuse(entity.update_policy, f"r{i}", "update")
                s += self.refuse(entity.update_policy, f"n{i}", "update")
        return s


    @property
    def marks(self) -> tuple[str, ...]:
        """The bindings whose rows a successful run writes, in order (the
        caller knows their keys: the answer does not carry them)."""
        c = self.command
        return tuple(b.as_ for b in c.bindings
                     if isinstance(b, Create) or self.index[b.as_] in self.deleted
                     or self.index[b.as_] in self.changed)

    def carried(self) -> list[tuple[str, str]]:
        """What a successful answer carries besides its name, data and
        events: the rows a cascade deleted (``written``) and each cause's
        data (``c<j>``)."""
        found = [("'written'", "written")] if self.cascaded else []
        return found + [(f"'c{j}'", f"c{j}" if clause.data else "'{}'::jsonb")
                        for j, clause in enumerate(self.caused)]

    def write(self) -> list[str]:
        c = self.command
        s = self.deletes.writes()
        for b in c.bindings:
            i = self.index[b.as_]
            if isinstance(b, Read) or not (
                isinstance(b, Create) or i in self.deleted or i in self.changed
            ):
                continue
            entity = c.entities[b.as_]
            t = self.table(entity)
            cols = ", ".join(quote_ident(f) for f in entity.all_fields)
            # The row as the table types it, read once into a typed variable
            # (no function scan in the statement that writes it).
            typed = f"    nt{i} := jsonb_populate_record(NULL::{t}, n{i});"
            picked = ", ".join(f"nt{i}.{quote_ident(f)}" for f in entity.all_fields)
            key_match = f"({', '.join(f't.{quote_ident(f)}' for f in entity.key)}) = (" + (
                f"{self.typed_key(i, entity)})")
            if isinstance(b, Create):
                s += [typed, f"    INSERT INTO {t} ({cols}) VALUES ({picked});"]
            elif i in self.deleted:
                s.append(f"    DELETE FROM {t} t WHERE {key_match};")
            else:
                if entity.revision is not None:
                    rev = _name_lit(entity.revision)
                    s.append(f"    n{i} := CASE WHEN jsonb_typeof(r{i} -> {rev}) = 'number' THEN"
                             f" n{i} || jsonb_build_object({rev},"
                             f" to_jsonb((r{i} ->> {rev})::numeric + 1)) ELSE n{i} END;"
                             + self.sync(b.as_))
                s += [typed, f"    UPDATE {t} t SET ({cols}) = ROW({picked}) WHERE {key_match};"]
            log = entity.fact_log
            if log is not None and any(isinstance(e, Record) and e.binding == b.as_
                                       for e in c.effects):
                # The facts recorded, in order, with the row's write (as the
                # soft-EDA store writes them).
                table, key_column, type_column, payload_column = log
                key = quote_ident(entity.key[0])
                s.append(f"    INSERT INTO {quote_ident(table)} ({quote_ident(key_column)},"
                         f" {quote_ident(type_column)}, {quote_ident(payload_column)})"
                         f" SELECT kt{i}.{key}, x ->> 't', x -> 'd' FROM jsonb_array_elements(f{i})"
                         " WITH ORDINALITY y(x, o) ORDER BY o;")
        s += self.occupancy.release()
        return s

    def returns(self) -> list[str]:
        ret = self.command.returns
        scope = self.scope(after=True)
        data = self.fields(list(ret.fields.items()), scope, "return ", settled=True)
        emits = [self.fields(list(clause.fields.items()), scope,
                             f"emit {clause.event.__qualname__}.", settled=True)
                 for clause in self.command.effects if isinstance(clause, Emit)]
        emitted = f"jsonb_build_array({', '.join(emits)})" if emits else "'[]'::jsonb"
        if not self.keyed:
            return [f"    RETURN jsonb_build_object('name', {_name_lit(ret.name)}, 'ok', true,"
                    f" 'data', {data}" + "".join(f", {k}, {v}" for k, v in self.carried())
                    + (f", 'emits', {emitted});" if emits else ");")]
        return [f"    out_data := {data};", *([f"    emits := {emitted};"] if emits else []),
                f"    out_name := {_name_lit(ret.name)}; out_ok := true;"]
