"""The GraphQL surface kit: compose a service's schema from its slices, type
its subscriptions, and serve it (HTTP, GraphiQL, graphql-transport-ws).

* `compose_service` / `SliceFragment`: each slice named once, its root
  fields and types merged and checked at assembly;
* `subscription_union`: the typed Reset / Upsert / Remove (+ lane notice)
  members of one projector, and the stream feeding them; its
  `SubscriptionUnion.field` declares a live subscription field from a
  function of the field's arguments to the `Live` session to attach;
* `MutationResult` / `Refusal`: the ``{ success error { code message
  retryable action } }`` shape every mutation's result type extends;
* `Views`: a query field's read of one projector's views for the caller,
  exactly as a session renders them;
* `graphql_app`: the Starlette app, the principal from the trusted
  ``X-Passport`` header, sockets bounded by ``session_max_age``.
"""

from .app import (
    CONNECTION_REFUSED_CLOSE_CODE,
    SESSION_MAX_AGE_CLOSE_CODE,
    SESSION_MAX_AGE_CLOSE_REASON,
    GraphQLContext,
    graphql_app,
)
from .compose import (
    ComposedService,
    DuplicateSchemaMember,
    SliceFragment,
    UndeclaredSchemaMember,
    compose_service,
)
from .ops import DEFAULT_OPS_ROLE
from .passport import (
    PASSPORT_HEADER,
    Passport,
    PassportError,
    PassportMalformed,
    PassportMissing,
    PassportPrincipal,
    PassportRefused,
    parse_passport,
)
from .reads import ProjectorViewMismatch, Views
from .results import MutationResult, Refusal
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
    "Views",
    "compose_service",
    "graphql_app",
    "merge_streams",
    "parse_passport",
    "presence_subscription_union",
    "subscription_union",
]
