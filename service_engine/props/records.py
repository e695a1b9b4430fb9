"""Records, stored events and the pure planning of every commit.

Both stores hold the same facts (a `RecordState` per key, a namespace's
``nseq`` and audit epoch, the durable `StoredEvent` history) and decide
every write with the same functions here, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

from .errors import PropsError
from .schema import Namespace, check_fields, run_delete_hook, run_validate_hook

EventKind: TypeAlias = Literal["created", "updated", "deleted", "completed", "reconciled"]


@dataclass(frozen=True, slots=True)
class RecordState:
    """What a store holds for one key. ``fields`` is None for a tombstone."""

    version: int
    fields: Mapping[str, Any] | None
    lifecycle: str | None = None
    reason: str | None = None

    @property
    def live(self) -> bool:
        return self.fields is not None

    def as_record(self, key: str) -> Record | None:
        """The record a read answers for ``key`` (None for a tombstone)."""
        if self.fields is None:
            return None
        return Record(key, self.version, dict(self.fields), self.lifecycle, self.reason)


@dataclass(frozen=True, slots=True)
class Record:
    key: str
    version: int
    fields: Mapping[str, Any]
    lifecycle: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One record (or None) read together with the namespace's cursor."""

    nseq: int
    record: Record | None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One committed change, as the durable history keeps it."""

    namespace: str
    nseq: int
    key: str
    kind: EventKind
    verb: str
    version: int
    audit_epoch: int
    actor: str
    ts: datetime
    digest: str
    cause: str | None = None
    lifecycle: str | None = None
    reason: str | None = None
    fields_changed: tuple[str, ...] = ()
    secret_fields_changed_count: int = 0


@dataclass(frozen=True, slots=True)
class History:
    """What a replay reads in one snapshot: the namespace's cursor ``nseq``,
    the oldest retained event's nseq (None when none is retained) and the
    retained events with ``after < nseq <= cursor``, in nseq order."""

    nseq: int
    oldest: int | None
    events: tuple[StoredEvent, ...]


@dataclass(frozen=True, slots=True)
class Commit:
    """What one commit did: the reply facts and its event."""

    key: str
    version: int
    nseq: int
    created: bool
    event: StoredEvent
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Planned:
    """A decided write: the key's next state (None: hard-deleted), the event
    to append (without nseq, epoch or digest) and the digest payload."""

    state: RecordState | None
    kind: EventKind
    verb: str
    created: bool
    payload: Any
    fields_changed: tuple[str, ...] = ()
    secret_fields_changed_count: int = 0
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Actor:
    """Who commits, and when."""

    actor: str
    at: datetime
    cause: str | None = None


def now() -> datetime:
    return datetime.now(UTC)


def _fence(if_version: int | None, current: int) -> None:
    if if_version is not None and if_version != current:
        raise PropsError(
            "version_mismatch",
            f"if_version {if_version} does not match the current version {current}",
            expected_version=if_version,
            current_version=current,
        )


def _changed(
    ns: Namespace, before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[tuple[str, ...], int]:
    names = sorted(
        n
        for n in set(before) | set(after)
        if n not in before or n not in after or before[n] != after[n]
    )
    secret = ns.secret_fields
    return tuple(n for n in names if n not in secret), sum(1 for n in names if n in secret)


def plan_set(
    ns: Namespace,
    key: str,
    current: RecordState | None,
    fields: Mapping[str, Any],
    *,
    merge: bool,
    if_version: int | None,
    lifecycle: str | None = None,
) -> Planned:
    """Decide a set: fence, validate, merge or replace, run the hook."""
    if ns.require_version and if_version is None:
        raise PropsError("validation_error", f"namespace {ns.name!r} requires if_version")
    current_version = current.version if current is not None else 0
    _fence(if_version, current_version)
    warnings = check_fields(ns, fields)
    before: Mapping[str, Any] = current.fields if current is not None and current.fields else {}
    created = current is None or not current.live
    after = {**before, **fields} if merge and not created else dict(fields)
    run_validate_hook(ns, key, after)
    changed, secret_count = _changed(ns, before, after)
    state = RecordState(current_version + 1, after, lifecycle, None)
    return Planned(
        state,
        "created" if created else "updated",
        "set",
        created,
        after,
        changed,
        secret_count,
        tuple(warnings),
    )


def plan_complete(
    ns: Namespace, current: RecordState | None, lifecycle: str, reason: str | None
) -> Planned:
    """Complete a saga write: the provisioned record becomes active or failed."""
    if current is None or current.fields is None:
        raise PropsError("conflict", f"nothing provisioned to complete in {ns.name!r}")
    state = RecordState(current.version + 1, current.fields, lifecycle, reason)
    return Planned(state, "completed", "set", False, dict(current.fields))


def plan_delete(
    ns: Namespace, key: str, current: RecordState | None, *, if_version: int | None
) -> Planned:
    """Decide a delete: collection only, hook, presence, fence; hard deletes
    drop the key's metadata, soft deletes keep a tombstone version."""
    run_delete_hook(ns, key)
    if ns.cardinality != "collection":
        raise PropsError(
            "validation_error", f"delete is for collections; {ns.name!r} is a singleton"
        )
    if ns.require_version and if_version is None:
        raise PropsError("validation_error", f"namespace {ns.name!r} requires if_version")
    if current is None or not current.live:
        raise PropsError("not_found", f"no record {key!r} in {ns.name!r}")
    _fence(if_version, current.version)
    tombstone = RecordState(current.version + 1, None)
    state = tombstone if ns.deletion == "soft" else None
    return Planned(state, "deleted", "delete", False, None)


def plan_reconcile(
    ns: Namespace, current: RecordState | None, fields: Mapping[str, Any]
) -> Planned:
    """The owner's reconciliation: replace the record's fields; bumps the audit epoch."""
    check_fields(ns, fields)
    before: Mapping[str, Any] = current.fields if current is not None and current.fields else {}
    version = current.version if current is not None else 0
    changed, secret_count = _changed(ns, before, fields)
    lifecycle = current.lifecycle if current is not None else None
    state = RecordState(version + 1, dict(fields), lifecycle, None)
    return Planned(
        state,
        "reconciled",
        "reconcile",
        current is None or not current.live,
        dict(fields),
        changed,
        secret_count,
    )


def state_version(planned: Planned, current: RecordState | None) -> int:
    """The version the commit's event and reply carry (a hard delete's
    tombstone version included)."""
    if planned.state is not None:
        return planned.state.version
    return (current.version if current is not None else 0) + 1


def make_event(
    ns: Namespace,
    key: str,
    planned: Planned,
    version: int,
    nseq: int,
    epoch: int,
    actor: Actor,
    digest: str,
) -> StoredEvent:
    state = planned.state
    completed = planned.kind == "completed"
    return StoredEvent(
        namespace=ns.name,
        nseq=nseq,
        key=key,
        kind=planned.kind,
        verb=planned.verb,
        version=version,
        audit_epoch=epoch,
        actor=actor.actor,
        ts=actor.at,
        digest=digest,
        cause=actor.cause,
        lifecycle=state.lifecycle if completed and state is not None else None,
        reason=state.reason if completed and state is not None else None,
        fields_changed=planned.fields_changed,
        secret_fields_changed_count=planned.secret_fields_changed_count,
    )
