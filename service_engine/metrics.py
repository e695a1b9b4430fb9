"""The engine's OpenTelemetry instruments, exposed as Prometheus text.

Each engine owns its meter provider and Prometheus registry, so several
engines in one process (two pods in a test) never share a series. Every
instrument is labelled by ``service`` and ``pod``.

The series, as Prometheus spells them (``observability/service-engine-alerts.yaml``
alerts over them; keep the names in step):

* ``service_engine_impacts_committed_total``: the notify budget counter;
* ``service_engine_listener_queue_usage``: ``pg_notification_queue_usage()``
  as the listener last read it (0.0 to 1.0, cluster-wide);
* ``service_engine_resets_total{projector, cause}``: sessions reset, by
  `RESET_CAUSES` (overflow, reconnect, threshold);
* ``service_engine_live_sessions{projector}``: sessions attached and live;
* ``service_engine_render_pass_duration_seconds``: a histogram of render passes;
* ``service_engine_deltas_delivered_total{projector}``: deltas enqueued to sessions;
* ``service_engine_dead_letters_total{source}`` and
  ``service_engine_dead_letters_waiting{source}``: recorded, and waiting on a human;
* ``service_engine_outbox_pending`` and ``service_engine_outbox_oldest_age_seconds``;
* ``service_engine_outbox_published_total``: outbox rows this pod published
  and marked PUBLISHED (counted after the mark committed);
* ``service_engine_dependency_up{dependency}`` for each of `DEPENDENCIES`;
* ``service_engine_presence_writes_total{lane, op, outcome}`` (stored or
  dropped), ``service_engine_presence_changes_total{lane, op}`` (folded
  upserts and removes) and ``service_engine_presence_reseeds_total``;
* ``service_engine_offer_publish_failures_total{offer}``: offer keys whose
  ``publish`` raised in a drain pass (each stays dirty and is retried);
* ``service_engine_memory_releases_total``: free heap pages handed back to
  the OS after many sessions closed (`service_engine.memory`);
* ``service_engine_loop_lag_seconds``: a histogram of how late the event
  loop ran a wake scheduled 50 ms ahead (the engine's ``loop_lag`` worker).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PROMETHEUS_CONTENT_TYPE: str = CONTENT_TYPE_LATEST

DEPENDENCIES: tuple[str, ...] = ("postgres", "listener", "nats", "mirrors", "inbound", "presence")
"""The degrade table's dependencies, each a ``service_engine_dependency_up`` series."""

RESET_CAUSES: tuple[str, ...] = ("overflow", "reconnect", "threshold")
"""Why sessions were reset: the listener channel overflowed, the LISTEN
connection was lost (or braked) and re-established, or a pass dirtied more
keys than the reset threshold."""

RENDER_PASS_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
"""Render pass histogram boundaries, in seconds."""

LOOP_LAG_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
"""Loop lag histogram boundaries, in seconds (15 ms: issue 11's p99 target)."""


