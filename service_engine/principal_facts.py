"""Principal facts contributed by the slices: loaders the engine runs.

A slice that owns a table exposing a fact about a principal (the boards a
person was invited to) registers a loader from its own register::

    engine.register_principal_fact(board_memberships(engine.db))

A loader takes the resolved principal and answers it with its fact set
(``async (principal) -> principal``; the principal type is the service's).
A loader registered with ``many=True`` takes a list of principals and
answers the list, each with its fact, in the same order
(``async (principals) -> principals``): one read serves every principal
resolved at once, as a burst of sockets reconnecting brings.

The engine runs every loader, in registration order, right after the
principal is resolved — each GraphQL HTTP request, each WebSocket at
``connection_init`` — and again on a principal-facts refresh, so no service
kernel loads a fact by name. The principals whose facts are asked for in
one turn of the event loop are loaded together (`PrincipalFactLoaders.load`):
a ``many`` loader is called once for all of them, any other once per
principal. A loader that fails is fail-closed, like a resolver failure:
`PrincipalFactLoadFailed` refuses the request (or ends the refreshed
sessions). When a ``many`` loader fails for a whole batch, each principal
is loaded again alone, so only a principal whose own load fails is refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from .failures import ConfigError, EngineError

__all__ = [
    "PrincipalFactBatchLoader",
    "PrincipalFactLoadFailed",
    "PrincipalFactLoader",
    "PrincipalFactLoaders",
]

PrincipalFactLoader: TypeAlias = Callable[[Any], Awaitable[Any]]
"""``async (principal) -> principal`` with the slice's fact set."""

PrincipalFactBatchLoader: TypeAlias = Callable[[list[Any]], Awaitable[Sequence[Any]]]
"""``async (principals) -> principals``, each with the slice's fact set, in
order (registered with ``many=True``)."""

_log = logging.getLogger(__name__)


class PrincipalFactLoadFailed(EngineError):
    """A principal fact loader raised: the principal is not served (fail-closed)."""

    code = "principal_facts_failed"


class _Loader:
    """One registered loader and its form."""

    __slots__ = ("load", "many", "name")

    def __init__(self, load: Callable[..., Awaitable[Any]], many: bool) -> None:
        self.load = load
        self.many = many
        self.name: str = getattr(load, "__qualname__", None) or getattr(
            getattr(load, "func", None), "__qualname__", None) or repr(load)


