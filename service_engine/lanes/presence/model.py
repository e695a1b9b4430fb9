"""Presence (lane B), the pure core: keys, the fold, the bucket rules, the
projector surface.

Presence is loss-tolerant, last-write-wins state that lives only in one
``EPHEMERAL_{service}`` JetStream key-value bucket: who is typing, who is
viewing. Every pod folds the bucket's latest value per key in memory (no
store write) and serves it through the ordinary render machinery: a
`PresenceProjector` is a `Projector` whose ``STORE`` reads that fold, so a
presence window gets the same sessions, revisions, visibility and cohorts
as every other view. A put is an Upsert, an expiry (the per-key
``Nats-TTL`` running out) or a clear is a Remove.

Lanes of different lifetimes share the bucket: each registered projector is
one lane whose keys live under ``{projector NAME}.`` in the bucket and whose
writes carry that lane's ttl. The bucket's rules (`check_bucket`) are the
boot refusals: it must exist, have a TTL (max_age), write expiry markers (an
expired key must raise a watch event) and accept per-message TTLs, and its
max_age must cover the longest lane's ttl.

This module is pure: no I/O, no driver imports. `bucket` reads and
writes the bucket; `runtime` runs the watcher.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

from ...failures import ConfigError, EngineError
from ...impacts.model import JsonValue, canonical_json
from ...render.cohort import CohortKey, HasPrincipalId
from ...render.projector import Populate, Projector, Unrestricted

__all__ = [
    "PRESENCE_LANE",
    "BucketFacts",
    "InvalidPresenceKey",
    "InvalidPresenceValue",
    "PresenceBucketMissing",
    "PresenceBucketNoMarkers",
    "PresenceBucketNoMsgTtl",
    "PresenceBucketNoTtl",
    "PresenceBucketRefused",
    "PresenceBucketTtlTooShort",
    "PresenceChange",
    "PresenceEntry",
    "PresenceFold",
    "PresenceProjector",
    "PresenceStore",
    "PresenceWithoutNats",
    "PresenceWithoutService",
    "UndecodableValue",
    "bucket_key",
    "check_bucket",
    "check_lane_name",
    "check_presence_key",
    "check_ttl",
    "classify",
    "decode_value",
    "encode_value",
    "presence_bucket_name",
    "split_bucket_key",
    "ttl_header",
]

PRESENCE_LANE = "presence"
"""The lane name presence sessions are paused and resumed under."""

ViewT = TypeVar("ViewT")
PrincipalT = TypeVar("PrincipalT", bound=HasPrincipalId)
QueryT = TypeVar("QueryT")

# A KV key is a dot-separated run of NATS subject tokens.
_TOKEN = r"[-/_=a-zA-Z0-9]+"
_KEY = re.compile(rf"{_TOKEN}(\.{_TOKEN})*")
_LANE = re.compile(_TOKEN)


# -- errors --------------------------------------------------------------------------


class InvalidPresenceKey(ConfigError):
    """A presence key is not a run of NATS subject tokens (``[-/_=a-zA-Z0-9]``
    separated by dots), or a lane name is not one token."""


class InvalidPresenceValue(ConfigError):
    """A presence value JSON cannot carry."""


class PresenceWithoutService(ConfigError):
    """A presence lane was registered on an engine with no service configured
    (the bucket is ``EPHEMERAL_{service}``)."""


class PresenceWithoutNats(ConfigError):
    """A presence lane was registered on an engine booted without NATS."""


class PresenceBucketRefused(EngineError):
    """The presence bucket cannot serve presence; boot fails loud and holds
    readiness DOWN under ``reason``. ``problem`` names the rule it broke."""

    reason = "presence_bucket"
    problem = "refused"

    def __init__(self, bucket: str, detail: str) -> None:
        super().__init__(f"presence bucket {bucket!r} refused ({self.problem}): {detail}")
        self.bucket = bucket
        self.detail = detail


class PresenceBucketMissing(PresenceBucketRefused):
    """The ``EPHEMERAL_{service}`` bucket is not declared (the engine never creates it)."""

    problem = "absent"


class PresenceBucketNoTtl(PresenceBucketRefused):
    """The bucket has no TTL (no max_age): presence would live forever."""

    problem = "no_ttl"


class PresenceBucketNoMarkers(PresenceBucketRefused):
    """The bucket writes no expiry markers (``limit_marker_ttl`` unset): an
    expired key would raise no watch event and never be Removed."""

    problem = "no_expiry_markers"


class PresenceBucketNoMsgTtl(PresenceBucketRefused):
    """The bucket refuses per-message TTL (``allow_msg_ttl`` off)."""

    problem = "no_per_message_ttl"


class PresenceBucketTtlTooShort(PresenceBucketRefused):
    """The bucket's max_age is below the longest lane's ttl: it would
    truncate that lane below its declared lifetime."""

    problem = "max_age_below_lane_ttl"


# -- keys and values -----------------------------------------------------------------


def presence_bucket_name(service: str) -> str:
    """The presence bucket of ``service``."""
    return f"EPHEMERAL_{service}"


def check_lane_name(name: str) -> str:
    """A lane (projector) name is one subject token."""
    if not isinstance(name, str) or not _LANE.fullmatch(name):
        raise InvalidPresenceKey(
            f"a presence projector's NAME is one NATS subject token ([-/_=a-zA-Z0-9]+), "
            f"got {name!r}"
        )
    return name


def check_presence_key(key: object) -> str:
    """Refuse a key the bucket cannot carry with `InvalidPresenceKey`."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InvalidPresenceKey(
            "a presence key is NATS subject tokens ([-/_=a-zA-Z0-9]+) joined by dots, "
            f"got {key!r}"
        )
    return key


