"""The async-context-manager shape every long-lived component shares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class AsyncResource(ABC):
    """A component opened once and closed with `aclose`; ``async with`` closes it."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release what the component holds. Safe to call twice."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
