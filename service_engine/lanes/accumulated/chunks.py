"""The pure core of the accumulated lane (lane A): chunk sequences, the
wire frame, the seal hash, the contiguous prefix, the seal plan and the
bounded fold cache. No I/O here.

A frame is one chunk of one key's stream, published on
``stream.{service}.{key}`` with its sequence in the ``Br-Chunk-Seq``
header and the chunk's bytes as the payload (``Br-Accumulator`` names the
accumulator when a service registers more than one).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from .errors import (
    ChunkSeqOutOfRange,
    InvalidChunkKey,
    SealChunkBeyondLastSeq,
    SealHashMismatch,
    SealTruncated,
)

__all__ = [
    "HEADER_ACCUMULATOR",
    "HEADER_CHUNK_SEQ",
    "MAX_CHUNK_SEQ",
    "ChunkFrame",
    "ChunkSeq",
    "FoldCache",
    "Gesture",
    "SealPlan",
    "check_key",
    "contiguous_prefix",
    "encode_frame",
    "frame_msg_id",
    "parse_frame",
    "plan_seal",
    "seal_hash",
    "stream_name",
    "stream_subject",
]

MAX_CHUNK_SEQ = (1 << 63) - 1
"""The largest sequence a Postgres bigint holds."""

HEADER_CHUNK_SEQ = "Br-Chunk-Seq"
HEADER_ACCUMULATOR = "Br-Accumulator"

S = TypeVar("S")

Gesture = Literal["seal", "partial", "current"]


class ChunkSeq(int):
    """A chunk's position in its key's stream: 0, 1, 2, ... within the
    bigint range. ``ChunkSeq(2**63)`` raises `ChunkSeqOutOfRange` rather
    than wrapping (a wrapped sequence would read as a gap)."""

    __slots__ = ()

    def __new__(cls, value: object) -> ChunkSeq:
        if isinstance(value, ChunkSeq):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ChunkSeqOutOfRange(f"a chunk seq is an int, got {value!r}")
        if not 0 <= value <= MAX_CHUNK_SEQ:
            raise ChunkSeqOutOfRange(
                f"chunk seq {value} is outside 0..{MAX_CHUNK_SEQ} (the bigint range)"
            )
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> ChunkSeq:
        """A sequence from its decimal text (a frame header)."""
        stripped = text.strip()
        if not (stripped.isascii() and stripped.isdigit()):
            raise ChunkSeqOutOfRange(f"chunk seq {text!r} is not a decimal integer")
        return cls(int(stripped))


_FORBIDDEN_IN_TOKEN = frozenset(".*> \t\r\n")


def check_key(key: object) -> str:
    """The stream key as one NATS subject token; `InvalidChunkKey` otherwise."""
    if not isinstance(key, str) or not key or len(key) > 256:
        raise InvalidChunkKey(
            f"a stream key is a non-empty string of at most 256 chars, got {key!r}"
        )
    if any(ch in _FORBIDDEN_IN_TOKEN for ch in key) or not key.isprintable():
        raise InvalidChunkKey(
            f"stream key {key!r} cannot be a NATS subject token (no dots, wildcards or spaces)"
        )
    return key


def stream_name(service: str) -> str:
    """The gitops-declared stream of a service's accumulated lane."""
    return f"STREAMING_{service}"


def stream_subject(service: str, key: str | None = None) -> str:
    """``stream.{service}.{key}``; every key's subjects (``>``) without one."""
    return f"stream.{service}.{'>' if key is None else check_key(key)}"


def seal_hash(chunks: Iterable[bytes]) -> str:
    """SHA-256 of the concatenated chunks, lowercase hex (the seal's hash)."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class ChunkFrame:
    """One ``(key, seq, chunk)`` frame of the lane's wire."""

    key: str
    seq: ChunkSeq
    chunk: bytes
    accumulator: str | None = None


def frame_msg_id(service: str, frame: ChunkFrame) -> str:
    """The ``Nats-Msg-Id`` a producer sets, so its retry is deduplicated."""
    return f"{service}.{frame.accumulator or ''}.{frame.key}.{int(frame.seq)}"


def encode_frame(service: str, frame: ChunkFrame) -> tuple[str, dict[str, str], bytes]:
    """Subject, headers and payload of ``frame``."""
    headers = {HEADER_CHUNK_SEQ: str(int(frame.seq)), "Nats-Msg-Id": frame_msg_id(service, frame)}
    if frame.accumulator is not None:
        headers[HEADER_ACCUMULATOR] = frame.accumulator
    return stream_subject(service, frame.key), headers, frame.chunk


def parse_frame(
    service: str, subject: str, headers: Mapping[str, str] | None, payload: bytes
) -> ChunkFrame:
    """The frame a message carries; `InvalidChunkKey` / `ChunkSeqOutOfRange`
    for one that is not a lane frame of ``service``."""
    prefix = f"stream.{service}."
    if not subject.startswith(prefix):
        raise InvalidChunkKey(f"subject {subject!r} is not under {prefix}>")
    key = check_key(subject[len(prefix):])
    raw = (headers or {}).get(HEADER_CHUNK_SEQ)
    if raw is None:
        raise ChunkSeqOutOfRange(f"frame on {subject} carries no {HEADER_CHUNK_SEQ} header")
    accumulator = (headers or {}).get(HEADER_ACCUMULATOR) or None
    return ChunkFrame(key, ChunkSeq.parse(raw), bytes(payload), accumulator)