def bucket_key(lane: str, key: str) -> str:
    """The bucket key of ``key`` in ``lane``."""
    return f"{lane}.{check_presence_key(key)}"


def split_bucket_key(text: str) -> tuple[str, str] | None:
    """``(lane, key)`` of a bucket key, or None for one no lane can own."""
    lane, dot, key = text.partition(".")
    if not dot or not lane or not key:
        return None
    return lane, key


def encode_value(value: JsonValue) -> bytes:
    """The canonical JSON bytes of a presence value (not null: clear the
    key instead)."""
    if value is None:
        raise InvalidPresenceValue("a presence value is not null: clear the key instead")
    try:
        return canonical_json(value).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidPresenceValue(f"a presence value must be a finite JSON value: {exc}") from exc


class UndecodableValue(ValueError):
    """A stored payload that is not JSON (a write that did not come through
    the engine): the watcher ignores it."""


def decode_value(data: bytes) -> JsonValue:
    """The value of a stored presence payload; raises `UndecodableValue`."""
    try:
        value: JsonValue = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UndecodableValue(str(exc)) from exc
    return value


def ttl_header(ttl: timedelta) -> str:
    """The ``Nats-TTL`` header of ``ttl``: whole seconds, rounded up (the
    server and nats-py count whole seconds)."""
    return f"{max(1, math.ceil(ttl.total_seconds()))}s"


def check_ttl(ttl: object) -> timedelta:
    if not isinstance(ttl, timedelta) or ttl.total_seconds() < 1:
        raise ConfigError(f"a presence ttl is a timedelta of at least one second, got {ttl!r}")
    return ttl


# -- the bucket's rules ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BucketFacts:
    """What boot reads of the bucket's stream (``KV_<bucket>``)."""

    name: str
    max_age: float
    """Seconds; 0 for none."""
    marker_ttl: float | None
    """``subject_delete_marker_ttl`` (the KV ``limit_marker_ttl``), seconds."""
    allow_msg_ttl: bool


def check_bucket(facts: BucketFacts, lane_ttls: Iterable[timedelta]) -> None:
    """Raise the `PresenceBucketRefused` subclass of the first rule the
    bucket breaks (checked in this order: TTL, per-message TTL, markers,
    max_age against the longest lane)."""
    if not facts.max_age or facts.max_age <= 0:
        raise PresenceBucketNoTtl(facts.name, "its max_age is unlimited; declare a TTL")
    if not facts.allow_msg_ttl:
        raise PresenceBucketNoMsgTtl(facts.name, "the stream does not allow per-message TTL")
    if not facts.marker_ttl or facts.marker_ttl <= 0:
        raise PresenceBucketNoMarkers(
            facts.name, "declare limit_marker_ttl so an expired key raises a watch event"
        )
    longest = max((ttl.total_seconds() for ttl in lane_ttls), default=0.0)
    if facts.max_age < longest:
        raise PresenceBucketTtlTooShort(
            facts.name, f"max_age {facts.max_age:g}s is below the longest lane ttl {longest:g}s"
        )


# -- the fold --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PresenceEntry:
    """One present key: the latest value written under it and the bucket
    revision that wrote it. The row a `PresenceProjector` projects."""

    key: str
    value: JsonValue
    revision: int


@dataclass(frozen=True, slots=True)
class PresenceChange:
    """One message of the bucket's stream, decoded: ``value`` None when the
    key is gone (a delete, a purge, an expiry marker)."""

    lane: str
    key: str
    revision: int
    value: JsonValue | None


_GONE_OPERATIONS = frozenset({"DEL", "PURGE"})


