"""A window read straight from a table: the default ``populate``.

Most windows are "the rows of my cohorts, in this order, one page at a
time". A projector declares that as data instead of writing the SQL, the
cohort filter and the paging itself::

    class NotesView(Projector[Note, NoteView, OrgMember, None]):
        NAME = "notes"
        WINDOW = TableWindow("note", cohort="org")

(its noun, store and `CohortColumn` visibility derived from the window
and the row type: see `service_engine.render.projector`).

The window lists ``key`` of ``table`` whose ``cohort`` column holds one of
the caller's cohort values (`cohort_values`: the plain cohorts, or with
``kind`` the values of the ``(kind, value)`` cohorts), ordered by ``order``
(ascending, or all descending), at most ``limit`` keys (a query with a
``limit`` attribute asks for fewer; never below one). A page back starts
after the cursor: the key of the last row the client holds, or the list of
its ``order`` values (a row already deleted still pages on from its
values). With no cohort filter (`Unrestricted`) every row is listed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..db.types import Conn
from ..failures import ConfigError
from ..impacts.model import JsonValue, canonical_json

__all__ = ["PageContext", "TableWindow", "cohort_values"]


class PageContext(Protocol):
    """What a page is read for: the caller's ``cohorts``, the ``cursor``
    (None: the head) and the read's ``conn`` (a `Populate` context is one)."""

    @property
    def cursor(self) -> JsonValue: ...

    @property
    def cohorts(self) -> frozenset[Hashable] | None: ...

    @property
    def conn(self) -> Conn: ...


def cohort_values(cohorts: Iterable[Hashable] | None, kind: str | None = None) -> list[Any]:
    """The values of ``cohorts`` a populate filters its column by: with
    ``kind``, the ``value`` of each ``(kind, value)`` cohort; without, each
    cohort that is not such a pair. ``None`` (no filter) gives ``[]``."""
    found: list[Any] = []
    for cohort in cohorts or ():
        if isinstance(cohort, tuple) and len(cohort) == 2:
            if kind is not None and cohort[0] == kind:
                found.append(cohort[1])
        elif kind is None:
            found.append(cohort)
    return found


def _ident(name: str) -> str:
    from ..persistence.crud import quote_ident

    return quote_ident(name)


