"""MutationExecutor: run a mutation handler through the pipeline, answer an outcome.

Callable without GraphQL::

    executor = engine.mutation_executor()
    outcome = await executor.ack(principal, increment, "counter-1")
    if isinstance(outcome, MutationError): ...

`ack` answers `Success` or a `MutationError`; `execute` answers the
handler's return value (a `OneShot` secret, a created id) or a
`MutationError`; `ack_bulk` / `execute_bulk` run the handler with a `Bulk`
context. Every refusal and fault is a `MutationError` value; an exception
the handler raises that is not the engine's (a bug in the slice) propagates
after the rollback.

Past saturation, mutations wait their turn in arrival order at the write
pipeline's admission queue in front of the pool (`Database.writes`, sized
to the pool less its read reserve), holding no connection: adding writers
lengthens that queue, not the transactions behind it, and past
``max_queue`` waiters a mutation is refused at once (retryable).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Concatenate, ParamSpec, TypeAlias, TypeVar

from ..clock import Clock, SystemClock
from ..config import EngineConfig
from ..db.errors import ConstraintViolation, DatabaseError
from ..db.pool import Database
from ..failures import CauseTooLarge, EngineError, ShuttingDown, TooManyImpacts
from ..metrics import Metrics
from ..persistence.base import HydrationFailed
from .contexts import Bulk, Mutation
from .outcomes import ANSWERED, MutationError, Success, mutation_error
from .run import StageHook, run_pipeline

__all__ = ["MutationExecutor"]

P = TypeVar("P")
T = TypeVar("T")
Ps = ParamSpec("Ps")

MutationHandler: TypeAlias = Callable[Concatenate[Mutation[P], Ps], Awaitable[T]]
"""``async def handler(cx: Mutation[P], *args, **kwargs) -> T``."""
BulkHandler: TypeAlias = Callable[Concatenate[Bulk[P], Ps], Awaitable[T]]
"""``async def handler(cx: Bulk[P], *args, **kwargs) -> T``."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MutationExecutor:
    """Runs mutations for one engine (`Engine.mutation_executor`).

    ``accepting`` is called before each mutation and raises `ShuttingDown`
    once the engine stops taking work (answered as the retryable
    ``shutting_down``). ``hook`` is the fault-injection seam (`StageHook`);
    production leaves it unset.
    """

    db: Database
    config: EngineConfig
    metrics: Metrics | None = None
    clock: Clock = field(default_factory=SystemClock)
    accepting: Callable[[], None] | None = None
    hook: StageHook | None = None
    nouns: Collection[str] | None = None
    """The nouns the engine's projectors read: a principal-facts
    dependency outside them is refused (`UnknownFactDependency`)."""

    def with_hook(self, hook: StageHook | None) -> MutationExecutor:
        """A copy of this executor calling ``hook`` at the pipeline's stages."""
        return replace(self, hook=hook)

    async def execute(
        self, principal: P, handler: MutationHandler[P, Ps, T], /,
        *args: Ps.args, **kwargs: Ps.kwargs,
    ) -> T | MutationError:
        """Run ``handler(cx, *args, **kwargs)`` as ``principal``; its return
        value once committed."""
        return await self._run(Mutation, principal, handler, *args, **kwargs)

    async def execute_bulk(
        self, principal: P, handler: BulkHandler[P, Ps, T], /,
        *args: Ps.args, **kwargs: Ps.kwargs,
    ) -> T | MutationError:
        """`execute` with a `Bulk` context (``cx.impact_all``)."""
        return await self._run(Bulk, principal, handler, *args, **kwargs)

    async def ack(
        self, principal: P, handler: MutationHandler[P, Ps, object], /,
        *args: Ps.args, **kwargs: Ps.kwargs,
    ) -> Success | MutationError:
        """`execute`, answering `Success` once committed."""
        return _acked(await self.execute(principal, handler, *args, **kwargs))

    async def ack_bulk(
        self, principal: P, handler: BulkHandler[P, Ps, object], /,
        *args: Ps.args, **kwargs: Ps.kwargs,
    ) -> Success | MutationError:
        """`execute_bulk`, answering `Success` once committed."""
        return _acked(await self.execute_bulk(principal, handler, *args, **kwargs))

    async def _run(
        self,
        context: type[Mutation[P]],
        principal: P,
        handler: Callable[..., Awaitable[T]],
        /,
        *args: object,
        **kwargs: object,
    ) -> T | MutationError:
        """The one body of every entry point: the pipeline around the
        handler, each `ANSWERED` error answered as its `MutationError`."""
        try:
            if self.accepting is not None:
                self.accepting()
        except ShuttingDown:
            return MutationError(ShuttingDown.code, "the service is shutting down", True)
        try:
            return await run_pipeline(
                self.db,
                self.config,
                lambda conn, now: context(conn, self.config, now, principal),
                lambda cx: handler(cx, *args, **kwargs),
                clock=self.clock,
                metrics=self.metrics,
                hook=self.hook,
                nouns=self.nouns,
            )
        except ANSWERED as exc:
            _log_answered(exc)
            return mutation_error(exc)


def _acked(outcome: object) -> Success | MutationError:
    return outcome if isinstance(outcome, MutationError) else Success()


def _log_answered(exc: EngineError) -> None:
    """Log what the caller is not told: a fault's detail stays server-side."""
    if isinstance(exc, ConstraintViolation):
        _log.info("mutation refused at stage %s: %s", exc.stage.value, exc)
    elif isinstance(exc, DatabaseError):
        if exc.retryable and exc.code != MutationError.DATABASE:
            _log.warning("mutation retryable at stage %s: %s", exc.stage.value, exc)
        else:
            _log.error("mutation failed at stage %s: %s", exc.stage.value, exc, exc_info=exc)
    elif isinstance(exc, HydrationFailed):
        _log.error("mutation refused a load: %s", exc, exc_info=exc)
    elif isinstance(exc, TooManyImpacts | CauseTooLarge):
        _log.error("mutation refused: %s", exc)
