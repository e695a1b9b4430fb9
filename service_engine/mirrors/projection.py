"""The write side of a mirror: `Known`, `KnownScope` and `Projection`.

A projector writes no SQL of its own. It declares its derived row once as a
`Known` dataclass (the table, its key column, the impact noun) and selects
rows with a `KnownScope`; the projection function then calls
`Projection.replace_one`, `Projection.replace` and `Projection.remove`,
which write the table inside the mirror's fenced transaction and stage one
impact per changed key, so live views over ``known_*`` update. A write that
changes nothing (the row already holds those values) stages nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..db.types import Conn
from ..failures import DeclarationError
from ..impacts.model import Impact, JsonValue

__all__ = ["Known", "KnownScope", "Projection"]

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")


def _ident(name: str, what: str) -> str:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise DeclarationError(f"{what} must be a lower-case SQL identifier, got {name!r}")
    return ".".join(f'"{part}"' for part in name.split("."))


class Known:
    """A derived row of a ``known_*`` table; subclass as a dataclass.

    ``TABLE`` is the table, ``KEY`` its primary-key column (a field),
    ``NOUN`` the impact noun live views over the table declare (default:
    the table's name). Every dataclass field is a column.
    """

    TABLE: ClassVar[str]
    KEY: ClassVar[str] = "id"
    NOUN: ClassVar[str] = ""

    @classmethod
    def noun(cls) -> str:
        return cls.NOUN or cls.TABLE.rpartition(".")[2]

    def columns(self) -> Mapping[str, Any]:
        if not dataclasses.is_dataclass(self):
            raise DeclarationError(f"{type(self).__qualname__}: a Known row is a dataclass")
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True)
class KnownScope:
    """The rows of ``row_type``'s table whose columns equal ``where`` (all
    rows when ``where`` is empty): what `Projection.replace` and
    `Projection.remove` act on."""

    row_type: type[Known]
    where: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, row_type: type[Known], **where: Any) -> KnownScope:
        return cls(row_type, where)

    def _sql(self, start: int = 1) -> tuple[str, list[Any]]:
        if not self.where:
            return "TRUE", []
        parts = [
            f"{_ident(column, 'a scope column')} = ${start + i}"
            for i, column in enumerate(self.where)
        ]
        return " AND ".join(parts), list(self.where.values())


class Projection:
    """One projection pass, bound to the mirror's open transaction."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._impacts: dict[Impact, None] = {}
        self.written = 0
        self.removed = 0

    @property
    def impacts(self) -> list[Impact]:
        return list(self._impacts)

    def _impact(self, row_type: type[Known], key: Any) -> None:
        self._impacts[Impact.entity(row_type.noun(), _json(key))] = None

    async def replace_one(self, row: Known) -> bool:
        """Write ``row`` (insert, or update when it differs); True when it changed."""
        columns = dict(row.columns())
        table = _ident(type(row).TABLE, "Known.TABLE")
        key = type(row).KEY
        if key not in columns:
            raise DeclarationError(f"{type(row).__qualname__}: KEY {key!r} is not a field")
        names = [_ident(c, "a Known column") for c in columns]
        others = [n for c, n in zip(columns, names, strict=True) if c != key]
        placeholders = ", ".join(f"${i + 1}" for i in range(len(names)))
        keyname = _ident(key, "Known.KEY")
        if others:
            update = (
                f"DO UPDATE SET {', '.join(f'{n} = EXCLUDED.{n}' for n in others)} "
                f"WHERE ({', '.join(f't.{n}' for n in others)}) IS DISTINCT FROM "
                f"({', '.join(f'EXCLUDED.{n}' for n in others)})"
            )
        else:
            update = "DO NOTHING"
        sql = (
            f"INSERT INTO {table} AS t ({', '.join(names)}) VALUES ({placeholders}) "
            f"ON CONFLICT ({keyname}) {update} RETURNING {keyname}"
        )
        changed = await self._conn.fetchval(sql, *columns.values())
        if changed is None:
            return False
        self.written += 1
        self._impact(type(row), columns[key])
        return True

    async def remove(self, scope: KnownScope) -> int:
        """Delete the rows of ``scope``; returns how many."""
        table = _ident(scope.row_type.TABLE, "Known.TABLE")
        keyname = _ident(scope.row_type.KEY, "Known.KEY")
        where, args = scope._sql()
        rows = await self._conn.fetch(
            f"DELETE FROM {table} WHERE {where} RETURNING {keyname} AS k", *args
        )
        for r in rows:
            self._impact(scope.row_type, r["k"])
        self.removed += len(rows)
        return len(rows)

    async def replace(self, scope: KnownScope, rows: Iterable[Known]) -> int:
        """Make ``scope`` hold exactly ``rows``: delete its other rows, write
        these; returns how many rows changed or went."""
        wanted = list(rows)
        for row in wanted:
            if type(row) is not scope.row_type:
                raise DeclarationError(
                    f"replace: a {type(row).__qualname__} in a scope of "
                    f"{scope.row_type.__qualname__}"
                )
        table = _ident(scope.row_type.TABLE, "Known.TABLE")
        key = scope.row_type.KEY
        keyname = _ident(key, "Known.KEY")
        where, args = scope._sql(2)
        keep = [row.columns()[key] for row in wanted]
        gone = await self._conn.fetch(
            f"DELETE FROM {table} WHERE {where} AND NOT ({keyname} = ANY($1)) "
            f"RETURNING {keyname} AS k",
            keep, *args,
        )
        for r in gone:
            self._impact(scope.row_type, r["k"])
        self.removed += len(gone)
        changed = len(gone)
        for row in wanted:
            changed += await self.replace_one(row)
        return changed


def _json(key: Any) -> JsonValue:
    if isinstance(key, str | int | bool) or key is None:
        return key
    return str(key)
