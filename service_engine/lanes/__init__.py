"""The two NATS lanes: presence (lane B) and the accumulated lane with its
verified seal (lane A)."""

from __future__ import annotations

from .accumulated.accumulator import Accumulator, Cancelled, Durable, Folded
from .accumulated.chunks import ChunkFrame, ChunkSeq, encode_frame, seal_hash
from .accumulated.errors import (
    AccumulatorWithoutService,
    AlreadySealed,
    ChunkConflict,
    ChunkSeqOutOfRange,
    InvalidChunkKey,
    KeySealed,
    LaneStreamMissing,
    SealChunkBeyondLastSeq,
    SealError,
    SealHashMismatch,
    SealRetentionTooShort,
    SealTruncated,
)
from .notices import ACCUMULATED_LANE, LaneNotice, LaneNotices, LaneNoticeStream
from .presence.model import (
    PRESENCE_LANE,
    InvalidPresenceKey,
    InvalidPresenceValue,
    PresenceBucketMissing,
    PresenceBucketNoMarkers,
    PresenceBucketNoMsgTtl,
    PresenceBucketNoTtl,
    PresenceBucketRefused,
    PresenceBucketTtlTooShort,
    PresenceEntry,
    PresenceProjector,
    PresenceWithoutNats,
    PresenceWithoutService,
)
from .presence.runtime import PresenceHandle, PresenceNotBound

__all__ = [
    "ACCUMULATED_LANE",
    "PRESENCE_LANE",
    "Accumulator",
    "AccumulatorWithoutService",
    "AlreadySealed",
    "Cancelled",
    "ChunkConflict",
    "ChunkFrame",
    "ChunkSeq",
    "ChunkSeqOutOfRange",
    "Durable",
    "Folded",
    "InvalidChunkKey",
    "InvalidPresenceKey",
    "InvalidPresenceValue",
    "KeySealed",
    "LaneNotice",
    "LaneNoticeStream",
    "LaneNotices",
    "LaneStreamMissing",
    "PresenceBucketMissing",
    "PresenceBucketNoMarkers",
    "PresenceBucketNoMsgTtl",
    "PresenceBucketNoTtl",
    "PresenceBucketRefused",
    "PresenceBucketTtlTooShort",
    "PresenceEntry",
    "PresenceHandle",
    "PresenceNotBound",
    "PresenceProjector",
    "PresenceWithoutNats",
    "PresenceWithoutService",
    "SealChunkBeyondLastSeq",
    "SealError",
    "SealHashMismatch",
    "SealRetentionTooShort",
    "SealTruncated",
    "encode_frame",
    "seal_hash",
]
