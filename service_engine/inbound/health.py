"""Supervision of the inbound consumers: `ConsumerSupervisor` restarts one
`InboundConsumer` with a bounded backoff and, past
``inbound_failure_threshold`` consecutive failures, reports it to
`InboundHealth`, which holds readiness DOWN (`REASON_INBOUND_STOPPED`,
``service_engine_dependency_up{dependency="inbound"}`` = 0) through the same
`DependencyGauge` as the NATS health.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from ..messaging.nats_health import DependencyGauge
from ..metrics import Metrics
from ..readiness import REASON_INBOUND_STOPPED, ReadinessHandle
from ..supervisor import Restarting
from .consumer import InboundConsumer

__all__ = ["DEPENDENCY", "ConsumerSupervisor", "InboundHealth"]

_log = logging.getLogger(__name__)

DEPENDENCY = "inbound"


class InboundHealth:
    """The pod's verdict on its inbound consumers: DOWN (`REASON_INBOUND_STOPPED`)
    while any is past the consecutive-failure threshold."""

    def __init__(self, readiness: ReadinessHandle, metrics: Metrics | None = None) -> None:
        self.readiness = readiness
        self.metrics = metrics
        self.dependency = DependencyGauge(readiness, metrics, DEPENDENCY, REASON_INBOUND_STOPPED)
        self._stopped: dict[str, str] = {}
        self.dependency.gauge(True)

    def stopped(self, name: str, detail: str) -> None:
        self._stopped[name] = detail
        self._apply()

    def healthy(self, name: str) -> None:
        if self._stopped.pop(name, None) is not None:
            _log.info("inbound consumer %s works again", name)
            self._apply()

    @property
    def down(self) -> bool:
        return bool(self._stopped)

    def _apply(self) -> None:
        if self._stopped:
            self.dependency.down(
                "; ".join(f"{name}: {detail}" for name, detail in sorted(self._stopped.items()))
            )
        else:
            self.dependency.up()


class ConsumerSupervisor(Restarting):
    """Keeps one `InboundConsumer` running: restarts it with a bounded,
    doubling backoff (one log line per step), and reports it stopped to
    `InboundHealth` past ``threshold`` consecutive failures. A consumer that
    answers a pull again resets the count."""

    returned = "the pull loop returned"

    def __init__(
        self,
        consumer: InboundConsumer,
        health: InboundHealth,
        *,
        threshold: int,
        backoff: timedelta,
        backoff_cap: timedelta,
    ) -> None:
        super().__init__(threshold=threshold, backoff=backoff, backoff_cap=backoff_cap)
        self.consumer = consumer
        self.health = health
        self.what = f"inbound consumer {consumer.reaction.name}"

    async def attempt(self, healthy: Callable[[], None]) -> None:
        await self.consumer.run(healthy)

    def healthy(self) -> None:
        self.failures = 0
        self.health.healthy(self.consumer.reaction.name)

    def stopped(self, detail: str) -> None:
        self.health.stopped(self.consumer.reaction.name, detail)
