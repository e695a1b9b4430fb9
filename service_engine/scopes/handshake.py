"""The boot handshake: declare the manifest to Identity over the engine's NATS.

`ScopeHandshake.hold` puts readiness DOWN under ``scope_declaration``
before ``run`` clears its boot reason; the supervised `ScopeHandshake.run`
waits for the mirrors to converge, then asks Identity
(`service_engine.scopes.handshake_wire`) until it answers — no responder or a
timeout is retried with a bounded backoff, still DOWN. ``confirmed``
clears the reason (and the worker idles until shutdown); ``rejected`` keeps
the pod DOWN with Identity's reason and raises `ScopeRejected`, which
``Engine.run`` raises: a scope typo is a failed deploy, not a silent deny.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from datetime import timedelta

from ..messaging.envelope import service_identity
from ..messaging.nats import Nats
from ..readiness import ReadinessHandle
from .handshake_wire import ScopeRequest, declare_subject, decode_reply, encode_request
from .manifest import ScopeDeclaration, ScopeRejected

__all__ = ["REASON_SCOPES", "ScopeHandshake"]

REASON_SCOPES = "scope_declaration"

_log = logging.getLogger(__name__)


class ScopeHandshake:
    def __init__(
        self,
        nats: Nats,
        declaration: ScopeDeclaration,
        readiness: ReadinessHandle,
        *,
        pod_id: str,
        converged: Callable[[], bool] = lambda: True,
        timeout: timedelta = timedelta(seconds=2),
        backoff: timedelta = timedelta(milliseconds=200),
        backoff_cap: timedelta = timedelta(seconds=5),
    ) -> None:
        self._nats = nats
        self.declaration = declaration
        self._readiness = readiness
        self._pod_id = pod_id
        self._converged = converged
        self._timeout = timeout.total_seconds()
        self._backoff = backoff.total_seconds()
        self._backoff_cap = backoff_cap.total_seconds()
        self.confirmed = asyncio.Event()
        self.attempts = 0

    def hold(self) -> None:
        self._readiness.set_down(
            REASON_SCOPES,
            f"awaiting Identity's confirmation of {len(self.declaration.scopes)} scopes",
        )

    async def run(self) -> None:
        self.hold()
        delay = self._backoff
        while not self._converged():  # noqa: ASYNC110 - the mirrors expose no event
            await asyncio.sleep(self._backoff)
        request_id = uuid.uuid4()
        request = ScopeRequest(
            request_id, self.declaration, self._pod_id,
            service_identity(self.declaration.service), request_id,
        )
        subject = declare_subject(self.declaration.service)
        while True:
            self.attempts += 1
            try:
                message = await self._nats.client.request(
                    subject, encode_request(request), timeout=self._timeout
                )
                reply = decode_reply(message.data, request)
            except Exception as exc:  # no responder, a timeout, a reply off the wire
                self._readiness.set_down(
                    REASON_SCOPES,
                    f"Identity has not confirmed the scopes yet: {type(exc).__name__}",
                )
                _log.info("scope declaration to %s not answered: %r", subject, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff_cap)
                continue
            break
        if reply.status == "rejected":
            reason = reply.reason or "rejected without a reason"
            self._readiness.set_down(REASON_SCOPES, f"Identity rejected the scopes: {reason}")
            raise ScopeRejected(self.declaration.service, reason)
        self._readiness.clear(REASON_SCOPES)
        self.confirmed.set()
        _log.info("Identity confirmed %d scopes", len(self.declaration.scopes))
        await asyncio.Event().wait()  # idle until shutdown: a supervised worker never returns
