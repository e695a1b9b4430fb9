"""An Identity responder for the scope handshake: the in-process fake the
conformance scenarios run, and what the black-box harness answers with.

`ScopeIdentity` subscribes to ``identity.scope.declare.v1.*`` and answers
each declaration with ``decide(declaration)``: None confirms, a str rejects
with that reason. `known_scopes` builds the usual decision: confirm when
every key is one Identity knows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .handshake_wire import (
    DECLARE_SUBJECT_PREFIX,
    ScopeReply,
    ScopeRequest,
    ScopeWireError,
    decode_request,
    encode_reply,
)
from .manifest import ScopeDeclaration

__all__ = ["Decide", "ScopeIdentity", "known_scopes"]

Decide = Callable[[ScopeDeclaration], str | None]


def known_scopes(known: Iterable[str]) -> Decide:
    """Confirm a declaration whose every key is in ``known``."""
    allowed = frozenset(known)

    def decide(declaration: ScopeDeclaration) -> str | None:
        unknown = sorted(set(declaration.scopes) - allowed)
        return None if not unknown else f"unknown scopes: {', '.join(unknown)}"

    return decide


class ScopeIdentity:
    """Answers scope declarations on a nats-py client until `aclose`."""

    def __init__(self, client: Any, decide: Decide = lambda _: None) -> None:
        self._client = client
        self.decide = decide
        self.requests: list[ScopeRequest] = []
        self._subscription: Any = None

    async def start(self) -> ScopeIdentity:
        self._subscription = await self._client.subscribe(
            f"{DECLARE_SUBJECT_PREFIX}.*", queue="identity", cb=self._answer
        )
        await self._client.flush()
        return self

    async def _answer(self, message: Any) -> None:
        try:
            request = decode_request(message.data)
        except ScopeWireError:
            return
        self.requests.append(request)
        reason = self.decide(request.declaration)
        reply = ScopeReply(
            request.envelope_id, request.declaration.digest,
            "confirmed" if reason is None else "rejected", reason,
        )
        await message.respond(encode_reply(reply))

    async def aclose(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
