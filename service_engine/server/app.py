"""The service's HTTP surface (`graphql_app`): ``POST /graphql`` and ``GET``
queries (`service_engine.server.http_route`), GraphiQL, ``/readyz`` and
``/metrics``; the graphql-transport-ws socket on ``ws_path`` is the
engine's own (`service_engine.server.wire`, under `run_with`), not an ASGI
route. Hostile input meets a bound at the edge, each an `EngineConfig`
field refused with a typed `EdgeRefusal` code; none reads past its bound.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from graphql import ASTValidationRule, DocumentNode, GraphQLError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send
from strawberry import Schema
from strawberry.extensions import (
    AddValidationRules,
    DisableIntrospection,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    ParserCache,
    QueryDepthLimiter,
    SchemaExtension,
    ValidationCache,
)
from strawberry.http.ides import get_graphql_ide_html
from strawberry.http.websocket_origin import (
    is_same_origin,
    normalize_allowed_origins,
    normalize_origin,
)
from strawberry.schema import BaseSchema
from strawberry.types.graphql import OperationType
from strawberry.types.unset import UnsetType

from ..config import EngineConfig
from ..failures import ConfigError
from ..graphql.compose import ComposedService
from ..graphql.context import GraphQLContext
from ..graphql.reads import check_views
from ..metrics import PROMETHEUS_CONTENT_TYPE
from ..readiness import readiness_route
from . import delivery
from .graphiql import graphiql_html
from .http_route import GraphQLHttp, encode_json, resolve_context
from .http_route import new_context as new_context  # the socket's context (wire_admission)
from .live_ops import LiveOps, per_operation_extensions
from .ops_page import DEFAULT_OPS_ROLE, ops_routes
from .passport import PASSPORT_HEADER, OrgMember, PassportError, PassportPrincipal
from .wire_protocol import MESSAGE_TOO_BIG_CLOSE_CODE, fit_close_reason

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = [
    "CONNECTION_REFUSED_CLOSE_CODE", "MESSAGE_TOO_BIG_CLOSE_CODE", "SESSION_MAX_AGE_CLOSE_CODE",
    "SESSION_MAX_AGE_CLOSE_REASON", "TRY_AGAIN_LATER_CLOSE_CODE", "EdgeRefusal", "GraphQLContext",
    "graphql_app",
]


class EdgeRefusal(enum.StrEnum):
    """Why the edge refused hostile input: the ``extensions.code`` of the
    GraphQL error, or the start of the WebSocket close reason. Each names
    the `EngineConfig` bound that refused it."""

    REQUEST_BODY_TOO_LARGE = "request_body_too_large"
    """HTTP 413: the body passed ``http_max_body_bytes``. Send less: bulk
    data belongs in a bulk path, not one GraphQL request."""
    REQUEST_BODY_NOT_UTF8 = "request_body_not_utf8"
    """HTTP 400: a JSON body (``application/json`` or ``+json``) that is not
    UTF-8 (RFC 8259). Encode the request as UTF-8."""
    QUERY_TOO_MANY_TOKENS = "query_too_many_tokens"
    """The document passed ``query_max_tokens``."""
    QUERY_TOO_MANY_ALIASES = "query_too_many_aliases"
    """The operation passed ``query_max_aliases``: ask once, page instead."""
    QUERY_TOO_DEEP = "query_too_deep"
    """The operation nested deeper than ``query_max_depth``."""
    INTROSPECTION_DISABLED = "introspection_disabled"
    """``graphql_introspection`` is off on this service."""
    SUBSCRIPTION_OVER_HTTP = "subscription_over_http"
    """HTTP 400: a subscription sent over HTTP, where it would outlive
    ``session_max_age``. Subscribe over graphql-transport-ws on the socket."""
    MESSAGE_TOO_BIG = "message_too_big"
    """Close 1009: a socket message passed ``ws_max_message_bytes``."""
    TOO_MANY_SUBSCRIPTIONS = "too_many_subscriptions"
    """An ``error`` for one ``subscribe``: the socket already carries
    ``ws_max_subscriptions_per_socket`` live operations. Complete one first."""
    TOO_MANY_SOCKETS = "too_many_sockets"
    """Close 1013: the pod holds ``ws_max_sockets`` sockets. Reconnect with
    backoff (another pod may take it)."""


TRY_AGAIN_LATER_CLOSE_CODE = 1013
"""RFC 6455 "try again later": the pod is at ws_max_sockets."""

SESSION_MAX_AGE_CLOSE_CODE = 1001
"""The close code ending a socket at session_max_age (RFC 6455 "going away")."""

SESSION_MAX_AGE_CLOSE_REASON = "session_max_age"
"""The close reason ending a socket at session_max_age: reconnect."""

CONNECTION_REFUSED_CLOSE_CODE = 4403
"""graphql-transport-ws "Forbidden": the passport was missing, malformed or
refused. The reason starts with the refusal's code (``passport_missing: ...``)."""

