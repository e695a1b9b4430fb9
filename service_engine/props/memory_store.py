"""The in-memory store, for tests and in-process services. Hard delete only."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..failures import ConfigError
from .digests import new_audit_key
from .errors import PropsError
from .records import (
    Actor,
    Commit,
    History,
    Record,
    RecordState,
    Snapshot,
    StoredEvent,
)
from .schema import Namespace
from .store import CommitVerbs, Plan, apply_commit


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


class MemoryStore(CommitVerbs):
    """`Store` in process memory. Commits are synchronous on the event loop,
    so each is atomic by construction."""

    def __init__(self) -> None:
        super().__init__()
        self._spaces: dict[str, _Space] = {}

    def _space(self, namespace: str) -> _Space:
        space = self._spaces.get(namespace)
        if space is None:
            raise PropsError("not_found", f"namespace {namespace!r} is not registered")
        return space

    async def register(self, ns: Namespace) -> None:
        if ns.deletion != "hard":
            raise ConfigError(f"the in-memory store implements hard delete only ({ns.name!r})")
        self._spaces.setdefault(ns.name, _Space(new_audit_key()))

    async def _commit(
        self, ns: Namespace, key: str, plan: Plan, actor: Actor, bump: bool = False
    ) -> Commit:
        self._space(ns.name)
        commit = apply_commit(_MemoryTxn(self._spaces), ns, key, plan, actor, bump_epoch=bump)
        self._committed(ns.name)
        return commit

    async def get(self, namespace: str, key: str) -> Snapshot:
        space = self._space(namespace)
        state = space.records.get(key)
        return Snapshot(space.nseq, None if state is None else state.as_record(key))

    async def list_records(self, namespace: str) -> tuple[int, list[Record]]:
        space = self._space(namespace)
        records = [
            record
            for key, state in sorted(space.records.items())
            if (record := state.as_record(key)) is not None
        ]
        return space.nseq, records

    async def cursor(self, namespace: str) -> int:
        return self._space(namespace).nseq

    async def events(self, namespace: str, after: int, through: int) -> list[StoredEvent]:
        return [e for e in self._space(namespace).events if after < e.nseq <= through]

    async def history(self, namespace: str, after: int) -> History:
        # Synchronous on the event loop: no commit can interleave.
        space = self._space(namespace)
        return History(
            space.nseq,
            space.events[0].nseq if space.events else None,
            tuple(e for e in space.events if e.nseq > after),
        )

    async def aclose(self) -> None:
        self._listeners.clear()

    def _audit_key(self, namespace: str) -> bytes:
        # For the store's own tests: keys never leave the owner's storage.
        return self._space(namespace).audit_key
