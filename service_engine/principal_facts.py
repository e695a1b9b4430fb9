"""Principal facts contributed by the slices: loaders the engine runs.

A slice that owns a table exposing a fact about a principal (the boards a
person was invited to) registers a loader from its own register::

    engine.register_principal_fact(board_memberships(engine.db))

A loader takes the resolved principal and answers it with its fact set
(``async (principal) -> principal``; the principal type is the service's).
The engine runs every loader, in registration order, right after the
principal is resolved — each GraphQL HTTP request, each WebSocket at
``connection_init`` — and again on a principal-facts refresh, so no service
kernel loads a fact by name. A loader that fails is fail-closed, like a
resolver failure: `PrincipalFactLoadFailed` refuses the request (or ends
the refreshed sessions).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from .failures import ConfigError, EngineError

__all__ = ["PrincipalFactLoadFailed", "PrincipalFactLoader", "PrincipalFactLoaders"]

PrincipalFactLoader: TypeAlias = Callable[[Any], Awaitable[Any]]
"""``async (principal) -> principal`` with the slice's fact set."""

_log = logging.getLogger(__name__)


class PrincipalFactLoadFailed(EngineError):
    """A principal fact loader raised: the principal is not served (fail-closed)."""

    code = "principal_facts_failed"


class PrincipalFactLoaders:
    """The loaders of one engine, run in registration order."""

    def __init__(self) -> None:
        self._loaders: list[PrincipalFactLoader] = []

    def register(self, loader: PrincipalFactLoader) -> None:
        if not callable(loader):
            raise ConfigError(f"a principal fact loader is an async callable, got {loader!r}")
        if loader in self._loaders:
            raise ConfigError(f"principal fact loader {loader!r} is registered twice")
        self._loaders.append(loader)

    def __len__(self) -> int:
        return len(self._loaders)

    async def load(self, principal: Any) -> Any:
        """``principal`` with every slice's fact loaded; `PrincipalFactLoadFailed`
        when a loader raises or answers nothing."""
        for loader in self._loaders:
            try:
                loaded = await loader(principal)
            except Exception as exc:
                name = _name(loader)
                _log.warning("principal fact loader %s failed: %s", name, exc, exc_info=exc)
                raise PrincipalFactLoadFailed(
                    f"principal fact loader {name} failed: {type(exc).__name__}"
                ) from exc
            if loaded is None:
                raise PrincipalFactLoadFailed(
                    f"principal fact loader {_name(loader)} answered None"
                )
            principal = loaded
        return principal


def _name(loader: PrincipalFactLoader) -> str:
    return getattr(loader, "__qualname__", repr(loader))
