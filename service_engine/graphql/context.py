"""What a resolver receives as ``info.context`` (`GraphQLContext`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast

if TYPE_CHECKING:
    from ..engine import Engine
    from ..pipeline import MutationError
    from ..pipeline.executor import MutationHandler

__all__ = ["GraphQLContext"]

P = TypeVar("P")
Ps = ParamSpec("Ps")
T = TypeVar("T")


class GraphQLContext(Generic[P]):
    """What a resolver receives as ``info.context``: the engine and the principal.

    Annotate resolvers with ``info: strawberry.Info[GraphQLContext[Me], None]``.
    `principal` is the service's principal for this request (HTTP) or this
    socket (WebSocket); reading it when the caller has none raises the typed
    refusal (`PassportMissing`, `PassportMalformed`, `PassportRefused`),
    which reaches the client as an error with that ``extensions.code``.
    The server builds it and resolves the principal (`admit` / `refuse`).
    """

    __slots__ = (
        "_principal", "_refusal", "connection_params", "engine", "handshake_at", "passport",
        "request", "response",
    )

    def __init__(
        self,
        engine: Engine,
        request: Any,
        response: Any,
        *,
        handshake_at: float | None = None,
        refusal: Exception | None = None,
    ) -> None:
        self.engine = engine
        self.request = request
        """The HTTP request (Starlette's), or the socket's upgrade (its headers, path, client)."""
        self.response = response
        # The event-loop time the WebSocket was accepted (None on HTTP).
        self.handshake_at = handshake_at
        # The ``connection_init`` payload (WebSocket only).
        self.connection_params: dict[str, object] | None = None
        self.passport: Any = None
        """The caller's `Passport` once the principal is resolved, else None."""
        self._principal: P | None = None
        self._refusal: Exception | None = refusal or LookupError(
            "no principal: the passport has not been resolved")

    @property
    def principal(self) -> P:
        """The caller's principal; raises the passport refusal when there is none."""
        refusal = self._refusal
        if refusal is not None:
            # A fresh exception per read: one instance raised twice would
            # grow one traceback across unrelated resolvers.
            raise type(refusal)(str(refusal))
        return cast(P, self._principal)

    async def execute(
        self, handler: MutationHandler[P, Ps, T], /, *args: Ps.args, **kwargs: Ps.kwargs
    ) -> T | MutationError:
        """Run the mutation ``handler(cx, *args, **kwargs)`` as the caller on
        the engine's executor: its value once committed, or the
        `MutationError` that refused it (answer either with
        `MutationResult.of`)."""
        return await self.engine.mutation_executor().execute(
            self.principal, handler, *args, **kwargs
        )

    @property
    def refusal(self) -> Exception | None:
        """Why there is no principal, or None when there is one."""
        return self._refusal

    @property
    def is_websocket(self) -> bool:
        return self.handshake_at is not None

    def admit(self, passport: Any, principal: P) -> None:
        """The principal resolved from ``passport``."""
        self.passport = passport
        self._principal = principal
        self._refusal = None

    def refuse(self, refusal: Exception) -> None:
        """No principal: reading it raises ``refusal`` (a fresh one each read)."""
        self.passport = None
        self._principal = None
        self._refusal = refusal
