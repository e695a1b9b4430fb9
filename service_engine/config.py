"""EngineConfig: every bound the engine runs under, validated at construction.

A relation between two fields (``lock_timeout < ack_wait``, ...) is checked
once, here, and a violation raises `ConfigError` naming the fields and the
relation, so a misconfigured pod fails at boot instead of misbehaving under
load.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .failures import ConfigError
from .logs import log_format
from .memory import requested_allocator

ENV_PREFIX = "SERVICE_ENGINE_"


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


class EngineConfig(BaseModel):
    """The engine's configuration.

    Durations are `timedelta`; from the environment they are read as seconds
    (``SERVICE_ENGINE_ACK_WAIT=30``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    service: str | None = None
    """Service label: metric label, NATS subject segment, advisory-lock domain."""
    service_version: str | None = None
    """The deployed service version recorded in the schema-version singleton."""
    http_addr: str | None = None
    """``host:port`` the service's HTTP surface binds, when the engine serves it."""
    pod_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    """This process's identity among the pods of one service (metric label)."""

    session_ttl: timedelta = _seconds(300)
    session_max_age: timedelta = _seconds(3600)
    lock_timeout: timedelta = _seconds(5)
    ack_wait: timedelta = _seconds(30)
    max_ack_pending: int = 256
    publish_ack_timeout: timedelta = _seconds(2)
    beat_interval: timedelta = _seconds(1)
    lease: timedelta = _seconds(10)
    nats_grace: timedelta = _seconds(10)
    listener_queue_threshold: float = 0.5
    listener_probe_timeout: timedelta = _seconds(5)
    schema_version_liveness: timedelta = _seconds(30)
    window_capacity: int = 1000
    impacts_per_commit: int = 1000
    listener_channel_capacity: int = 10_000
    fold_cache_capacity: int = 1024
    repair_attempts: int = 3
    reset_threshold: int = 64
    render_shedding: bool = True
    """Overload degrades (`service_engine.render.runtime`): a render pass
    yields the loop between bounded slices, a pass that is behind folds
    PerImpact causes to the latest per key, and a subscriber's stream
    collapses what it has not taken once it is behind. False renders each
    pass in one burst and queues every delta (to measure the difference)."""
    message_retention: timedelta = timedelta(days=7)
    """Age past which message claims and FAILED outbox rows are swept; must
    cover the max_age of every integration stream a reaction binds."""
    seal_retention: timedelta = timedelta(days=7)
    """How long a lane A seal marker (and an unsealed chunk) is kept; must
    cover the max_age of the ``STREAMING_{service}`` stream, so a marker
    outlives every chunk the stream could still deliver."""
    outbox_discipline: Literal["leader", "row_claim"] = "leader"
    """Who publishes the outbox: ``leader``, the pod holding the fenced
    ``outbox`` lease (one publisher, rows in commit order); or
    ``row_claim``, every pod, each on the rows it claimed with ``FOR
    UPDATE SKIP LOCKED`` (a backlog drains on every pod; a producer
    sequence still leaves in order). Every pod of a service must run the
    same discipline."""
    outbox_sweep_every: timedelta = _seconds(60)
    """The period of the outbox relay's hygiene sweep (``with_sweep_every``):
    PUBLISHED rows, FAILED rows and message claims older than
    ``message_retention`` are deleted at most this often, by the relay's
    leader; best-effort, it never lowers readiness."""
    outbox_drain_bound: int = 1000
    outbox_max_attempts: int = 5
    scheduled_max_attempts: int = 5
    inbound_failure_threshold: int = 3
    """Consecutive failures of an inbound consumer past which readiness goes DOWN."""
    inbound_restart_backoff: timedelta = _seconds(0.5)
    """The first pause before an inbound consumer is restarted; it doubles per
    consecutive failure up to ``inbound_restart_backoff_cap``."""
    inbound_restart_backoff_cap: timedelta = _seconds(30)
    offer_reconcile: timedelta = _seconds(300)
    """How often the offer leader reconciles its bucket against the store
    (besides its first drain after boot or takeover)."""
    offer_drain_batch: int = 256
    """Dirty offer keys claimed, resolved and written per drain batch."""
    mirror_reconcile: timedelta = _seconds(60)
    """How often a mirror re-reads its consumed prefixes in full and the
    leader re-projects them (repairs drift in ``known_*``)."""
    mirror_failure_threshold: int = 3
    """Consecutive failed mirror restarts past which it is dead-lettered."""
    mirror_restart_backoff: timedelta = _seconds(0.5)
    """The first pause before a failed mirror restarts; doubles per
    consecutive failure up to ``mirror_restart_backoff_cap``."""
    mirror_restart_backoff_cap: timedelta = _seconds(30)

    # -- the HTTP and WebSocket edge (service_engine.server.app) ----------
    http_max_body_bytes: int = 1_048_576
    """A request body past this many bytes is refused with 413
    (``request_body_too_large``) before it is read whole: at once from its
    Content-Length, or as soon as a chunked body crosses the bound."""
    query_max_tokens: int = 2000
    """A GraphQL document of more lexical tokens is refused while it is
    parsed (``query_too_many_tokens``; Strawberry's MaxTokensLimiter).
    GraphiQL's introspection query is about 200."""
    query_max_aliases: int = 30
    """An operation with more aliased fields is refused at validation
    (``query_too_many_aliases``; Strawberry's MaxAliasesLimiter)."""
    query_max_depth: int = 12
    """An operation nested deeper is refused at validation
    (``query_too_deep``; Strawberry's QueryDepthLimiter; introspection
    fields are not counted)."""
    graphql_introspection: bool = True
    """False refuses introspection (``introspection_disabled``): schema
    queries and GraphiQL's documentation stop working."""
    ws_max_message_bytes: int = 262_144
    """A graphql-transport-ws message past this many bytes closes its socket
    with 1009 (message too big) and reason ``message_too_big``."""
    ws_max_subscriptions_per_socket: int = 100
    """Operations live at once on one socket; the next ``subscribe`` gets an
    ``error`` message (``too_many_subscriptions``) and the socket stays up."""
    ws_max_sockets: int = Field(default_factory=lambda: default_ws_max_sockets())
    """Sockets open at once on this pod; past it a new upgrade is accepted
    and closed with 1013 (try again later) and reason ``too_many_sockets``,
    and existing sockets are untouched. By default what the process's
    open-file limit holds (`default_ws_max_sockets`), at least 10,000."""
    ws_max_handshakes: int = 512
    """Sockets answered but not yet sent their ``connection_init``, at once.
    Past it a new upgrade waits, unanswered, for one of them: the init
    timeout counts from the answer, so a burst of sockets queues at the
    handshake instead of timing out (4408) while the pod works through it.
    While every slot is taken, a socket's init timeout is extended once."""
    ws_per_message_deflate: bool = False
    """Offer per-message deflate (RFC 7692) on the subscription socket.
    Off by default: each compressed socket keeps zlib state (~64 KB or more
    a connection) and deflates every frame, for frames that are small JSON."""
    gc_tuned: bool = True
    """`run_with` freezes the heap built at boot (``gc.freeze()``: the
    collector never scans it again) and raises the collection thresholds
    (``GC_THRESHOLDS`` in `service_engine.server.host`), so a long-lived pod does
    fewer, shorter collections. False leaves Python's defaults."""
    graphiql_asset_base_url: str = "https://unpkg.com"
    """Where GraphiQL's page loads React and GraphiQL from: the public CDN,
    or an operator's mirror of the same files (same paths, same bytes: the
    page checks their integrity hashes). An ``http(s)://`` URL or a path
    on this host starting with ``/``."""
    ws_max_attaching: int = 64
    """Sockets being attached at once: a turn runs from the arrival of ``connection_init``
    (the principal's resolve, the acknowledgement) to the first answer of
    the socket's first operation (a live subscription's Reset: its attach),
    or ends two seconds (at most the init timeout) after the
    acknowledgement if none came. Past
    it an init waits its turn, its init timeout already ended by its
    arrival: a burst of sockets is attached in waves, each wave's transient
    objects freed and their memory reused by the next wave's sessions
    instead of all of them interleaved at once (bench/README.md, "Back to
    idle": RSS of 10,000 sessions held and after they closed)."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from exc

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        problems: list[str] = []

        def require(ok: bool, relation: str) -> None:
            if not ok:
                problems.append(relation)

        positive_durations = (
            "session_ttl", "session_max_age", "lock_timeout", "ack_wait",
            "publish_ack_timeout", "beat_interval", "lease", "nats_grace",
            "listener_probe_timeout", "schema_version_liveness", "message_retention",
            "seal_retention", "outbox_sweep_every",
            "inbound_restart_backoff", "offer_reconcile", "mirror_reconcile",
            "mirror_restart_backoff",
        )
        for name in positive_durations:
            require(getattr(self, name) > timedelta(0), f"{name} > 0")
        positive_counts = (
            "max_ack_pending", "window_capacity", "impacts_per_commit",
            "listener_channel_capacity", "fold_cache_capacity", "repair_attempts",
            "reset_threshold", "outbox_drain_bound", "outbox_max_attempts",
            "scheduled_max_attempts", "inbound_failure_threshold",
            "offer_drain_batch", "mirror_failure_threshold",
            "http_max_body_bytes", "query_max_tokens", "query_max_aliases", "query_max_depth",
            "ws_max_message_bytes", "ws_max_subscriptions_per_socket", "ws_max_sockets",
            "ws_max_handshakes", "ws_max_attaching",
        )
        for name in positive_counts:
            require(getattr(self, name) > 0, f"{name} > 0")
        require(self.session_max_age > self.session_ttl, "session_max_age > session_ttl")
        require(self.lock_timeout < self.ack_wait, "lock_timeout < ack_wait")
        require(self.publish_ack_timeout < self.ack_wait, "publish_ack_timeout < ack_wait")
        require(self.lease > self.beat_interval, "lease > beat_interval")
        require(
            self.inbound_restart_backoff_cap >= self.inbound_restart_backoff,
            "inbound_restart_backoff_cap >= inbound_restart_backoff",
        )
        require(self.offer_reconcile > self.beat_interval, "offer_reconcile > beat_interval")
        require(self.mirror_reconcile > self.beat_interval, "mirror_reconcile > beat_interval")
        require(
            self.mirror_restart_backoff_cap >= self.mirror_restart_backoff,
            "mirror_restart_backoff_cap >= mirror_restart_backoff",
        )
        require(
            0.0 < self.listener_queue_threshold <= 1.0,
            "listener_queue_threshold in (0.0, 1.0]",
        )
        require(
            _is_asset_base(self.graphiql_asset_base_url),
            "graphiql_asset_base_url is an http(s):// URL or a path starting with /",
        )
        if problems:
            raise ValueError("violated: " + "; ".join(problems))
        return self

    def with_service_version(self, version: str) -> EngineConfig:
        """A copy recording ``version`` as the deployed service version."""
        return self.replace(service_version=version)

    def replace(self, **changes: Any) -> EngineConfig:
        """A validated copy with ``changes`` applied."""
        return EngineConfig(**{**self.model_dump(), **changes})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> EngineConfig:
        """Build from ``SERVICE_ENGINE_<FIELD>`` variables (durations in seconds)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            if field.annotation is timedelta:
                try:
                    values[name] = _seconds(float(raw))
                except ValueError:
                    raise ConfigError(
                        f"invalid EngineConfig: {name}: {ENV_PREFIX}{name.upper()}={raw!r} "
                        "is not a number of seconds"
                    ) from None
            else:
                values[name] = raw
        values.update(overrides)
        return cls(**values)


def _is_asset_base(value: str) -> bool:
    if value.startswith("/"):
        return not value.startswith("//")
    scheme, sep, rest = value.partition("://")
    return bool(sep) and scheme in ("http", "https") and bool(rest) and " " not in value


def _problems(exc: ValidationError) -> list[str]:
    parts: list[str] = []
    for error in exc.errors():
        location = ".".join(str(p) for p in error["loc"]) or "EngineConfig"
        message = error["msg"].removeprefix("Value error, ")
        if location == "EngineConfig" and message.startswith("violated: "):
            parts.extend(f"violated: {r}" for r in message.removeprefix("violated: ").split("; "))
        else:
            parts.append(f"{location}: {message}")
    return parts


def _describe(exc: ValidationError) -> str:
    return "invalid EngineConfig: " + " | ".join(_problems(exc))


MIN_WS_MAX_SOCKETS = 10_000
"""The least default socket bound: a pod holds 10,000 idle sessions in
well under 200 MB (bench/README.md)."""

FILES_KEPT_FOR_THE_REST = 1_024
"""Open files a pod keeps for everything but its sockets (Postgres and NATS
connections, HTTP requests, logs, blobs)."""


def default_ws_max_sockets(limits: tuple[int, int] | None = None) -> int:
    """The default ``ws_max_sockets``: what the process's open-file limit
    (``limits``: soft and hard, the process's own when None) holds, less
    `FILES_KEPT_FOR_THE_REST`, at least `MIN_WS_MAX_SOCKETS` and at most ten
    times it. The hard limit counts: `run_with` raises the soft one to it."""
    import resource

    if limits is None:
        try:
            limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        except (OSError, ValueError):
            return MIN_WS_MAX_SOCKETS
    soft, hard = limits
    limit = soft if hard == resource.RLIM_INFINITY else hard
    if limit == resource.RLIM_INFINITY:
        return 10 * MIN_WS_MAX_SOCKETS
    return max(MIN_WS_MAX_SOCKETS, min(limit, 10 * MIN_WS_MAX_SOCKETS) - FILES_KEPT_FOR_THE_REST)


NON_FIELD_VARIABLES = frozenset({
    "LOG_FORMAT",  # service_engine.logs
    "DEBUG_LOOP_WATCH", "DEBUG_GC_THRESHOLDS",  # bench/loopwatch.py (debug only)
    "ALLOCATOR",  # service_engine.memory.run_on_allocator (read before the engine starts)
    # service_engine.blobs.s3.BlobStoreConfig.from_env (the blob bucket)
    "S3_ENDPOINT", "S3_BUCKET", "S3_REGION", "S3_ACCESS_KEY", "S3_SECRET_KEY",
})
"""``SERVICE_ENGINE_*`` variables that are not `EngineConfig` fields."""


@dataclass(frozen=True, slots=True)
class ConfigCheck:
    """What `check_environment` found: the config when every bound and
    relation holds, else each problem (a violated relation, a bad value, a
    ``SERVICE_ENGINE_*`` variable no field reads) on its own line."""

    config: EngineConfig | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.config is not None and not self.problems


def check_environment(environ: Mapping[str, str]) -> ConfigCheck:
    """Validate the `EngineConfig` ``environ`` describes, without booting.

    Unlike `EngineConfig.from_env`, a misspelt ``SERVICE_ENGINE_*`` name is
    a problem rather than silently ignored.
    """
    fields = {name.upper() for name in EngineConfig.model_fields}
    unknown = sorted(
        key for key in environ
        if key.startswith(ENV_PREFIX)
        and key.removeprefix(ENV_PREFIX) not in fields
        and key.removeprefix(ENV_PREFIX) not in NON_FIELD_VARIABLES
    )
    problems = [f"{key}: no EngineConfig field reads this variable" for key in unknown]
    for read in (log_format, requested_allocator):
        try:
            read(environ)
        except ConfigError as exc:
            problems.append(str(exc))
    try:
        config: EngineConfig | None = EngineConfig.from_env(environ)
    except ConfigError as exc:
        config = None
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            problems.extend(_problems(cause))
        else:
            problems.append(str(exc).removeprefix("invalid EngineConfig: "))
    return ConfigCheck(config, tuple(problems))


def describe_config(config: EngineConfig) -> dict[str, Any]:
    """Every field as plain JSON values (durations in seconds)."""
    values: dict[str, Any] = {}
    for name in EngineConfig.model_fields:
        value = getattr(config, name)
        values[name] = value.total_seconds() if isinstance(value, timedelta) else value
    return values
