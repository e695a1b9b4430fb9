"""The in-memory store, for tests and in-process services. Hard delete only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .digests import new_audit_key
from .errors import PropsError
from .records import (
    Actor,
    Commit,
    Record,
    RecordState,
    Snapshot,
    StoredEvent,
    plan_complete,
    plan_delete,
    plan_reconcile,
    plan_set,
)
from .schema import Namespace
from .store import Listener, Plan, apply_commit


@dataclass
class _Space:
    audit_key: bytes
    nseq: int = 0
    epoch: int = 0
    records: dict[str, RecordState] = field(default_factory=dict)
    events: list[StoredEvent] = field(default_factory=list)


class _MemoryTxn:
    def __init__(self, spaces: dict[str, _Space]) -> None:
        self._spaces = spaces

    def meta(self, namespace: str) -> tuple[int, int]:
        space = self._spaces[namespace]
        return space.nseq, space.epoch

    def put_meta(self, namespace: str, nseq: int, epoch: int) -> None:
        space = self._spaces[namespace]
        space.nseq, space.epoch = nseq, epoch

    def record(self, namespace: str, key: str) -> RecordState | None:
        return self._spaces[namespace].records.get(key)

    def put_record(self, namespace: str, key: str, state: RecordState | None) -> None:
        records = self._spaces[namespace].records
        if state is None:
            records.pop(key, None)
        else:
            records[key] = state

    def append(self, event: StoredEvent) -> None:
        self._spaces[event.namespace].events.append(event)

    def prune(self, namespace: str, through: int) -> None:
        space = self._spaces[namespace]
        space.events = [e for e in space.events if e.nseq > through]

    def audit_key(self, namespace: str) -> bytes:
        return self._spaces[namespace].audit_key


class MemoryStore:
    """`Store` in process memory. Commits are synchronous on the event loop,
    so each is atomic by construction."""

    def __init__(self) -> None:
        self._spaces: dict[str, _Space] = {}
        self._listeners: list[Listener] = []

    def _space(self, namespace: str) -> _Space:
        space = self._spaces.get(namespace)
        if space is None:
            raise PropsError("not_found", f"namespace {namespace!r} is not registered")
        return space

    async def register(self, ns: Namespace) -> None:
        if ns.deletion != "hard":
            raise ConfigError(f"the in-memory store implements hard delete only ({ns.name!r})")
        self._spaces.setdefault(ns.name, _Space(new_audit_key()))

    def _commit(
        self, ns: Namespace, key: str, plan: Plan, actor: Actor, bump: bool = False
    ) -> Commit:
        self._space(ns.name)
        commit = apply_commit(_MemoryTxn(self._spaces), ns, key, plan, actor, bump_epoch=bump)
        for listener in list(self._listeners):
            listener(ns.name)
        return commit

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
        return self._commit(
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
        return self._commit(ns, key, lambda cur: plan_complete(ns, cur, lifecycle, reason), actor)

    async def delete(
        self, ns: Namespace, key: str, *, if_version: int | None, actor: Actor
    ) -> Commit:
        return self._commit(
            ns, key, lambda cur: plan_delete(ns, key, cur, if_version=if_version), actor
        )

    async def reconcile(
        self, ns: Namespace, key: str, fields: Mapping[str, Any], *, actor: Actor
    ) -> Commit:
        return self._commit(ns, key, lambda cur: plan_reconcile(ns, key, cur, fields), actor, True)

    async def get(self, namespace: str, key: str) -> Snapshot:
        space = self._space(namespace)
        state = space.records.get(key)
        if state is None or state.fields is None:
            return Snapshot(space.nseq, None)
        return Snapshot(
            space.nseq,
            Record(key, state.version, dict(state.fields), state.lifecycle, state.reason),
        )

    async def list_records(self, namespace: str) -> tuple[int, list[Record]]:
        space = self._space(namespace)
        records = [
            Record(key, s.version, dict(s.fields), s.lifecycle, s.reason)
            for key, s in sorted(space.records.items())
            if s.fields is not None
        ]
        return space.nseq, records

    async def cursor(self, namespace: str) -> int:
        return self._space(namespace).nseq

    async def events(self, namespace: str, after: int, through: int) -> list[StoredEvent]:
        return [e for e in self._space(namespace).events if after < e.nseq <= through]

    async def oldest_nseq(self, namespace: str) -> int | None:
        events = self._space(namespace).events
        return events[0].nseq if events else None

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def aclose(self) -> None:
        self._listeners.clear()

    def _audit_key(self, namespace: str) -> bytes:
        # For the store's own tests: keys never leave the owner's storage.
        return self._space(namespace).audit_key
