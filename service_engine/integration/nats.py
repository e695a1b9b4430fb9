"""The engine's own NATS connection over nats-py.

Bind-only: the engine never creates a stream or bucket it depends on; an
absent one fails loud with its name.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

import nats
from nats.aio.client import Client

from ..errors import EngineError

_log = logging.getLogger(__name__)


class NatsUnavailable(EngineError):
    """The NATS server could not be reached."""


class StreamMissing(EngineError):
    """A gitops-declared stream the engine binds does not exist."""

    def __init__(self, stream: str) -> None:
        super().__init__(
            f"JetStream stream {stream!r} is not declared (the engine never creates it)"
        )
        self.stream = stream


class Nats:
    """One NATS connection with JetStream, reconnecting on its own."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.js: Any = client.jetstream()

    @property
    def client(self) -> Client:
        return self._client

    def reachable(self) -> bool:
        """True while the connection is up (not reconnecting or closed)."""
        return bool(self._client.is_connected)

    async def bind_stream(self, name: str) -> None:
        """Fail loud with `StreamMissing` when stream ``name`` is absent."""
        from nats.js.errors import NotFoundError

        try:
            await self.js.stream_info(name)
        except NotFoundError as exc:
            raise StreamMissing(name) from exc

    async def aclose(self) -> None:
        if not self._client.is_closed:
            await self._client.drain()

    async def __aenter__(self) -> Nats:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def open_nats(url: str, *, name: str = "service-engine") -> Nats:
    """Connect to ``url``; reconnects forever once connected."""

    async def on_error(exc: Exception) -> None:
        _log.warning("nats: %s", exc)

    try:
        client = await nats.connect(
            url, name=name, connect_timeout=5, max_reconnect_attempts=-1,
            reconnect_time_wait=0.5, error_cb=on_error,
        )
    except Exception as exc:
        raise NatsUnavailable(f"cannot connect to NATS at {url}: {exc}") from exc
    return Nats(client)
