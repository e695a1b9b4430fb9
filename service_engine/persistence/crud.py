"""CRUD: the aggregate is one state row. `CrudStore` writes the SQL for you.

A slice declares its table and how a row maps to the aggregate::

    class BoardStore(CrudStore[Board, str]):
        TABLE = "board"
        KEY = "id"
        COLUMNS = ("id", "title", "archived")

        def to_row(self, board: Board) -> Mapping[str, object]:
            return {"id": board.id, "title": board.title, "archived": board.archived}

        def from_row(self, row: Mapping[str, Any]) -> Board:
            return Board(row["id"], row["title"], row["archived"])

    class Board(Aggregate):
        Store = BoardStore()

An aggregate that is a dataclass whose fields are the columns declares
``AGGREGATE`` instead: ``COLUMNS`` default to its fields, `to_row` reads
them and `from_row` builds it from the row::

    class NoteStore(CrudStore[Note, str]):
        TABLE = "note"
        AGGREGATE = Note

or, with nothing else to declare, in one line (`CrudStore.of`)::

    Note.Store = CrudStore.of(Note, "note")

Either way the store gets `load`, a batched `read_many` (``WHERE id = ANY($1)``), `lock`
(``SELECT ... FOR UPDATE``, off with ``lock_rows=False``), `load_locked`
(the pipeline's load: pin and read in one ``SELECT cols ... FOR UPDATE``),
`create`, `create_locked` (the pipeline's create: its advisory lock and the
insert in one statement), `save`, `save_later` (the pipeline's save of a
row it pinned, sent with COMMIT as one statement without parameters:
`save_inlined`) and `delete`. A table under row-level security names the
transaction-local settings its writes run under (`settings`); the pipeline
sends them with the write, in its round trip. The table's own constraints
(unique, foreign key, check) are the domain's: a violation rolls the whole
command back.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, ClassVar, TypeVar, cast

from ..db.literals import dollar_quoted
from ..db.types import Conn
from ..failures import ConfigError, DeclarationError
from .base import NotFound, Persistence, Row, Style, as_row, qualified_name

__all__ = ["CrudStore", "PinnedSave", "affected", "batched", "quote_ident"]

A = TypeVar("A")
K = TypeVar("K")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def quote_ident(name: str) -> str:
    """Quote ``name`` (optionally ``schema.name``) as a SQL identifier.

    Only plain identifiers are accepted, so a quoted name is never a way
    to smuggle SQL in.
    """
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(_IDENT.fullmatch(p) for p in parts):
        raise ConfigError(f"not a plain SQL identifier: {name!r}")
    return ".".join(f'"{p}"' for p in parts)


@dataclass(frozen=True, slots=True)
class _StateSql:
    select: str
    select_many: str
    lock: str
    select_locked: str
    insert: str
    insert_locked: str
    update: str
    update_from_json: str
    insert_from_json: str
    delete: str
    delete_from_json: str

    @classmethod
    def build(cls, table: str, key: str, columns: Sequence[str]) -> _StateSql:
        if key not in columns:
            raise ConfigError(f"KEY {key!r} must be one of COLUMNS {tuple(columns)!r}")
        t = quote_ident(table)
        k = quote_ident(key)
        cols = [quote_ident(c) for c in columns]
        listed = ", ".join(cols)
        values = ", ".join(f"${i}" for i in range(1, len(cols) + 1))
        shifted = ", ".join(f"${i}" for i in range(2, len(cols) + 2))
        others = [c for c in cols if c != k]
        assign = ", ".join(f"{c} = ${i}" for i, c in enumerate(others, start=2))
        update = (
            f"UPDATE {t} SET {assign} WHERE {k} = $1" if others
            else f"UPDATE {t} SET {k} = $1 WHERE {k} = $1"
        )
        return cls(
            select=f"SELECT {listed} FROM {t} WHERE {k} = $1",
            select_many=f"SELECT {listed} FROM {t} WHERE {k} = ANY($1)",
            lock=f"SELECT 1 FROM {t} WHERE {k} = $1 FOR UPDATE",
            select_locked=f"SELECT {listed} FROM {t} WHERE {k} = $1 FOR UPDATE",
            insert=f"INSERT INTO {t} ({listed}) VALUES ({values})",
            # The advisory lock ($1) is granted before the row is written: the
            # insert's one source row is the lock's (materialised) result.
            insert_locked=(
                f"WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock($1)) "
                f"INSERT INTO {t} ({listed}) SELECT {shifted} FROM l"
            ),
            update=update,
            # The row as one JSON literal (appended): each column read from
            # it by the column's own type, as json_populate_record does.
            update_from_json=(
                f"UPDATE {t} AS __t SET "
                + (", ".join(f"{c} = __r.{c}" for c in others) or f"{k} = __r.{k}")
                + f" FROM json_populate_record(NULL::{t}, %s::json) AS __r"
                f" WHERE __t.{k} = __r.{k}"
            ),
            insert_from_json=(
                f"INSERT INTO {t} ({listed}) SELECT "
                + ", ".join(f"__r.{c}" for c in cols)
                + f" FROM json_populate_record(NULL::{t}, %s::json) AS __r"
            ),
            delete=f"DELETE FROM {t} WHERE {k} = $1",
            delete_from_json=(
                f"DELETE FROM {t} AS __t USING json_populate_record(NULL::{t}, %s::json) AS __r"
                f" WHERE __t.{k} = __r.{k}"
            ),
        )


@dataclass(frozen=True, slots=True)
class PinnedSave:
    """A pinned row's save (`CrudStore.save_later`): ``inlined`` to ride
    in another round trip, `send` to go alone; ``table`` (no schema) is
    what a constraint error names."""

    inlined: str
    table: str
    statement: str
    values: tuple[object, ...]
    settings: str = ""

    async def send(self, conn: Conn) -> None:
        """Alone in its round trip, as `CrudStore.save` sends it (prepared,
        with parameters; the pinned row is there to update), or inlined
        behind the store's `settings` when it has some."""
        if self.settings:
            await conn.execute(self.inlined)
        else:
            await conn.execute(self.statement, *self.values)


