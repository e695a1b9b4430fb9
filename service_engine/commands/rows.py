"""The command layer's engine rows, as stores the pipeline locks and loads.

Each is a `Persistence` over an engine table of migration 0010, so the
runner reaches them only through the pipeline's context (``cx.load_optional``
takes the row's advisory lock, held to commit; ``cx.create`` / ``cx.delete``
write in the command's transaction):

* `IdempotencyRecord` (``command_idempotency``): a key's first outcome and
  its sealed service values, written with the effect;
* `Occupancy` (``command_occupancy``): one unique value inside one
  partition, owned by one row; the advisory lock on it serialises two
  writers of one value, so the second finds the first's row (exact), and
  a claim is a conditional insert that answers whether it took the value;
* `ReverseScan`: a bounded read of a reverse index (the referencing rows'
  store keys), for restrict proofs and cascades.

Each record write also deletes a few records past their retention (the
table stays bounded while commands run); `sweep_idempotency` deletes them a
batch at a time (for a beat, or after a quiet period).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from ..clock import Timestamp
from ..db.errors import DRIVER_ERRORS, Stage, translate_db_error
from ..db.pool import Database
from ..db.types import Conn
from ..impacts.model import JsonValue
from ..offers.staging import dollar_quoted
from ..persistence.base import Aggregate, Style
from ..persistence.crud import quote_ident

__all__ = [
    "SWEEP_WITH_WRITE",
    "IdempotencyRecord",
    "Occupancy",
    "ReverseScan",
    "claim_statement",
    "claimed",
    "scan_key",
    "sweep_idempotency",
]

SWEEP_WITH_WRITE = 2
"""Expired records each record write deletes: twice the write rate drains a
backlog while commands keep coming."""


@dataclass
class IdempotencyRecord(Aggregate):
    """The stored first run of one idempotency key."""

    command: str
    scope: str
    key: str
    digest: str
    outcome: Mapping[str, Any]
    sealed: Mapping[str, JsonValue]
    recorded_at: datetime
    expired_before: datetime | None = None
    """Writing the record also deletes up to `SWEEP_WITH_WRITE` records
    recorded before this instant (past their retention)."""

    Store: ClassVar[_IdempotencyStore]

    @property
    def record_key(self) -> list[str]:
        return [self.command, self.scope, self.key]


class _IdempotencyStore:
    STYLE: ClassVar[Style] = Style.CRUD
    store_type = "service_engine.commands.idempotency"

    def key_of(self, record: IdempotencyRecord) -> list[str]:
        return record.record_key

    async def load(self, conn: Conn, key: Sequence[str]) -> IdempotencyRecord | None:
        row = await conn.fetchrow(
            "SELECT input_digest, outcome, sealed, recorded_at"
            " FROM service_engine.command_idempotency"
            " WHERE command = $1 AND scope = $2 AND key = $3",
            key[0], key[1], key[2],
        )
        if row is None:
            return None
        return IdempotencyRecord(
            key[0], key[1], key[2], row["input_digest"], row["outcome"], row["sealed"],
            row["recorded_at"],
        )

    async def read_many(self, conn: Conn, keys: Sequence[Sequence[str]]) -> list[IdempotencyRecord]:
        found = [await self.load(conn, key) for key in keys]
        return [r for r in found if r is not None]

    async def lock(self, conn: Conn, key: Sequence[str]) -> None:
        return None

    async def create(self, conn: Conn, record: IdempotencyRecord) -> None:
        # A record past its retention may still be there (not yet swept):
        # the key is free again, and its new first run replaces it. Each
        # write sweeps a few expired records in the same statement, so the
        # table stays bounded by the retention without a loop of its own;
        # SKIP LOCKED keeps two writers from contending on one.
        await conn.execute(
            "WITH swept AS (DELETE FROM service_engine.command_idempotency WHERE ctid IN ("
            " SELECT ctid FROM service_engine.command_idempotency WHERE recorded_at < $8"
            f" ORDER BY recorded_at LIMIT {SWEEP_WITH_WRITE:d} FOR UPDATE SKIP LOCKED))"
            " INSERT INTO service_engine.command_idempotency"
            " (command, scope, key, input_digest, outcome, sealed, recorded_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7)"
            " ON CONFLICT (command, scope, key) DO UPDATE SET input_digest = EXCLUDED.input_digest,"
            " outcome = EXCLUDED.outcome, sealed = EXCLUDED.sealed,"
            " recorded_at = EXCLUDED.recorded_at",
            record.command, record.scope, record.key, record.digest, dict(record.outcome),
            dict(record.sealed), record.recorded_at,
            record.expired_before or datetime.min.replace(tzinfo=UTC),
        )

    async def save(self, conn: Conn, record: IdempotencyRecord) -> None:
        await self.create(conn, record)

    async def delete(self, conn: Conn, record: IdempotencyRecord) -> None:
        await conn.execute(
            "DELETE FROM service_engine.command_idempotency"
            " WHERE command = $1 AND scope = $2 AND key = $3",
            record.command, record.scope, record.key,
        )


IdempotencyRecord.Store = _IdempotencyStore()


@dataclass
class Occupancy(Aggregate):
    """One occupied unique value: ``(entity, index, partition, value)`` owned by ``owner``."""

    entity: str
    index: str
    partition: str
    value: str
    owner: str
    claimed: bool = field(default=False, compare=False)
    """Set by a create: whether the value was free and is now this owner's."""

    Store: ClassVar[_OccupancyStore]

    @classmethod
    def of(cls, key: Sequence[str], owner: str) -> Occupancy:
        return cls(key[0], key[1], key[2], key[3], owner)

    @property
    def occupancy_key(self) -> list[str]:
        return [self.entity, self.index, self.partition, self.value]


