"""The runner's pure steps: inputs, service values, digests, lock order, occupancy.

Nothing here touches the database: the runner (`runner`) calls these
around its reads and writes, and they are unit-tested on their own.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ..clock import Timestamp
from ..failures import EngineError
from ..impacts.model import JsonValue, canonical_json
from .declaration import TRANSACTION_TIME, UUID_V7, Entity, Input, Service, Unique

if TYPE_CHECKING:
    from .checked import CheckedCommand

__all__ = [
    "InvalidInput",
    "OccupancyKey",
    "encode_value",
    "input_digest",
    "lock_identity",
    "occupancy_keys",
    "order_by_lock",
    "seal",
    "unseal",
    "uuid_v7",
    "validate_inputs",
]

T = TypeVar("T")


class InvalidInput(EngineError):
    """A command's inputs do not match its declaration (a name unknown or
    missing, a type or length wrong); answered as ``command.invalid_input``."""


def _check_input(declared: Input, value: object) -> object:
    typ = declared.type
    if value is None:
        if declared.optional:
            return None
        raise InvalidInput(f"input {declared.name} is required")
    if typ is bool or typ is str:
        ok = type(value) is typ
    elif typ is int:
        ok = type(value) is int
    elif typ is float:
        ok = type(value) in (int, float)
        value = float(value) if ok else value  # type: ignore[arg-type]
    elif typ is uuid.UUID:
        if isinstance(value, str):
            try:
                value = uuid.UUID(value)
            except ValueError as exc:
                raise InvalidInput(f"input {declared.name} is not a uuid") from exc
        ok = isinstance(value, uuid.UUID)
    else:
        ok = isinstance(value, datetime) and value.tzinfo is not None
    if not ok:
        if isinstance(value, datetime) and typ is datetime:
            raise InvalidInput(f"input {declared.name} must be a datetime with a time zone, "
                               "got one without")
        raise InvalidInput(
            f"input {declared.name} must be a {typ.__name__}, got {type(value).__name__}"
        )
    if declared.max_length is not None and len(value) > declared.max_length:  # type: ignore[arg-type]
        raise InvalidInput(f"input {declared.name} is longer than {declared.max_length}")
    return value


def validate_inputs(command: CheckedCommand, raw: Mapping[str, object]) -> dict[str, object]:
    """The inputs as declared: every required input present and typed, none extra.

    A service value among them is refused: the engine samples those.
    """
    declared = {i.name: i for i in command.inputs}
    services = {s.name for s in command.services}
    for name in raw:
        if name in services:
            raise InvalidInput(
                f"{name} is a service value: the engine samples it, never the caller"
            )
        if name not in declared:
            raise InvalidInput(f"{command.name} has no input {name!r}")
    return {name: _check_input(i, raw.get(name)) for name, i in declared.items()}


_PLAIN: frozenset[type] = frozenset({str, int, float, bool, type(None)})
"""Exact types that are their own JSON (the common case, checked first)."""


def encode_value(value: object) -> JsonValue:
    """An input, service or field value as JSON (uuid and instants as text)."""
    if type(value) in _PLAIN:
        return value  # type: ignore[return-value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Timestamp):
        return value.value.isoformat()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [encode_value(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((encode_value(v) for v in value), key=canonical_json)
    if isinstance(value, Mapping):
        return {str(k): encode_value(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"not a command value: {value!r}")


def input_digest(command: CheckedCommand, inputs: Mapping[str, object]) -> str:
    """What "the same inputs" means for a key: a digest of every input but the key."""
    relevant = {k: encode_value(v) for k, v in inputs.items() if k != command.idempotency_key}
    text = canonical_json({"command": command.name, "inputs": relevant})
    return hashlib.sha256(text.encode()).hexdigest()


def uuid_v7(unix_ms: int | None = None, random_bytes: bytes | None = None) -> uuid.UUID:
    """A version-7 UUID (RFC 9562): 48 bits of Unix milliseconds, then random."""
    ms = int(time.time() * 1000) if unix_ms is None else unix_ms
    rand = os.urandom(10) if random_bytes is None else random_bytes
    if not 0 <= ms < 1 << 48 or len(rand) != 10:
        raise ValueError("uuid_v7 needs 48-bit milliseconds and 10 random bytes")
    value = (ms << 80) | int.from_bytes(rand, "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)


def seal(
    services: Sequence[Service], now: Timestamp,
    make_uuid: Callable[[int], uuid.UUID] = lambda ms: uuid_v7(ms),
) -> dict[str, object]:
    """Sample every service value once: the transaction's instant, fresh uuids."""
    ms = now.epoch_micros // 1000
    return {
        s.name: now.value if s.kind == TRANSACTION_TIME else make_uuid(ms) for s in services
    }


def unseal(services: Sequence[Service], sealed: Mapping[str, JsonValue]) -> dict[str, object]:
    """The service values a record stored, back as values."""
    values: dict[str, object] = {}
    for s in services:
        raw = sealed[s.name]
        if not isinstance(raw, str):
            raise ValueError(f"sealed {s.name} is not text: {raw!r}")
        values[s.name] = uuid.UUID(raw) if s.kind == UUID_V7 else datetime.fromisoformat(raw)
    return values


def lockable(key: object) -> JsonValue:
    """A store key as the pipeline's advisory lock hashes it."""
    return encode_value(key)


def lock_identity(store_type: str, key: object) -> tuple[str, str]:
    """What one lock is, as a sortable pair: the store type and canonical key."""
    return (store_type, canonical_json(lockable(key)))


def order_by_lock(items: Iterable[T], identity: Callable[[T], tuple[str, str]]) -> list[T]:
    """``items`` in the one fixed lock order every command uses (duplicates kept once)."""
    seen: dict[tuple[str, str], T] = {}
    for item in items:
        seen.setdefault(identity(item), item)
    return [seen[k] for k in sorted(seen)]


@dataclass(frozen=True, slots=True)
class OccupancyKey:
    """One unique value inside one partition: ``(entity, index, partition, value)``."""

    entity: str
    index: str
    partition: str
    value: str

    def as_key(self) -> list[str]:
        return [self.entity, self.index, self.partition, self.value]


def occupancy_keys(entity: Entity, row: Mapping[str, Any]) -> dict[str, OccupancyKey]:
    """The occupancy of ``row`` under each unique key of ``entity``, by key
    name; a unique key with a missing (or None) field occupies nothing."""
    found: dict[str, OccupancyKey] = {}
    route = len(entity.partition_by)
    for unique in entity.unique:
        values = [row.get(f) for f in unique.fields]
        if any(v is None for v in values):
            continue
        found[unique.name] = _occupancy(entity, unique, values, route)
    return found


def _occupancy(entity: Entity, unique: Unique, values: list[Any], route: int) -> OccupancyKey:
    return OccupancyKey(
        entity.name, unique.name, canonical_json(encode_value(values[:route])),
        canonical_json(encode_value(values[route:])),
    )