INTERNAL_ERROR_CLOSE_CODE = 4500
"""graphql-transport-ws internal error: the principal resolver failed."""

_log = logging.getLogger(__name__)


_REFUSAL_MESSAGES: tuple[tuple[re.Pattern[str], EdgeRefusal], ...] = (
    # The wording of Strawberry's limiters and graphql-core's rule; a test
    # pins each, so an upgrade that changes one fails loudly.
    (re.compile(r"Document contains more than \d+ tokens"), EdgeRefusal.QUERY_TOO_MANY_TOKENS),
    (re.compile(r"^\d+ aliases found\. Allowed: \d+"), EdgeRefusal.QUERY_TOO_MANY_ALIASES),
    (re.compile(r"exceeds maximum operation depth of \d+"), EdgeRefusal.QUERY_TOO_DEEP),
    (re.compile(r"^GraphQL introspection has been disabled"), EdgeRefusal.INTROSPECTION_DISABLED),
    (re.compile(r"^subscriptions are served over graphql-transport-ws"),
     EdgeRefusal.SUBSCRIPTION_OVER_HTTP),
)


def refusal_of(error: GraphQLError) -> EdgeRefusal | None:
    """The `EdgeRefusal` a limiter's error stands for, or None."""
    for pattern, refusal in _REFUSAL_MESSAGES:
        if pattern.search(error.message):
            return refusal
    return None


class _Checked(NamedTuple):
    """A document text as the edge parsed and validated it (`_EdgeChecks`)."""

    parse_options: dict[str, Any]
    rules: tuple[type[ASTValidationRule], ...]
    document: DocumentNode
    errors: list[GraphQLError]


class _EdgeChecks(SchemaExtension):
    """The edge's bounds on each operation (Strawberry's `MaxTokensLimiter`
    and `AddValidationRules` in one extension), each document text parsed
    and validated once (its refusals tagged with their `EdgeRefusal` code)
    and a subscription over HTTP refused (400, pointed at the socket).
    `bounded` makes a subclass per schema, holding its bounds and an LRU of
    its documents."""

    ws_path: ClassVar[str]
    max_tokens: ClassVar[int]
    rules: ClassVar[tuple[type[ASTValidationRule], ...]]
    documents: ClassVar[OrderedDict[str, _Checked]]
    checked: _Checked | None = None

    @classmethod
    def bounded(cls, ws_path: str, max_tokens: int,
                rules: tuple[type[ASTValidationRule], ...]) -> type[_EdgeChecks]:
        """The extension class (Strawberry's factory) of one limited schema."""
        return type("EdgeChecks", (cls,), {
            "ws_path": ws_path, "max_tokens": max_tokens, "rules": rules,
            "documents": OrderedDict(),
        })

    def on_parse(self) -> Iterator[None]:
        execution = self.execution_context
        options = execution.parse_options
        options["max_tokens"] = self.max_tokens
        rules = execution.validation_rules = (*execution.validation_rules, *self.rules)
        query = execution.query
        if query and execution.graphql_document is None:
            checked = self.documents.get(query)
            if checked is not None and checked.rules == rules and checked.parse_options == options:
                self.documents.move_to_end(query)
                self.checked = checked
                execution.graphql_document = checked.document
        yield
        self._tag()

    def on_validate(self) -> Iterator[None]:
        execution = self.execution_context
        checked = self.checked
        if checked is not None and execution.pre_execution_errors is None:
            execution.pre_execution_errors = checked.errors
        yield
        errors = execution.pre_execution_errors
        if checked is None and errors is not None:
            self._tag()
            document, query = execution.graphql_document, execution.query
            if document is not None and query:
                self.documents[query] = _Checked(
                    dict(execution.parse_options), execution.validation_rules, document, errors)
                if len(self.documents) > delivery.DOCUMENT_CACHE_SIZE:
                    self.documents.popitem(last=False)
        if errors:
            return
        context = execution.context
        if (isinstance(context, GraphQLContext) and not context.is_websocket
                and execution.operation_type is OperationType.SUBSCRIPTION):
            context.response.status_code = 400
            raise GraphQLError(
                f"subscriptions are served over graphql-transport-ws on {self.ws_path}, "
                "not over HTTP", extensions={"code": EdgeRefusal.SUBSCRIPTION_OVER_HTTP.value})

    def _tag(self) -> None:
        for error in self.execution_context.pre_execution_errors or ():
            refusal = refusal_of(error)
            if refusal is not None:
                error.extensions = {**(error.extensions or {}), "code": refusal.value}


