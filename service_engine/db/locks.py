"""Advisory-lock keys: domain-tagged, separator-safe FNV-1a 64-bit hashes.

The write pipeline serialises commands on one aggregate with
``pg_advisory_xact_lock(key)``, where ``key`` is `aggregate_lock_key` of the
store type and the JSON-encoded aggregate key; other engine locks (the
per-service schema-version lock, ...) use `named_lock_key` under their own
domain.

The hashed bytes are an unambiguous framing of ``(domain, *parts)``: every
field is written as its length (8 bytes, big-endian) followed by its bytes.
The length is the separator between the parts, and it cannot be forged by a
part's content, so ``("ab", "c")`` and ``("a", "bc")`` hash different inputs
and two domains never share an input. Distinct inputs can still collide in a
64-bit hash, with negligible probability for the key counts a service locks.

All functions are pure and need no database.
"""

from __future__ import annotations

import functools
import json

__all__ = [
    "AGGREGATE_LOCK_DOMAIN",
    "SCHEMA_VERSION_LOCK_DOMAIN",
    "advisory_key",
    "aggregate_lock_key",
    "fnv1a_64",
    "lock_key_bytes",
    "named_lock_key",
]

AGGREGATE_LOCK_DOMAIN = "service_engine.aggregate"
"""Domain of the write pipeline's per-aggregate lock."""

SCHEMA_VERSION_LOCK_DOMAIN = "service_engine.schema_version"
"""Domain of the per-service lock boot claims the schema-version row under."""

_FNV_OFFSET_BASIS = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK_64 = (1 << 64) - 1
_SIGN_BIT = 1 << 63
_LENGTH_BYTES = 8


def fnv1a_64(data: bytes) -> int:
    """Return the FNV-1a 64-bit hash of ``data`` as an unsigned int.

    This is the standard FNV-1a (offset basis 0xcbf29ce484222325, prime
    0x100000001b3). Advisory locks want a signed bigint: use `advisory_key`.
    """
    return _fnv1a_64_from(_FNV_OFFSET_BASIS, data)


def _fnv1a_64_from(h: int, data: bytes) -> int:
    """FNV-1a continued from state ``h`` over ``data``: FNV-1a is a left
    fold over the bytes, so hashing ``a + b`` equals continuing the state
    after ``a`` over ``b``."""
    prime, mask = _FNV_PRIME, _MASK_64
    # Four bytes a step, masked once per step: the product's low 64 bits
    # depend only on the factors' low 64 bits, and the xor touches only the
    # low byte, so masking every fourth step gives the same state.
    whole = len(data) - len(data) % 4
    it = iter(data[:whole])
    for b0, b1, b2, b3 in zip(it, it, it, it, strict=True):
        h = ((((((((h ^ b0) * prime) ^ b1) * prime) ^ b2) * prime) ^ b3) * prime) & mask
    for byte in data[whole:]:
        h = ((h ^ byte) * prime) & mask
    return h


@functools.lru_cache(maxsize=1024)
def _prefix_state(domain: str, *parts: str | bytes) -> int:
    """The FNV-1a state after the framed ``(domain, *parts)``: the fields a
    kind of lock shares (its domain, a store's name), hashed once."""
    return fnv1a_64(lock_key_bytes(domain, *parts))


def lock_key_bytes(domain: str, *parts: str | bytes) -> bytes:
    """Return the unambiguous byte framing `advisory_key` hashes.

    Each field (the domain, then every part) is its 8-byte big-endian length
    followed by its bytes; a ``str`` is encoded as UTF-8 (lone surrogates
    passed through, so every ``str`` has exactly one encoding). Distinct
    ``(domain, *parts)`` field sequences always give distinct bytes.
    """
    return b"".join(_frame(field) for field in (domain, *parts))


def _frame(field: str | bytes) -> bytes:
    """One field's framing: its 8-byte big-endian length, then its bytes."""
    raw = field.encode("utf-8", "surrogatepass") if isinstance(field, str) else field
    return len(raw).to_bytes(_LENGTH_BYTES, "big") + raw


def advisory_key(domain: str, *parts: str | bytes) -> int:
    """Return the advisory-lock key of ``parts`` under ``domain``.

    The result is a signed 64-bit int (the FNV-1a hash read as two's
    complement), so pass it straight to ``pg_advisory_xact_lock($1::bigint)``
    or ``pg_try_advisory_xact_lock``. Pick a domain per kind of lock, named
    ``service_engine.<what>``, so two kinds never contend by construction.
    """
    if parts:
        # Every field but the last is shared by many keys (the domain, the
        # store's name): its state is cached, only the last field is hashed.
        h = _fnv1a_64_from(_prefix_state(domain, *parts[:-1]), _frame(parts[-1]))
    else:
        h = _prefix_state(domain)
    return h - (1 << 64) if h & _SIGN_BIT else h


_KEY_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)
"""The canonical encoding of an aggregate key (built once, not per key)."""


def aggregate_lock_key(store_type: str | type[object], key: object) -> int:
    """Return the write pipeline's lock key for one aggregate.

    ``store_type`` is the store's qualified name (``"module.Class"``) or the
    store class itself, whose ``__module__`` and ``__qualname__`` make that
    name. ``key`` must be JSON-encodable; it is encoded canonically (sorted
    object keys, no whitespace, unescaped Unicode), so equal keys lock the
    same row whatever their dict order, while ``1`` and ``"1"`` stay distinct.
    Raises ``TypeError`` when ``key`` is not JSON-encodable.
    """
    name = store_type if isinstance(store_type, str) else _qualified_name(store_type)
    encoded = _KEY_JSON.encode(key)
    return advisory_key(AGGREGATE_LOCK_DOMAIN, name, encoded)


def named_lock_key(domain: str, name: str) -> int:
    """Return the lock key of a single named resource under ``domain``.

    For engine-wide locks that are not per aggregate, e.g. the schema-version
    lock of one service: ``named_lock_key(SCHEMA_VERSION_LOCK_DOMAIN, service)``.
    """
    return advisory_key(domain, name)


def _qualified_name(store_type: type[object]) -> str:
    return f"{store_type.__module__}.{store_type.__qualname__}"