class Metrics:
    """The instruments of one engine."""

    def __init__(self, service: str | None, pod: str) -> None:
        self.registry = CollectorRegistry()
        self._reader = PrometheusMetricReader(
            disable_target_info=True, scope_info_enabled=False, registry=self.registry
        )
        self._provider = MeterProvider(metric_readers=[self._reader])
        meter = self._provider.get_meter("service_engine")
        self.labels: Mapping[str, str] = {"service": service or "", "pod": pod}
        # Counted in a plain int on the commit path and observed at each
        # collection: no measurement object or attribute hashing per commit.
        self._impacts_committed = 0
        self.impacts_committed = meter.create_observable_counter(
            "service_engine_impacts_committed",
            callbacks=[self._observe_impacts_committed],
            description="Impacts of committed transactions (the notify budget)",
        )
        self.dependency_up = meter.create_gauge(
            "service_engine_dependency_up",
            description="1 while a degrade-table dependency is healthy, else 0",
        )
        self.dead_letters = meter.create_counter(
            "service_engine_dead_letters",
            description="Distinct dead letters recorded, by source (counted after commit)",
        )
        self.outbox_pending = meter.create_gauge(
            "service_engine_outbox_pending",
            description="Outbox rows waiting to be published",
        )
        self.outbox_oldest_age = meter.create_gauge(
            "service_engine_outbox_oldest_age_seconds",
            description="Age in seconds of the oldest outbox row waiting to be published",
        )
        self.outbox_published = meter.create_counter(
            "service_engine_outbox_published",
            description="Outbox rows this pod published and marked PUBLISHED",
        )
        self.listener_queue_usage = meter.create_gauge(
            "service_engine_listener_queue_usage",
            description="Postgres notification queue usage (0.0 to 1.0) as the listener read it",
        )
        self.resets = meter.create_counter(
            "service_engine_resets",
            description="Sessions reset, by projector and cause (overflow, reconnect, threshold)",
        )
        # Kept in a plain dict on every attach and detach and observed at
        # each collection: a burst of attaches sets no instrument.
        self._live_sessions: dict[str, int] = {}
        self.live_sessions = meter.create_observable_gauge(
            "service_engine_live_sessions",
            callbacks=[self._observe_live_sessions],
            description="Live sessions attached to this pod, by projector",
        )
        self.render_pass_duration = meter.create_histogram(
            "service_engine_render_pass_duration",
            unit="s",
            description="Duration of one render pass in seconds",
            explicit_bucket_boundaries_advisory=list(RENDER_PASS_BUCKETS),
        )
        self.deltas_delivered = meter.create_counter(
            "service_engine_deltas_delivered",
            description="Deltas enqueued to live sessions, by projector",
        )
        self.dead_letters_waiting = meter.create_gauge(
            "service_engine_dead_letters_waiting",
            description="Dead letters waiting on a human (retry or discard), by source",
        )

        self.lane_chunks = meter.create_counter(
            "service_engine_lane_chunks",
            description="Lane A chunks written, by outcome (durable, duplicate, conflict, sealed)",
        )
        self.lane_seals = meter.create_counter(
            "service_engine_lane_seals",
            description="Lane A seals, by gesture and outcome (sealed, or the refusal's code)",
        )

        self.presence_writes = meter.create_counter(
            "service_engine_presence_writes",
            description="Presence writes, by lane, op (put, clear) and outcome (stored, dropped)",
        )
        self.presence_changes = meter.create_counter(
            "service_engine_presence_changes",
            description="Presence changes folded from the bucket, by lane and op (upsert, remove)",
        )
        self.presence_reseeds = meter.create_counter(
            "service_engine_presence_reseeds",
            description="Presence folds reseeded from the bucket after a reconnection",
        )

        self.offer_publish_failures = meter.create_counter(
            "service_engine_offer_publish_failures",
            description="Offer keys whose publish raised in a drain pass, by offer (kept dirty)",
        )

        self.memory_releases = meter.create_counter(
            "service_engine_memory_releases",
            description="Free heap pages handed back to the OS after many sessions closed",
        )

        self.loop_lag = meter.create_histogram(
            "service_engine_loop_lag",
            unit="s",
            description="How late the event loop ran a scheduled wake, in seconds",
            explicit_bucket_boundaries_advisory=list(LOOP_LAG_BUCKETS),
        )

    def observe_loop_lag(self, seconds: float) -> None:
        """Record how late one scheduled wake ran."""
        self.loop_lag.record(seconds, self.labels)

    def add_memory_release(self) -> None:
        """Count one release of free memory (`service_engine.memory`)."""
        self.memory_releases.add(1, self.labels)

    def add_offer_publish_failures(self, offer: str, count: int) -> None:
        """Count ``count`` keys of ``offer`` whose publish raised, after the
        pass that kept them dirty committed."""
        if count:
            self.offer_publish_failures.add(count, {**self.labels, "offer": offer})

    def add_presence_write(self, lane: str, op: str, stored: bool) -> None:
        """Count one presence write of ``lane`` (``op`` put or clear)."""
        outcome = "stored" if stored else "dropped"
        self.presence_writes.add(1, {**self.labels, "lane": lane, "op": op, "outcome": outcome})

    def add_presence_change(self, lane: str, op: str) -> None:
        """Count one change folded from the presence bucket (upsert or remove)."""
        self.presence_changes.add(1, {**self.labels, "lane": lane, "op": op})

    def add_presence_reseed(self) -> None:
        """Count one reseed of the presence folds."""
        self.presence_reseeds.add(1, self.labels)

    def add_impacts_committed(self, count: int) -> None:
        """Record ``count`` impacts; call only after the commit returned."""
        if count > 0:
            self._impacts_committed += count

    def _observe_impacts_committed(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self._impacts_committed, self.labels)]

    def add_dead_letters(self, source: str, count: int = 1) -> None:
        """Count ``count`` distinct dead letters of ``source``; call only
        after the transaction that recorded them committed."""
        if count:
            self.dead_letters.add(count, {**self.labels, "source": source})

    def set_outbox_backlog(self, pending: int, oldest_age_seconds: float) -> None:
        """Gauge the outbox backlog: rows waiting and the oldest one's age."""
        self.outbox_pending.set(pending, self.labels)
        self.outbox_oldest_age.set(oldest_age_seconds, self.labels)

    def add_outbox_published(self, count: int) -> None:
        """Count ``count`` outbox rows this pod marked PUBLISHED, after the
        mark committed."""
        if count:
            self.outbox_published.add(count, self.labels)

    def add_chunks(self, outcome: str, count: int = 1) -> None:
        """Count lane A chunks of ``outcome``, after their flush committed."""
        if count:
            self.lane_chunks.add(count, {**self.labels, "outcome": outcome})

    def add_seals(self, gesture: str, outcome: str) -> None:
        """Count one seal (after its commit) or one refused seal."""
        self.lane_seals.add(1, {**self.labels, "gesture": gesture, "outcome": outcome})

    def set_dependency(self, dependency: str, up: bool) -> None:
        """Gauge one of `DEPENDENCIES` up (1) or down (0)."""
        self.dependency_up.set(1 if up else 0, {**self.labels, "dependency": dependency})

    def set_listener_queue_usage(self, usage: float) -> None:
        """Gauge ``pg_notification_queue_usage()`` as last read."""
        self.listener_queue_usage.set(usage, self.labels)

    def add_resets(self, projector: str, cause: str, count: int = 1) -> None:
        """Count ``count`` sessions of ``projector`` reset for ``cause``
        (one of `RESET_CAUSES`)."""
        if count:
            self.resets.add(count, {**self.labels, "projector": projector, "cause": cause})

    def set_live_sessions(self, projector: str, count: int) -> None:
        """Gauge the live sessions of ``projector`` on this pod (observed
        at the next collection)."""
        self._live_sessions[projector] = count

    def _observe_live_sessions(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, {**self.labels, "projector": projector})
                for projector, count in list(self._live_sessions.items())]

    def observe_render_pass(self, seconds: float) -> None:
        """Record one render pass's duration."""
        self.render_pass_duration.record(seconds, self.labels)

    def add_deltas_delivered(self, projector: str, count: int) -> None:
        """Count ``count`` deltas of ``projector`` enqueued to sessions."""
        if count:
            self.deltas_delivered.add(count, {**self.labels, "projector": projector})

    def set_dead_letters_waiting(self, source: str, count: int) -> None:
        """Gauge the dead letters of ``source`` waiting on a human."""
        self.dead_letters_waiting.set(count, {**self.labels, "source": source})

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every instrument."""
        result: bytes = generate_latest(self.registry)
        return result

    def sample(self, name: str, **labels: str) -> float | None:
        """The current value of one series (``name`` as Prometheus spells it)."""
        value: float | None = self.registry.get_sample_value(name, {**self.labels, **labels})
        return value

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """This engine's samples of ``name`` (as Prometheus spells it),
        summed by the value of ``label``."""
        totals: dict[str, float] = {}
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name != name or label not in sample.labels:
                    continue
                if any(sample.labels.get(k) != v for k, v in self.labels.items()):
                    continue
                key = sample.labels[label]
                totals[key] = totals.get(key, 0.0) + float(sample.value)
        return totals

    def total(self, name: str) -> float:
        """The sum of this engine's samples of ``name`` over every other label."""
        total = 0.0
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in self.labels.items()
                ):
                    total += float(sample.value)
        return total

    def shutdown(self) -> None:
        self._provider.shutdown()
