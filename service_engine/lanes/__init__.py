"""The two NATS lanes: presence (lane B) and the accumulated lane with its
verified seal (lane A)."""

from __future__ import annotations

from .notices import LaneNotice, LaneNotices, LaneNoticeStream
from .presence import (
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
from .presence_lane import PresenceHandle, PresenceNotBound

__all__ = [
    "PRESENCE_LANE",
    "InvalidPresenceKey",
    "InvalidPresenceValue",
    "LaneNotice",
    "LaneNoticeStream",
    "LaneNotices",
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
]
