"""`SqliteStore`: the property store on one SQLite file.

It owns exactly five tables with frozen DDL (`DDL`), created when absent
and verified when present, so an existing database opens without
migration. Every commit is one ``BEGIN IMMEDIATE`` transaction; a domain
`SqliteMapping` writes its business tables inside that same transaction.
All SQLite I/O runs on the store's one worker thread, never on the event
loop.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from .digests import new_audit_key
from .errors import PropsError, PropsSchemaMismatch, PropsStoreError
from .records import (
    Actor,
    Commit,
    EventKind,
    History,
    Record,
    RecordState,
    Snapshot,
    StoredEvent,
)
from .schema import Namespace
from .store import CommitVerbs, Plan, apply_commit

T = TypeVar("T")

DDL: Mapping[str, str] = {
    "__props_meta": (
        "CREATE TABLE __props_meta (namespace TEXT PRIMARY KEY NOT NULL, "
        "nseq INTEGER NOT NULL, audit_epoch INTEGER NOT NULL)"
    ),
    "__props_records": (
        "CREATE TABLE __props_records (namespace TEXT NOT NULL, key TEXT NOT NULL, "
        "version INTEGER NOT NULL, lifecycle TEXT, reason TEXT, "
        "tombstone INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (namespace, key))"
    ),
    "__props_events": (
        "CREATE TABLE __props_events (namespace TEXT NOT NULL, nseq INTEGER NOT NULL, "
        "key TEXT NOT NULL, kind TEXT NOT NULL, verb TEXT NOT NULL, version INTEGER NOT NULL, "
        "audit_epoch INTEGER NOT NULL, actor TEXT NOT NULL, ts TEXT NOT NULL, "
        "digest TEXT NOT NULL, cause TEXT, lifecycle TEXT, reason TEXT, "
        "fields_changed TEXT NOT NULL, secret_fields_changed_count INTEGER NOT NULL, "
        "PRIMARY KEY (namespace, nseq))"
    ),
    "__props_audit_keys": (
        "CREATE TABLE __props_audit_keys (namespace TEXT PRIMARY KEY NOT NULL, "
        "audit_key BLOB NOT NULL)"
    ),
    "__props_values": (
        "CREATE TABLE __props_values (namespace TEXT NOT NULL, key TEXT NOT NULL, "
        "fields TEXT NOT NULL, PRIMARY KEY (namespace, key))"
    ),
}
"""The frozen definitions, exactly as ``sqlite_master.sql`` holds them."""

TABLES = tuple(DDL)


class SqliteMapping(Protocol):
    """A domain mapping: a namespace's values in the owner's business tables
    instead of ``__props_values``. Each call runs inside the store's
    ``BEGIN IMMEDIATE`` transaction on its worker thread: use ``conn``, never
    commit, raise to roll the whole commit back."""

    def create(self, conn: sqlite3.Connection) -> None:
        """Create the business tables if absent (at registration)."""

    def load(self, conn: sqlite3.Connection, key: str) -> dict[str, Any] | None: ...

    def save(self, conn: sqlite3.Connection, key: str, fields: Mapping[str, Any]) -> None: ...

    def remove(self, conn: sqlite3.Connection, key: str) -> None: ...


class _JsonValues:
    """The default mapping: one JSON object per record in ``__props_values``."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def create(self, conn: sqlite3.Connection) -> None:
        return None

    def load(self, conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
        row = conn.execute(
            "SELECT fields FROM __props_values WHERE namespace = ? AND key = ?",
            (self.namespace, key),
        ).fetchone()
        return None if row is None else cast(dict[str, Any], json.loads(row[0]))

    def save(self, conn: sqlite3.Connection, key: str, fields: Mapping[str, Any]) -> None:
        conn.execute(
            "INSERT INTO __props_values (namespace, key, fields) VALUES (?, ?, ?) "
            "ON CONFLICT (namespace, key) DO UPDATE SET fields = excluded.fields",
            (self.namespace, key, json.dumps(dict(fields), sort_keys=True)),
        )

    def remove(self, conn: sqlite3.Connection, key: str) -> None:
        conn.execute(
            "DELETE FROM __props_values WHERE namespace = ? AND key = ?", (self.namespace, key)
        )


class _SqliteTxn:
    def __init__(self, conn: sqlite3.Connection, mapping: SqliteMapping) -> None:
        self._conn = conn
        self._mapping = mapping

    def meta(self, namespace: str) -> tuple[int, int]:
        row = self._conn.execute(
            "SELECT nseq, audit_epoch FROM __props_meta WHERE namespace = ?", (namespace,)
        ).fetchone()
        if row is None:
            raise PropsError("not_found", f"namespace {namespace!r} is not registered")
        return int(row[0]), int(row[1])

    def put_meta(self, namespace: str, nseq: int, epoch: int) -> None:
        self._conn.execute(
            "UPDATE __props_meta SET nseq = ?, audit_epoch = ? WHERE namespace = ?",
            (nseq, epoch, namespace),
        )

    def record(self, namespace: str, key: str) -> RecordState | None:
        row = self._conn.execute(
            "SELECT version, lifecycle, reason, tombstone FROM __props_records "
            "WHERE namespace = ? AND key = ?",
            (namespace, key),
        ).fetchone()
        if row is None:
            return None
        fields = None if row[3] else (self._mapping.load(self._conn, key) or {})
        return RecordState(int(row[0]), fields, row[1], row[2])

    def put_record(self, namespace: str, key: str, state: RecordState | None) -> None:
        if state is None:
            self._conn.execute(
                "DELETE FROM __props_records WHERE namespace = ? AND key = ?", (namespace, key)
            )
            self._mapping.remove(self._conn, key)
            return
        self._conn.execute(
            "INSERT INTO __props_records (namespace, key, version, lifecycle, reason, tombstone) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, key) DO UPDATE SET "
            "version = excluded.version, lifecycle = excluded.lifecycle, "
            "reason = excluded.reason, tombstone = excluded.tombstone",
            (namespace, key, state.version, state.lifecycle, state.reason, 0 if state.live else 1),
        )
        if state.fields is None:
            self._mapping.remove(self._conn, key)
        else:
            self._mapping.save(self._conn, key, state.fields)

    def append(self, event: StoredEvent) -> None:
        self._conn.execute(
            "INSERT INTO __props_events (namespace, nseq, key, kind, verb, version, audit_epoch, "
            "actor, ts, digest, cause, lifecycle, reason, fields_changed, "
            "secret_fields_changed_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                event.namespace,
                event.nseq,
                event.key,
                event.kind,
                event.verb,
                event.version,
                event.audit_epoch,
                event.actor,
                event.ts.isoformat(),
                event.digest,
                event.cause,
                event.lifecycle,
                event.reason,
                json.dumps(list(event.fields_changed)),
                event.secret_fields_changed_count,
            ),
        )

    def prune(self, namespace: str, through: int) -> None:
        self._conn.execute(
            "DELETE FROM __props_events WHERE namespace = ? AND nseq <= ?", (namespace, through)
        )

    def audit_key(self, namespace: str) -> bytes:
        row = self._conn.execute(
            "SELECT audit_key FROM __props_audit_keys WHERE namespace = ?", (namespace,)
        ).fetchone()
        if row is None:
            raise PropsError("not_found", f"namespace {namespace!r} is not registered")
        return bytes(row[0])