class _RefusalsAtInfo(logging.Filter):
    """Strawberry logs an operation's errors on its ``strawberry.execution``
    logger at error level, with the document. A refusal (a limiter's, or a
    passport missing, malformed or refused) is the client's fault and cheap
    to provoke: one info line naming its code instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.msg
        if not isinstance(error, GraphQLError):
            return True
        if isinstance(error.original_error, PassportError):
            _log.info("refused at the edge: %s", error.original_error.code)
            return False
        refusal = refusal_of(error)
        if refusal is None:
            return True
        _log.info("refused at the edge: %s", refusal.value)
        return False


_REFUSALS_AT_INFO = _RefusalsAtInfo()

_DOCUMENT_FIXED: tuple[type[SchemaExtension], ...] = (
    MaxTokensLimiter, AddValidationRules, DisableIntrospection, _EdgeChecks,
    ParserCache, ValidationCache,
)
"""The extensions whose effect on a socket is fixed by the document text
(`limited_schema`'s, and Strawberry's caches should a service add them),
so a document they passed once passes again (live_ops.py)."""


def limited_schema(schema: BaseSchema, config: EngineConfig, *,
                   ws_path: str = "/graphql/ws") -> Schema:
    """A copy of ``schema`` bounded at ``config``'s bounds (`_EdgeChecks`).
    The service's schema object is left as it was: one schema may serve
    several apps under different bounds."""
    if not isinstance(schema, Schema):
        raise ConfigError(
            f"graphql_app needs a strawberry.Schema to enforce the query limits, got "
            f"{type(schema).__name__}"
        )
    # The rules are built once (not per request), so the validation cache
    # sees the same rules each time.
    limited = copy.copy(schema)
    rules = (
        *MaxAliasesLimiter(max_alias_count=config.query_max_aliases).validation_rules,
        *QueryDepthLimiter(max_depth=config.query_max_depth).validation_rules,
        # Each operation as its validation saw it, for the delivery plan.
        delivery.document_seen_rule(limited),
        *(() if config.graphql_introspection else DisableIntrospection().validation_rules),
    )
    limited.extensions = (
        *schema.extensions, _EdgeChecks.bounded(ws_path, config.query_max_tokens, rules))
    logging.getLogger("strawberry.execution").addFilter(_REFUSALS_AT_INFO)
    return limited


def _refusal_body(refusal: EdgeRefusal, message: str, **extensions: object) -> bytes:
    error = {"message": message, "extensions": {"code": refusal.value, **extensions}}
    return json.dumps({"data": None, "errors": [error]}).encode()


class BodyLimit:
    """ASGI middleware refusing request bodies past ``limit`` bytes with 413.

    A declared Content-Length past the bound is refused before any of the
    body is read. A body without one (chunked) is read up to the bound and
    refused the moment it crosses it; a body within the bound is handed on
    whole, so at most ``limit`` bytes are ever held for a request.
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Any], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(receive, send, declared)
            return
        json_body = _is_json(scope)
        if declared is not None and not json_body:
            # The server holds the body to its Content-Length.
            await self.app(scope, receive, send)
            return
        # A body without a Content-Length (chunked) is read up to the bound;
        # a JSON body is read whole (within the bound) to check it is UTF-8.
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body: bytes = message.get("body", b"")
            total += len(body)
            if total > self.limit:
                await self._refuse(receive, send, None)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        if json_body:
            try:
                whole.decode("utf-8")
            except UnicodeDecodeError as exc:
                await _answer(send, 400, _refusal_body(
                    EdgeRefusal.REQUEST_BODY_NOT_UTF8,
                    f"request body is not UTF-8 (byte {exc.start}); a JSON body must be",
                ))
                return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, receive: Receive, send: Send, declared: int | None) -> None:
        detail = f"{declared} bytes declared" if declared is not None else "chunked body"
        body = _refusal_body(
            EdgeRefusal.REQUEST_BODY_TOO_LARGE,
            f"request body exceeds http_max_body_bytes ({self.limit} bytes; {detail})",
            limit=self.limit,
        )
        await _start(send, 413, body, (b"connection", b"close"))
        # The whole answer is on the wire (its Content-Length says so), but
        # the response is held open while what the client is still sending
        # is read and dropped, within a bound: closing a socket with unread
        # input resets it, and the reset can destroy the 413 before the
        # client has read it. Nothing drained is kept.
        await send({"type": "http.response.body", "body": body, "more_body": True})
        await self._discard(receive)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _discard(self, receive: Receive) -> None:
        # A standard client sends its whole body before it reads the answer.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER_SECONDS
        while True:
            remaining = min(deadline - loop.time(), LINGER_IDLE_SECONDS)
            if remaining <= 0:
                return
            try:
                message = await asyncio.wait_for(receive(), remaining)
            except TimeoutError:
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                return


