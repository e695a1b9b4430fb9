"""The delete part of a compiled command's function body: each delete's
proofs and the rows its cascades take.

A restricted delete answers its declared outcome while a referencing row
exists; a cascading one reads the children each edge reaches (more than
the edge's maximum answers its outcome), then reads and locks every child
in the one fixed order, judges each by its own delete row policy, and,
with the run's writes, deletes them and notes them as ``written``.
`function_body` calls `_Deletes.proofs` after the row policies and
`_Deletes.writes` first among the writes; this is apart because it reads
tables other than the bindings' own (the referencing and cascaded
entities'), which nothing else in the body does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..persistence.base import store_of
from ..persistence.crud import quote_ident
from .declaration import Cascade, Entity, Restrict, ReverseIndex
from .sql_expr import _canon, _canon_list, _name_lit

if TYPE_CHECKING:
    from .checked import CheckedCommand


def cascade_children(command: CheckedCommand) -> list[Entity]:
    """The entities whose rows ``command``'s cascades remove, each once, in
    the order its deletes and their edges name them."""
    found: dict[str, Entity] = {}
    for step in command.deletes.values():
        policy = step.entity.delete_policy
        if isinstance(policy, Cascade):
            for edge in policy.edges:
                found.setdefault(edge.entity, command.catalog.entities[edge.entity])
    return list(found.values())


class _Deletes:
    """One command's delete proofs and cascades."""

    def __init__(self, command: CheckedCommand, tables: Mapping[str, str],
                 index: Mapping[str, int], cascaded: Sequence[Entity],
                 finish: Callable[[str, str, str], list[str]],
                 refuse: Callable[[Any, str, str], list[str]]) -> None:
        self.command = command
        self.tables = tables
        self.index = index
        self.cascaded = cascaded
        """The entities whose rows a cascade removes (`cascade_children`)."""
        self.finish = finish
        """Answers an outcome (SQL text) with its data now, at an indent,
        having written nothing."""
        self.refuse = refuse
        """A row policy's refusal of a row (its policy, the row, the action)."""

    def answer(self, name: str, data: str = "'{}'::jsonb", indent: str = "    ") -> list[str]:
        """Answer the outcome ``name`` now, with ``data``."""
        return self.finish(_name_lit(name), data, indent)

    def typed(self, table: str, columns: Sequence[str], values: Sequence[str]) -> str:
        """The ``columns`` of ``table`` holding the ``jsonb`` ``values``, typed
        as the table types them (a row of ``jsonb_populate_record``)."""
        pairs = ", ".join(f"{_name_lit(c)}, {v}" for c, v in zip(columns, values, strict=True))
        cols = ", ".join(f"p.{quote_ident(c)}" for c in columns)
        return (f"(SELECT {cols} FROM jsonb_populate_record(NULL::{table},"
                f" jsonb_build_object({pairs})) p)")

    def referencing(
        self, entity: str, index_name: str, target: Sequence[str]
    ) -> tuple[Entity, ReverseIndex, str, list[str], str]:
        """The rows of ``entity`` whose index ``index_name`` holds the deleted
        row's key ``target``: the entity, the index, its table (quoted), the
        index's leading columns and their match list (``t.col, ...``)."""
        child = self.command.catalog.entities[entity]
        index = child.index(index_name)
        assert index is not None
        cols = list(index.sql_columns[: len(target)])
        return (child, index, quote_ident(index.table), cols,
                ", ".join(f"t.{quote_ident(col)}" for col in cols))

    def proofs(self) -> list[str]:
        c = self.command
        s: list[str] = []
        for name, step in c.deletes.items():
            i = self.index[name]
            policy = step.entity.delete_policy
            target = [f"k{i} -> {_name_lit(f)}" for f in step.entity.key]
            if isinstance(policy, Restrict):
                for ref in policy.indexes:
                    _, _, t, cols, match = self.referencing(ref.entity, ref.index, target)
                    assert step.clause.referenced is not None
                    s += [f"    IF EXISTS (SELECT 1 FROM {t} t WHERE ({match}) ="
                          f" {self.typed(t, cols, target)}) THEN",
                          *self.answer(step.clause.referenced.name, indent="      "),
                          "    END IF;"]
            elif isinstance(policy, Cascade):
                for edge in policy.edges:
                    child, index, t, cols, match = self.referencing(edge.entity, edge.index,
                                                                    target)
                    assert step.clause.too_many is not None
                    key_columns = index.key_columns if index.key_columns is not None else (
                        child.key)
                    found = ", ".join(f"{_name_lit(f)}, to_jsonb(t.{quote_ident(col)})"
                                      for f, col in zip(child.key, key_columns, strict=True))
                    order = ", ".join(f"t.{quote_ident(col)}" for col in key_columns)
                    store_type = store_of(child.aggregate).store_type
                    key_text = (_canon("x -> " + _name_lit(child.key[0])) if len(child.key) == 1
                                else _canon_list([f"x -> {_name_lit(f)}" for f in child.key]))
                    data = f"jsonb_build_object('maximum', {edge.maximum:d})"
                    s += ["    SELECT coalesce(jsonb_agg(x), '[]') INTO v FROM (SELECT"
                          f" jsonb_build_object({found}) x FROM {t} t WHERE ({match}) ="
                          f" {self.typed(t, cols, target)} ORDER BY {order}"
                          f" LIMIT {edge.maximum + 1:d}) q;",
                          f"    IF jsonb_array_length(v) > {edge.maximum:d} THEN",
                          *self.answer(step.clause.too_many.name, data, indent="      "),
                          "    END IF;",
                          "    children := children || (SELECT coalesce(jsonb_agg("
                          f"jsonb_build_object('e', {_name_lit(child.name)}, 'k', x, 's',"
                          f" to_jsonb({_name_lit(store_type)} || chr(1) ||"
                          f" ({key_text})))), '[]') FROM jsonb_array_elements(v) q(x));"]
        s += self.taken()
        return s

    def taken(self) -> list[str]:
        """Every row a cascade takes, read (locked) in the one fixed order and
        judged by its own delete row policy; a row gone since is skipped."""
        entities = self.cascaded
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

    def writes(self) -> list[str]:
        """The rows the cascades took, deleted and noted as ``written``."""
        s: list[str] = []
        for child in self.cascaded:
            t = quote_ident(self.tables[child.name])
            match = ", ".join(f"t.{quote_ident(f)}" for f in child.key)
            keys = ", ".join(f"q.{quote_ident(f)}" for f in child.key)
            s += [f"    DELETE FROM {t} t USING jsonb_array_elements(taken) x WHERE x ->> 'e' ="
                  f" {_name_lit(child.name)} AND ({match}) = (SELECT {keys} FROM"
                  f" jsonb_populate_record(NULL::{t}, x -> 'k') q);",
                  "    written := written || (SELECT coalesce(jsonb_agg(jsonb_build_object("
                  "'e', x -> 'e', 'k', x -> 'k')), '[]') FROM jsonb_array_elements(taken) x"
                  f" WHERE x ->> 'e' = {_name_lit(child.name)});"]
        return s