def classify(
    subject_key: str, revision: int, headers: Mapping[str, str] | None, data: bytes
) -> PresenceChange | None:
    """Decode one message of the bucket's stream (its key under
    ``$KV.<bucket>.``): a delete, a purge (``KV-Operation``) or an expiry
    marker (``Nats-Marker-Reason``) is the key gone. None for a key no lane
    owns or a value that is not JSON."""
    split = split_bucket_key(subject_key)
    if split is None:
        return None
    lane, key = split
    headers = headers or {}
    if headers.get("KV-Operation") in _GONE_OPERATIONS or "Nats-Marker-Reason" in headers:
        return PresenceChange(lane, key, revision, None)
    try:
        value = decode_value(data)
    except UndecodableValue:
        return None
    return PresenceChange(lane, key, revision, value)


class PresenceFold:
    """The latest value per key of one lane (last write wins by revision)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: dict[str, PresenceEntry] = {}

    def apply(self, change: PresenceChange) -> bool:
        """Fold one change; True when the key's state changed. A change older
        than the revision held is ignored (a replay after a reseed)."""
        held = self.entries.get(change.key)
        if held is not None and held.revision >= change.revision:
            return False
        if change.value is None:
            return self.entries.pop(change.key, None) is not None
        self.entries[change.key] = PresenceEntry(change.key, change.value, change.revision)
        return True

    def reseed(self, entries: Mapping[str, PresenceEntry]) -> set[str]:
        """Replace the fold with what the bucket holds now; the keys that
        changed (appeared, changed value, or are gone)."""
        old = self.entries
        changed = {key for key in old if key not in entries}
        changed.update(
            key for key, entry in entries.items()
            if key not in old or old[key].value != entry.value
        )
        self.entries = dict(entries)
        return changed

    def read(self, keys: Iterable[str]) -> list[PresenceEntry]:
        entries = self.entries
        return [entries[key] for key in keys if key in entries]

    def __len__(self) -> int:
        return len(self.entries)


class PresenceStore:
    """The ``STORE`` of a `PresenceProjector`: reads its lane's fold. The
    connection the render pass hands it is not used: presence has no rows."""

    def __init__(self) -> None:
        self.fold = PresenceFold()

    async def read_many(self, conn: Any, keys: Sequence[JsonValue]) -> list[PresenceEntry]:
        return self.fold.read(key for key in keys if isinstance(key, str))

    @staticmethod
    def key_of(entry: PresenceEntry) -> str:
        return entry.key


# -- the projector surface --------------------------------------------------------------


class PresenceProjector(Projector[PresenceEntry, ViewT, PrincipalT, QueryT]):
    """A live view of one presence lane.

    Declare ``NAME`` (one NATS subject token: the lane's prefix in the
    bucket), ``VISIBILITY`` and `project` (a `PresenceEntry` to the
    principal's view); register it with ``Engine.register_presence(projector,
    ttl)``. ``NOUN`` defaults to ``presence.<NAME>`` and ``STORE`` is the
    lane's in-memory fold (one per subclass): there is no table.

    The default `populate` lists every present key `select` accepts for the
    window's query (in key order) and that the principal's cohorts admit;
    override `select` to scope a window (a channel's typists), or `populate`
    for another order.
    """

    STORE: ClassVar[PresenceStore]  # type: ignore[assignment]

    def __init__(self) -> None:
        # One fold per instance: two engines in one process (two pods in a
        # test) each fold the bucket themselves.
        setattr(self, "STORE", PresenceStore())  # noqa: B010 - shadows the ClassVar

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "STORE" not in cls.__dict__:
            cls.STORE = PresenceStore()  # what a declaration check reads; never folded
        name = cls.__dict__.get("NAME")
        if "NOUN" not in cls.__dict__ and isinstance(name, str):
            cls.NOUN = f"presence.{name}"

    def select(self, entry: PresenceEntry, query: QueryT) -> bool:
        """Whether ``entry`` belongs to a window of ``query`` (default: all)."""
        return True

    def cohort(self, principal: PrincipalT) -> CohortKey:
        """Under `Unrestricted` visibility (and `visible` not narrowed) every
        principal sees the same rows, so every session shares one load;
        otherwise one cohort per principal, as for any projector."""
        cls = type(self)
        if isinstance(cls.VISIBILITY, Unrestricted) and cls.visible is Projector.visible:
            return CohortKey.of_parts()
        return super().cohort(principal)

    async def populate(self, cx: Populate[PrincipalT], query: QueryT) -> Sequence[JsonValue]:
        cohorts = cx.cohorts
        out: list[JsonValue] = []
        for key in sorted(self.STORE.fold.entries):
            entry = self.STORE.fold.entries[key]
            if not self.select(entry, query):
                continue
            if cohorts is not None and not _admits(cohorts, self.VISIBILITY.cohorts(entry)):
                continue
            out.append(key)
        return out


def _admits(cohorts: frozenset[Hashable], row: Iterable[Hashable]) -> bool:
    return not cohorts.isdisjoint(row)
