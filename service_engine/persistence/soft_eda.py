"""Soft EDA: a state row plus facts, written in the same transaction.

The state row stays the truth (reads are the CRUD reads); each command also
appends the facts it produced to a facts table, in the same statement as
the state write, so a constraint failure on either rolls both back. The
aggregate records facts with `RecordsEvents.record`::

    class CardStore(SoftEdaStore[Card, str]):
        TABLE = "card"
        COLUMNS = ("id", "title", "column_id")
        FACTS_TABLE = "card_fact"      # (card_id, fact_type, payload jsonb, ...)
        FACT_KEY = "card_id"
        ...

The facts table needs the columns ``FACT_KEY``, ``FACT_TYPE`` (text) and
``FACT_PAYLOAD`` (jsonb); anything else (an id, a recorded_at default) is
the slice's. Facts are inserted in the order they were recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, TypeVar

from ..db.types import Conn
from .base import DomainEvent, NotFound, RecordsEvents, Style
from .crud import CrudStore, affected, quote_ident

__all__ = ["SoftEdaStore"]

A = TypeVar("A", bound=RecordsEvents)
K = TypeVar("K")


class SoftEdaStore(CrudStore[A, K]):
    """A `CrudStore` that also appends the aggregate's pending facts.

    Set ``FACTS_TABLE`` (and ``FACT_KEY`` when the facts table names the
    aggregate key differently from ``KEY``).
    """

    STYLE: ClassVar[Style] = Style.SOFT_EDA
    FACTS_TABLE: ClassVar[str]
    FACT_KEY: ClassVar[str | None] = None
    FACT_TYPE: ClassVar[str] = "fact_type"
    FACT_PAYLOAD: ClassVar[str] = "payload"

    def __init__(self, *, lock_rows: bool = True) -> None:
        super().__init__(lock_rows=lock_rows)
        facts = quote_ident(self.FACTS_TABLE)
        fact_key = quote_ident(self.FACT_KEY or self.KEY)
        key = quote_ident(self.KEY)
        columns = f"{fact_key}, {quote_ident(self.FACT_TYPE)}, {quote_ident(self.FACT_PAYLOAD)}"
        n = len(self.COLUMNS)

        # One statement writes the state row and its facts: the facts hang
        # off the state CTE, so a state write that touches no row writes no
        # fact either (and is reported as NotFound).
        def with_facts(state_sql: str, params: int) -> str:
            return (
                f"WITH state AS ({state_sql} RETURNING {key} AS k) "
                f"INSERT INTO {facts} ({columns}) "
                f"SELECT state.k, f.fact_type, f.payload::jsonb "
                f"FROM state, unnest(${params + 1}::text[], ${params + 2}::text[]) "
                f"WITH ORDINALITY AS f(fact_type, payload, ord) ORDER BY f.ord"
            )

        self._insert_with_facts = with_facts(self._sql.insert, n)
        self._update_with_facts = with_facts(self._sql.update, n)
        self._delete_with_facts = with_facts(self._sql.delete, 1)

    @property
    def tables(self) -> tuple[str, ...]:
        return (self.TABLE, self.FACTS_TABLE)

    @staticmethod
    def _fact_params(events: Sequence[DomainEvent]) -> tuple[list[str], list[str]]:
        return [e.type for e in events], [e.data_json for e in events]

    async def create(self, conn: Conn, aggregate: A) -> None:
        events = aggregate.pending_events()
        if not events:
            await super().create(conn, aggregate)
        else:
            await conn.execute(
                self._insert_with_facts,
                *self._insert_values(aggregate), *self._fact_params(events),
            )
        aggregate.clear_pending_events()

    async def save(self, conn: Conn, aggregate: A) -> None:
        events = aggregate.pending_events()
        if not events:
            await super().save(conn, aggregate)
            return
        values = self._values(aggregate)
        status = await conn.execute(self._update_with_facts, *values, *self._fact_params(events))
        if affected(status) == 0:
            raise NotFound(self.store_type, values[0])
        aggregate.clear_pending_events()

    async def delete(self, conn: Conn, aggregate: A) -> None:
        events = aggregate.pending_events()
        if not events:
            await super().delete(conn, aggregate)
            return
        key = self.key_of(aggregate)
        status = await conn.execute(self._delete_with_facts, key, *self._fact_params(events))
        if affected(status) == 0:
            raise NotFound(self.store_type, key)
        aggregate.clear_pending_events()
