"""service-engine: personalised live views of Postgres state and one
exactly-once write and integration pipeline for Python microservices."""

from .clock import Clock, SystemClock, Timestamp
from .config import EngineConfig
from .db import Database, connect_pool, validate_database_tls
from .engine import ENGINE_VERSION, Engine
from .errors import (
    AttachError,
    ConfigError,
    DatabaseUrlRefused,
    DuplicateRegistration,
    EngineError,
    ListenerProbeFailed,
    PostureBypassRls,
    PostureError,
    PostureOwner,
    PostureSuperuser,
    SchemaVersionConflict,
    ShuttingDown,
    WorkerStopped,
)
from .impacts import Cause, Impact
from .readiness import Readiness, ReadinessHandle, readiness_route
from .render import (
    CohortKey,
    Keys,
    NoLiveSession,
    Ordered,
    Query,
    Remove,
    Reset,
    SessionId,
    Upsert,
)
from .render.population import WindowSpec
from .render.runtime import SessionEnded, SessionStream
from .view import (
    Coalesced,
    PerImpact,
    Populate,
    Projector,
    RlsApplier,
    Unrestricted,
    Visibility,
)

__all__ = [
    "ENGINE_VERSION",
    "AttachError",
    "Cause",
    "Clock",
    "Coalesced",
    "CohortKey",
    "ConfigError",
    "Database",
    "DatabaseUrlRefused",
    "DuplicateRegistration",
    "Engine",
    "EngineConfig",
    "EngineError",
    "Impact",
    "Keys",
    "ListenerProbeFailed",
    "NoLiveSession",
    "Ordered",
    "PerImpact",
    "Populate",
    "PostureBypassRls",
    "PostureError",
    "PostureOwner",
    "PostureSuperuser",
    "Projector",
    "Query",
    "Readiness",
    "ReadinessHandle",
    "Remove",
    "Reset",
    "RlsApplier",
    "SchemaVersionConflict",
    "SessionEnded",
    "SessionId",
    "SessionStream",
    "ShuttingDown",
    "SystemClock",
    "Timestamp",
    "Unrestricted",
    "Upsert",
    "Visibility",
    "WindowSpec",
    "WorkerStopped",
    "connect_pool",
    "readiness_route",
    "validate_database_tls",
]
