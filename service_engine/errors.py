"""Every exception the engine raises, importable from one place.

`EngineError` is the root of every typed failure the engine raises. Three
branches say whose fault a failure is:

* `ConfigError` (also a `ValueError`): the caller built a bad configuration
  (`DeclarationError`: a declaration of the wrong shape);
* `AttachError`: a subscription attach was refused;
* everything else under `EngineError`: the engine met a state it refuses to
  run over (posture, schema version, a dead worker, an external failure).

Driver exceptions (asyncpg, nats) are translated at the adapter with
``raise ... from exc`` and never reach a slice author. Every engine error
carries a stable ``code``: what it is called when it crosses a wire (a
`MutationError` code, a reaction's dead-letter reason).

Each class is defined beside the feature that raises it and re-exported
here; the feature's own namespace (`service_engine.lanes`,
`service_engine.commands`, ...) exports those its author meets too. The
reaction dispositions (`Retry`, `Park`, `Terminal`) are exceptions a
reaction raises, listed here with the rest.
"""

from __future__ import annotations

from .beat.leader import (
    LeaseLost,
)
from .blobs.model import (
    BlobBucketMissing,
    BlobError,
    BlobStoreUnbound,
    InvalidBlobReference,
)
from .blobs.runtime import (
    BlobStoreMissing,
)
from .cli.commands import (
    Failed,
)
from .commands.errors import (
    BindingError,
    ClauseOrderError,
    CommandDeclarationError,
    CommandNotInstalled,
    DeletePolicyError,
    DuplicateName,
    IdempotencyDeclarationError,
    MissingOutcome,
    MissingRelationshipProof,
    NotCompilable,
    PartitionRouteMismatch,
    RouteIdentifiesRow,
    ServiceValueError,
    TypeMismatch,
    UnboundReference,
    UniqueKeyOutsidePartition,
    UnknownName,
    UnprovenSet,
    ValueMissing,
    WorkflowError,
)
from .commands.plan import (
    InvalidInput,
)
from .db.errors import (
    ConstraintViolation,
    DatabaseError,
    DatabaseFault,
    LockTimeout,
    TransientConflict,
)
from .db.pool import (
    PoolQueueFull,
)
from .failures import (
    AttachError,
    AttachShuttingDown,
    CauseTooLarge,
    ConfigError,
    DatabaseUrlRefused,
    DeclarationError,
    DuplicateRegistration,
    EngineError,
    FrameError,
    ListenerProbeFailed,
    MigrationAltered,
    MigrationError,
    NestedConnectionError,
    PostureBypassRls,
    PostureError,
    PostureOwner,
    PostureSuperuser,
    SchemaVersionConflict,
    ShuttingDown,
    TooManyImpacts,
    TornGroup,
    WorkerStopped,
)
from .gates import (
    Refused,
)
from .graphql.compose import (
    DuplicateSchemaMember,
    UndeclaredSchemaMember,
)
from .graphql.delivery_plan import (
    NotPlanned,
)
from .graphql.reads import (
    ProjectorViewMismatch,
    UnregisteredProjector,
)
from .impacts.model import (
    InvalidImpact,
    UnencodableImpactValue,
    UnknownFactDependency,
)
from .impacts.watched import UnwatchedNoun
from .inbound.consumer import (
    ConsumerBindFailed,
    ConsumerLost,
)
from .lanes.accumulated.errors import (
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
from .lanes.presence.model import (
    InvalidPresenceKey,
    InvalidPresenceValue,
    PresenceBucketMissing,
    PresenceBucketNoMarkers,
    PresenceBucketNoMsgTtl,
    PresenceBucketNoTtl,
    PresenceBucketRefused,
    PresenceBucketTtlTooShort,
    PresenceWithoutNats,
    PresenceWithoutService,
    UndecodableValue,
)
from .lanes.presence.runtime import (
    PresenceNotBound,
)
from .messaging.dead_letters import (
    DeadLetterNotFound,
    NotRetryable,
)
from .messaging.envelope import (
    EnvelopeError,
    PayloadMismatch,
    SequenceWithoutService,
    ServiceRequired,
)
from .messaging.nats import (
    BucketMissing,
    KvConflict,
    NatsUnavailable,
    StreamMissing,
)
from .messaging.reactions import (
    Disposition,
    Park,
    PrincipalUnresolved,
    Retry,
    Terminal,
)
from .outbox.relay import (
    MessageRetentionTooShort,
)
from .persistence.base import (
    HydrationFailed,
    NotFound,
)
from .pipeline.outcomes import (
    SecretSpent,
)
from .pipeline.transaction import (
    ClaimedBefore,
)
from .principal_facts import (
    PrincipalFactLoadFailed,
)
from .props.client import (
    PropsUnanswered,
)
from .props.errors import (
    HookRejected,
    PropsError,
    PropsSchemaMismatch,
    PropsStoreError,
)
from .props.logging_bridge import (
    LogBridgeError,
)
from .render.cohort import (
    CohortMismatch,
    InvalidCohortPart,
    InvalidPrincipalId,
)
from .render.deltas import (
    RevisionGap,
)
from .render.interest import (
    InvalidRoute,
    UnknownProjector,
)
from .render.membership import (
    PopulateRequired,
)
from .render.paging import (
    NoLiveSession,
    NotPageable,
    PageInterrupted,
)
from .render.projector import (
    InvalidProjector,
    MissingRlsApplier,
    RlsRegimeMismatch,
    VisibilityMismatch,
)
from .render.registry import (
    UnknownProjectorName,
)
from .render.session import (
    IllegalTransition,
    PrincipalChanged,
)
from .render.session_id import (
    InvalidSessionId,
)
from .render.sharing import (
    InvalidViewKey,
)
from .render.stream import (
    SessionEnded,
)
from .render.windows import (
    InvalidWindow,
)
from .scopes.handshake_wire import (
    ScopeWireError,
)
from .scopes.manifest import (
    EmptyScopeManifest,
    MalformedScopeKey,
    ScopeError,
    ScopeManifestSpansServices,
    ScopeRejected,
    ScopeWithoutNats,
)
from .server.passport import (
    PassportError,
    PassportMalformed,
    PassportMissing,
    PassportRefused,
)
from .server.wire_operations import (
    OperationStreamClosed,
)

__all__ = [
    "AccumulatorWithoutService",
    "AlreadySealed",
    "AttachError",
    "AttachShuttingDown",
    "BindingError",
    "BlobBucketMissing",
    "BlobError",
    "BlobStoreMissing",
    "BlobStoreUnbound",
    "BucketMissing",
    "CauseTooLarge",
    "ChunkConflict",
    "ChunkSeqOutOfRange",
    "ClaimedBefore",
    "ClauseOrderError",
    "CohortMismatch",
    "CommandDeclarationError",
    "CommandNotInstalled",
    "ConfigError",
    "ConstraintViolation",
    "ConsumerBindFailed",
    "ConsumerLost",
    "DatabaseError",
    "DatabaseFault",
    "DatabaseUrlRefused",
    "DeadLetterNotFound",
    "DeclarationError",
    "DeletePolicyError",
    "Disposition",
    "DuplicateName",
    "DuplicateRegistration",
    "DuplicateSchemaMember",
    "EmptyScopeManifest",
    "EngineError",
    "EnvelopeError",
    "Failed",
    "FrameError",
    "HookRejected",
    "HydrationFailed",
    "IdempotencyDeclarationError",
    "IllegalTransition",
    "InvalidBlobReference",
    "InvalidChunkKey",
    "InvalidCohortPart",
    "InvalidImpact",
    "InvalidInput",
    "InvalidPresenceKey",
    "InvalidPresenceValue",
    "InvalidPrincipalId",
    "InvalidProjector",
    "InvalidRoute",
    "InvalidSessionId",
    "InvalidViewKey",
    "InvalidWindow",
    "KeySealed",
    "KvConflict",
    "LaneStreamMissing",
    "LeaseLost",
    "ListenerProbeFailed",
    "LockTimeout",
    "LogBridgeError",
    "MalformedScopeKey",
    "MessageRetentionTooShort",
    "MigrationAltered",
    "MigrationError",
    "MissingOutcome",
    "MissingRelationshipProof",
    "MissingRlsApplier",
    "NatsUnavailable",
    "NestedConnectionError",
    "NoLiveSession",
    "NotCompilable",
    "NotFound",
    "NotPageable",
    "NotPlanned",
    "NotRetryable",
    "OperationStreamClosed",
    "PageInterrupted",
    "Park",
    "PartitionRouteMismatch",
    "PassportError",
    "PassportMalformed",
    "PassportMissing",
    "PassportRefused",
    "PayloadMismatch",
    "PoolQueueFull",
    "PopulateRequired",
    "PostureBypassRls",
    "PostureError",
    "PostureOwner",
    "PostureSuperuser",
    "PresenceBucketMissing",
    "PresenceBucketNoMarkers",
    "PresenceBucketNoMsgTtl",
    "PresenceBucketNoTtl",
    "PresenceBucketRefused",
    "PresenceBucketTtlTooShort",
    "PresenceNotBound",
    "PresenceWithoutNats",
    "PresenceWithoutService",
    "PrincipalChanged",
    "PrincipalFactLoadFailed",
    "PrincipalUnresolved",
    "ProjectorViewMismatch",
    "PropsError",
    "PropsSchemaMismatch",
    "PropsStoreError",
    "PropsUnanswered",
    "Refused",
    "Retry",
    "RevisionGap",
    "RlsRegimeMismatch",
    "RouteIdentifiesRow",
    "SchemaVersionConflict",
    "ScopeError",
    "ScopeManifestSpansServices",
    "ScopeRejected",
    "ScopeWireError",
    "ScopeWithoutNats",
    "SealChunkBeyondLastSeq",
    "SealError",
    "SealHashMismatch",
    "SealRetentionTooShort",
    "SealTruncated",
    "SecretSpent",
    "SequenceWithoutService",
    "ServiceRequired",
    "ServiceValueError",
    "SessionEnded",
    "ShuttingDown",
    "StreamMissing",
    "Terminal",
    "TooManyImpacts",
    "TornGroup",
    "TransientConflict",
    "TypeMismatch",
    "UnboundReference",
    "UndeclaredSchemaMember",
    "UndecodableValue",
    "UnencodableImpactValue",
    "UniqueKeyOutsidePartition",
    "UnknownFactDependency",
    "UnknownName",
    "UnknownProjector",
    "UnknownProjectorName",
    "UnprovenSet",
    "UnregisteredProjector",
    "UnwatchedNoun",
    "ValueMissing",
    "VisibilityMismatch",
    "WorkerStopped",
    "WorkflowError",
]
