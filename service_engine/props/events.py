"""The projection functions replay and live publication share.

`records_changed_body` and `audit_body` turn one `StoredEvent` into the
body of ``<svc>.props.records.changed`` and ``<svc>.props.audit``. Neither
ever carries a record value or a secret field name; records-changed omits
the digest, audit omits kind, lifecycle, cause and the secret count.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .records import StoredEvent

TOPIC_RETAIN = False
"""Both reserved topics are published with ``retain:false``: a late
subscriber recovers through watch, never from a retained message."""


def rfc3339_ms(ts: datetime) -> str:
    """RFC 3339 UTC with milliseconds: ``2026-12-01T09:00:00.123Z``."""
    utc = ts.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def records_changed_body(event: StoredEvent) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespace": event.namespace,
        "key": event.key,
        "kind": event.kind,
        "verb": event.verb,
        "nseq": event.nseq,
        "version": event.version,
        "audit_epoch": event.audit_epoch,
        "actor": event.actor,
        "ts": rfc3339_ms(event.ts),
    }
    if event.fields_changed:
        body["fields_changed"] = list(event.fields_changed)
    if event.secret_fields_changed_count:
        body["secret_fields_changed_count"] = event.secret_fields_changed_count
    if event.cause is not None:
        body["cause"] = event.cause
    if event.kind == "completed":
        body["lifecycle"] = event.lifecycle
        if event.reason is not None:
            body["reason"] = event.reason
    return body


def audit_body(event: StoredEvent) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespace": event.namespace,
        "key": event.key,
        "verb": event.verb,
        "version": event.version,
        "nseq": event.nseq,
        "audit_epoch": event.audit_epoch,
        "actor": event.actor,
        "at": rfc3339_ms(event.ts),
        "audit_digest": event.digest,
    }
    if event.fields_changed:
        body["fields_changed"] = list(event.fields_changed)
    return body


def caught_up(namespace: str, nseq: int) -> dict[str, Any]:
    return {"event_type": "caught_up", "namespace": namespace, "nseq": nseq}
