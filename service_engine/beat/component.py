"""The shape of one feature the engine composes.

Each feature folder (lanes, offers, mirrors, blobs, integration, scopes)
provides one component built from its own bounds: what it registers, the
loops it runs, the steps it adds to the beat and what it releases at the
end. `Engine` holds the list and drives every component the same way:

* `Component.start` once `Engine.run` begins, in list order: bind what the
  registrations need (a refusal raises its typed error with readiness DOWN);
* `Component.tasks` right after: each named loop runs under the engine's
  supervisor (one that dies takes readiness DOWN with `WorkerStopped`);
* `Component.beat_steps` on every beat: each step's failure holds readiness
  DOWN under ``beat:<name>`` until it next succeeds;
* `Component.aclose` when `run` ends, whatever ended it.

`Delegate` is how `Engine` keeps the verbs an author calls on it (say
``engine.register_presence``) while the work and its documentation live on
the component: ``register_presence = Delegate("lanes", Lanes.register_presence)``
answers the component's bound method, with its signature and docstring.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from ..failures import EngineError
from ..readiness import ReadinessHandle
from ..supervisor import Worker

__all__ = ["NO_STEPS", "NO_TASKS", "BeatStep", "Component", "Delegate", "run_beat"]

_log = logging.getLogger(__name__)

BeatStep = Callable[[], Awaitable[None]]
"""One step of the beat; it raises to hold readiness DOWN."""

NO_TASKS: Mapping[str, Worker] = {}
NO_STEPS: Mapping[str, BeatStep] = {}


class Component(Protocol):
    """One feature of the engine, driven by `Engine.run` and the beat."""

    async def start(self) -> None:
        """Bind what the registrations need, once `Engine.run` begins."""

    def tasks(self) -> Mapping[str, Worker]:
        """The loops to supervise from `start` on, by worker name."""

    def beat_steps(self) -> Mapping[str, BeatStep]:
        """The steps this feature adds to the beat now, by step name."""

    async def aclose(self) -> None:
        """Release what `start` took (leases, connections); idempotent."""


async def run_beat(
    steps: Callable[[], Iterable[tuple[str, BeatStep]]],
    readiness: ReadinessHandle,
    interval: timedelta,
) -> None:
    """The beat: every ``interval``, each of this beat's ``steps()`` in turn;
    a step that raises holds readiness DOWN under ``beat:<name>`` until it
    next succeeds. Runs until cancelled (a worker of the engine's supervisor)."""
    while True:
        for name, step in list(steps()):
            reason = f"beat:{name}"
            try:
                await step()
            except Exception as exc:
                # A bound that ran out or a typed engine error says it all in
                # one line; formatting a traceback also fills linecache with
                # every file's source for good (it would land amid a burst's
                # sessions and outlive them).
                expected = isinstance(exc, TimeoutError | EngineError)
                _log.warning("beat step %s failed: %s: %s", name, type(exc).__name__, exc,
                             exc_info=None if expected else exc)
                readiness.set_down(reason, f"{type(exc).__name__}: {exc}")
            else:
                readiness.clear(reason)
            # One loop turn between steps: the steps that await nothing (the
            # sessions sweep, the gauges) never hold the loop together.
            await asyncio.sleep(0)
        await asyncio.sleep(interval.total_seconds())


P = ParamSpec("P")
R = TypeVar("R")


class Delegate(Generic[P, R]):
    """A method of the owner that is ``method`` of the owner's component
    ``attribute``: read on an instance it is that component's bound method
    (same signature, same docstring); read on the class, ``method`` itself."""

    def __init__(self, attribute: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.attribute = attribute
        self.method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, owner: type) -> Callable[..., R]:
        if obj is None:
            return self.method
        bound: Callable[P, R] = getattr(getattr(obj, self.attribute), self.method.__name__)
        return bound
