"""The body of a compiled command's generated PL/pgSQL function, clause by
clause (`compile` names, creates and calls it).

`_Generator` writes the body in the order the `compile` module's docstring
lays out: the advisory locks and the idempotency record, the bindings'
exact reads, the requirements and effects, the creates' defaults, the row
policies, the delete proofs and cascades, the unique occupancy claims, the
writes and the idempotency record, each declared outcome answered early
with nothing written. Every value reads through `sql_expr`; identifiers
come only from the checked declaration, quoted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..persistence.base import store_of
from ..persistence.crud import quote_ident
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
from .expr import Expr, Fact, references
from .sql_expr import (
    SCHEMA,
    _admits_sql,
    _canon,
    _canon_list,
    _expr,
    _lit,
    _name_lit,
    _Scope,
)

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


_OCCUPIED = ("jsonb_build_object('e', claim -> 'e', 'i', claim -> 'i', 'p', claim -> 'p',"
             " 'v', claim -> 'v')")
"""The occupied value ``claim`` names (entity, index, partition, value)."""

_AT_CLAIM = ("entity = claim ->> 'e' AND index_name = claim ->> 'i' AND partition = claim ->> 'p'"
             " AND value = claim ->> 'v'")
"""The ``command_occupancy`` row of the value ``claim`` names (its primary key)."""


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
                "  taken jsonb := '[]';", "  emits jsonb := '[]';", "  j integer;"]
        for b in c.bindings:
            i = self.index[b.as_]
            # The key and the row typed as the table types them (its row
            # type: `install` creates the function without resolving it).
            table = self.table(c.entities[b.as_])
            decl += [f"  r{i} jsonb;", f"  n{i} jsonb;", f"  ch{i} boolean := false;",
                     f"  kt{i} {table};", f"  nt{i} {table};",
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
            match = ", ".join(f"t.{quote_ident(f)}" for f in entity.key)
            s += [f"    IF k{i} IS NOT NULL AND jsonb_typeof(k{i}) = 'object' THEN",
                  f"      kt{i} := jsonb_populate_record(NULL::{self.table(entity)}, k{i});",
                  f"      SELECT to_jsonb(t) INTO r{i} FROM {self.table(entity)} t"
                  f" WHERE ({match}) = ({self.typed_key(i, entity)}) FOR UPDATE;",
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
                # A created row is at revision 1, whatever the dataclass defaults to.
                defaults[entity.revision] = 1
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
        # Sorted (and the duplicates dropped) by a query only when there
        # is more than one claim to order.
        s += [
            "    IF jsonb_array_length(claims) > 1 THEN",
            "      claims := (SELECT jsonb_agg(x.c ORDER BY x.id) FROM (SELECT DISTINCT ON (t.id)"
            " t.c, t.id FROM (SELECT e AS c,"
            " ('[' || (e -> 'e')::text || ',' || (e -> 'i')::text || ',' || (e -> 'p')::text"
            " || ',' || (e -> 'v')::text || ']')"
            " COLLATE \"C\" AS id, n FROM jsonb_array_elements(claims) WITH ORDINALITY q(e, n)) t"
            " ORDER BY t.id, t.n) x);",
            "    END IF;",
            "    FOR j IN 0 .. jsonb_array_length(claims) - 1 LOOP",
            "      claim := claims -> j;",
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
            # The row as the table types it, read once into a typed variable
            # (no function scan in the statement that writes it).
            typed = f"      nt{i} := jsonb_populate_record(NULL::{t}, n{i});"
            picked = ", ".join(f"nt{i}.{quote_ident(f)}" for f in entity.all_fields)
            key_match = f"({', '.join(f't.{quote_ident(f)}' for f in entity.key)}) = (" + (
                f"{self.typed_key(i, entity)})")
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
                         f" SELECT kt{i}.{key}, x ->> 't', x -> 'd' FROM jsonb_array_elements(f{i})"
                         " WITH ORDINALITY y(x, o) ORDER BY o;")
            if isinstance(b, Create):
                s += [typed[2:], f"    INSERT INTO {t} ({cols}) VALUES ({picked});", mark]
                continue
            if b.as_ in c.deletes:
                s += [f"    IF d{i} THEN",
                      f"      DELETE FROM {t} t WHERE {key_match};", "  " + mark,
                      f"    ELSIF ch{i} THEN"]
            else:
                s.append(f"    IF ch{i} THEN")
            if entity.revision is not None:
                rev = _name_lit(entity.revision)
                s.append(f"      IF jsonb_typeof(r{i} -> {rev}) = 'number' THEN n{i} := n{i} ||"
                         f" jsonb_build_object({rev}, to_jsonb((r{i} ->> {rev})::numeric + 1));"
                         " END IF;" + self.sync(b.as_))
            s += [typed, f"      UPDATE {t} t SET ({cols}) = ROW({picked}) WHERE {key_match};",
                  "  " + mark, "    END IF;"]
        if any(c.entities[b.as_].unique for b in c.bindings if not isinstance(b, Read)) or any(
            child.unique for child in self.child_entities()
        ):
            # One indexed statement per value released (a value transferred
            # stays, its owner changed) and none when there is none.
            s += [
                "    FOR j IN 0 .. jsonb_array_length(releases) - 1 LOOP",
                "      claim := releases -> j;",
                f"      CONTINUE WHEN transfers @> jsonb_build_array({_OCCUPIED});",
                f"      DELETE FROM service_engine.command_occupancy WHERE {_AT_CLAIM};",
                "    END LOOP;",
                "    FOR j IN 0 .. jsonb_array_length(transfers) - 1 LOOP",
                "      claim := transfers -> j;",
                "      UPDATE service_engine.command_occupancy SET owner = claim ->> 'w'"
                f" WHERE {_AT_CLAIM};",
                "    END LOOP;",
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