def _event(row: tuple[Any, ...]) -> StoredEvent:
    return StoredEvent(
        namespace=row[0],
        nseq=int(row[1]),
        key=row[2],
        kind=cast(EventKind, row[3]),
        verb=row[4],
        version=int(row[5]),
        audit_epoch=int(row[6]),
        actor=row[7],
        ts=datetime.fromisoformat(row[8]),
        digest=row[9],
        cause=row[10],
        lifecycle=row[11],
        reason=row[12],
        fields_changed=tuple(json.loads(row[13])),
        secret_fields_changed_count=int(row[14]),
    )


_EVENT_COLUMNS = (
    "namespace, nseq, key, kind, verb, version, audit_epoch, actor, ts, digest, cause, "
    "lifecycle, reason, fields_changed, secret_fields_changed_count"
)


class SqliteStore(CommitVerbs):
    """`Store` on a SQLite file. Open with `open_sqlite_store`; ``mappings``
    name a domain `SqliteMapping` per namespace (others use ``__props_values``)."""

    def __init__(self, path: Path, mappings: Mapping[str, SqliteMapping] | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self._mappings: dict[str, SqliteMapping] = dict(mappings or {})
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="props-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    async def _run(self, call: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise PropsStoreError("the props store is closed")

        def work() -> T:
            if self._conn is None:
                raise PropsStoreError("the props store is not open")
            return call(self._conn)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        except (PropsError, PropsStoreError):
            raise
        except Exception as exc:
            # A driver error or a domain mapping's own failure: the commit
            # rolled back, and the caller sees a storage failure.
            raise PropsStoreError(f"sqlite: {type(exc).__name__}: {exc}") from exc

    async def open(self) -> None:
        def connect() -> None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA busy_timeout=5000")
                found = dict(
                    conn.execute(
                        "SELECT name, sql FROM sqlite_master WHERE type = 'table' "
                        "AND name LIKE '\\_\\_props\\_%' ESCAPE '\\'"
                    ).fetchall()
                )
                for table, ddl in DDL.items():
                    if table in found and found[table] != ddl:
                        raise PropsSchemaMismatch(table, found[table])
                missing = [t for t in DDL if t not in found]
                if missing:
                    conn.execute("BEGIN IMMEDIATE")
                    for table in missing:
                        conn.execute(DDL[table])
                    conn.execute("COMMIT")
            except BaseException:
                conn.close()
                raise
            self._conn = conn

        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, connect)
        except sqlite3.Error as exc:
            raise PropsStoreError(f"sqlite: {exc}") from exc

    def _mapping(self, namespace: str) -> SqliteMapping:
        return self._mappings.setdefault(namespace, _JsonValues(namespace))

    async def register(self, ns: Namespace) -> None:
        mapping = self._mapping(ns.name)

        def register(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT INTO __props_meta (namespace, nseq, audit_epoch) VALUES (?, 0, 0) "
                    "ON CONFLICT (namespace) DO NOTHING",
                    (ns.name,),
                )
                conn.execute(
                    "INSERT INTO __props_audit_keys (namespace, audit_key) VALUES (?, ?) "
                    "ON CONFLICT (namespace) DO NOTHING",
                    (ns.name, new_audit_key()),
                )
                mapping.create(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        await self._run(register)

    async def _commit(
        self, ns: Namespace, key: str, plan: Plan, actor: Actor, bump: bool = False
    ) -> Commit:
        mapping = self._mapping(ns.name)

        def commit(conn: sqlite3.Connection) -> Commit:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = apply_commit(
                    _SqliteTxn(conn, mapping), ns, key, plan, actor, bump_epoch=bump
                )
                conn.execute("COMMIT")
                return result
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        result = await self._run(commit)
        self._committed(ns.name)
        return result

    async def get(self, namespace: str, key: str) -> Snapshot:
        mapping = self._mapping(namespace)

        def get(conn: sqlite3.Connection) -> Snapshot:
            conn.execute("BEGIN")
            try:
                txn = _SqliteTxn(conn, mapping)
                nseq, _ = txn.meta(namespace)
                state = txn.record(namespace, key)
            finally:
                conn.execute("COMMIT")
            return Snapshot(nseq, None if state is None else state.as_record(key))

        return await self._run(get)

    async def list_records(self, namespace: str) -> tuple[int, list[Record]]:
        mapping = self._mapping(namespace)

        def list_(conn: sqlite3.Connection) -> tuple[int, list[Record]]:
            conn.execute("BEGIN")
            try:
                txn = _SqliteTxn(conn, mapping)
                nseq, _ = txn.meta(namespace)
                keys = [
                    r[0]
                    for r in conn.execute(
                        "SELECT key FROM __props_records WHERE namespace = ? AND tombstone = 0 "
                        "ORDER BY key",
                        (namespace,),
                    )
                ]
                records = []
                for key in keys:
                    state = txn.record(namespace, key)
                    record = None if state is None else state.as_record(key)
                    if record is not None:
                        records.append(record)
            finally:
                conn.execute("COMMIT")
            return nseq, records

        return await self._run(list_)

    async def cursor(self, namespace: str) -> int:
        return await self._run(
            lambda conn: _SqliteTxn(conn, self._mapping(namespace)).meta(namespace)[0]
        )

    async def events(self, namespace: str, after: int, through: int) -> list[StoredEvent]:
        def events(conn: sqlite3.Connection) -> list[StoredEvent]:
            rows = conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM __props_events WHERE namespace = ? "
                "AND nseq > ? AND nseq <= ? ORDER BY nseq",
                (namespace, after, through),
            ).fetchall()
            return [_event(tuple(r)) for r in rows]

        return await self._run(events)

    async def history(self, namespace: str, after: int) -> History:
        mapping = self._mapping(namespace)

        def history(conn: sqlite3.Connection) -> History:
            # One read transaction: one snapshot of the file, so no commit or
            # prune (of this process or another) lands between the reads.
            conn.execute("BEGIN")
            try:
                nseq, _ = _SqliteTxn(conn, mapping).meta(namespace)
                row = conn.execute(
                    "SELECT MIN(nseq) FROM __props_events WHERE namespace = ?", (namespace,)
                ).fetchone()
                rows = conn.execute(
                    f"SELECT {_EVENT_COLUMNS} FROM __props_events WHERE namespace = ? "
                    "AND nseq > ? AND nseq <= ? ORDER BY nseq",
                    (namespace, after, nseq),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            oldest = None if row is None or row[0] is None else int(row[0])
            return History(nseq, oldest, tuple(_event(tuple(r)) for r in rows))

        return await self._run(history)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._listeners.clear()

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        # The close ran last on the one worker: nothing is left to wait for.
        self._executor.shutdown(wait=False)


async def open_sqlite_store(
    path: Path | str, mappings: Mapping[str, SqliteMapping] | None = None
) -> SqliteStore:
    """Open (creating or verifying the five tables) the store at ``path``."""
    store = SqliteStore(Path(path), mappings)
    try:
        await store.open()
    except BaseException:
        await store.aclose()
        raise
    return store
