"""NatsHealth: the pod rides out a NATS outage shorter than ``nats_grace``.

`NatsHealth.run` is a worker of its own (never a beat step), so a beat busy
or frozen on anything never delays the verdict. Every ``interval`` it checks
the connection and asks JetStream for the account info (bounded by
``probe_timeout``); the pure `GraceTracker` turns those observations into a
verdict: UP through an outage shorter than the grace, DOWN with
`REASON_NATS_UNREACHABLE` once the outage has lasted the grace, UP again on
the first healthy observation. ``service_engine_dependency_up{dependency=
"nats"}`` follows the verdict.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from ..failures import ConfigError
from ..metrics import Metrics
from ..readiness import REASON_NATS_UNREACHABLE, ReadinessHandle
from .nats import Nats

_log = logging.getLogger(__name__)

DEPENDENCY = "nats"


class DependencyGauge:
    """One dependency's verdict applied to readiness and metrics: DOWN with
    ``reason`` and a detail, or clear, and
    ``service_engine_dependency_up{dependency=...}`` following it."""

    def __init__(
        self, readiness: ReadinessHandle, metrics: Metrics | None, dependency: str, reason: str
    ) -> None:
        self.readiness = readiness
        self.metrics = metrics
        self.dependency = dependency
        self.reason = reason

    def up(self) -> None:
        """The dependency works: clear its reason, gauge it up."""
        self.readiness.clear(self.reason)
        self.gauge(True)

    def down(self, detail: str) -> None:
        """The dependency failed past its bound: readiness DOWN with ``detail``."""
        self.readiness.set_down(self.reason, detail)
        self.gauge(False)

    def gauge(self, up: bool) -> None:
        if self.metrics is not None:
            self.metrics.set_dependency(self.dependency, up)


@dataclass(frozen=True, slots=True)
class GraceVerdict:
    """``down`` once an outage outlasted the grace; ``outage_for`` how long
    the current outage has lasted (0 when healthy)."""

    down: bool
    outage_for: float
    detail: str | None


class GraceTracker:
    """Pure: observations of health at monotonic instants in, a verdict out.

    An outage starts at the first unhealthy observation after a healthy one
    and ends at the next healthy one; it is DOWN once it has lasted
    ``grace`` seconds.
    """

    def __init__(self, grace: float) -> None:
        if grace <= 0:
            raise ConfigError("grace must be positive")
        self.grace = grace
        self._since: float | None = None

    def observe(self, healthy: bool, now: float, detail: str | None = None) -> GraceVerdict:
        if healthy:
            self._since = None
            return GraceVerdict(False, 0.0, None)
        if self._since is None:
            self._since = now
        outage_for = now - self._since
        return GraceVerdict(outage_for >= self.grace, outage_for, detail)


class NatsHealth:
    """Tracks one `Nats` connection's health into readiness and metrics.

    Register `run` as a worker. ``grace`` is `EngineConfig.nats_grace`.
    ``interval`` defaults to a tenth of the grace (between 50 ms and 1 s)
    and ``probe_timeout`` to a quarter of it (at most 1 s): the verdict
    lands within grace + interval + probe_timeout of the outage's start.
    """

    def __init__(
        self,
        nats: Nats,
        readiness: ReadinessHandle,
        metrics: Metrics | None = None,
        *,
        grace: timedelta,
        interval: timedelta | None = None,
        probe_timeout: timedelta | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        seconds = grace.total_seconds()
        self.nats = nats
        self.readiness = readiness
        self.metrics = metrics
        self.dependency = DependencyGauge(readiness, metrics, DEPENDENCY, REASON_NATS_UNREACHABLE)
        self.tracker = GraceTracker(seconds)
        self.interval = (
            interval.total_seconds() if interval is not None
            else min(max(seconds / 10, 0.05), 1.0)
        )
        self.probe_timeout = (
            probe_timeout.total_seconds() if probe_timeout is not None
            else min(seconds / 4, 1.0)
        )
        if self.interval <= 0 or self.probe_timeout <= 0:
            raise ConfigError("interval and probe_timeout must be positive")
        self._clock = clock
        self._down = False
        self.started = asyncio.Event()

    @property
    def down(self) -> bool:
        """True while the pod is held DOWN for NATS."""
        return self._down

    async def check(self) -> GraceVerdict:
        """Observe once and apply the verdict to readiness and metrics."""
        problem = await self.nats.probe_jetstream(self.probe_timeout)
        verdict = self.tracker.observe(problem is None, self._clock(), problem)
        if verdict.down and not self._down:
            _log.error("NATS unavailable for %.1fs (past nats_grace): %s",
                       verdict.outage_for, verdict.detail)
            self.dependency.down(
                f"NATS unavailable for {verdict.outage_for:.1f}s: {verdict.detail}"
            )
        elif not verdict.down and self._down:
            _log.info("NATS available again")
            self.dependency.up()
        self._down = verdict.down
        self.dependency.gauge(not verdict.down)
        return verdict

    async def run(self) -> None:
        """Check every ``interval`` until cancelled."""
        try:
            while True:
                started = self._clock()
                await self.check()
                self.started.set()
                elapsed = self._clock() - started
                await asyncio.sleep(max(self.interval - elapsed, 0.0))
        finally:
            # A stopped tracker's stale verdict must not outlive it.
            if self._down:
                self.readiness.clear(REASON_NATS_UNREACHABLE)
                self._down = False
