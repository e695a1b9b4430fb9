"""The engine's OpenTelemetry instruments, exposed as Prometheus text.

Each engine owns its meter provider and Prometheus registry, so several
engines in one process (two pods in a test) never share a series. Every
instrument is labelled by ``service`` and ``pod``.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PROMETHEUS_CONTENT_TYPE: str = CONTENT_TYPE_LATEST


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
        self.impacts_committed = meter.create_counter(
            "service_engine_impacts_committed",
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

    def add_impacts_committed(self, count: int) -> None:
        """Record ``count`` impacts; call only after the commit returned."""
        if count:
            self.impacts_committed.add(count, self.labels)

    def add_dead_letters(self, source: str, count: int = 1) -> None:
        """Count ``count`` distinct dead letters of ``source``; call only
        after the transaction that recorded them committed."""
        if count:
            self.dead_letters.add(count, {**self.labels, "source": source})

    def set_outbox_backlog(self, pending: int, oldest_age_seconds: float) -> None:
        """Gauge the outbox backlog: rows waiting and the oldest one's age."""
        self.outbox_pending.set(pending, self.labels)
        self.outbox_oldest_age.set(oldest_age_seconds, self.labels)

    def set_dependency(self, dependency: str, up: bool) -> None:
        self.dependency_up.set(1 if up else 0, {**self.labels, "dependency": dependency})

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every instrument."""
        result: bytes = generate_latest(self.registry)
        return result

    def sample(self, name: str, **labels: str) -> float | None:
        """The current value of one series (``name`` as Prometheus spells it)."""
        value: float | None = self.registry.get_sample_value(name, {**self.labels, **labels})
        return value

    def shutdown(self) -> None:
        self._provider.shutdown()