class _NotInlinable(TypeError):
    """A column value without an exact JSON text (the save keeps its parameters)."""


def _json_value(value: object) -> object:
    """A column's value as JSON: the text its column type reads for a value
    json.dumps cannot write (an instant, a UUID...); any other value as is
    (a ``json``/``jsonb`` column's value as the pool's codec writes it)."""
    if value is None or isinstance(value, str | int | float | dict | list):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise _NotInlinable  # a naive instant: left to the driver's codec
        return value.isoformat()
    if isinstance(value, date | time | uuid.UUID | Decimal):
        return str(value)
    if isinstance(value, timedelta):
        return (f"{value.days:d} days {value.seconds:d} seconds "
                f"{value.microseconds:d} microseconds")
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    raise _NotInlinable  # a type JSON does not know: left to the driver's codec


def affected(status: str) -> int:
    """The row count of a command status (``"UPDATE 1"``, ``"INSERT 0 2"``)."""
    return int(status.rsplit(" ", 1)[-1])


def batched(*statements: str) -> str:
    """Statements without parameters as one simple-protocol batch (empty ones left out)."""
    return "; ".join(s for s in statements if s)


class CrudStore(Persistence[A, K]):
    """A store over one table keyed by one column.

    Set ``TABLE``, ``KEY`` and ``COLUMNS`` (which include ``KEY``) and
    implement `to_row` / `from_row`, or set ``AGGREGATE`` (a dataclass whose
    fields are the columns) for all three. ``STORE_TYPE`` (default: the store's
    qualified class name) is what the advisory lock is keyed on.
    ``lock_rows=False`` makes `lock` a no-op; the pipeline's advisory lock
    still serialises commands on one key.
    """

    STYLE: ClassVar[Style] = Style.CRUD
    TABLE: ClassVar[str]
    KEY: ClassVar[str] = "id"
    COLUMNS: ClassVar[tuple[str, ...]]
    STORE_TYPE: ClassVar[str | None] = None
    AGGREGATE: ClassVar[type[Any] | None] = None
    """A dataclass aggregate whose fields are the columns (``COLUMNS``,
    `to_row` and `from_row` default from it); None: declare them."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        aggregate = cls.__dict__.get("AGGREGATE")
        if aggregate is None:
            return
        if not (isinstance(aggregate, type) and dataclasses.is_dataclass(aggregate)):
            raise DeclarationError(f"{cls.__qualname__}.AGGREGATE must be a dataclass")
        if "COLUMNS" not in cls.__dict__:
            cls.COLUMNS = tuple(f.name for f in dataclasses.fields(aggregate))

    @classmethod
    def of(
        cls, aggregate: type[A], table: str, *, key: str = "id", lock_rows: bool = True
    ) -> CrudStore[A, Any]:
        """A store over ``table`` keyed by its column ``key`` for ``aggregate``
        (a dataclass whose fields are the columns): the class a slice would
        declare with ``TABLE``, ``KEY`` and ``AGGREGATE``, named
        ``<Aggregate>Store`` in the aggregate's module (its ``store_type``,
        the advisory locks' key), instantiated::

            Note.Store = CrudStore.of(Note, "note")
        """
        name = f"{aggregate.__name__}Store"
        declared = type(name, (cls,), {
            "TABLE": table, "KEY": key, "AGGREGATE": aggregate,
            "__module__": aggregate.__module__, "__qualname__": f"{aggregate.__qualname__}Store",
        })
        return cast("CrudStore[A, Any]", declared(lock_rows=lock_rows))

    def __init__(self, *, lock_rows: bool = True) -> None:
        cls = type(self)
        defaults = cls.to_row is CrudStore.to_row or cls.from_row is CrudStore.from_row
        if cls.AGGREGATE is None and defaults:
            raise DeclarationError(
                f"{cls.__qualname__} implements to_row and from_row, or sets AGGREGATE "
                "(a dataclass whose fields are the columns)"
            )
        self.lock_rows = lock_rows
        self._sql = _StateSql.build(self.TABLE, self.KEY, self.COLUMNS)
        self._store_type = self.STORE_TYPE or qualified_name(type(self))
        cls = type(self)
        # One statement for lock + load only where both are this class's own
        # (a subclass that overrides either keeps its own pair).
        self._one_statement_load = cls.load is CrudStore.load and cls.lock is CrudStore.lock
        self._one_statement_create = cls.create is CrudStore.create
        self._own_save = cls.save is CrudStore.save
        self._own_delete = cls.delete is CrudStore.delete
        self._has_settings = cls.settings is not CrudStore.settings

    @property
    def store_type(self) -> str:
        return self._store_type

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables this store reads and writes (the app role needs
        SELECT, INSERT, UPDATE and DELETE on each; checked at `Engine.run`)."""
        return (self.TABLE,)

    def to_row(self, aggregate: A) -> Mapping[str, object]:
        """Every column of ``COLUMNS`` for ``aggregate`` (default: its
        attributes of those names)."""
        return {column: getattr(aggregate, column) for column in self.COLUMNS}

    def from_row(self, row: Row) -> A:
        """The aggregate a row (with ``COLUMNS``) holds (default:
        ``AGGREGATE(**row)``)."""
        aggregate = type(self).AGGREGATE
        assert aggregate is not None  # __init__ refused a store with neither
        return cast(A, aggregate(**row))

    def key_of(self, aggregate: A) -> K:
        return cast(K, self.to_row(aggregate)[self.KEY])

    def _row(self, aggregate: A) -> Mapping[str, object]:
        """`to_row`, every column of ``COLUMNS`` in it (else `ConfigError`)."""
        row = self.to_row(aggregate)
        missing = [c for c in self.COLUMNS if c not in row]
        if missing:
            raise ConfigError(f"{type(self).__qualname__}.to_row lacks columns {missing}")
        return row

    def _values(self, aggregate: A) -> list[object]:
        """Column values in statement order: the key first, then the others."""
        row = self._row(aggregate)
        return [row[self.KEY], *(row[c] for c in self.COLUMNS if c != self.KEY)]

    def _insert_values(self, aggregate: A) -> list[object]:
        row = self._row(aggregate)
        return [row[c] for c in self.COLUMNS]

    async def load(self, conn: Conn, key: K) -> A | None:
        row = await conn.fetchrow(self._sql.select, key)
        return None if row is None else self.from_row(as_row(row))

    async def read_many(self, conn: Conn, keys: Sequence[K]) -> list[A]:
        """One query for the whole batch; found rows in the order of ``keys``."""
        if not keys:
            return []
        wanted = list(dict.fromkeys(keys))
        rows = await conn.fetch(self._sql.select_many, wanted)
        by_key = {row[self.KEY]: row for row in rows}
        return [self.from_row(as_row(by_key[key])) for key in wanted if key in by_key]

    async def lock(self, conn: Conn, key: K) -> None:
        if self.lock_rows:
            await conn.execute(self._sql.lock, key)

    async def load_locked(self, conn: Conn, key: K) -> A | None:
        """Pin and read the row in one statement (``SELECT cols ... FOR
        UPDATE``; a plain select with ``lock_rows=False``)."""
        if not self._one_statement_load:
            await self.lock(conn, key)
            return await self.load(conn, key)
        sql = self._sql.select_locked if self.lock_rows else self._sql.select
        row = await conn.fetchrow(sql, key)
        return None if row is None else self.from_row(as_row(row))

    async def create(self, conn: Conn, aggregate: A) -> None:
        await conn.execute(self._sql.insert, *self._insert_values(aggregate))

    @property
    def creates_locked(self) -> bool:
        """Whether `create_locked` is one statement (this class's own `create`;
        a subclass that overrides it keeps the lock and its own insert apart)."""
        return self._one_statement_create

    async def create_locked(self, conn: Conn, aggregate: A, lock_key: int) -> None:
        """Take the transaction advisory lock ``lock_key``, then insert the
        row, in one statement (``WITH l AS MATERIALIZED (SELECT
        pg_advisory_xact_lock($1)) INSERT ... SELECT ... FROM l``): the lock
        is granted (or refused under ``lock_timeout``) before the row is
        written, in the same transaction. A subclass with its own `create`
        takes the lock on its own first, then runs that `create`."""
        if not self._one_statement_create:
            await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key)
            await self.create(conn, aggregate)
            return
        await conn.execute(self._sql.insert_locked, lock_key, *self._insert_values(aggregate))

    async def save(self, conn: Conn, aggregate: A) -> None:
        values = self._values(aggregate)
        if affected(await conn.execute(self._sql.update, *values)) == 0:
            raise NotFound(self.store_type, values[0])

    def settings(self, aggregate: A) -> Mapping[str, str]:
        """The transaction-local settings a write of ``aggregate`` runs
        under (``set_config(name, value, true)``, gone at commit): the
        context a row-level security policy on ``TABLE`` checks, e.g.
        ``{"app.current_org_id": board.org}``. The pipeline sets them in the
        write's own round trip, right before it. Default: none."""
        return {}

    def settings_sql(self, aggregate: A) -> str:
        """`settings` as one statement without parameters (``""`` for none)."""
        if not self._has_settings:
            return ""
        pairs = self.settings(aggregate)
        calls = []
        for name, value in pairs.items():
            if not (isinstance(name, str) and isinstance(value, str)):
                raise DeclarationError(
                    f"{type(self).__qualname__}.settings maps setting names to text, "
                    f"got {name!r}: {value!r}"
                )
            if "\x00" in name or "\x00" in value:
                raise DeclarationError(
                    f"{type(self).__qualname__}.settings: a setting cannot hold NUL ({name!r})"
                )
            calls.append(f"set_config({dollar_quoted(name)}, {dollar_quoted(value)}, true)")
        return f"SELECT {', '.join(calls)}" if calls else ""

    def _row_json(self, aggregate: A, columns: Sequence[str]) -> str | None:
        """``columns`` of ``aggregate``'s row as one dollar-quoted JSON
        literal (each column read by its own type on the server), or None
        when a value has no exact JSON text (a naive datetime, NaN, a type
        JSON does not know)."""
        row = self._row(aggregate)
        try:
            text = json.dumps({c: _json_value(row[c]) for c in columns},
                              allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError):
            return None
        return dollar_quoted(text)

    @property
    def error_table(self) -> str:
        """``TABLE`` without its schema: what a constraint error of this
        store's writes names (the driver's ``table_name``)."""
        return self.TABLE.rsplit(".", 1)[-1]

    def create_inlined(self, aggregate: A) -> str | None:
        """`create` as one statement without parameters (``INSERT ... SELECT
        ... FROM json_populate_record(...)``), to ride behind its lock and
        `settings` in one round trip; None for a subclass with its own
        `create` or a value without an exact JSON text."""
        if not self._one_statement_create:
            return None
        literal = self._row_json(aggregate, self.COLUMNS)
        return None if literal is None else self._sql.insert_from_json % literal

    def save_inlined(self, aggregate: A) -> str | None:
        """`save` as one statement without parameters (every value in one
        JSON literal, each column read by its own type), or None when it
        cannot be: a subclass with its own `save`, or a value without an
        exact JSON text (a naive datetime, NaN, a type JSON does not know).
        Its command status counts the rows it updated (0: no such row).

        For a row this transaction pinned (``SELECT ... FOR UPDATE``): it
        exists until the commit, so the UPDATE's row count needs no check
        and the statement may ride in a later round trip (COMMIT's).
        Values a column's type cannot read fail there as `save` would."""
        if not self._own_save:
            return None
        literal = self._row_json(aggregate, self.COLUMNS)
        return None if literal is None else self._sql.update_from_json % literal

    def delete_inlined(self, aggregate: A) -> str | None:
        """`delete` as one statement without parameters (its status counts
        the rows removed), or None for a subclass with its own `delete` or a
        key without an exact JSON text."""
        if not self._own_delete:
            return None
        literal = self._row_json(aggregate, (self.KEY,))
        return None if literal is None else self._sql.delete_from_json % literal

    def save_later(self, aggregate: A) -> PinnedSave | None:
        """`save` of a row this transaction pinned, taken now (the values
        as they are) and sent later by the pipeline: inlined
        (`save_inlined`) where it rides with other statements, or as `save`
        sends it where it travels alone. None where `save_inlined` is."""
        inlined = self.save_inlined(aggregate)
        if inlined is None:
            return None
        settings = self.settings_sql(aggregate)
        return PinnedSave(batched(settings, inlined), self.error_table,
                          self._sql.update, tuple(self._values(aggregate)), settings)

    async def delete(self, conn: Conn, aggregate: A) -> None:
        key = self.key_of(aggregate)
        if affected(await conn.execute(self._sql.delete, key)) == 0:
            raise NotFound(self.store_type, key)
