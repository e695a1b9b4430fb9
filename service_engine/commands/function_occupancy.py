"""The unique occupancy part of a compiled command's function body: the
values a run claims in ``command_occupancy`` and those it gives up.

A created row claims its unique values, a changed one claims its new value
and releases its old one, a deleted one (and each row a cascade removes)
releases. A run that can claim at most one value, with nothing to hand
over, claims it by one insert; otherwise the claims are ordered as the
interpreter's lock order sorts them, a value another row holds answers its
declared outcome (nothing written), and a value the run releases and
claims again is handed over, its owner changed. `function_body` calls
`_Occupancy.claims` after the delete proofs and `_Occupancy.release` after
the writes; this is apart because it is one self-contained protocol
(claim, hand over, release) over its own table, sharing with the rest of
the body only the bindings' variables and the way an outcome is answered.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from .declaration import Create, Entity, Mutate, Read, Unique
from .sql_expr import _canon, _canon_list, _name_lit
from .typecheck import ValueType

if TYPE_CHECKING:
    from .checked import CheckedCommand


_OCCUPIED = ("jsonb_build_object('e', claim -> 'e', 'i', claim -> 'i', 'p', claim -> 'p',"
             " 'v', claim -> 'v')")
"""The occupied value ``claim`` names (entity, index, partition, value)."""

_AT_CLAIM = ("entity = claim ->> 'e' AND index_name = claim ->> 'i' AND partition = claim ->> 'p'"
             " AND value = claim ->> 'v'")
"""The ``command_occupancy`` row of the value ``claim`` names (its primary key)."""


def _listed(texts: Sequence[str]) -> str:
    """The canonical JSON text of a list of canonical texts."""
    return "'[' || " + " || ',' || ".join(texts) + " || ']'" if texts else "'[]'"


_SCALARS = (str, int, float, bool, uuid.UUID, datetime)
"""Field types whose JSON is a scalar: its canonical text is its own."""


class _Occupancy:
    """One command's unique claims and releases (what the declaration
    fixes, decided here: which values a run may claim or release, and
    whether one insert claims them)."""

    def __init__(self, command: CheckedCommand, index: Mapping[str, int], deleted: set[int],
                 cascaded: Sequence[Entity], finish: Callable[[str, str, str], list[str]]) -> None:
        self.command = command
        self.index = index
        self.deleted = deleted
        """The bindings a run deletes."""
        self.cascaded = cascaded
        """The entities whose rows a cascade removes."""
        self.finish = finish
        """Answers an outcome (SQL text) with its data now, at an indent,
        having written nothing."""

    def answer(self, name: str, indent: str) -> list[str]:
        """Answer the outcome ``name`` now, with no data."""
        return self.finish(_name_lit(name), "'{}'::jsonb", indent)

    def uniques(self) -> tuple[list[tuple[int, Unique]], list[tuple[int, Unique]]]:
        """The unique values a run may claim and those it may release, each
        ``(binding index, unique key)`` in the bindings' order: a created row
        claims, a changed one claims its new value and releases its old one,
        a deleted one releases (a cascade's children release theirs too)."""
        c = self.command
        claims: list[tuple[int, Unique]] = []
        releases: list[tuple[int, Unique]] = []
        for b in c.bindings:
            if isinstance(b, Read):
                continue
            i = self.index[b.as_]
            for unique in c.entities[b.as_].unique:
                if i not in self.deleted:
                    claims.append((i, unique))
                if not isinstance(b, Create):
                    releases.append((i, unique))
        return claims, releases

    @property
    def one_claim(self) -> bool:
        """At most one unique value claimed and none another binding or a
        cascade releases (so none is handed over): claimed and released
        straight, without the lists that order many."""
        claims, releases = self.uniques()
        if not claims:
            return True
        if len(claims) > 1 or any(child.unique for child in self.cascaded):
            return False
        return all(r == claims[0] for r in releases)

    def occupied(self, i: int, unique: Unique, row: str) -> tuple[str, str, str]:
        """Of binding ``i``'s ``row``: whether it holds ``unique``'s value, its
        partition's canonical text and the value's."""
        entity = self.command.entities[self.command.bindings[i].as_]
        route = len(entity.partition_by)
        values = [f"{row} -> {_name_lit(f)}" for f in unique.fields]
        present = " AND ".join(f"jsonb_typeof({v}) IS DISTINCT FROM 'null'"
                               f" AND {v} IS NOT NULL" for v in values)
        texts = [self.canon(v, entity, f) for v, f in zip(values, unique.fields, strict=True)]
        return present, f"({_listed(texts[:route])})", f"({_listed(texts[route:])})"

    @staticmethod
    def canon(value: str, entity: Entity, name: str) -> str:
        """The canonical JSON text of ``entity``'s field ``name`` holding
        ``value``: a scalar's own text where the field's type is a scalar."""
        if entity.types.get(name, ValueType(None)).base in _SCALARS:
            return f"({value})::text"
        return _canon(value)

    def owner(self, i: int) -> str:
        entity = self.command.entities[self.command.bindings[i].as_]
        texts = [self.canon(f"k{i} -> {_name_lit(f)}", entity, f) for f in entity.key]
        return f"({texts[0] if len(texts) == 1 else _listed(texts)})"

    def claims(self) -> list[str]:
        if self.one_claim:
            return self.claim_one()
        c = self.command
        s: list[str] = []
        for b in c.bindings:
            if isinstance(b, Read):
                continue
            i = self.index[b.as_]
            entity = c.entities[b.as_]
            for unique in entity.unique:
                a_present, a_part, a_val = self.occupied(i, unique, f"n{i}")
                outcome = b.taken.get(unique.name)
                entry = (f"jsonb_build_object('e', {_name_lit(entity.name)}, 'i',"
                         f" {_name_lit(unique.name)}, 'p', {a_part}, 'v', {a_val}, 'o',"
                         f" {_name_lit(outcome.name if outcome else '')}, 'w', {self.owner(i)})")
                if isinstance(b, Create):
                    s += [f"    IF {a_present} THEN",
                          f"      claims := claims || jsonb_build_array({entry});", "    END IF;"]
                    continue
                b_present, b_part, b_val = self.occupied(i, unique, f"r{i}")
                before = (f"jsonb_build_object('e', {_name_lit(entity.name)}, 'i',"
                          f" {_name_lit(unique.name)}, 'p', {b_part}, 'v', {b_val})")
                release = (f"IF {b_present} THEN releases := releases ||"
                           f" jsonb_build_array({before}); END IF;")
                if i in self.deleted:
                    # A deleted row gives up its values, claims none.
                    s.append(f"    {release}")
                    continue
                s += [f"    IF {a_present} AND NOT (({b_present}) AND {a_part} = {b_part}"
                      f" AND {a_val} = {b_val}) THEN",
                      f"      claims := claims || jsonb_build_array({entry});",
                      f"      {release}",
                      "    END IF;"]
        s += self.child_releases()
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
            *self.finish("claim ->> 'o'", "'{}'::jsonb", "      "),
            "    END LOOP;",
        ]
        return s

    def child_releases(self) -> list[str]:
        """Children a cascade removes give up their unique values too."""
        s: list[str] = []
        for child in self.cascaded:
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
        return s

    def claim_one(self) -> list[str]:
        """The one value a run may claim, claimed by one insert (a value its
        row already owns is kept; one another row holds answers its
        outcome, nothing claimed); the old value it replaces noted as
        ``released``."""
        c = self.command
        claims, _ = self.uniques()
        s = self.child_releases()
        if not claims:
            return s
        i, unique = claims[0]
        b = c.bindings[i]
        assert isinstance(b, Mutate | Create)
        entity = c.entities[b.as_]
        outcome = b.taken.get(unique.name)
        present, part, val = self.occupied(i, unique, f"n{i}")
        owner = self.owner(i)
        where = (f"entity = {_name_lit(entity.name)} AND index_name = {_name_lit(unique.name)}"
                 f" AND partition = {part} AND value = {val}")
        if isinstance(b, Create):
            s.append(f"    IF {present} THEN")
        else:
            b_present, b_part, b_val = self.occupied(i, unique, f"r{i}")
            s.append(f"    IF {present} AND NOT (({b_present}) AND {part} = {b_part}"
                     f" AND {val} = {b_val}) THEN")
        s += ["      INSERT INTO service_engine.command_occupancy (entity, index_name, partition,"
              f" value, owner) VALUES ({_name_lit(entity.name)}, {_name_lit(unique.name)}, {part},"
              f" {val}, {owner}) ON CONFLICT DO NOTHING RETURNING true INTO ok;",
              # Held (two statements: a condition with a query is planned
              # at each run, for each value of ``ok``).
              "      IF ok IS NULL THEN",
              "        IF (SELECT owner FROM service_engine.command_occupancy WHERE"
              f" {where}) IS DISTINCT FROM {owner} THEN",
              *self.answer(outcome.name if outcome else "", indent="          "),
              "        END IF;",
              "      END IF;"]
        if not isinstance(b, Create):
            s.append(f"      released := {b_present};")
        return [*s, "    END IF;"]

    def release(self) -> list[str]:
        """The unique values the run gave up, deleted (one indexed statement
        per value, none when there is none; a value handed to another row
        stays, its owner changed)."""
        c = self.command
        _, releases = self.uniques()
        if not self.one_claim:
            return [
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
        s: list[str] = []
        for i, unique in releases:
            if i in self.deleted:
                present, part, val = self.occupied(i, unique, f"r{i}")
                s += [f"    IF {present} THEN",
                      "      DELETE FROM service_engine.command_occupancy WHERE entity ="
                      f" {_name_lit(c.entities[c.bindings[i].as_].name)} AND index_name ="
                      f" {_name_lit(unique.name)} AND partition = {part} AND value = {val};",
                      "    END IF;"]
            else:
                # The row's old value, its new one claimed.
                present, part, val = self.occupied(i, unique, f"r{i}")
                s += ["    IF released THEN",
                      "      DELETE FROM service_engine.command_occupancy WHERE entity ="
                      f" {_name_lit(c.entities[c.bindings[i].as_].name)} AND index_name ="
                      f" {_name_lit(unique.name)} AND partition = {part} AND value = {val};",
                      "    END IF;"]
        if any(child.unique for child in self.cascaded):
            s += ["    FOR j IN 0 .. jsonb_array_length(releases) - 1 LOOP",
                  "      claim := releases -> j;",
                  f"      DELETE FROM service_engine.command_occupancy WHERE {_AT_CLAIM};",
                  "    END LOOP;"]
        return s
