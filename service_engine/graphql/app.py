"""The service's HTTP surface: GraphQL over HTTP and graphql-transport-ws.

`graphql_app` serves, on one Starlette app:

* ``POST /graphql`` (and ``GET`` queries): GraphQL over HTTP;
* ``GET /graphql`` from a browser (``Accept: text/html``): GraphiQL, with
  subscriptions running over ``/graphql/ws``;
* ``GET /graphql/ws``: the graphql-transport-ws subscription endpoint (the
  protocol of the ``graphql-ws`` client library; the legacy
  subscriptions-transport-ws protocol is not offered);
* ``GET /readyz`` and ``GET /metrics``.

The principal comes from the trusted ``X-Passport`` header (see
`service_engine.graphql.passport`): on HTTP once per request, on a WebSocket
once per socket, at its ``connection_init``, from the header of the upgrade.
A socket whose passport is missing, malformed or refused is closed with
4403 and a reason naming the refusal. Every socket is closed at
``config.session_max_age`` measured from the handshake, with
`SESSION_MAX_AGE_CLOSE_CODE` (1001, going away) and
`SESSION_MAX_AGE_CLOSE_REASON`: the client reconnects, and the gateway hands
it a fresh passport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from cross_web import AsyncHTTPRequestAdapter, HTTPException
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketState
from strawberry.asgi import ASGIWebSocketAdapter, GraphQL
from strawberry.exceptions import MissingQueryError
from strawberry.http import GraphQLRequestData
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.schema import BaseSchema
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_transport_ws.types import ConnectionInitMessage
from strawberry.types import ExecutionResult
from strawberry.types.graphql import OperationType

from ..metrics import PROMETHEUS_CONTENT_TYPE
from ..readiness import readiness_route
from .passport import (
    PASSPORT_HEADER,
    PassportError,
    PassportMissing,
    PassportPrincipal,
    parse_passport,
    resolve_principal,
)

if TYPE_CHECKING:
    from ..engine import Engine
    from .passport import Passport

__all__ = [
    "CONNECTION_REFUSED_CLOSE_CODE",
    "SESSION_MAX_AGE_CLOSE_CODE",
    "SESSION_MAX_AGE_CLOSE_REASON",
    "GraphQLContext",
    "graphql_app",
]

SESSION_MAX_AGE_CLOSE_CODE = 1001
"""The close code ending a socket at session_max_age (RFC 6455 "going away")."""

SESSION_MAX_AGE_CLOSE_REASON = "session_max_age"
"""The close reason ending a socket at session_max_age: reconnect."""

CONNECTION_REFUSED_CLOSE_CODE = 4403
"""graphql-transport-ws "Forbidden": the passport was missing, malformed or
refused. The reason starts with the refusal's code (``passport_missing: ...``)."""

INTERNAL_ERROR_CLOSE_CODE = 4500
"""graphql-transport-ws internal error: the principal resolver failed."""

_MAX_CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's payload is at most 125 bytes

P = TypeVar("P")

_log = logging.getLogger(__name__)


