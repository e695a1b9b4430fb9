"""Postgres: the pooled connect, posture, schema version, migrations, lock keys."""

from .locks import advisory_key, aggregate_lock_key, fnv1a_64, named_lock_key
from .migrate import (
    ENGINE_RESERVED_MAX,
    Migration,
    engine_migrations,
    grant_engine_access,
    load_migrations,
    migrate,
    service_migrations,
)
from .pool import Database, connect_pool
from .posture import assert_posture
from .tls import trusted_hosts_from_env, validate_database_tls

__all__ = [
    "ENGINE_RESERVED_MAX",
    "Database",
    "Migration",
    "advisory_key",
    "aggregate_lock_key",
    "assert_posture",
    "connect_pool",
    "engine_migrations",
    "fnv1a_64",
    "grant_engine_access",
    "load_migrations",
    "migrate",
    "named_lock_key",
    "service_migrations",
    "trusted_hosts_from_env",
    "validate_database_tls",
]
