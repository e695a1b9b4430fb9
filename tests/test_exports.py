"""The public surface is re-exported once from `service_engine` and listed
here: a removal or an accidental addition is a deliberate change."""

from __future__ import annotations

import service_engine

EXPECTED = {
    "ENGINE_VERSION", "ActionName", "Affordances", "Aggregate", "AttachError", "Bulk", "Cause",
    "Clock", "Coalesced", "CohortKey", "ConfigError", "ConstraintViolation", "CrudStore",
    "Database", "DatabaseError", "DatabaseUrlRefused", "DomainEvent", "DuplicateRegistration",
    "Engine", "EngineConfig", "EngineError", "EventSourced", "FullEda", "Gate",
    "HydrationFailed", "Impact", "Keys", "ListenerProbeFailed", "LockTimeout", "Mutation",
    "MutationError", "MutationExecutor", "NoLiveSession", "NotFound", "OneShot", "Ordered",
    "PerImpact", "Persistence", "Populate", "PostureBypassRls", "PostureError", "PostureOwner",
    "PostureSuperuser", "Projector", "Query", "Readiness", "ReadinessHandle", "Reason",
    "RecordsEvents", "Refused", "Remove", "Reset", "RlsApplier", "SchemaVersionConflict",
    "SessionEnded", "SessionId", "SessionStream", "ShuttingDown", "SoftEdaStore", "Style",
    "Success", "SystemClock", "Timestamp", "Unrestricted", "Upsert", "Visibility",
    "WindowSpec", "WorkerStopped", "affordances", "check_gates_match_affordances",
    "connect_pool", "gated", "readiness_route", "validate_database_tls",
    "Acked", "Actor", "Cron", "DeadLetter", "DeadLetterSource", "DeadLetters",
    "DeclaredSequence", "Duplicate", "EventMetadata", "IntegrationCommand", "IntegrationEvent",
    "KvBucket", "KvKey", "Nats", "OutboundCommand", "OutboundEvent", "PublishOutcome",
    "Rejected", "SequenceWithoutService", "Tick", "Unanswered", "open_nats",
    "Conn", "bind_listener", "run_on_allocator", "run_with", "run_with_listener",
    "Disposition", "InboundReaction", "Park", "PrincipalUnresolved",
    "ReactionBudget", "Retry", "Terminal",
    "Reaction",
    "Emission",
    "NatsUnavailable", "command_subject", "event_subject", "stage_outbox_row",
    "service_migrations",
    "LaneNotice", "PresenceBucketRefused", "PresenceEntry", "PresenceHandle", "PresenceProjector",
    "ACCUMULATED_LANE",
    "Accumulator", "AccumulatorWithoutService", "AlreadySealed", "ChunkConflict", "ChunkFrame",
    "ChunkSeq", "ChunkSeqOutOfRange", "Cancelled", "Durable", "Folded", "InvalidChunkKey", "KeySealed",
    "LaneStreamMissing", "SealChunkBeyondLastSeq", "SealError", "SealHashMismatch",
    "SealRetentionTooShort", "SealTruncated", "encode_frame", "seal_hash",
    "Offer", "Published", "KvDrainRelay", "KvPut", "KvRetract",
    "Mirror", "Merged", "Shadow", "Known", "KnownScope", "Projection",
    "BlobBucketMissing", "BlobError", "BlobKind", "BlobPolicy", "BlobStoreConfig",
    "BlobStoreMissing", "DownloadUrl", "UploadUrl",
    "Erasable", "Erase", "Erased", "Eraser", "ErasureResult", "PersonErased",
    "PERSON_ERASED_SUBJECT", "person_erased_subject",
    "VisibilityMismatch", "check_window_matches_visibility",
    "HostedKvRelay", "KvSource",
    "PrincipalFactLoader", "PrincipalFactLoadFailed",
    "NestedConnectionError",
    "EmptyScopeManifest", "MalformedScopeKey", "ScopeDeclaration", "ScopeError",
    "ScopeManifest", "ScopeManifestSpansServices", "ScopeRejected", "ScopeWithoutNats",
}


def test_the_public_surface_is_exactly_the_listed_names() -> None:
    assert set(service_engine.__all__) == EXPECTED


def test_every_listed_name_resolves() -> None:
    for name in service_engine.__all__:
        assert getattr(service_engine, name) is not None
