"""The service property contract (version 0.2.1): structured property verbs
over NATS request/reply, capabilities and redaction, replay and live topics,
the SQLite and in-memory stores, and the logging bridge."""

from .addressing import (
    VERBS,
    Command,
    audit_topic,
    parse_command,
    records_changed_topic,
    verb_registry,
)
from .capabilities import (
    REQUEST_INFO_HEADER,
    PeerIdentity,
    Policy,
    StaticPolicy,
    all_caps,
    attested_peer,
    audit_cap,
    capability_name,
    describe_cap,
    read_cap,
    secrets_cap,
    write_cap,
)
from .client import PropsClient, PropsUnanswered
from .digests import canonical_json, event_digest
from .errors import ERROR_RC, HookRejected, PropsError, PropsSchemaMismatch, PropsStoreError
from .events import audit_body, caught_up, records_changed_body, rfc3339_ms
from .granter import DevGranter
from .handler import (
    GRANT_SUBJECT,
    REVOKE_SUBJECT,
    Granted,
    GranterMissing,
    GrantOutcome,
    GrantRefused,
    PropsHandler,
    Reply,
)
from .logging_bridge import (
    LogBridge,
    LogBridgeError,
    log_namespace,
    open_log_bridge,
    parse_filter,
)
from .memory_store import MemoryStore
from .records import Actor, Commit, History, Record, Snapshot, StoredEvent, now
from .schema import FieldSpec, Namespace, SagaOutcome, Validator
from .service import NatsGranter, PropsService
from .sqlite_store import DDL, SqliteMapping, SqliteStore, open_sqlite_store
from .store import Store
from .watch import PropsWatch, WatchMerge, open_watch

__all__ = [
    "DDL",
    "ERROR_RC",
    "GRANT_SUBJECT",
    "REQUEST_INFO_HEADER",
    "REVOKE_SUBJECT",
    "VERBS",
    "Actor",
    "Command",
    "Commit",
    "DevGranter",
    "FieldSpec",
    "GrantOutcome",
    "GrantRefused",
    "Granted",
    "GranterMissing",
    "History",
    "HookRejected",
    "LogBridge",
    "LogBridgeError",
    "MemoryStore",
    "Namespace",
    "NatsGranter",
    "PeerIdentity",
    "Policy",
    "PropsClient",
    "PropsError",
    "PropsHandler",
    "PropsSchemaMismatch",
    "PropsService",
    "PropsStoreError",
    "PropsUnanswered",
    "PropsWatch",
    "Record",
    "Reply",
    "SagaOutcome",
    "Snapshot",
    "SqliteMapping",
    "SqliteStore",
    "StaticPolicy",
    "Store",
    "StoredEvent",
    "Validator",
    "WatchMerge",
    "all_caps",
    "attested_peer",
    "audit_body",
    "audit_cap",
    "audit_topic",
    "canonical_json",
    "capability_name",
    "caught_up",
    "describe_cap",
    "event_digest",
    "log_namespace",
    "now",
    "open_log_bridge",
    "open_sqlite_store",
    "open_watch",
    "parse_command",
    "parse_filter",
    "read_cap",
    "records_changed_body",
    "records_changed_topic",
    "rfc3339_ms",
    "secrets_cap",
    "verb_registry",
    "write_cap",
]
