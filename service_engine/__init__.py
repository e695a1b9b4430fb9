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
from .readiness import Readiness, ReadinessHandle, readiness_route

__all__ = [
    "ENGINE_VERSION",
    "AttachError",
    "Clock",
    "ConfigError",
    "Database",
    "DatabaseUrlRefused",
    "DuplicateRegistration",
    "Engine",
    "EngineConfig",
    "EngineError",
    "ListenerProbeFailed",
    "PostureBypassRls",
    "PostureError",
    "PostureOwner",
    "PostureSuperuser",
    "Readiness",
    "ReadinessHandle",
    "SchemaVersionConflict",
    "ShuttingDown",
    "SystemClock",
    "Timestamp",
    "WorkerStopped",
    "connect_pool",
    "readiness_route",
    "validate_database_tls",
]
