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
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..clock import Clock, SystemClock, Timestamp
from ..config import EngineConfig
from ..db.errors import ConstraintViolation, DatabaseError
from ..db.pool import Database
from ..db.types import Conn
from ..errors import CauseTooLarge, ShuttingDown, TooManyImpacts
from ..gates import Refused
from ..metrics import Metrics
from ..persistence.base import HydrationFailed, NotFound
from .contexts import Bulk, Mutation, Ops
from .outcomes import MutationError, Success
from .run import StageHook, run_pipeline

__all__ = ["MutationExecutor"]

P = TypeVar("P")
T = TypeVar("T")
C = TypeVar("C", bound=Ops)
Ps = ParamSpec("Ps")

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

    def with_hook(self, hook: StageHook | None) -> MutationExecutor:
        """A copy of this executor calling ``hook`` at the pipeline's stages."""
        return replace(self, hook=hook)

    async def ack(
        self,
        principal: P,
        handler: Callable[Concatenate[Mutation[P], Ps], Awaitable[object]],
        /,
        *args: Ps.args,
        **kwargs: Ps.kwargs,
    ) -> Success | MutationError:
        """Run ``handler(cx, *args, **kwargs)`` as ``principal``; `Success` once committed."""
        outcome = await self._run(_mutation(principal), lambda cx: handler(cx, *args, **kwargs))
        return outcome if isinstance(outcome, MutationError) else Success()

    async def execute(
        self,
        principal: P,
        handler: Callable[Concatenate[Mutation[P], Ps], Awaitable[T]],
        /,
        *args: Ps.args,
        **kwargs: Ps.kwargs,
    ) -> T | MutationError:
        """Run the handler; its return value once committed."""
        return await self._run(_mutation(principal), lambda cx: handler(cx, *args, **kwargs))

    async def ack_bulk(
        self,
        principal: P,
        handler: Callable[Concatenate[Bulk[P], Ps], Awaitable[object]],
        /,
        *args: Ps.args,
        **kwargs: Ps.kwargs,
    ) -> Success | MutationError:
        """`ack` with a `Bulk` context (``cx.impact_all``)."""
        outcome = await self._run(_bulk(principal), lambda cx: handler(cx, *args, **kwargs))
        return outcome if isinstance(outcome, MutationError) else Success()

    async def execute_bulk(
        self,
        principal: P,
        handler: Callable[Concatenate[Bulk[P], Ps], Awaitable[T]],
        /,
        *args: Ps.args,
        **kwargs: Ps.kwargs,
    ) -> T | MutationError:
        """`execute` with a `Bulk` context (``cx.impact_all``)."""
        return await self._run(_bulk(principal), lambda cx: handler(cx, *args, **kwargs))

    async def _run(
        self,
        open_context: Callable[[Conn, Timestamp, EngineConfig], C],
        handler: Callable[[C], Awaitable[T]],
    ) -> T | MutationError:
        try:
            if self.accepting is not None:
                self.accepting()
        except ShuttingDown:
            return MutationError("shutting_down", "the service is shutting down", True)
        try:
            return await run_pipeline(
                self.db,
                self.config,
                lambda conn, now: open_context(conn, now, self.config),
                handler,
                clock=self.clock,
                metrics=self.metrics,
                hook=self.hook,
            )
        except Refused as exc:
            return MutationError.refused(exc.reason, exc.action)
        except NotFound as exc:
            return MutationError("not_found", f"not found: {exc.key!r}")
        except ConstraintViolation as exc:
            _log.info("mutation refused at stage %s: %s", exc.stage.value, exc)
            return MutationError(exc.code, f"mutation refused: {exc.kind} violation")
        except DatabaseError as exc:
            if exc.retryable and exc.code != MutationError.DATABASE:
                _log.warning("mutation retryable at stage %s: %s", exc.stage.value, exc)
                return MutationError(exc.code, f"mutation not applied: {exc.code}", True)
            _log.error("mutation failed at stage %s: %s", exc.stage.value, exc, exc_info=exc)
            return MutationError.database(retryable=exc.retryable)
        except HydrationFailed as exc:
            _log.error("mutation refused a load: %s", exc, exc_info=exc)
            return MutationError("hydration_failed", "mutation failed: an aggregate did not load")
        except (TooManyImpacts, CauseTooLarge) as exc:
            _log.error("mutation refused: %s", exc)
            code = "too_many_impacts" if isinstance(exc, TooManyImpacts) else "cause_too_large"
            return MutationError(code, str(exc))


def _mutation(principal: Any) -> Callable[[Conn, Timestamp, EngineConfig], Mutation[Any]]:
    return lambda conn, now, config: Mutation(conn, config, now, principal)


def _bulk(principal: Any) -> Callable[[Conn, Timestamp, EngineConfig], Bulk[Any]]:
    return lambda conn, now, config: Bulk(conn, config, now, principal)