class GraphQLContext(Generic[P]):
    """What a resolver receives as ``info.context``: the engine and the principal.

    Annotate resolvers with ``info: strawberry.Info[GraphQLContext[Me], None]``.
    `principal` is the service's principal for this request (HTTP) or this
    socket (WebSocket); reading it when the caller has none raises the typed
    refusal (`PassportMissing`, `PassportMalformed`, `PassportRefused`),
    which reaches the client as an error with that ``extensions.code``.
    """

    __slots__ = (
        "_principal",
        "_refusal",
        "connection_params",
        "engine",
        "handshake_at",
        "passport",
        "request",
        "response",
    )

    def __init__(
        self,
        engine: Engine,
        request: Request | WebSocket,
        response: Response | WebSocket,
        *,
        handshake_at: float | None = None,
    ) -> None:
        self.engine = engine
        self.request = request
        self.response = response
        # The event-loop time the WebSocket was accepted (None on HTTP).
        self.handshake_at = handshake_at
        # The ``connection_init`` payload (WebSocket only; Strawberry sets it).
        self.connection_params: dict[str, object] | None = None
        self.passport: Passport | None = None
        self._principal: P | None = None
        self._refusal: PassportError | None = PassportMissing(
            "no principal: the passport has not been resolved"
        )

    @property
    def principal(self) -> P:
        """The caller's principal; raises the passport refusal when there is none."""
        refusal = self._refusal
        if refusal is not None:
            # A fresh exception per read: one instance raised twice would
            # grow one traceback across unrelated resolvers.
            raise type(refusal)(str(refusal))
        return cast(P, self._principal)

    @property
    def refusal(self) -> PassportError | None:
        """Why there is no principal, or None when there is one."""
        return self._refusal

    @property
    def is_websocket(self) -> bool:
        return isinstance(self.request, WebSocket)

    async def resolve(self, resolver: PassportPrincipal[Any], value: str | None) -> None:
        """Resolve the principal from an ``X-Passport`` value, once.

        A `PassportError` is kept as the `refusal`; any other error of the
        resolver propagates.
        """
        try:
            passport = parse_passport(value)
            principal = await resolve_principal(resolver, passport)
        except PassportError as exc:
            self.passport = None
            self._principal = None
            self._refusal = exc
            return
        self.passport = passport
        self._principal = principal
        self._refusal = None


class _WebSocketAdapter(ASGIWebSocketAdapter):
    # The socket can be closed by the session bound while an operation is
    # about to send: both paths must see a closed socket, not Starlette's
    # RuntimeError for a send or close after the close frame.
    async def send_json(self, message: Mapping[str, object]) -> None:
        if self.ws.application_state is WebSocketState.DISCONNECTED:
            raise WebSocketDisconnected
        await super().send_json(message)

    async def close(self, code: int, reason: str) -> None:
        if self.ws.application_state is WebSocketState.DISCONNECTED:
            return
        await super().close(code, reason)


class _TransportWSHandler(BaseGraphQLTransportWSHandler[GraphQLContext[Any], None]):
    """graphql-transport-ws with the passport checked at connection_init and
    the socket bounded by session_max_age."""

    _session_bound: asyncio.Task[None] | None = None

    @property
    def _engine_view(self) -> _EngineGraphQL:
        return cast(_EngineGraphQL, self.view)

    def on_request_accepted(self) -> None:
        super().on_request_accepted()
        self._session_bound = asyncio.create_task(self._close_at_session_max_age())
        self._session_bound.add_done_callback(self._task_done)

    async def shutdown(self) -> None:
        bound = self._session_bound
        if bound is not None and not bound.done():
            bound.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bound
        await super().shutdown()

    async def _close_at_session_max_age(self) -> None:
        loop = asyncio.get_running_loop()
        handshake_at = self.context.handshake_at
        if handshake_at is None:  # get_context always sets it; be safe
            handshake_at = loop.time()
        max_age = self._engine_view.session_max_age.total_seconds()
        await asyncio.sleep(max(0.0, handshake_at + max_age - loop.time()))
        # Stop the operations before the close frame, so none tries to send
        # a `next` on a closed socket.
        for operation_id in list(self.operations):
            await self.cleanup_operation(operation_id)
        await self.websocket.close(
            code=SESSION_MAX_AGE_CLOSE_CODE, reason=SESSION_MAX_AGE_CLOSE_REASON
        )

    async def handle_connection_init(self, message: ConnectionInitMessage) -> None:
        payload = message.get("payload", {})
        # Strawberry refuses a repeated init, a non-object payload and an
        # init after the timeout itself; the passport is checked only on the
        # one init that would otherwise be acknowledged.
        if (
            not self.connection_init_received
            and not self.connection_timed_out
            and isinstance(payload, dict)
        ):
            refused = await self._engine_view.admit(self.context, payload)
            if refused is not None:
                if self.connection_init_timeout_task is not None:
                    self.connection_init_timeout_task.cancel()
                await self.websocket.close(code=refused[0], reason=refused[1])
                return
        await super().handle_connection_init(message)


