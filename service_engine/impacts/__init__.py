"""Impacts: what a commit touched, and how it travels over NOTIFY.

`model` holds the `Impact` value, its canonical wire encoding and what the
listener delivers (`Delivery`: a commit's impacts, or `Reconnected`); `framing`
packs one commit's impacts into NOTIFY payloads below Postgres's 8000-byte
limit and reassembles them. Both are pure.
"""

from __future__ import annotations

from service_engine.impacts.framing import (
    DEFAULT_MAX_PENDING,
    FRAME_VERSION,
    MAX_FRAMES,
    MAX_GROUP_ID_LENGTH,
    MAX_IMPACT_BYTES,
    MAX_PAYLOAD_BYTES,
    NotifyFrame,
    Reassembler,
    encode_group,
    new_group_id,
    parse_frame,
)
from service_engine.impacts.model import (
    PRINCIPAL_FACTS_NOUN,
    Cause,
    Delivery,
    Impact,
    ImpactKind,
    InvalidImpact,
    JsonValue,
    Reconnected,
    UnencodableImpactValue,
    UnknownFactDependency,
    canonical_json,
    decode_impact,
    encode_impact,
    impact_json,
)

__all__ = [
    "DEFAULT_MAX_PENDING",
    "FRAME_VERSION",
    "MAX_FRAMES",
    "MAX_GROUP_ID_LENGTH",
    "MAX_IMPACT_BYTES",
    "MAX_PAYLOAD_BYTES",
    "PRINCIPAL_FACTS_NOUN",
    "Cause",
    "Delivery",
    "Impact",
    "ImpactKind",
    "InvalidImpact",
    "JsonValue",
    "NotifyFrame",
    "Reassembler",
    "Reconnected",
    "UnencodableImpactValue",
    "UnknownFactDependency",
    "canonical_json",
    "decode_impact",
    "encode_group",
    "encode_impact",
    "impact_json",
    "new_group_id",
    "parse_frame",
]