class _OccupancyStore:
    STYLE: ClassVar[Style] = Style.CRUD
    store_type = "service_engine.commands.occupancy"

    def key_of(self, row: Occupancy) -> list[str]:
        return row.occupancy_key

    async def load(self, conn: Conn, key: Sequence[str]) -> Occupancy | None:
        owner = await conn.fetchval(
            "SELECT owner FROM service_engine.command_occupancy"
            " WHERE entity = $1 AND index_name = $2 AND partition = $3 AND value = $4",
            key[0], key[1], key[2], key[3],
        )
        return None if owner is None else Occupancy(key[0], key[1], key[2], key[3], owner)

    async def read_many(self, conn: Conn, keys: Sequence[Sequence[str]]) -> list[Occupancy]:
        found = [await self.load(conn, key) for key in keys]
        return [r for r in found if r is not None]

    async def lock(self, conn: Conn, key: Sequence[str]) -> None:
        return None

    async def create(self, conn: Conn, row: Occupancy) -> None:
        # Conditional: a held value is not an error but an answer
        # (``row.claimed``), so the transaction goes on to its outcome.
        claimed = await conn.fetchval(
            "INSERT INTO service_engine.command_occupancy"
            " (entity, index_name, partition, value, owner) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT DO NOTHING RETURNING true",
            row.entity, row.index, row.partition, row.value, row.owner,
        )
        row.claimed = claimed is True

    async def save(self, conn: Conn, row: Occupancy) -> None:
        await conn.execute(
            "UPDATE service_engine.command_occupancy SET owner = $5"
            " WHERE entity = $1 AND index_name = $2 AND partition = $3 AND value = $4",
            row.entity, row.index, row.partition, row.value, row.owner,
        )

    async def delete(self, conn: Conn, row: Occupancy) -> None:
        await conn.execute(
            "DELETE FROM service_engine.command_occupancy"
            " WHERE entity = $1 AND index_name = $2 AND partition = $3 AND value = $4",
            row.entity, row.index, row.partition, row.value,
        )


Occupancy.Store = _OccupancyStore()


def _literal(value: str) -> str:
    # The offer marks' quoting: dollar-quoted, no escape processing.
    return dollar_quoted(value)


def _where(key: Sequence[str]) -> str:
    entity, index, partition, value = (_literal(v) for v in key)
    return (f"entity = {entity} AND index_name = {index} AND partition = {partition}"
            f" AND value = {value}")


