"""The `Store` protocol both property stores implement, and the one commit
sequence and write verbs (`CommitVerbs`) they share.

A store keeps, per registered namespace, the cursor ``nseq`` and audit
epoch, one `RecordState` per key, the private audit key and the durable
event history. Every commit runs `apply_commit` inside the store's single
transaction: read the state, decide with the pure planner, advance the
cursor, append the digested event, prune history past the namespace's
retention.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .digests import event_digest
from .records import (
    Actor,
    Commit,
    History,
    Planned,
    Record,
    RecordState,
    Snapshot,
    StoredEvent,
    make_event,
    plan_complete,
    plan_delete,
    plan_reconcile,
    plan_set,
    state_version,
)
from .schema import Namespace

Listener = Callable[[str], None]
"""Called on the event loop after each commit with the namespace's name."""


class Store(Protocol):
    """Where a service's property records live. Every method may raise
    `PropsError` (the refusal to answer with) or `PropsStoreError`."""

    async def register(self, ns: Namespace) -> None:
        """Make ``ns`` known; creates its cursor and audit key once."""

    async def set(
        self,
        ns: Namespace,
        key: str,
        fields: Mapping[str, Any],
        *,
        merge: bool,
        if_version: int | None,
        actor: Actor,
        lifecycle: str | None = None,
    ) -> Commit: ...

    async def complete(
        self, ns: Namespace, key: str, *, lifecycle: str, reason: str | None, actor: Actor
    ) -> Commit: ...

    async def delete(
        self, ns: Namespace, key: str, *, if_version: int | None, actor: Actor
    ) -> Commit: ...

    async def reconcile(
        self, ns: Namespace, key: str, fields: Mapping[str, Any], *, actor: Actor
    ) -> Commit:
        """The owner's reconciliation: the only commit that increases the audit epoch."""

    async def get(self, namespace: str, key: str) -> Snapshot: ...

    async def list_records(self, namespace: str) -> tuple[int, list[Record]]:
        """The cursor and every live record, by key."""

    async def cursor(self, namespace: str) -> int: ...

    async def events(self, namespace: str, after: int, through: int) -> list[StoredEvent]:
        """The retained events with ``after < nseq <= through``, in nseq order."""

    async def history(self, namespace: str, after: int) -> History:
        """The cursor, the oldest retained nseq and the retained events past
        ``after``, read in one snapshot: a commit or a prune cannot fall
        between the retention check and the events a replay returns."""

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` after every commit; returns its remover."""

    async def aclose(self) -> None: ...


class Txn(Protocol):
    """The reads and writes of one store transaction."""

    def meta(self, namespace: str) -> tuple[int, int]:
        """``(nseq, audit_epoch)``."""

    def put_meta(self, namespace: str, nseq: int, epoch: int) -> None: ...

    def record(self, namespace: str, key: str) -> RecordState | None: ...

    def put_record(self, namespace: str, key: str, state: RecordState | None) -> None: ...

    def append(self, event: StoredEvent) -> None: ...

    def prune(self, namespace: str, through: int) -> None:
        """Drop events with ``nseq <= through``."""

    def audit_key(self, namespace: str) -> bytes: ...


Plan = Callable[[RecordState | None], Planned]


def apply_commit(
    txn: Txn, ns: Namespace, key: str, plan: Plan, actor: Actor, *, bump_epoch: bool
) -> Commit:
    """One commit: plan against the current state, then write everything.

    Planning raises before anything is written, so a refusal leaves the
    transaction untouched.
    """
    current = txn.record(ns.name, key)
    planned = plan(current)
    nseq, epoch = txn.meta(ns.name)
    nseq += 1
    if bump_epoch:
        epoch += 1
    version = state_version(planned, current)
    digest = event_digest(txn.audit_key(ns.name), planned.payload, nseq)
    event = make_event(ns, key, planned, version, nseq, epoch, actor, digest)
    txn.put_record(ns.name, key, planned.state)
    txn.put_meta(ns.name, nseq, epoch)
    txn.append(event)
    if nseq > ns.retain_events:
        txn.prune(ns.name, nseq - ns.retain_events)
    return Commit(key, version, nseq, planned.created, event, planned.warnings)


class CommitVerbs:
    """The write verbs and listeners both stores share: each verb plans with
    the pure planner and runs through the store's one-transaction
    `_commit`, which calls `_committed` once the commit is durable."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    async def _commit(
        self, ns: Namespace, key: str, plan: Plan, actor: Actor, bump: bool = False
    ) -> Commit:
        """Run `apply_commit` with ``plan`` in one transaction of the store."""
        raise NotImplementedError

    def _committed(self, namespace: str) -> None:
        for listener in list(self._listeners):
            listener(namespace)

    async def set(
        self,
        ns: Namespace,
        key: str,
        fields: Mapping[str, Any],
        *,
        merge: bool,
        if_version: int | None,
        actor: Actor,
        lifecycle: str | None = None,
    ) -> Commit:
        return await self._commit(
            ns,
            key,
            lambda cur: plan_set(
                ns, key, cur, fields, merge=merge, if_version=if_version, lifecycle=lifecycle
            ),
            actor,
        )

    async def complete(
        self, ns: Namespace, key: str, *, lifecycle: str, reason: str | None, actor: Actor
    ) -> Commit:
        return await self._commit(
            ns, key, lambda cur: plan_complete(ns, cur, lifecycle, reason), actor
        )

    async def delete(
        self, ns: Namespace, key: str, *, if_version: int | None, actor: Actor
    ) -> Commit:
        return await self._commit(
            ns, key, lambda cur: plan_delete(ns, key, cur, if_version=if_version), actor
        )

    async def reconcile(
        self, ns: Namespace, key: str, fields: Mapping[str, Any], *, actor: Actor
    ) -> Commit:
        return await self._commit(
            ns, key, lambda cur: plan_reconcile(ns, cur, fields), actor, True
        )

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None