def contiguous_prefix(seqs: Iterable[int], start: int = 0) -> int:
    """The first sequence missing from ``seqs`` (sorted ascending) at or after
    ``start``: the fold of a key stops there."""
    expected = start
    for seq in seqs:
        if seq < expected:
            continue
        if seq != expected:
            break
        expected += 1
    return expected


@dataclass(frozen=True, slots=True)
class SealPlan:
    """What a seal folds (``chunks``, in order), the marker it writes, and
    the durable chunks a cancel gesture drops beyond a gap (``dropped``,
    ascending; always empty for a verified seal)."""

    chunks: tuple[bytes, ...]
    high_water: int
    hash: str
    dropped: tuple[int, ...] = ()


def plan_seal(
    accumulator: str,
    key: str,
    rows: Sequence[tuple[int, bytes]],
    gesture: Gesture,
    last_seq: int | None = None,
    expected_hash: str | None = None,
) -> SealPlan:
    """Decide a seal over a key's durable chunks ``rows`` (``(seq, chunk)``,
    ascending), or raise the refusal.

    * ``seal``: refuses a durable chunk beyond ``last_seq``
      (`SealChunkBeyondLastSeq`), a prefix that stops before it
      (`SealTruncated`) and a hash that is not the SHA-256 of chunks
      ``0..last_seq`` (`SealHashMismatch`); seals at ``last_seq + 1``.
    * ``partial``: seals at ``last_seq + 1`` whatever prefix is durable
      (no hash), refusing a durable chunk beyond ``last_seq``.
    * ``current``: seals the contiguous prefix durable now, at the high
      water past the last durable chunk.

    A cancel gesture (``partial``, ``current``) ends the stream whatever is
    missing: a chunk durable beyond a gap in the prefix cannot be folded
    (the fold stops at the gap) and is named in ``dropped``, so the caller
    sees what the cancel discarded; it is never dropped silently.
    """
    seqs = [seq for seq, _ in rows]
    prefix = contiguous_prefix(seqs)
    top = seqs[-1] if seqs else -1
    dropped = tuple(seq for seq in seqs if seq >= prefix)
    if gesture == "current":
        folded = tuple(chunk for seq, chunk in rows if seq < prefix)
        return SealPlan(folded, max(prefix, top + 1), seal_hash(folded), dropped)
    if last_seq is None:
        raise ValueError("a seal names its last_seq")
    last = int(ChunkSeq(last_seq))
    if top > last:
        raise SealChunkBeyondLastSeq(accumulator, key, last, top)
    if gesture == "partial":
        folded = tuple(chunk for seq, chunk in rows if seq < prefix)
        return SealPlan(folded, last + 1, seal_hash(folded), dropped)
    if prefix <= last:
        raise SealTruncated(accumulator, key, last, prefix)
    folded = tuple(chunk for _, chunk in rows)
    actual = seal_hash(folded)
    given = (expected_hash or "").strip().lower()
    if given != actual:
        raise SealHashMismatch(accumulator, key, expected_hash or "", actual)
    return SealPlan(folded, last + 1, actual)


@dataclass(slots=True)
class _Entry(Generic[S]):
    next_seq: int
    state: S
    digest: Any  # hashlib's running SHA-256 over chunks 0..next_seq-1
    last_chunk: bytes | None


@dataclass(frozen=True, slots=True)
class CachedFold(Generic[S]):
    """A cached fold of chunks ``0..next_seq-1``; ``last_chunk`` is the
    chunk at ``next_seq - 1``, which the table must still hold for the
    entry to be trusted."""

    next_seq: int
    state: S
    digest: Any
    last_chunk: bytes | None


class FoldCache(Generic[S]):
    """A bounded LRU of folded prefixes by (accumulator, key).

    Table-verified: a caller trusts an entry only after reading the chunk
    at ``next_seq - 1`` back from the table unchanged (a seal or an
    erasure deletes chunks; `invalidate` drops an entry at once).
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("fold cache capacity > 0")
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], _Entry[S]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, accumulator: str, key: str) -> CachedFold[S] | None:
        entry = self._entries.get((accumulator, key))
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end((accumulator, key))
        self.hits += 1
        return CachedFold(entry.next_seq, entry.state, entry.digest.copy(), entry.last_chunk)

    def put(
        self, accumulator: str, key: str, next_seq: int, state: S, digest: Any,
        last_chunk: bytes | None,
    ) -> None:
        current = self._entries.get((accumulator, key))
        if current is not None and current.next_seq > next_seq:
            return  # a concurrent fold already cached a longer prefix
        self._entries[(accumulator, key)] = _Entry(next_seq, state, digest.copy(), last_chunk)
        self._entries.move_to_end((accumulator, key))
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def invalidate(self, accumulator: str, key: str) -> None:
        self._entries.pop((accumulator, key), None)
