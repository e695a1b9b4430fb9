"""One contract suite for both property stores (the in-memory store and
SqliteStore on disk), then what only SQLite promises: the frozen DDL, opening
an existing database without migration, soft delete, domain mappings inside
the one BEGIN IMMEDIATE transaction, I/O off the event loop."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sqlite3
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from service_engine.errors import ConfigError
from service_engine.props import (
    DDL,
    Actor,
    FieldSpec,
    History,
    HookRejected,
    MemoryStore,
    Namespace,
    PropsError,
    PropsSchemaMismatch,
    SqliteStore,
    Store,
    open_sqlite_store,
)
from service_engine.props.records import now


def actor(cause: str | None = None) -> Actor:
    return Actor("A/alice", now(), cause)


ITEMS = Namespace(
    "items",
    (
        FieldSpec("title", "string", default="untitled"),
        FieldSpec("count", "integer", default=0),
        FieldSpec("token", "string", secret=True),
    ),
    retain_events=50,
)


def rejecting(key: str, fields: Mapping[str, Any]) -> None:
    if fields.get("title") == "bad":
        raise HookRejected("title may not be bad")
    if fields.get("title") == "boom":
        raise RuntimeError("the hook itself broke")


HOOKED = Namespace("hooked", (FieldSpec("title", "string"),), validate=rejecting)
SHORT = Namespace("short", (FieldSpec("n", "integer"),), retain_events=3)


def _refuse_bad_keys(key: str, fields: Mapping[str, Any]) -> None:
    if key.startswith("bad"):
        raise HookRejected(f"key {key} refused")


def _keep(key: str) -> None:
    raise HookRejected(f"{key} is kept")


KEYED = Namespace("keyed", (FieldSpec("title", "string"),), validate=_refuse_bad_keys, on_delete=_keep)
NUMBERS = Namespace("numbers", (FieldSpec("ratio", "number"), FieldSpec("meta", "object")))


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class StoreContract:
    """The behaviour every `Store` shares. Subclasses provide `store` and
    `audit_key`."""

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        raise NotImplementedError
        yield

    def audit_key(self, store: Store, namespace: str) -> bytes:
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    async def registered(self, store: Store) -> None:
        for ns in (ITEMS, HOOKED, SHORT, NUMBERS, KEYED):
            await store.register(ns)

    async def test_register_is_idempotent_and_starts_at_zero(self, store: Store) -> None:
        """A registered namespace starts at cursor 0 with an empty history."""
        await store.register(ITEMS)
        assert await store.cursor("items") == 0
        assert await store.history("items", 0) == History(0, None, ())

    async def test_versions_and_nseq_increase_on_commits(self, store: Store) -> None:
        """Each commit bumps its record's version and the namespace's nseq by one; other namespaces'
        cursors do not move."""
        first = await store.set(ITEMS, "a", {"title": "x"}, merge=True, if_version=None, actor=actor())
        assert (first.version, first.nseq, first.created) == (1, 1, True)
        second = await store.set(ITEMS, "a", {"count": 2}, merge=True, if_version=None, actor=actor())
        assert (second.version, second.nseq, second.created) == (2, 2, False)
        other = await store.set(ITEMS, "b", {"title": "y"}, merge=True, if_version=None, actor=actor())
        assert (other.version, other.nseq) == (1, 3)
        assert await store.cursor("items") == 3
        assert await store.cursor("hooked") == 0

    async def test_merge_patches_and_replace_replaces(self, store: Store) -> None:
        """A merge set patches the named fields and keeps the rest; a replace set keeps only the
        fields given."""
        await store.set(ITEMS, "a", {"title": "x", "count": 1}, merge=True, if_version=None, actor=actor())
        await store.set(ITEMS, "a", {"count": 2}, merge=True, if_version=None, actor=actor())
        assert (await store.get("items", "a")).record.fields == {"title": "x", "count": 2}  # type: ignore[union-attr]
        await store.set(ITEMS, "a", {"count": 3}, merge=False, if_version=None, actor=actor())
        assert (await store.get("items", "a")).record.fields == {"count": 3}  # type: ignore[union-attr]

    async def test_stored_values_are_verbatim_without_defaults(self, store: Store) -> None:
        """The store keeps the fields as written, without filling schema defaults."""
        await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
        snap = await store.get("items", "a")
        assert snap.record is not None and snap.record.fields == {"count": 1}
        assert snap.nseq == 1

    async def test_zero_fences_creation(self, store: Store) -> None:
        """if_version 0 creates a record only when it does not exist; a second such set is
        version_mismatch naming both versions and commits nothing."""
        created = await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=0, actor=actor())
        assert created.version == 1
        with pytest.raises(PropsError) as caught:
            await store.set(ITEMS, "a", {"count": 2}, merge=True, if_version=0, actor=actor())
        assert caught.value.error_code == "version_mismatch"
        assert caught.value.body() == {
            "error_code": "version_mismatch", "message": caught.value.message,
            "expected_version": 0, "current_version": 1,
        }
        assert await store.cursor("items") == 1

    async def test_fence_on_update_and_delete(self, store: Store) -> None:
        """A fenced update or delete succeeds at the current version and is refused at a stale one,
        naming expected and current."""
        await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
        assert (await store.set(ITEMS, "a", {"count": 2}, merge=True, if_version=1, actor=actor())).version == 2
        with pytest.raises(PropsError) as caught:
            await store.delete(ITEMS, "a", if_version=1, actor=actor())
        assert (caught.value.extra["expected_version"], caught.value.extra["current_version"]) == (1, 2)
        deleted = await store.delete(ITEMS, "a", if_version=2, actor=actor())
        assert deleted.version == 3

    async def test_hard_delete_restarts_a_recreated_record_at_version_one(self, store: Store) -> None:
        """After a hard delete the record is gone and a recreation starts again at version 1 (the
        nseq keeps counting)."""
        await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
        await store.set(ITEMS, "a", {"count": 2}, merge=True, if_version=None, actor=actor())
        deleted = await store.delete(ITEMS, "a", if_version=None, actor=actor())
        assert (deleted.version, deleted.nseq) == (3, 3)
        assert (await store.get("items", "a")).record is None
        again = await store.set(ITEMS, "a", {"count": 9}, merge=True, if_version=0, actor=actor())
        assert (again.version, again.created, again.nseq) == (1, True, 4)

    async def test_delete_of_a_missing_record_is_not_found(self, store: Store) -> None:
        """Deleting a missing record is not_found naming the key and namespace."""
        with pytest.raises(PropsError) as caught:
            await store.delete(ITEMS, "nope", if_version=None, actor=actor())
        assert (caught.value.error_code, caught.value.message) == ("not_found", "no record 'nope' in 'items'")

    async def test_a_commit_reports_its_key_and_event(self, store: Store) -> None:
        """A commit reports its key and the very event stored for it."""
        commit = await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
        (event,) = await store.events("items", 0, 1)
        assert (commit.key, commit.event) == ("a", event)

    async def test_hooks_receive_the_key(self, store: Store) -> None:
        """The namespace's hooks receive the key, and a hook's refusal of a set or a delete answers
        its message."""
        with pytest.raises(PropsError) as rejected:
            await store.set(KEYED, "bad-key", {"title": "t"}, merge=True, if_version=None, actor=actor())
        assert rejected.value.message == "key bad-key refused"
        await store.set(KEYED, "good", {"title": "t"}, merge=True, if_version=None, actor=actor())
        with pytest.raises(PropsError) as kept:
            await store.delete(KEYED, "good", if_version=None, actor=actor())
        assert kept.value.message == "good is kept"

    async def test_a_saga_write_keeps_its_lifecycle_until_completion(self, store: Store) -> None:
        """A saga write stays provisioning until completed; completing a record nothing provisioned
        is a conflict."""
        await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor(), lifecycle="provisioning")
        snap = await store.get("items", "a")
        assert snap.record is not None and snap.record.lifecycle == "provisioning"
        with pytest.raises(PropsError) as nothing:
            await store.complete(ITEMS, "ghost", lifecycle="active", reason=None, actor=actor())
        assert (nothing.value.error_code, nothing.value.message) == ("conflict", "nothing provisioned to complete in 'items'")

    async def test_every_reconciliation_increases_the_audit_epoch_by_one(self, store: Store) -> None:
        """Each reconciliation raises the audit epoch by one."""
        for n in range(3):
            await store.reconcile(ITEMS, "a", {"count": n}, actor=Actor("demo", now()))
        assert [e.audit_epoch for e in await store.events("items", 0, 3)] == [1, 2, 3]

    async def test_retention_keeps_exactly_retain_events(self, store: Store) -> None:
        """Exactly retain_events commits keep the history starting at nseq 1."""
        for n in range(SHORT.retain_events):
            await store.set(SHORT, "k", {"n": n}, merge=True, if_version=None, actor=actor())
        assert (await store.history("short", 0)).oldest == 1

    async def test_a_listener_remover_may_run_twice(self, store: Store) -> None:
        """Removing a listener twice is harmless, and a removed listener hears nothing."""
        heard: list[str] = []
        remove = store.add_listener(heard.append)
        remove()
        remove()
        await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
        assert heard == []

    async def test_list_returns_cursor_and_live_records(self, store: Store) -> None:
        """A list returns the cursor and the live records in key order, without deleted ones."""
        await store.set(ITEMS, "b", {"count": 1}, merge=True, if_version=None, actor=actor())
        await store.set(ITEMS, "a", {"count": 2}, merge=True, if_version=None, actor=actor())
        await store.set(ITEMS, "c", {"count": 3}, merge=True, if_version=None, actor=actor())
        await store.delete(ITEMS, "c", if_version=None, actor=actor())
        nseq, records = await store.list_records("items")
        assert nseq == 4
        assert [(r.key, r.version, dict(r.fields)) for r in records] == [("a", 1, {"count": 2}), ("b", 1, {"count": 1})]

    async def test_events_carry_kind_changes_and_secret_counts(self, store: Store) -> None:
        """Events record their kind, verb, version, nseq, changed non-secret field names, the count
        of changed secret fields, actor, cause and epoch; events() pages by nseq."""
        await store.set(ITEMS, "a", {"title": "x", "token": "s1"}, merge=True, if_version=None, actor=actor("c1"))
        await store.set(ITEMS, "a", {"title": "x", "token": "s2", "count": 1}, merge=True, if_version=None, actor=actor())
        await store.delete(ITEMS, "a", if_version=None, actor=actor())
        events = await store.events("items", 0, 3)
        assert [(e.kind, e.verb, e.version, e.nseq) for e in events] == [
            ("created", "set", 1, 1), ("updated", "set", 2, 2), ("deleted", "delete", 3, 3),
        ]
        assert (events[0].fields_changed, events[0].secret_fields_changed_count, events[0].cause) == (("title",), 1, "c1")
        assert (events[1].fields_changed, events[1].secret_fields_changed_count) == (("count",), 1)
        assert events[0].actor == "A/alice" and events[0].audit_epoch == 0
        assert [e.nseq for e in await store.events("items", 1, 2)] == [2]

    async def test_digests_recompute_from_the_private_key(self, store: Store) -> None:
        """Each event's digest is the HMAC-SHA256, under the namespace's 32-byte audit key, of the
        canonical fields (null for a delete) and the nseq."""
        await store.set(ITEMS, "a", {"title": "x", "token": "s"}, merge=True, if_version=None, actor=actor())
        await store.delete(ITEMS, "a", if_version=None, actor=actor())
        key = self.audit_key(store, "items")
        assert len(key) == 32
        created, deleted = await store.events("items", 0, 2)
        expected = hmac.new(key, canonical({"title": "x", "token": "s"}) + (1).to_bytes(8, "big"), hashlib.sha256)
        assert created.digest == expected.hexdigest()
        assert deleted.digest == hmac.new(key, b"null" + (2).to_bytes(8, "big"), hashlib.sha256).hexdigest()

    async def test_hook_rejection_and_hook_failure_commit_nothing(self, store: Store) -> None:
        """A hook's rejection (validation_error) and a hook's failure (hook_error rc 20) commit
        nothing and move no cursor."""
        with pytest.raises(PropsError) as rejected:
            await store.set(HOOKED, "a", {"title": "bad"}, merge=True, if_version=None, actor=actor())
        assert rejected.value.error_code == "validation_error"
        with pytest.raises(PropsError) as failed:
            await store.set(HOOKED, "a", {"title": "boom"}, merge=True, if_version=None, actor=actor())
        assert (failed.value.error_code, failed.value.rc) == ("hook_error", 20)
        assert await store.cursor("hooked") == 0 and await store.events("hooked", 0, 10) == []

    async def test_field_checks(self, store: Store) -> None:
        """Unknown fields, wrongly typed values (a bool is not an integer) and reserved names are
        refused as validation_error."""
        for fields in ({"nope": 1}, {"count": "1"}, {"count": True}, {"_lifecycle": "x"}):
            with pytest.raises(PropsError) as caught:
                await store.set(ITEMS, "a", fields, merge=True, if_version=None, actor=actor())
            assert caught.value.error_code == "validation_error"

    async def test_reconciliation_alone_increases_the_audit_epoch(self, store: Store) -> None:
        """Only a reconciliation raises the audit epoch; later updates keep it."""
        await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
        rec = await store.reconcile(ITEMS, "a", {"count": 5}, actor=Actor("demo", now()))
        after = await store.set(ITEMS, "a", {"count": 6}, merge=True, if_version=None, actor=actor())
        epochs = [(e.kind, e.audit_epoch) for e in await store.events("items", 0, after.nseq)]
        assert epochs == [("created", 0), ("reconciled", 1), ("updated", 1)]
        assert rec.version == 2

    async def test_saga_completion_is_its_own_commit(self, store: Store) -> None:
        """Completing a saga is a commit of its own, a completed event carrying the lifecycle and
        reason."""
        await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor(), lifecycle="provisioning")
        done = await store.complete(ITEMS, "a", lifecycle="failed", reason="quota", actor=actor())
        last = (await store.events("items", 1, 2))[0]
        assert (last.kind, last.lifecycle, last.reason, done.version) == ("completed", "failed", "quota", 2)
        snap = await store.get("items", "a")
        assert snap.record is not None and snap.record.lifecycle == "failed"

    async def test_history_is_bounded_by_retention(self, store: Store) -> None:
        """The history keeps the last retain_events events, reports the oldest retained nseq, and
        replays from a cursor within it."""
        for n in range(5):
            await store.set(SHORT, "k", {"n": n}, merge=True, if_version=None, actor=actor())
        history = await store.history("short", 0)
        assert (history.nseq, history.oldest) == (5, 3)
        assert [e.nseq for e in history.events] == [3, 4, 5]
        assert [e.nseq for e in await store.events("short", 0, 5)] == [3, 4, 5]
        assert [e.nseq for e in (await store.history("short", 3)).events] == [4, 5]
        assert (await store.history("short", 5)).events == ()

    @pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400"])
    async def test_non_finite_numbers_are_validation_errors(self, store: Store, raw: str) -> None:
        """JSON has no NaN or infinity: both stores refuse them (rc 10) on
        a number field and inside an object, and write nothing."""
        value = json.loads(raw)
        for fields in ({"ratio": value}, {"meta": {"a": [1, value]}}):
            with pytest.raises(PropsError) as caught:
                await store.set(NUMBERS, "k", fields, merge=True, if_version=None, actor=actor())
            assert (caught.value.error_code, caught.value.rc) == ("validation_error", 10)
            assert "non-finite" in caught.value.message
        with pytest.raises(PropsError) as reconciled:
            await store.reconcile(NUMBERS, "k", {"ratio": value}, actor=actor())
        assert reconciled.value.error_code == "validation_error"
        assert await store.cursor("numbers") == 0 and (await store.get("numbers", "k")).record is None
        await store.set(NUMBERS, "k", {"ratio": 1e308, "meta": {"a": [-0.0]}}, merge=True, if_version=None, actor=actor())

    async def test_listeners_hear_every_commit(self, store: Store) -> None:
        """A listener hears the namespace of each commit until it is removed."""
        heard: list[str] = []
        remove = store.add_listener(heard.append)
        await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
        remove()
        await store.set(ITEMS, "a", {"count": 2}, merge=True, if_version=None, actor=actor())
        assert heard == ["items"]

    async def test_unregistered_namespace_is_not_found(self, store: Store) -> None:
        """An unregistered namespace is not_found."""
        with pytest.raises(PropsError) as caught:
            await store.cursor("ghost")
        assert caught.value.error_code == "not_found"


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = MemoryStore()
        yield store
        await store.aclose()

    def audit_key(self, store: Store, namespace: str) -> bytes:
        assert isinstance(store, MemoryStore)
        return store._audit_key(namespace)

    async def test_implements_hard_delete_only(self, store: Store) -> None:
        """The in-memory store refuses a soft-delete namespace."""
        with pytest.raises(ConfigError):
            await store.register(SOFT)


class TestSqliteStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = await open_sqlite_store(tmp_path / "props.db")
        yield store
        await store.aclose()

    def audit_key(self, store: Store, namespace: str) -> bytes:
        assert isinstance(store, SqliteStore)
        with sqlite3.connect(store.path) as conn:
            row = conn.execute("SELECT audit_key FROM __props_audit_keys WHERE namespace = ?", (namespace,)).fetchone()
        return bytes(row[0])


SOFT = Namespace("soft", (FieldSpec("n", "integer"),), deletion="soft", require_version=True)

FROZEN_DDL = {
    "__props_meta": "CREATE TABLE __props_meta (namespace TEXT PRIMARY KEY NOT NULL, nseq INTEGER NOT NULL, audit_epoch INTEGER NOT NULL)",
    "__props_records": "CREATE TABLE __props_records (namespace TEXT NOT NULL, key TEXT NOT NULL, version INTEGER NOT NULL, lifecycle TEXT, reason TEXT, tombstone INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (namespace, key))",
    "__props_events": "CREATE TABLE __props_events (namespace TEXT NOT NULL, nseq INTEGER NOT NULL, key TEXT NOT NULL, kind TEXT NOT NULL, verb TEXT NOT NULL, version INTEGER NOT NULL, audit_epoch INTEGER NOT NULL, actor TEXT NOT NULL, ts TEXT NOT NULL, digest TEXT NOT NULL, cause TEXT, lifecycle TEXT, reason TEXT, fields_changed TEXT NOT NULL, secret_fields_changed_count INTEGER NOT NULL, PRIMARY KEY (namespace, nseq))",
    "__props_audit_keys": "CREATE TABLE __props_audit_keys (namespace TEXT PRIMARY KEY NOT NULL, audit_key BLOB NOT NULL)",
    "__props_values": "CREATE TABLE __props_values (namespace TEXT NOT NULL, key TEXT NOT NULL, fields TEXT NOT NULL, PRIMARY KEY (namespace, key))",
}
"""The schema-compatibility pin: change these and existing databases break."""


def master_tables(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())


async def test_sqlite_owns_exactly_the_five_tables_with_frozen_ddl(tmp_path: Path) -> None:
    """The SQLite store creates exactly its five tables, with the DDL frozen in the test, and its
    own DDL table equals it."""
    store = await open_sqlite_store(tmp_path / "p.db")
    await store.register(ITEMS)
    await store.aclose()
    assert master_tables(tmp_path / "p.db") == FROZEN_DDL
    assert dict(DDL) == FROZEN_DDL


async def test_sqlite_existing_database_opens_without_migration(tmp_path: Path) -> None:
    """Reopening an existing SQLite file keeps its records and cursor, accepts fenced writes, and
    changes no table."""
    path = tmp_path / "p.db"
    store = await open_sqlite_store(path)
    await store.register(ITEMS)
    await store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
    await store.aclose()
    before = master_tables(path)
    reopened = await open_sqlite_store(path)
    try:
        await reopened.register(ITEMS)
        snap = await reopened.get("items", "a")
        assert snap.nseq == 1 and snap.record is not None and snap.record.fields == {"count": 1}
        assert (await reopened.set(ITEMS, "a", {"count": 2}, merge=True, if_version=1, actor=actor())).nseq == 2
    finally:
        await reopened.aclose()
    assert master_tables(path) == before


async def test_sqlite_refuses_a_foreign_props_table(tmp_path: Path) -> None:
    """A file holding a props table of another shape is refused with PropsSchemaMismatch."""
    path = tmp_path / "p.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE __props_meta (namespace TEXT, nseq INTEGER)")
    with pytest.raises(PropsSchemaMismatch):
        await open_sqlite_store(path)


async def test_sqlite_soft_delete_keeps_the_tombstone_and_recreates_against_it(tmp_path: Path) -> None:
    """A soft-delete namespace requires a version fence, keeps the tombstone's version after a
    delete, and recreates only against that version."""
    store = await open_sqlite_store(tmp_path / "p.db")
    try:
        await store.register(SOFT)
        with pytest.raises(PropsError) as unfenced:
            await store.set(SOFT, "a", {"n": 1}, merge=True, if_version=None, actor=actor())
        assert unfenced.value.error_code == "validation_error"
        await store.set(SOFT, "a", {"n": 1}, merge=True, if_version=0, actor=actor())
        deleted = await store.delete(SOFT, "a", if_version=1, actor=actor())
        assert deleted.version == 2
        assert (await store.get("soft", "a")).record is None
        assert (await store.list_records("soft"))[1] == []
        with pytest.raises(PropsError) as stale:
            await store.set(SOFT, "a", {"n": 2}, merge=True, if_version=0, actor=actor())
        assert stale.value.extra == {"expected_version": 0, "current_version": 2}
        again = await store.set(SOFT, "a", {"n": 2}, merge=True, if_version=2, actor=actor())
        assert (again.version, again.created) == (3, True)
    finally:
        await store.aclose()


async def test_sqlite_delete_requires_if_version_under_require_version(tmp_path: Path) -> None:
    """require_version fences deletes too: none is validation_error and a
    stale one version_mismatch, each leaving the record and the cursor."""
    store = await open_sqlite_store(tmp_path / "p.db")
    try:
        await store.register(SOFT)
        await store.set(SOFT, "a", {"n": 1}, merge=True, if_version=0, actor=actor())
        with pytest.raises(PropsError) as unfenced:
            await store.delete(SOFT, "a", if_version=None, actor=actor())
        assert (unfenced.value.error_code, unfenced.value.rc) == ("validation_error", 10)
        assert "requires if_version" in unfenced.value.message
        with pytest.raises(PropsError) as stale:
            await store.delete(SOFT, "a", if_version=0, actor=actor())
        assert (stale.value.error_code, stale.value.extra) == ("version_mismatch", {"expected_version": 0, "current_version": 1})
        assert await store.cursor("soft") == 1 and (await store.get("soft", "a")).record is not None
    finally:
        await store.aclose()


async def test_sqlite_history_is_one_snapshot_under_a_concurrent_writer(tmp_path: Path) -> None:
    """Another connection to the file commits (and prunes) while history is
    read: every history is one snapshot, its oldest nseq the retention floor
    of its own cursor and its events contiguous from there to the cursor."""
    writer = await open_sqlite_store(tmp_path / "p.db")
    reader = await open_sqlite_store(tmp_path / "p.db")
    await writer.register(SHORT)
    await reader.register(SHORT)

    async def write() -> None:
        for n in range(200):
            await writer.set(SHORT, "k", {"n": n}, merge=True, if_version=None, actor=actor())

    writing = asyncio.create_task(write())
    try:
        reads = 0
        while not writing.done():
            history = await reader.history("short", 0)
            reads += 1
            if history.nseq:
                assert history.oldest == max(1, history.nseq - SHORT.retain_events + 1), history
                assert [e.nseq for e in history.events] == list(range(history.oldest, history.nseq + 1))
        await writing
        assert reads > 1
    finally:
        writing.cancel()
        await asyncio.gather(writing, return_exceptions=True)
        await writer.aclose()
        await reader.aclose()


class Tickets:
    """A domain mapping: the namespace's values in a business table."""

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.fail_next = False

    def create(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS tickets (id TEXT PRIMARY KEY, title TEXT)")

    def load(self, conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
        row = conn.execute("SELECT title FROM tickets WHERE id = ?", (key,)).fetchone()
        return None if row is None else {"title": row[0]}

    def save(self, conn: sqlite3.Connection, key: str, fields: Mapping[str, Any]) -> None:
        self.threads.add(threading.get_ident())
        conn.execute("INSERT OR REPLACE INTO tickets (id, title) VALUES (?, ?)", (key, fields.get("title")))
        if self.fail_next:
            raise sqlite3.IntegrityError("the business rule refused it")

    def remove(self, conn: sqlite3.Connection, key: str) -> None:
        conn.execute("DELETE FROM tickets WHERE id = ?", (key,))


TICKETS = Namespace("tickets", (FieldSpec("title", "string"),))


async def test_sqlite_domain_mapping_shares_the_one_transaction_off_the_loop(tmp_path: Path) -> None:
    """A domain mapping writes its own table in the store's transaction on a worker thread; a
    mapping that fails rolls the whole commit back."""
    path = tmp_path / "p.db"
    mapping = Tickets()
    store = await open_sqlite_store(path, {"tickets": mapping})
    try:
        await store.register(TICKETS)
        await store.set(TICKETS, "t1", {"title": "first"}, merge=True, if_version=None, actor=actor())
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT title FROM tickets").fetchall() == [("first",)]
            assert conn.execute("SELECT COUNT(*) FROM __props_values").fetchone() == (0,)
        assert threading.get_ident() not in mapping.threads
        mapping.fail_next = True
        with pytest.raises(Exception, match="business rule"):
            await store.set(TICKETS, "t1", {"title": "second"}, merge=True, if_version=None, actor=actor())
        mapping.fail_next = False
        snap = await store.get("tickets", "t1")
        assert snap.nseq == 1 and snap.record is not None and snap.record.fields == {"title": "first"}
        assert [e.nseq for e in await store.events("tickets", 0, 9)] == [1]
    finally:
        await store.aclose()


def test_hard_delete_cannot_require_version_fencing() -> None:
    """A hard-delete namespace that requires version fencing is refused at declaration."""
    with pytest.raises(ConfigError):
        Namespace("x", (FieldSpec("n", "integer"),), require_version=True)


async def test_sqlite_commit_waits_for_the_write_lock_off_the_loop(tmp_path: Path) -> None:
    """A commit takes the write lock at BEGIN IMMEDIATE: while another
    connection holds it, the commit waits on the store's thread and the event
    loop keeps running; it lands once the lock is released."""
    import asyncio

    path = tmp_path / "p.db"
    store = await open_sqlite_store(path)
    try:
        await store.register(ITEMS)
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        pending = asyncio.ensure_future(
            store.set(ITEMS, "a", {"count": 1}, merge=True, if_version=None, actor=actor())
        )
        # The loop's own timer fires while the commit waits on its thread.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pending), 0.1)
        assert not pending.done()
        other.execute("ROLLBACK")
        other.close()
        assert (await asyncio.wait_for(pending, 5)).nseq == 1
    finally:
        await store.aclose()
