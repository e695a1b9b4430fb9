"""GraphQL over HTTP: ``POST /graphql`` and ``GET`` queries over Strawberry's
public `Schema.execute` on the limited schema (`app.limited_schema`), under
the request's principal (`resolve_context`), answering as Strawberry's ASGI
view did: JSON, 200 unless the operation set its response's status; a
malformed request, a batch or a mutation over ``GET`` 400 in plain text
naming what is wrong; a browser's ``GET`` without a query GraphiQL (404
when it is off).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from strawberry import Schema
from strawberry.exceptions import MissingQueryError
from strawberry.http import process_result
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.types.graphql import OperationType

from ..graphql.context import GraphQLContext
from .passport import (
    PASSPORT_HEADER,
    PassportError,
    PassportMissing,
    PassportPrincipal,
    parse_passport,
    resolve_principal,
)

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from ..engine import Engine

__all__ = ["GraphQLHttp", "encode_json", "new_context", "resolve_context"]

_ON_GET = frozenset({OperationType.QUERY, OperationType.SUBSCRIPTION})
"""What a ``GET`` may run (a subscription only to be refused pointing at the socket)."""
_ON_POST = frozenset(OperationType)


def encode_json(data: object) -> str:
    """The app's JSON, over HTTP and on the socket (Strawberry's spelling)."""
    return _ENCODER.encode(data)


_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""``json.dumps(data, separators=(",", ":"))``'s encoder, built once (``dumps``
builds one per call when given separators)."""


async def resolve_context(
    context: GraphQLContext[Any], resolver: PassportPrincipal[Any], value: str | None
) -> None:
    """Resolve ``context``'s principal from an ``X-Passport`` value.

    A `PassportError` is kept as the context's refusal; any other error of
    the resolver (or of the slices' principal facts) propagates (fail-closed).
    """
    try:
        passport = parse_passport(value)
        principal = await resolve_principal(resolver, passport)
        # The slices' facts, right after the resolve.
        principal = await context.engine.load_principal_facts(principal)
    except PassportError as exc:
        context.refuse(exc)
        return
    context.admit(passport, principal)


def new_context(engine: Engine, request: Any, response: Any, *,
                handshake_at: float | None = None) -> GraphQLContext[Any]:
    """A request's or socket's context, its principal not resolved yet."""
    return GraphQLContext(
        engine, request, response, handshake_at=handshake_at,
        refusal=PassportMissing("no principal: the passport has not been resolved"),
    )


class _BadRequest(Exception):
    """A request that names no operation to run: answered 400 with its message."""


class GraphQLHttp:
    """The ASGI app of the GraphQL path (see the module docstring)."""

    __slots__ = ("engine", "ide_html", "resolver", "schema")

    def __init__(self, engine: Engine, schema: Schema, resolver: PassportPrincipal[Any], *,
                 ide_html: str | None) -> None:
        self.engine = engine
        self.schema = schema
        self.resolver = resolver
        self.ide_html = ide_html

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.answer(Request(scope, receive))
        await response(scope, receive, send)

    async def answer(self, request: Request) -> Response:
        """The response to one request on the GraphQL path."""
        method = request.method
        if method not in ("GET", "POST"):
            return PlainTextResponse("GraphQL only supports GET and POST requests.", 405)
        if method == "GET" and request.query_params.get("query") is None:
            accept = request.headers.get("accept", "")
            if "text/html" in accept or "*/*" in accept:  # a browser: the page
                if self.ide_html is None:
                    return PlainTextResponse("Not Found", 404)
                return HTMLResponse(self.ide_html)
        try:
            data = await _request_data(request)
            query, variables, extensions = _operation(data)
        except _BadRequest as exc:
            return PlainTextResponse(str(exc), 400)
        sub = Response()  # what the operation sets on its response: status, headers
        del sub.headers["content-length"]
        context = new_context(self.engine, request, sub)
        await resolve_context(context, self.resolver, request.headers.get(PASSPORT_HEADER))
        try:
            result = await self.schema.execute(
                query, variable_values=variables, context_value=context,
                operation_name=data.get("operationName"), operation_extensions=extensions,
                allowed_operation_types=_ON_GET if method == "GET" else _ON_POST,
            )
        except CannotGetOperationTypeError as exc:
            return PlainTextResponse(exc.as_http_error_reason(), 400)
        except InvalidOperationTypeError as exc:
            return PlainTextResponse(exc.as_http_error_reason(method), 400)
        except MissingQueryError:
            return PlainTextResponse("No GraphQL query found in the request", 400)
        response = Response(encode_json(process_result(result)), status_code=sub.status_code,
                            media_type="application/json", background=sub.background)
        response.raw_headers.extend(sub.raw_headers)
        return response


def _json(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # a UnicodeDecodeError is a ValueError
        raise _BadRequest("Unable to parse request body as JSON") from exc


async def _request_data(request: Request) -> dict[str, Any]:
    """The request's operation fields: a ``GET``'s query parameters, a POST's JSON body."""
    if request.method == "GET":
        data: dict[str, Any] = dict(request.query_params)
        for name in ("variables", "extensions"):
            if data.get(name):
                data[name] = _json(data[name])
        return data
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if "application/json" not in media:
        raise _BadRequest("Unsupported content type")
    body = _json(await request.body())
    if isinstance(body, list):
        raise _BadRequest("Batching is not enabled")
    if not isinstance(body, dict):
        raise _BadRequest("The GraphQL request must be a JSON object.")
    return body


def _operation(data: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None,
                                               dict[str, Any] | None]:
    """The request's query, variables and extensions, each of its JSON type."""
    query, variables, extensions = data.get("query"), data.get("variables"), data.get("extensions")
    if not isinstance(query, str | None):
        raise _BadRequest("The GraphQL operation's `query` must be a string or null, if provided.")
    for name, value in (("variables", variables), ("extensions", extensions)):
        if not isinstance(value, dict | None):
            raise _BadRequest(
                f"The GraphQL operation's `{name}` must be an object or null, if provided.")
    return query, variables, extensions
