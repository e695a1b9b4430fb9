"""MkDocs hook: the configuration table, generated from `EngineConfig`.

A page that contains the marker ``<!-- engine-config-table -->`` gets, in
its place, one row per `EngineConfig` field: its environment variable, its
type, its default and its description. The description is the field's
docstring in ``service_engine/config.py``; a field without one takes its
line from `UNDOCUMENTED` below, and a field with neither fails the build, so
a new field cannot reach the docs undescribed.
"""

from __future__ import annotations

import types
from datetime import timedelta
from typing import Any, get_args

import griffe

MARKER = "<!-- engine-config-table -->"

UNDOCUMENTED: dict[str, str] = {
    "session_ttl": "A live session no subscriber has read for this long is ended.",
    "session_max_age": (
        "A live session, and the socket carrying it, lives at most this long from its "
        "handshake; the client reconnects with a fresh passport. Must exceed `session_ttl`."
    ),
    "lock_timeout": (
        "`SET LOCAL lock_timeout` of every write transaction, and the longest the pipeline "
        "waits for a pool connection. Must be below `ack_wait`."
    ),
    "ack_wait": "JetStream `ack_wait` of every inbound consumer the engine creates.",
    "max_ack_pending": "JetStream `max_ack_pending` of every inbound consumer.",
    "publish_ack_timeout": (
        "The longest a JetStream publish (outbox, scheduled message) waits for its "
        "acknowledgement. Must be below `ack_wait`."
    ),
    "beat_interval": "The period of the housekeeping beat.",
    "lease": (
        "How long a leader lease (outbox relay, offer drain, mirror projection) holds "
        "without renewal. Must exceed `beat_interval`."
    ),
    "nats_grace": (
        "A NATS outage shorter than this keeps the pod UP; past it the pod goes DOWN and the "
        "NATS lanes pause."
    ),
    "listener_queue_threshold": (
        "Postgres notification-queue usage (0.0 to 1.0] past which the beat closes the "
        "listener, takes the pod DOWN and resets its sessions."
    ),
    "listener_probe_timeout": (
        "How long the boot probe waits for its own NOTIFY through the listener (a "
        "transaction-mode pooler never delivers it)."
    ),
    "schema_version_liveness": (
        "A schema-version row whose heartbeat is older than this no longer blocks a pod of "
        "another version."
    ),
    "window_capacity": (
        "The most keys one live session holds across its pages; past it the oldest page is "
        "released silently."
    ),
    "impacts_per_commit": (
        "The most keys an ordinary write may dirty; more is refused and names the bulk path."
    ),
    "listener_channel_capacity": (
        "Impacts buffered between the listener and the render loop; an overflow resets every "
        "live session of the pod."
    ),
    "fold_cache_capacity": "Lane A folded prefixes kept in memory (least recently used).",
    "repair_attempts": (
        "Failed renders or repairs of one session before the session is ended."
    ),
    "reset_threshold": (
        "A render pass that would send one session more deltas than this sends a Reset "
        "instead (a projector may override it with `RESET_THRESHOLD`)."
    ),
    "outbox_drain_bound": "Outbox rows the relay publishes per pass.",
    "outbox_max_attempts": (
        "Publishes of one outbox row the broker refused before it is dead-lettered."
    ),
    "scheduled_max_attempts": (
        "Publishes of one scheduled message the broker refused before it is dead-lettered."
    ),
    "inbound_restart_backoff_cap": "The longest pause between inbound consumer restarts.",
    "mirror_restart_backoff_cap": "The longest pause between mirror restarts.",
}
"""Descriptions of the fields whose code carries no docstring."""


def _type_name(annotation: Any) -> str:
    if annotation is timedelta:
        return "seconds"
    args = [a for a in get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) and len(args) == 1:
        return _type_name(args[0])  # the default says "unset"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        return "generated"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        return f"`{int(seconds) if seconds.is_integer() else seconds}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_table() -> str:
    """The Markdown table of every `EngineConfig` field."""
    from service_engine.config import ENV_PREFIX, EngineConfig

    module = griffe.load("service_engine.config")
    members = module["EngineConfig"].members
    rows = [
        "| Field, variable, type and default | Description |",
        "| --- | --- |",
    ]
    missing = []
    for name, field in EngineConfig.model_fields.items():
        docstring = members[name].docstring if name in members else None
        description = docstring.value if docstring is not None else UNDOCUMENTED.get(name)
        if description is None:
            missing.append(name)
            continue
        rows.append(
            f"| `{name}`<br>`{ENV_PREFIX}{name.upper()}`<br>"
            f"{_type_name(field.annotation)}, default {_default(field)} "
            f"| {_one_line(description)} |"
        )
    if missing:
        raise ValueError(
            "EngineConfig fields without a description (add a docstring in "
            f"service_engine/config.py or a line in docs/hooks/config_table.py): {missing}"
        )
    return '<div class="config-table" markdown>\n\n' + "\n".join(rows) + "\n\n</div>"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_table())