def claim_statement(claim: Occupancy, releases: Sequence[Sequence[str]] = ()) -> str:
    """One statement, every value an inlined literal (to ride in the round
    trip of the locks taken just before it): claim ``claim``'s value by the
    store's conditional insert and, only when it was free, delete the
    occupancy rows under ``releases`` (the values the same row gives up).
    Its command status answers whether the value was claimed (`claimed`);
    a held value changes nothing."""
    values = ", ".join(_literal(v) for v in (*claim.occupancy_key, claim.owner))
    sql = (
        "WITH claimed AS (INSERT INTO service_engine.command_occupancy"
        f" (entity, index_name, partition, value, owner) VALUES ({values})"
        " ON CONFLICT DO NOTHING RETURNING 1)"
    )
    for n, key in enumerate(releases):
        sql += (f", released{n} AS (DELETE FROM service_engine.command_occupancy"
                f" WHERE {_where(key)} AND EXISTS (SELECT 1 FROM claimed) RETURNING 1)")
    return sql + " SELECT 1 FROM claimed"


def claimed(status: str) -> bool:
    """Whether `claim_statement` took its value (its status ``SELECT 1``)."""
    return status == "SELECT 1"


@dataclass
class ReverseScan(Aggregate):
    """The complete keys (each a list of the key columns' values) of the
    rows a reverse index holds under one prefix."""

    query: list[Any]
    keys: list[Any] = field(default_factory=list)

    Store: ClassVar[_ReverseScanStore]


def scan_key(
    table: str, key_columns: Sequence[str], columns: Sequence[str], values: Sequence[Any],
    limit: int,
) -> list[Any]:
    """The scan's store key: which index, which prefix, which key columns,
    how many at most."""
    return [table, list(key_columns), list(columns), list(values), limit]


class _ReverseScanStore:
    STYLE: ClassVar[Style] = Style.CRUD
    store_type = "service_engine.commands.reverse_index"

    def key_of(self, scan: ReverseScan) -> list[Any]:
        return scan.query

    async def load(self, conn: Conn, key: Sequence[Any]) -> ReverseScan:
        table, key_columns, columns, values, limit = key
        where = " AND ".join(f"{quote_ident(c)} = ${i}" for i, c in enumerate(columns, start=1))
        k = ", ".join(quote_ident(c) for c in key_columns)
        rows = await conn.fetch(
            f"SELECT {k} FROM {quote_ident(table)} WHERE {where} ORDER BY {k}"
            f" LIMIT {int(limit):d}",
            *values,
        )
        return ReverseScan(list(key), [list(row) for row in rows])

    async def read_many(self, conn: Conn, keys: Sequence[Sequence[Any]]) -> list[ReverseScan]:
        return [await self.load(conn, key) for key in keys]

    async def lock(self, conn: Conn, key: Sequence[Any]) -> None:
        return None

    async def create(self, conn: Conn, scan: ReverseScan) -> None:
        raise TypeError("a reverse scan is read-only")

    async def save(self, conn: Conn, scan: ReverseScan) -> None:
        raise TypeError("a reverse scan is read-only")

    async def delete(self, conn: Conn, scan: ReverseScan) -> None:
        raise TypeError("a reverse scan is read-only")


ReverseScan.Store = _ReverseScanStore()


async def sweep_idempotency(
    db: Database, *, older_than: Timestamp, batch: int
) -> int:
    """Delete up to ``batch`` idempotency records recorded before ``older_than``;
    the number deleted (run it on a beat until it answers less than ``batch``)."""
    try:
        status = await db.pool.execute(
            "DELETE FROM service_engine.command_idempotency WHERE ctid IN ("
            " SELECT ctid FROM service_engine.command_idempotency"
            " WHERE recorded_at < $1 ORDER BY recorded_at LIMIT $2)",
            older_than.value, batch,
        )
    except DRIVER_ERRORS as exc:
        raise translate_db_error(exc, Stage.FLUSH) from exc
    return int(status.rsplit(" ", 1)[-1])
