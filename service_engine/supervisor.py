"""Supervision of the engine's long-running workers.

Every loop the engine runs is a named worker here. A worker that returns or
raises before shutdown takes readiness DOWN with `WorkerStopped` and makes
`Supervisor.run` raise: the pod never reports UP over a dead loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

from .failures import DuplicateRegistration, WorkerStopped
from .readiness import REASON_WORKER_STOPPED, ReadinessHandle

_log = logging.getLogger(__name__)

CANCEL_REPEAT_SECONDS = 0.5
"""How long `Supervisor.run` waits on cancelled workers before cancelling
the ones still running again."""

Worker = Callable[[], Coroutine[Any, Any, None]]
"""A long-running loop; it should run until cancelled."""


class Supervisor:
    def __init__(self, readiness: ReadinessHandle) -> None:
        self._readiness = readiness
        self._workers: dict[str, Worker] = {}
        self._stop = asyncio.Event()

    def add(self, name: str, worker: Worker) -> None:
        if name in self._workers:
            raise DuplicateRegistration("worker", name)
        self._workers[name] = worker

    @property
    def names(self) -> list[str]:
        return list(self._workers)

    def stop(self) -> None:
        """Begin shutdown: `run` cancels every worker and returns."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        tasks: dict[asyncio.Task[None], str] = {
            asyncio.create_task(worker(), name=f"service_engine:{name}"): name
            for name, worker in self._workers.items()
        }
        stop = asyncio.create_task(self._stop.wait(), name="service_engine:stop")
        try:
            done, _ = await asyncio.wait({stop, *tasks}, return_when=asyncio.FIRST_COMPLETED)
            if self._stop.is_set():
                return
            task = next(t for t in tasks if t in done)
            name = tasks[task]
            error = None if task.cancelled() else task.exception()
            detail = "returned" if error is None else f"raised {type(error).__name__}: {error}"
            self._readiness.set_down(REASON_WORKER_STOPPED, f"{name} {detail}")
            _log.error("worker %s stopped before shutdown: %s", name, detail, exc_info=error)
            raise WorkerStopped(name, detail) from error
        finally:
            # Cancel, then await: a worker's cleanup (a LISTEN connection
            # closed, a consumer's frames nak'ed) finishes before run returns.
            # A cancellation can be swallowed (on Python 3.11 asyncio.wait_for
            # drops one that races its inner result), which would leave the
            # worker looping and run never returning: repeat the cancel of
            # whatever is still running until every task has ended.
            pending: set[asyncio.Task[Any]] = {stop, *tasks}
            for t in pending:
                t.cancel()
            while pending:
                _, pending = await asyncio.wait(pending, timeout=CANCEL_REPEAT_SECONDS)
                for t in pending:
                    t.cancel()
            await asyncio.gather(stop, *tasks, return_exceptions=True)


class Restarting:
    """One fallible loop kept running: after it fails (raises or returns) it
    is restarted with a doubling backoff capped at ``backoff_cap``, one log
    line per step; past ``threshold`` consecutive failures `stopped` is told
    (a subclass lowers readiness there), and the loop calls `healthy` once it
    works again, which resets the count and tells `recovered`.

    Subclasses implement `attempt` (one run of the loop, handed `healthy`)
    and name themselves in ``what`` for the log.
    """

    what = "worker"
    returned = "the loop returned"

    def __init__(self, *, threshold: int, backoff: timedelta, backoff_cap: timedelta) -> None:
        self.threshold = threshold
        self.backoff = backoff
        self.backoff_cap = backoff_cap
        self.failures = 0
        self.restarts = 0

    async def attempt(self, healthy: Callable[[], None]) -> None:
        raise NotImplementedError

    def stopped(self, detail: str) -> None:
        """The loop failed ``threshold`` times in a row (``detail`` says how)."""

    def recovered(self) -> None:
        """The loop works again after a failure."""

    def healthy(self) -> None:
        if self.failures:
            self.failures = 0
            self.recovered()

    def delay(self) -> float:
        exponent = min(max(self.failures - 1, 0), 32)
        return min(
            self.backoff.total_seconds() * float(1 << exponent), self.backoff_cap.total_seconds()
        )

    async def run(self) -> None:
        """Run the loop until cancelled; never returns."""
        while True:
            try:
                await self.attempt(self.healthy)
                detail = self.returned
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:
                detail = f"{type(exc).__name__}: {exc}"
            self.failures += 1
            self.restarts += 1
            delay = self.delay()
            if self.failures >= self.threshold:
                self.stopped(f"failed {self.failures} times in a row: {detail}")
            # One line per restart step; the step that crosses the threshold
            # (and takes the pod DOWN) is an error.
            _log.log(
                logging.ERROR if self.failures == self.threshold else logging.WARNING,
                "%s stopped (failure %d of %d before readiness DOWN): %s; restarting in %.2fs",
                self.what, self.failures, self.threshold, detail, delay,
            )
            await asyncio.sleep(delay)