@dataclass(frozen=True, slots=True)
class TableWindow:
    """The keys of ``table`` the caller's cohorts select, in ``order``, a
    page at a time (see the module docstring)."""

    table: str
    cohort: str | None = None
    """The column holding a row's cohort value; None: no cohort filter."""
    kind: str | None = None
    """The tag of the ``(kind, value)`` cohorts the column holds; None: plain cohorts."""
    order: tuple[str, ...] = ("id",)
    """The order columns; the last one is unique (the key, as a tie-break)."""
    descending: bool = False
    key: str = "id"
    limit: int = 500

    def __post_init__(self) -> None:
        if not self.order or self.limit < 1:
            raise ConfigError("a TableWindow needs an order column and a limit of at least 1")
        object.__setattr__(self, "order", tuple(self.order))
        self.sql(filtered=True)  # refuses a name that is not a plain identifier

    def sql(self, *, filtered: bool) -> str:
        """The page's query: ``$1`` the cohort values (when ``filtered``),
        ``$2`` the cursor as the text of a JSON object of the order columns (or null),
        ``$3`` the limit."""
        t = _ident(self.table)
        cols = ", ".join(f"t.{_ident(c)}" for c in self.order)
        after = ", ".join(f"p.{_ident(c)}" for c in self.order)
        direction = " DESC" if self.descending else ""
        where = [f"t.{_ident(self.cohort)} = ANY($1)" if filtered and self.cohort
                 else "$1::int IS NULL"]
        where.append(f"($2::text IS NULL OR ({cols}) {'<' if self.descending else '>'} ({after}))")
        return (
            f"SELECT t.{_ident(self.key)} AS key FROM {t} AS t, "
            # The cursor is sent as text and parsed here: a pool whose jsonb
            # codec encodes values itself would send a str as a JSON string.
            f"jsonb_populate_record(NULL::{t}, coalesce($2::text::jsonb, '{{}}')) AS p "
            f"WHERE {' AND '.join(where)} "
            f"ORDER BY {', '.join(f't.{_ident(c)}{direction}' for c in self.order)} LIMIT $3"
        )

    def place(self, cursor: JsonValue) -> str | None:
        """The cursor as the JSON object of the order columns (None: the head)."""
        if cursor is None:
            return None
        values = list(cursor) if isinstance(cursor, list | tuple) else [cursor]
        if len(values) != len(self.order):
            raise ConfigError(
                f"a cursor of {self.table} is a key or the values of {list(self.order)}, "
                f"got {cursor!r}"
            )
        return canonical_json(dict(zip(self.order, values, strict=True)))

    def page_size(self, asked: int | None) -> int:
        """The limit of a page: ``asked``, clamped to ``1..limit``."""
        return self.limit if asked is None else max(1, min(asked, self.limit))

    def many_sql(self, value_type: str) -> str:
        """The head pages of many windows in one query: ``$1`` the windows'
        numbers, ``$2`` their limits, ``$3`` the cohort values of all of them
        (of the cohort column's type, ``value_type``) and ``$4`` the number
        of the window each value is of. Rows: each window's ``n`` and
        ``key``, a window's keys in its order."""
        if self.cohort is None:
            raise ConfigError(f"the window of {self.table} has no cohort column to filter by")
        t = _ident(self.table)
        direction = " DESC" if self.descending else ""
        cols = ", ".join(f"t.{_ident(c)} AS o{i}" for i, c in enumerate(self.order))
        return (
            f"SELECT w.n AS n, k.key AS key FROM unnest($1::int[], $2::int[]) AS w(n, lim) "
            f"CROSS JOIN LATERAL (SELECT ARRAY(SELECT v.value FROM "
            f"unnest($3::{value_type}[], $4::int[]) AS v(value, n) WHERE v.n = w.n) AS vals) AS a "
            f"CROSS JOIN LATERAL (SELECT t.{_ident(self.key)} AS key, {cols} FROM {t} AS t "
            f"WHERE t.{_ident(self.cohort)} = ANY(a.vals) "
            f"ORDER BY {', '.join(f't.{_ident(c)}{direction}' for c in self.order)} "
            f"LIMIT w.lim) AS k "
            f"ORDER BY w.n, {', '.join(f'k.o{i}{direction}' for i in range(len(self.order)))}"
        )

    async def keys_many(
        self, cxs: Sequence[PageContext], asked: Sequence[int | None]
    ) -> list[Sequence[JsonValue]]:
        """The page of each of ``cxs`` (``asked[i]`` the limit ``cxs[i]``
        asks for), as `keys` lists it; all read through one connection.
        The head pages filtered by cohort are read in one statement; a page
        after a cursor, or with no cohort filter, is read by itself (an
        unfiltered head page once per limit)."""
        pages: list[Sequence[JsonValue] | None] = [None] * len(cxs)
        together = [i for i, cx in enumerate(cxs)
                    if cx.cursor is None and cx.cohorts is not None and self.cohort is not None]
        if together:
            conn = cxs[together[0]].conn
            # The column's type, for the values' array (the query's one
            # parameter typed by the column, as ``= ANY($1)`` is in `sql`).
            value_type = await conn.fetchval(
                "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute AS a "
                "WHERE a.attrelid = $1::regclass AND a.attname = $2 AND NOT a.attisdropped",
                _ident(self.table), self.cohort,
            )
            if value_type is None:
                together = []  # no such column: each page's own query says so
            else:
                values: list[Any] = []
                owners: list[int] = []
                for n, i in enumerate(together):
                    found = cohort_values(cxs[i].cohorts, self.kind)
                    values.extend(found)
                    owners.extend([n] * len(found))
                rows = await conn.fetch(
                    self.many_sql(value_type), list(range(len(together))),
                    [self.page_size(asked[i]) for i in together], values, owners,
                )
                lists: list[list[JsonValue]] = [[] for _ in together]
                for row in rows:
                    lists[row["n"]].append(row["key"])
                for n, i in enumerate(together):
                    pages[i] = lists[n]
        heads: dict[int, Sequence[JsonValue]] = {}
        for i, cx in enumerate(cxs):
            if pages[i] is not None:
                continue
            if cx.cursor is None and (cx.cohorts is None or self.cohort is None):
                size = self.page_size(asked[i])
                if size not in heads:
                    heads[size] = await self.keys(cx, size)
                pages[i] = heads[size]
            else:
                pages[i] = await self.keys(cx, asked[i])
        return [page if page is not None else [] for page in pages]

    async def keys(self, cx: PageContext, asked: int | None = None) -> Sequence[JsonValue]:
        """The page's keys for ``cx`` (its cohorts, its cursor)."""
        filtered = cx.cohorts is not None and self.cohort is not None
        cursor = cx.cursor
        if cursor is not None and len(self.order) > 1 and not isinstance(cursor, list | tuple):
            # A key: page on after its row's order values.
            place = await cx.conn.fetchval(
                f"SELECT row_to_json(t)::text FROM {_ident(self.table)} AS t "
                f"WHERE t.{_ident(self.key)} = $1", cursor,
            )
            if place is None:
                return []  # a key no longer stored: nothing after it is known
        else:
            place = self.place(cursor)
        values = cohort_values(cx.cohorts, self.kind) if filtered else None
        rows = await cx.conn.fetch(
            self.sql(filtered=filtered), values, place, self.page_size(asked)
        )
        return [row["key"] for row in rows]