LINGER_SECONDS = 30.0
"""How long a refused body is read and dropped at most, for its client to
finish sending and read the 413; past it the connection is closed."""
LINGER_IDLE_SECONDS = 1.0
"""How long the refused body's client may pause before the connection is closed."""


async def _start(send: Send, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *headers,
    ]})


async def _answer(send: Send, status: int, body: bytes) -> None:
    await _start(send, status, body)
    await send({"type": "http.response.body", "body": body})


def _is_json(scope: Scope) -> bool:
    """Whether the request's (first) Content-Type is a JSON media type."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media: bytes = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return False


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class HeaderLookup(Protocol):
    """A request's headers as far as the socket's admission reads them:
    one header's (first) value by name, any case."""

    def get(self, name: str, /) -> str | None: ...


class HandshakeSlots:
    """The ``ws_max_handshakes`` slots of one app: a socket holds one from
    its upgrade until its ``connection_init`` arrives or it ends."""

    __slots__ = ("free",)

    def __init__(self, limit: int) -> None:
        self.free = limit

    def full(self) -> bool:
        """Every slot is taken (a burst of sockets)."""
        return self.free <= 0

    def take(self) -> None:
        self.free -= 1

    def release(self) -> None:
        self.free += 1


class _EngineGraphQL:
    """One app's GraphQL: its HTTP route (`GraphQLHttp`) and what the
    engine's socket (`service_engine.server.wire`) serves."""

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
        served = limited_schema(schema, engine.config, ws_path=ws_path)
        self.schema = served
        self.engine = engine
        self.config: EngineConfig = engine.config
        self.open_sockets = 0  # bounded by ws_max_sockets
        self.handshakes = HandshakeSlots(engine.config.ws_max_handshakes)
        self.ws_path = ws_path
        self.resolver = resolver
        self.session_max_age: timedelta = engine.config.session_max_age
        self.connection_init_wait_timeout = connection_init_wait_timeout
        self.passport_from_connection_params = passport_from_connection_params
        self.allowed_origins = normalize_allowed_origins(allowed_origins)
        self.encode_json = encode_json
        # Known-planned live documents, served without Strawberry per
        # operation: nothing of the schema may act per operation or per field.
        self.live_ops = LiveOps(served, encode=encode_json, enabled=not served.directives
                                and not per_operation_extensions(served, _DOCUMENT_FIXED))
        ide_html = graphiql_html(
            get_graphql_ide_html("graphiql"), http_path, ws_path,
            asset_base=engine.config.graphiql_asset_base_url,
        ) if graphiql else None
        self.http = GraphQLHttp(engine, served, resolver, ide_html=ide_html)

    def origin_allowed(self, headers: HeaderLookup) -> bool:
        """Whether an upgrade with ``headers`` may open the socket: no
        ``Origin`` (not a browser), a same-origin page, or an origin of
        ``allowed_origins`` (``"*"``: any), as Strawberry's view decides."""
        origin = headers.get("origin")
        if origin is None:
            return True
        host = headers.get("host")
        if headers.get("sec-fetch-site") == "same-origin" or is_same_origin(origin, host):
            return True
        if "*" in self.allowed_origins or normalize_origin(origin) in self.allowed_origins:
            return True
        _log.warning("refused a WebSocket from origin %r to host %r: add it to "
                     "allowed_origins if its pages may connect", origin, host)
        return False

    async def on_ws_connect(self, context: GraphQLContext[Any]) -> UnsetType:
        """The ``connection_ack``'s payload: none (Strawberry's ``UNSET``)."""
        return UnsetType()

    async def admit(
        self, context: GraphQLContext[Any], payload: Mapping[str, object]
    ) -> tuple[int, str] | None:
        """Resolve the socket's principal; the close (code, reason) refusing it, or None."""
        value = context.request.get(PASSPORT_HEADER)  # the socket's `WireRequest`
        if value is None and self.passport_from_connection_params:
            value = _connection_param(payload, PASSPORT_HEADER)
        try:
            await resolve_context(context, self.resolver, value)
        except Exception:
            _log.exception("the principal resolver failed at connection_init")
            return INTERNAL_ERROR_CLOSE_CODE, "internal_error: the principal could not be resolved"
        refusal = context.refusal
        if refusal is None:
            return None
        if not isinstance(refusal, PassportError):
            raise TypeError(f"a resolved context refused with {refusal!r}")
        return CONNECTION_REFUSED_CLOSE_CODE, close_reason(refusal)


