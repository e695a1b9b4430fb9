"""Supervision of the inbound consumers: `ConsumerSupervisor` restarts one
`InboundConsumer` with a bounded backoff and, past
``inbound_failure_threshold`` consecutive failures, reports it to
`InboundHealth`, which holds readiness DOWN (`REASON_INBOUND_STOPPED`,
``service_engine_dependency_up{dependency="inbound"}`` = 0) through the same
`DependencyGauge` as the NATS health.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from ..messaging.reactions import backoff_delay
from ..metrics import Metrics
from ..readiness import REASON_INBOUND_STOPPED, ReadinessHandle
from .health import DependencyGauge
from .inbound import InboundConsumer

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


class ConsumerSupervisor:
    """Keeps one `InboundConsumer` running: restarts it with a bounded,
    doubling backoff (one log line per step), and reports it stopped to
    `InboundHealth` past ``threshold`` consecutive failures. A consumer that
    answers a pull again resets the count."""

    def __init__(
        self,
        consumer: InboundConsumer,
        health: InboundHealth,
        *,
        threshold: int,
        backoff: timedelta,
        backoff_cap: timedelta,
    ) -> None:
        self.consumer = consumer
        self.health = health
        self.threshold = threshold
        self.backoff = backoff
        self.backoff_cap = backoff_cap
        self.failures = 0
        self.restarts = 0

    def _healthy(self) -> None:
        if self.failures:
            self.failures = 0
        self.health.healthy(self.consumer.reaction.name)

    async def run(self) -> None:
        """Run the consumer until cancelled; never returns."""
        name = self.consumer.reaction.name
        while True:
            try:
                await self.consumer.run(self._healthy)
                detail = "the pull loop returned"
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:
                detail = f"{type(exc).__name__}: {exc}"
            self.failures += 1
            self.restarts += 1
            delay = backoff_delay(self.failures, self.backoff, self.backoff_cap)
            if self.failures >= self.threshold:
                self.health.stopped(name, f"failed {self.failures} times in a row: {detail}")
            # One line per restart step; the step that crosses the threshold
            # (and takes the pod DOWN) is an error.
            _log.log(
                logging.ERROR if self.failures == self.threshold else logging.WARNING,
                "inbound consumer %s stopped (failure %d of %d before readiness DOWN): %s; "
                "restarting in %.2fs",
                name, self.failures, self.threshold, detail, delay,
            )
            await asyncio.sleep(delay)
