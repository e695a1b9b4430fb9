"""The typed failures of the accumulated lane (lane A) and its seal."""

from __future__ import annotations

from ...failures import ConfigError, EngineError

__all__ = [
    "AccumulatorWithoutService",
    "AlreadySealed",
    "ChunkConflict",
    "ChunkSeqOutOfRange",
    "InvalidChunkKey",
    "KeySealed",
    "LaneStreamMissing",
    "SealChunkBeyondLastSeq",
    "SealError",
    "SealHashMismatch",
    "SealRetentionTooShort",
    "SealTruncated",
]


class ChunkSeqOutOfRange(ConfigError):
    """A chunk sequence outside the bigint range (0 to 2**63 - 1), or not an
    integer: refused at construction, never wrapped into a gap."""

    code = "chunk_seq_out_of_range"


class InvalidChunkKey(ConfigError):
    """A stream key that cannot be one NATS subject token (empty, or with a
    dot, a wildcard or whitespace): ``stream.{service}.{key}`` must name it."""

    code = "invalid_chunk_key"


class ChunkConflict(EngineError):
    """A chunk resubmitted at an already-durable sequence with different
    bytes. The durable chunk stands; the producer is out of step."""

    code = "chunk_conflict"

    def __init__(self, accumulator: str, key: str, seq: int) -> None:
        super().__init__(
            f"accumulator {accumulator} key {key!r}: seq {seq} is already durable "
            "with different content"
        )
        self.accumulator = accumulator
        self.key = key
        self.seq = seq


class KeySealed(EngineError):
    """A chunk for a key that carries a seal marker: refused on every pod."""

    code = "key_sealed"

    def __init__(self, accumulator: str, key: str, high_water: int) -> None:
        super().__init__(
            f"accumulator {accumulator} key {key!r} is sealed at high water {high_water}"
        )
        self.accumulator = accumulator
        self.key = key
        self.high_water = high_water


class SealError(EngineError):
    """A seal the engine refused; nothing was sealed or deleted."""

    code = "seal_refused"

    def __init__(self, accumulator: str, key: str, detail: str) -> None:
        super().__init__(f"seal of accumulator {accumulator} key {key!r} refused: {detail}")
        self.accumulator = accumulator
        self.key = key


class SealTruncated(SealError):
    """The durable prefix stops before ``last_seq`` (a chunk is missing):
    retry once the stream healed, or seal what is there (`seal_partial`)."""

    code = "seal_truncated"

    def __init__(self, accumulator: str, key: str, last_seq: int, durable_prefix: int) -> None:
        super().__init__(
            accumulator, key,
            f"last_seq {last_seq} but the durable prefix ends before seq {durable_prefix}",
        )
        self.last_seq = last_seq
        self.durable_prefix = durable_prefix


class SealHashMismatch(SealError):
    """The SHA-256 of the chunks 0..last_seq is not the hash the caller sealed with."""

    code = "seal_hash_mismatch"

    def __init__(self, accumulator: str, key: str, expected: str, actual: str) -> None:
        super().__init__(accumulator, key, f"hash {expected} given, the chunks hash to {actual}")
        self.expected = expected
        self.actual = actual


class SealChunkBeyondLastSeq(SealError):
    """A chunk is durable beyond ``last_seq``: an acked chunk is never
    dropped by a seal. Seal at the true last sequence."""

    code = "seal_chunk_beyond_last_seq"

    def __init__(self, accumulator: str, key: str, last_seq: int, beyond: int) -> None:
        super().__init__(
            accumulator, key, f"last_seq {last_seq} but seq {beyond} is already durable"
        )
        self.last_seq = last_seq
        self.beyond = beyond


class AlreadySealed(SealError):
    """The key already carries a seal marker; the sealed record is never
    rewritten (a deadline's `seal_current` reads this as a lost race)."""

    code = "already_sealed"

    def __init__(self, accumulator: str, key: str, high_water: int) -> None:
        super().__init__(accumulator, key, f"already sealed at high water {high_water}")
        self.high_water = high_water


class AccumulatorWithoutService(ConfigError):
    """An accumulator was registered on an engine with no service: there is
    no ``STREAMING_{service}`` stream to bind."""

    code = "accumulator_without_service"


class LaneStreamMissing(EngineError):
    """The gitops-declared ``STREAMING_{service}`` stream is absent (the
    engine never creates it); readiness stays DOWN."""

    code = "lane_stream_missing"
    reason = "lane_stream"

    def __init__(self, stream: str) -> None:
        super().__init__(
            f"JetStream stream {stream!r} is not declared (the engine never creates it); "
            "a registered accumulator needs it"
        )
        self.stream = stream


class SealRetentionTooShort(ConfigError):
    """``seal_retention`` is below the lane stream's max_age (or the stream
    keeps messages forever): a seal marker must outlive every chunk the
    stream could still redeliver."""

    code = "seal_retention_too_short"
    reason = "lane_stream"