def _connection_param(payload: Mapping[str, object], name: str) -> str | None:
    wanted = name.lower()
    for key, value in payload.items():
        if key.lower() == wanted:
            return value if isinstance(value, str) else ""
    return None


def close_reason(refusal: PassportError) -> str:
    """``<code>: <message>``, cut to fit a WebSocket close frame."""
    return fit_close_reason(f"{refusal.code}: {refusal}")


def graphql_app(
    engine: Engine,
    schema: BaseSchema | ComposedService,
    principal_resolver: PassportPrincipal[Any] = OrgMember.of,
    *,
    path: str = "/graphql",
    ws_path: str = "/graphql/ws",
    graphiql: bool = True,
    passport_from_connection_params: bool = False,
    connection_init_wait_timeout: timedelta = timedelta(seconds=10),
    allowed_origins: Sequence[str] = (),
    routes: Sequence[BaseRoute] = (),
    ops_role: str | None = DEFAULT_OPS_ROLE,
) -> Starlette:
    """The service's Starlette app: GraphQL, GraphiQL, the subscription
    socket, ``/readyz`` and ``/metrics``. Serve it with `run_with`.

    ``schema`` is the service's schema, or its `ComposedService`, which is
    then registered with ``engine`` (`ComposedService.register`) and served
    as its `ComposedService.schema`.

    ``principal_resolver`` maps each passport to the service's principal
    (see `PassportPrincipal`; default `OrgMember.of`: the subject in its
    org, a passport naming no org refused with ``passport_refused``);
    resolvers read it as ``info.context.principal``.
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

    ``/ops`` serves the ops page to passports with ``ops_role``; None
    leaves it out. The edge bounds (body size, query limits, socket bounds)
    come from ``engine.config``. Raises `UnregisteredProjector` when the
    schema serves a `Views` of a projector ``engine`` never registered.
    """
    if isinstance(schema, ComposedService):
        schema.register(engine)
        schema = schema.schema()
    check_views(engine, schema)
    view = _EngineGraphQL(
        engine, schema, principal_resolver, graphiql=graphiql, http_path=path, ws_path=ws_path,
        passport_from_connection_params=passport_from_connection_params,
        connection_init_wait_timeout=connection_init_wait_timeout,
        allowed_origins=allowed_origins,
    )

    async def metrics(_request: Request) -> Response:
        return Response(engine.metrics.exposition(), media_type=PROMETHEUS_CONTENT_TYPE)

    # A Route, never a Mount: a Mount answers POST /graphql with a 307 to /graphql/.
    app = Starlette(
        routes=[
            Route(path, view.http, methods=["GET", "POST"]),
            readiness_route(engine.readiness),
            Route("/metrics", metrics, methods=["GET"]),
            *(ops_routes(engine, role=ops_role) if ops_role is not None else ()),
            *routes,
        ],
        middleware=[Middleware(BodyLimit, limit=engine.config.http_max_body_bytes)],
    )
    app.state.graphql_view = view  # what the engine's socket serves (host.http_config)
    return app
