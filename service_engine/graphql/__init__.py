"""The GraphQL author's kit: compose a service's schema from its slices and
type its subscriptions. The server that serves it (HTTP, GraphiQL,
graphql-transport-ws, the passport, the ops page) is `service_engine.server`;
the kit never imports it. Its public names (`graphql_app`, the passport,
the close codes) are also importable from here, loaded on first use.

* `compose_service` / `SliceFragment`: each slice named once, its root
  fields and types merged and checked at assembly; a slice's projectors
  and mutation handlers listed as data derive their query, live and
  mutation fields and the kit's result types
  (`service_engine.graphql.declared`);
* `subscription_union`: the typed Reset / Upsert / Remove (+ lane notice)
  members of one projector, and the stream feeding them (a `Views` builds
  its own); its `SubscriptionUnion.field` declares a live subscription
  field from a function of the field's arguments to the `Live` session to
  attach;
* `MutationResult` / `Refusal`: the ``{ success error { code message
  retryable action } }`` shape every mutation's result type extends, and
  `MutationResult.of`, which answers whatever the executor answered (a
  value, a `MutationError`, a declared command's outcome); `CommandResult`
  adds the declared outcome's name; `require_ok` raises a declared
  command's refusal inside a handler;
* `Views`: one projector's views declared once: a query field's read of
  them for the caller, exactly as a session renders them, and its live
  subscription field (`Views.field`) over the generated union;
* `GraphQLContext`: what a resolver receives as ``info.context``;
* `graphql_app` (`service_engine.server`): the Starlette app, the principal
  from the trusted ``X-Passport`` header (by default an `OrgMember`),
  sockets bounded by ``session_max_age``.
"""

from typing import Any

from .compose import (
    ComposedService,
    DuplicateSchemaMember,
    SliceFragment,
    UndeclaredSchemaMember,
    compose_service,
)
from .context import GraphQLContext
from .reads import ProjectorViewMismatch, UnregisteredProjector, Views
from .results import CommandResult, MutationResult, Refusal, require_ok
from .subscriptions import (
    DeltaCause,
    LaneNotice,
    LanesPaused,
    LanesResumed,
    Live,
    LiveRequest,
    SubscriptionUnion,
    merge_streams,
    presence_subscription_union,
    subscription_union,
)

__all__ = [
    "CONNECTION_REFUSED_CLOSE_CODE",
    "DEFAULT_OPS_ROLE",
    "PASSPORT_HEADER",
    "SESSION_MAX_AGE_CLOSE_CODE",
    "SESSION_MAX_AGE_CLOSE_REASON",
    "CommandResult",
    "ComposedService",
    "DeltaCause",
    "DuplicateSchemaMember",
    "GraphQLContext",
    "LaneNotice",
    "LanesPaused",
    "LanesResumed",
    "Live",
    "LiveRequest",
    "MutationResult",
    "OrgMember",
    "Passport",
    "PassportError",
    "PassportMalformed",
    "PassportMissing",
    "PassportPrincipal",
    "PassportRefused",
    "ProjectorViewMismatch",
    "Refusal",
    "SliceFragment",
    "SubscriptionUnion",
    "UndeclaredSchemaMember",
    "UnregisteredProjector",
    "Views",
    "compose_service",
    "graphql_app",
    "merge_streams",
    "parse_passport",
    "presence_subscription_union",
    "require_ok",
    "subscription_union",
]

_SERVED = {
    "CONNECTION_REFUSED_CLOSE_CODE": "app",
    "SESSION_MAX_AGE_CLOSE_CODE": "app",
    "SESSION_MAX_AGE_CLOSE_REASON": "app",
    "graphql_app": "app",
    "DEFAULT_OPS_ROLE": "ops_page",
    "PASSPORT_HEADER": "passport",
    "OrgMember": "passport",
    "Passport": "passport",
    "PassportError": "passport",
    "PassportMalformed": "passport",
    "PassportMissing": "passport",
    "PassportPrincipal": "passport",
    "PassportRefused": "passport",
    "parse_passport": "passport",
}
"""The server's public names importable from here (`service_engine.server`)."""


def __getattr__(name: str) -> Any:
    module = _SERVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"service_engine.server.{module}"), name)