class _Batch:
    """The principals asked for in one turn of ``loop``, and their waiters."""

    __slots__ = ("loop", "taken", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: list[tuple[Any, asyncio.Future[Any]]] = []
        self.taken = False


class PrincipalFactLoaders:
    """The loaders of one engine, run in registration order over the
    principals asked for in one loop turn.

    ``inline()`` says whether the calling task must load its principal in
    its own task, alone (the engine's: the task holds a connection of the
    pool, inside a handler, where a loader reaching the pool is refused as
    any nested acquire is; a batch's task would wait for the pool instead)."""

    def __init__(self, inline: Callable[[], bool] = lambda: False) -> None:
        self._inline = inline
        self._loaders: list[_Loader] = []
        self._batch: _Batch | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def register(self, loader: PrincipalFactLoader | PrincipalFactBatchLoader, *,
                 many: bool = False) -> None:
        if not callable(loader):
            raise ConfigError(f"a principal fact loader is an async callable, got {loader!r}")
        if any(known.load == loader for known in self._loaders):
            raise ConfigError(f"principal fact loader {loader!r} is registered twice")
        self._loaders.append(_Loader(loader, many))

    def __len__(self) -> int:
        return len(self._loaders)

    async def load(self, principal: Any) -> Any:
        """``principal`` with every slice's fact loaded; `PrincipalFactLoadFailed`
        when a loader raises or answers nothing for it.

        The principals asked for in the same loop turn are loaded together,
        from one task started in the next turn (unless ``inline()``: then in
        the caller's task, alone)."""
        if not self._loaders:
            return principal
        if self._inline():
            (loaded,) = await self._load_all([principal])
            if isinstance(loaded, PrincipalFactLoadFailed):
                raise loaded
            return loaded
        loop = asyncio.get_running_loop()
        batch = self._batch
        if batch is None or batch.taken or batch.loop is not loop:
            batch = self._batch = _Batch(loop)
            task = loop.create_task(self._run(batch), name="service_engine:principal_facts")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        waiter: asyncio.Future[Any] = loop.create_future()
        batch.waiting.append((principal, waiter))
        return await waiter

    async def _run(self, batch: _Batch) -> None:
        batch.taken = True
        if self._batch is batch:
            self._batch = None
        # A waiter already done was cancelled meanwhile (its request went away).
        waiting = [(p, w) for p, w in batch.waiting if not w.done()]
        batch.waiting = []
        try:
            loaded = await self._load_all([p for p, _ in waiting])
        except BaseException:
            for _, waiter in waiting:
                if not waiter.done():
                    waiter.set_exception(PrincipalFactLoadFailed(
                        "the principal facts' load was interrupted"))
            raise
        for (_, waiter), result in zip(waiting, loaded, strict=True):
            if waiter.done():
                continue
            if isinstance(result, PrincipalFactLoadFailed):
                waiter.set_exception(result)
            else:
                waiter.set_result(result)

    async def _load_all(self, principals: list[Any]) -> list[Any]:
        """Each of ``principals`` through every loader, or the
        `PrincipalFactLoadFailed` refusing it."""
        results: list[Any] = list(principals)
        for loader in self._loaders:
            live = [i for i, p in enumerate(results) if not isinstance(p, PrincipalFactLoadFailed)]
            if not live:
                break
            subset = [results[i] for i in live]
            if loader.many:
                answered = await self._many(loader, subset)
            elif len(subset) == 1:
                # In this task: an inline caller's loaders run in its own.
                answered = [await self._one(loader, subset[0])]
            else:
                answered = list(await asyncio.gather(*(self._one(loader, p) for p in subset)))
            for i, value in zip(live, answered, strict=True):
                results[i] = value
        return results

    async def _many(self, loader: _Loader, principals: list[Any]) -> list[Any]:
        try:
            return _checked(loader, principals, await loader.load(list(principals)))
        except Exception as exc:
            if len(principals) == 1:
                return [_failed(loader, exc)]
        # One principal may have failed the batch: each alone, so only its
        # own failure refuses it.
        return list(await asyncio.gather(*(self._alone(loader, p) for p in principals)))

    async def _alone(self, loader: _Loader, principal: Any) -> Any:
        try:
            return _checked(loader, [principal], await loader.load([principal]))[0]
        except Exception as exc:
            return _failed(loader, exc)

    async def _one(self, loader: _Loader, principal: Any) -> Any:
        try:
            loaded = await loader.load(principal)
        except Exception as exc:
            return _failed(loader, exc)
        if loaded is None:
            return PrincipalFactLoadFailed(f"principal fact loader {loader.name} answered None")
        return loaded


class _AnsweredWrong(Exception):
    """A ``many`` loader's answer does not match what it was asked."""


def _checked(loader: _Loader, principals: list[Any], answered: object) -> list[Any]:
    if not isinstance(answered, Sequence) or len(answered) != len(principals):
        raise _AnsweredWrong(
            f"principal fact loader {loader.name} answered "
            f"{len(answered) if isinstance(answered, Sequence) else type(answered).__name__} "
            f"for {len(principals)} principals")
    out = list(answered)
    if any(value is None for value in out):
        raise _AnsweredWrong(f"principal fact loader {loader.name} answered None")
    return out


def _failed(loader: _Loader, exc: Exception) -> PrincipalFactLoadFailed:
    if isinstance(exc, _AnsweredWrong):
        _log.warning("%s", exc)
        return PrincipalFactLoadFailed(str(exc))
    _log.warning("principal fact loader %s failed: %s", loader.name, exc, exc_info=exc)
    failure = PrincipalFactLoadFailed(
        f"principal fact loader {loader.name} failed: {type(exc).__name__}")
    failure.__cause__ = exc
    return failure
