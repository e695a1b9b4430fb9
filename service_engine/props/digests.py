"""Event digests: lowercase hex HMAC-SHA256 over canonical JSON and the nseq.

``digest = HMAC-SHA256(namespace_key, canonical_json(payload) || nseq as 8
big-endian bytes)``, where the payload is the record's stored fields after
the commit (``null`` for a delete) and the key is the namespace's private
32-byte audit key. No previous-digest chain.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

from ..failures import ConfigError

AUDIT_KEY_BYTES = 32


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def event_digest(key: bytes, payload: Any, nseq: int) -> str:
    if len(key) != AUDIT_KEY_BYTES:
        raise ConfigError("an audit key is 32 bytes")
    message = canonical_json(payload) + nseq.to_bytes(8, "big")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def new_audit_key() -> bytes:
    return secrets.token_bytes(AUDIT_KEY_BYTES)
