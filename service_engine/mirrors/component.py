"""The mirrors component: every mirror of one pod under supervision.

`Mirrors` is what `Engine` composes for mirroring: each registered mirror
runs as one supervised worker (`MirrorSupervisor`), the beat re-records a
stuck mirror's dead letter and keeps ``dependency_up{dependency="mirrors"}``,
and the end of `run` hands every mirror's lease over. On an engine without
NATS nothing is mirrored (the ``known_*`` tables stay as they are) and the
log says so, so a slice registers its mirror the same way everywhere.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping

from ..beat.component import BeatStep
from ..db.pool import Database
from ..failures import ConfigError, DuplicateRegistration
from ..messaging.dead_letters import DeadLetters
from ..messaging.nats import Nats
from ..metrics import Metrics
from ..readiness import ReadinessHandle
from ..supervisor import Worker
from .declaration import Mirror
from .worker import MirrorBounds, MirrorRuntime, MirrorSupervisor

__all__ = ["Mirrors"]

_log = logging.getLogger(__name__)


class Mirrors:
    """Every mirror of one pod: their supervisors, the beat step and
    ``dependency_up{dependency="mirrors"}``."""

    def __init__(
        self,
        db: Database,
        nats: Nats | None,
        readiness: ReadinessHandle,
        metrics: Metrics,
        dead_letters: DeadLetters,
        *,
        holder: str,
        bounds: MirrorBounds,
    ) -> None:
        self._db = db
        self._nats = nats
        self._readiness = readiness
        self._dead_letters = dead_letters
        self._holder = holder
        self._bounds = bounds
        self._started = False
        self.metrics = metrics
        self.supervisors: dict[str, MirrorSupervisor] = {}

    def register(self, mirror: Mirror) -> None:
        """Mirror ``mirror``'s consumed prefixes from `run` on (a supervised
        worker; readiness is DOWN until it converged). Raises
        `DeclarationError` for an incomplete declaration,
        `DuplicateRegistration` for a name already registered, `ConfigError`
        after `run` started; without NATS nothing is mirrored (logged)."""
        if self._started:
            raise ConfigError("register mirrors before run()")
        if self._nats is None:
            _log.info("mirror %s is not running: the engine has no NATS connection", mirror.name)
            return
        if mirror.name in self.supervisors:
            raise DuplicateRegistration("mirror", mirror.name)
        runtime = MirrorRuntime(
            mirror, self._db, self._nats, self._holder, self._readiness, self._bounds
        )
        self.supervisors[runtime.name] = MirrorSupervisor(runtime, self._dead_letters, self._bounds)

    def runtime(self, name: str) -> MirrorRuntime:
        """The running state of mirror ``name`` (its shadows, its lease)."""
        return self.supervisors[name].runtime

    def converged(self) -> bool:
        """Whether every mirror converged (true with none)."""
        return all(s.runtime.converged for s in self.supervisors.values())

    async def start(self) -> None:
        self._started = True

    def tasks(self) -> Mapping[str, Worker]:
        return {f"mirror:{name}": s.run for name, s in self.supervisors.items()}

    def beat_steps(self) -> Mapping[str, BeatStep]:
        return {"mirrors": self.beat} if self.supervisors else {}

    async def beat(self) -> None:
        for supervisor in self.supervisors.values():
            await supervisor.beat()
        self.metrics.set_dependency(
            "mirrors", all(s.healthy for s in self.supervisors.values())
        )

    async def aclose(self) -> None:
        for supervisor in self.supervisors.values():
            with contextlib.suppress(Exception):
                await supervisor.runtime.lease.release()
