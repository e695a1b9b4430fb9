"""The scope-declaration handshake's wire (schema version 1). Pure.

Request / reply over core NATS (no stream: a declaration is a boot-time
conversation, not a fact to keep):

* subject ``identity.scope.declare.v1.{service}`` (`declare_subject`);
  Identity subscribes to ``identity.scope.declare.v1.*`` in a queue group;
* request: the integration envelope shape —
  ``{"schema": "service_engine.scope_declaration/1", "envelope_id": uuid,
  "type": "scope.declared", "version": 1, "occurred_at": RFC 3339,
  "metadata": {"actor": {"kind": "service", "id": <v5 service identity>},
  "correlation_id": uuid, "causation_id": null},
  "payload": {"service": str, "pod_id": str, "scopes": [sorted keys],
  "digest": sha256 hex of the keys joined by "\\n"}}``;
* reply: ``{"schema": "service_engine.scope_declaration_reply/1",
  "correlation_id": <the request's envelope_id>, "digest": <echoed>,
  "status": "confirmed" | "rejected", "reason": str | null}``.

A reply of another schema, or whose digest or correlation does not match,
is refused as `ScopeWireError` (the pod keeps asking); ``rejected`` carries
the reason the pod is held DOWN with (an unknown key, say).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ..failures import EngineError
from .manifest import ScopeDeclaration

__all__ = [
    "DECLARE_SUBJECT_PREFIX",
    "REPLY_SCHEMA",
    "REQUEST_SCHEMA",
    "ScopeReply",
    "ScopeRequest",
    "ScopeWireError",
    "declare_subject",
    "decode_reply",
    "decode_request",
    "encode_reply",
    "encode_request",
]

DECLARE_SUBJECT_PREFIX = "identity.scope.declare.v1"
REQUEST_SCHEMA = "service_engine.scope_declaration/1"
REPLY_SCHEMA = "service_engine.scope_declaration_reply/1"


class ScopeWireError(EngineError):
    """A handshake message that does not follow the wire."""


def declare_subject(service: str) -> str:
    return f"{DECLARE_SUBJECT_PREFIX}.{service}"


@dataclass(frozen=True, slots=True)
class ScopeRequest:
    envelope_id: uuid.UUID
    declaration: ScopeDeclaration
    pod_id: str
    actor_id: uuid.UUID
    correlation_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class ScopeReply:
    correlation_id: uuid.UUID
    digest: str
    status: Literal["confirmed", "rejected"]
    reason: str | None = None


def encode_request(request: ScopeRequest, at: datetime | None = None) -> bytes:
    declaration = request.declaration
    return json.dumps({
        "schema": REQUEST_SCHEMA,
        "envelope_id": str(request.envelope_id),
        "type": "scope.declared",
        "version": 1,
        "occurred_at": (at or datetime.now(UTC)).isoformat(),
        "metadata": {
            "actor": {"kind": "service", "id": str(request.actor_id)},
            "correlation_id": str(request.correlation_id),
            "causation_id": None,
        },
        "payload": {
            "service": declaration.service, "pod_id": request.pod_id,
            "scopes": list(declaration.scopes), "digest": declaration.digest,
        },
    }, separators=(",", ":")).encode()


def _object(data: bytes, schema: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ScopeWireError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict) or value.get("schema") != schema:
        raise ScopeWireError(f"expected schema {schema!r}")
    return value


def decode_request(data: bytes) -> ScopeRequest:
    value = _object(data, REQUEST_SCHEMA)
    try:
        payload, metadata = value["payload"], value["metadata"]
        declaration = ScopeDeclaration(str(payload["service"]), tuple(map(str, payload["scopes"])))
        if declaration.digest != payload["digest"]:
            raise ScopeWireError("the request's digest does not match its scopes")
        return ScopeRequest(
            uuid.UUID(value["envelope_id"]), declaration, str(payload["pod_id"]),
            uuid.UUID(metadata["actor"]["id"]), uuid.UUID(metadata["correlation_id"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ScopeWireError(f"malformed scope declaration: {exc!r}") from exc


def encode_reply(reply: ScopeReply) -> bytes:
    return json.dumps({
        "schema": REPLY_SCHEMA, "correlation_id": str(reply.correlation_id),
        "digest": reply.digest, "status": reply.status, "reason": reply.reason,
    }, separators=(",", ":")).encode()


def decode_reply(data: bytes, request: ScopeRequest) -> ScopeReply:
    """The reply to ``request``; `ScopeWireError` for anything else."""
    value = _object(data, REPLY_SCHEMA)
    try:
        reply = ScopeReply(
            uuid.UUID(value["correlation_id"]), str(value["digest"]), value["status"],
            None if value.get("reason") is None else str(value["reason"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ScopeWireError(f"malformed scope reply: {exc!r}") from exc
    if reply.status not in ("confirmed", "rejected"):
        raise ScopeWireError(f"unknown reply status {reply.status!r}")
    if reply.correlation_id != request.envelope_id or reply.digest != request.declaration.digest:
        raise ScopeWireError("the reply answers another declaration")
    return reply