class _EngineGraphQL(GraphQL[GraphQLContext[Any], None]):
    graphql_transport_ws_handler_class = _TransportWSHandler
    websocket_adapter_class = _WebSocketAdapter

    def __init__(
        self,
        engine: Engine,
        schema: BaseSchema,
        resolver: PassportPrincipal[Any],
        *,
        graphiql: bool,
        http_path: str,
        ws_path: str,
        passport_from_connection_params: bool,
        connection_init_wait_timeout: timedelta,
        allowed_origins: Sequence[str],
    ) -> None:
        super().__init__(
            schema,
            graphql_ide="graphiql" if graphiql else None,
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL,),
            connection_init_wait_timeout=connection_init_wait_timeout,
            allowed_origins=allowed_origins,
        )
        self.engine = engine
        self.resolver = resolver
        self.session_max_age: timedelta = engine.config.session_max_age
        self.passport_from_connection_params = passport_from_connection_params
        self._subscriptions_here = (
            f"subscriptions are served over graphql-transport-ws on {ws_path}, not over HTTP"
        )
        self._ide_html = (
            graphiql_html(self.graphql_ide_html, http_path, ws_path) if graphiql else ""
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and self.engine.shutting_down:
            # Closing before accepting answers the upgrade with 403: a pod
            # that is shutting down takes no new session.
            await WebSocket(scope, receive, send).close()
            return
        await super().__call__(scope, receive, send)

    async def get_context(
        self, request: Request | WebSocket, response: Response | WebSocket
    ) -> GraphQLContext[Any]:
        if isinstance(request, WebSocket):
            # Called right after the upgrade is accepted: the session bound
            # counts from here. The principal is resolved at connection_init.
            loop = asyncio.get_running_loop()
            return GraphQLContext(self.engine, request, response, handshake_at=loop.time())
        context: GraphQLContext[Any] = GraphQLContext(self.engine, request, response)
        await context.resolve(self.resolver, request.headers.get(PASSPORT_HEADER))
        return context

    async def admit(
        self, context: GraphQLContext[Any], payload: Mapping[str, object]
    ) -> tuple[int, str] | None:
        """Resolve the socket's principal; the close (code, reason) refusing it, or None."""
        value = context.request.headers.get(PASSPORT_HEADER)
        if value is None and self.passport_from_connection_params:
            value = _connection_param(payload, PASSPORT_HEADER)
        try:
            await context.resolve(self.resolver, value)
        except Exception:
            _log.exception("the principal resolver failed at connection_init")
            return INTERNAL_ERROR_CLOSE_CODE, "internal_error: the principal could not be resolved"
        refusal = context.refusal
        if refusal is None:
            return None
        return CONNECTION_REFUSED_CLOSE_CODE, close_reason(refusal)

    async def render_graphql_ide(self, request: Request) -> Response:
        return HTMLResponse(self._ide_html)

    async def execute_single(
        self,
        request: Request,
        request_adapter: AsyncHTTPRequestAdapter,
        sub_response: Response,
        context: GraphQLContext[Any],
        root_value: None,
        request_data: GraphQLRequestData,
    ) -> ExecutionResult:
        # Strawberry's own, minus subscriptions: over HTTP one would run
        # outside the socket's session bound (and without a stream transport
        # it would be executed as a query against the Subscription root).
        allowed = OperationType.from_http(request_adapter.method) - {OperationType.SUBSCRIPTION}
        try:
            return await self.schema.execute(
                request_data.query,
                root_value=root_value,
                variable_values=request_data.variables,
                context_value=context,
                operation_name=request_data.operation_name,
                allowed_operation_types=allowed,
                operation_extensions=request_data.extensions,
            )
        except CannotGetOperationTypeError as e:
            raise HTTPException(400, e.as_http_error_reason()) from e
        except InvalidOperationTypeError as e:
            if e.operation_type is OperationType.SUBSCRIPTION:
                raise HTTPException(400, self._subscriptions_here) from e
            raise HTTPException(400, e.as_http_error_reason(request_adapter.method)) from e
        except MissingQueryError as e:
            raise HTTPException(400, "No GraphQL query found in the request") from e


def _connection_param(payload: Mapping[str, object], name: str) -> str | None:
    wanted = name.lower()
    for key, value in payload.items():
        if key.lower() == wanted:
            return value if isinstance(value, str) else ""
    return None


def close_reason(refusal: PassportError) -> str:
    """``<code>: <message>``, cut to fit a WebSocket close frame."""
    text = f"{refusal.code}: {refusal}"
    raw = text.encode()
    if len(raw) <= _MAX_CLOSE_REASON_BYTES:
        return text
    return raw[:_MAX_CLOSE_REASON_BYTES].decode("utf-8", errors="ignore")


_SUBSCRIPTION_URL_LINE = "const subscriptionUrl = httpUrlToWebSockeUrl(fetchURL);"


def graphiql_html(template: str, http_path: str, ws_path: str) -> str:
    """Strawberry's GraphiQL page, its subscriptions pointed at ``ws_path``.

    Strawberry's page opens subscriptions on the page's own URL; this app
    serves them on ``ws_path``. The URL is resolved against the page's, so
    a service behind a path prefix keeps working when ``ws_path`` extends
    ``http_path``. Raises `RuntimeError` if the page no longer has the line
    this rewrites (a Strawberry upgrade changed it): fail at startup rather
    than serve a GraphiQL whose subscriptions silently go nowhere.
    """
    if _SUBSCRIPTION_URL_LINE not in template:
        raise RuntimeError(
            "Strawberry's GraphiQL page changed: cannot point its subscriptions at "
            f"{ws_path!r}; update service_engine.graphql.app.graphiql_html"
        )
    if ws_path.startswith(http_path.rstrip("/") + "/"):
        target = http_path.rstrip("/").rsplit("/", 1)[-1] + ws_path[len(http_path.rstrip("/")):]
    else:
        target = ws_path
    line = (
        "const subscriptionUrl = httpUrlToWebSockeUrl("
        f"new URL({json.dumps(target)}, fetchURL).toString());"
    )
    return template.replace(_SUBSCRIPTION_URL_LINE, line)


def graphql_app(
    engine: Engine,
    schema: BaseSchema,
    principal_resolver: PassportPrincipal[Any],
    *,
    path: str = "/graphql",
    ws_path: str = "/graphql/ws",
    graphiql: bool = True,
    passport_from_connection_params: bool = False,
    connection_init_wait_timeout: timedelta = timedelta(seconds=10),
    allowed_origins: Sequence[str] = (),
    routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The service's Starlette app: GraphQL, GraphiQL, the subscription
    socket, ``/readyz`` and ``/metrics``. Serve it with `run_with`.

    ``principal_resolver`` maps each passport to the service's principal
    (see `PassportPrincipal`); resolvers read it as ``info.context.principal``.
    Sockets are closed at ``engine.config.session_max_age`` from the
    handshake.

    ``passport_from_connection_params`` also accepts the passport from the
    ``connection_init`` payload (``{"X-Passport": ...}``) when the upgrade
    carries no header. Browsers cannot set headers on a WebSocket, so this
    is what makes GraphiQL's subscriptions work on a developer's machine
    (GraphiQL sends its Headers tab as that payload). The payload is not
    covered by the gateway's header stripping: enable it only where no
    gateway is expected (local development), never in production.

    ``allowed_origins`` lists the cross-origin pages allowed to open the
    socket (same-origin pages and non-browser clients always may);
    ``routes`` are appended to the app's routes.
    """
    view = _EngineGraphQL(
        engine,
        schema,
        principal_resolver,
        graphiql=graphiql,
        http_path=path,
        ws_path=ws_path,
        passport_from_connection_params=passport_from_connection_params,
        connection_init_wait_timeout=connection_init_wait_timeout,
        allowed_origins=allowed_origins,
    )

    async def metrics(_request: Request) -> Response:
        return Response(engine.metrics.exposition(), media_type=PROMETHEUS_CONTENT_TYPE)

    # Route + WebSocketRoute, never Mount: a Mount answers POST /graphql with
    # a 307 to /graphql/ and refuses the WebSocket.
    return Starlette(
        routes=[
            Route(path, view, methods=["GET", "POST"]),
            WebSocketRoute(ws_path, view),
            readiness_route(engine.readiness),
            Route("/metrics", metrics, methods=["GET"]),
            *routes,
        ]
    )
