"""Event digests recomputed independently from their definition, and the
topic projections' exact field sets."""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from service_engine.props import (
    audit_body,
    canonical_json,
    event_digest,
    records_changed_body,
    rfc3339_ms,
)
from service_engine.props.records import StoredEvent

KEY = bytes(range(32))


def independent_digest(key: bytes, payload: object, nseq: int) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hmac.new(key, text.encode("utf-8") + struct.pack(">Q", nseq), hashlib.sha256).hexdigest()


def test_digest_matches_its_definition() -> None:
    """An event digest is the lowercase hex HMAC-SHA256 of the canonical JSON and the 8-byte nseq,
    as an independent computation gives."""
    payload = {"b": 1, "a": {"z": [1, 2], "y": "é"}}
    digest = event_digest(KEY, payload, 42)
    assert digest == independent_digest(KEY, payload, 42)
    assert digest == digest.lower() and len(digest) == 64


def test_deletes_hash_null() -> None:
    """A delete's digest hashes null."""
    assert event_digest(KEY, None, 3) == hmac.new(KEY, b"null" + (3).to_bytes(8, "big"), hashlib.sha256).hexdigest()


def test_nseq_is_part_of_the_digest_and_there_is_no_chain() -> None:
    """The nseq is part of the digest, and a digest depends on nothing before it (no chain)."""
    assert event_digest(KEY, {"a": 1}, 1) != event_digest(KEY, {"a": 1}, 2)
    assert event_digest(KEY, {"a": 1}, 2) == event_digest(KEY, {"a": 1}, 2)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@given(json_values, st.integers(min_value=0, max_value=2**64 - 1))
def test_digest_property(payload: object, nseq: int) -> None:
    """The digest equals the independent computation for any JSON payload and nseq (property test)."""
    assert event_digest(KEY, payload, nseq) == independent_digest(KEY, payload, nseq)


def test_canonical_json_sorts_keys_without_whitespace() -> None:
    """Canonical JSON sorts keys at every level and has no whitespace."""
    assert canonical_json({"b": [1, {"d": 1, "c": 2}], "a": None}) == b'{"a":null,"b":[1,{"c":2,"d":1}]}'


def event(**overrides: object) -> StoredEvent:
    base: dict[str, object] = dict(
        namespace="cfg", nseq=5, key="k", kind="updated", verb="set", version=3, audit_epoch=0,
        actor="A/alice", ts=datetime(2026, 12, 1, 9, 0, 0, 123456, tzinfo=UTC), digest="ab" * 32,
    )
    base.update(overrides)
    return StoredEvent(**base)  # type: ignore[arg-type]


def test_rfc3339_utc_milliseconds() -> None:
    """Timestamps render as RFC 3339 UTC with milliseconds and Z."""
    assert rfc3339_ms(datetime(2026, 12, 1, 9, 0, 0, 123456, tzinfo=UTC)) == "2026-12-01T09:00:00.123Z"


def test_records_changed_body_fields() -> None:
    """A records.changed body carries the event's public fields and no digest; optional fields
    appear only when set, the lifecycle only on completion."""
    body = records_changed_body(event())
    assert set(body) == {"namespace", "key", "kind", "verb", "nseq", "version", "audit_epoch", "actor", "ts"}
    assert "audit_digest" not in body and "digest" not in body
    full = records_changed_body(event(
        kind="completed", fields_changed=("a",), secret_fields_changed_count=2, cause="c",
        lifecycle="failed", reason="no",
    ))
    assert full["fields_changed"] == ["a"] and full["secret_fields_changed_count"] == 2
    assert (full["cause"], full["lifecycle"], full["reason"]) == ("c", "failed", "no")
    assert "lifecycle" not in records_changed_body(event(lifecycle="active"))


def test_audit_body_fields() -> None:
    """An audit body carries the audit fields and the digest."""
    body = audit_body(event(fields_changed=("a",), secret_fields_changed_count=1, cause="c", lifecycle="x"))
    assert set(body) == {
        "namespace", "key", "verb", "version", "nseq", "audit_epoch", "actor", "at", "audit_digest",
        "fields_changed",
    }
    assert body["audit_digest"] == "ab" * 32
