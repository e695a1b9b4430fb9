"""The GraphQL author's kit: compose a service's schema from its slices
(`compose_service`, `SliceFragment`), read and stream a projector's views
(`Views`, `subscription_union`, `Live`) and answer mutations
(`MutationResult`, `Refusal`, `require_ok`); resolvers receive a
`GraphQLContext`. The server that serves it is `service_engine.server`,
which the kit never imports; the server's public names (`graphql_app`, the
passport, the close codes) are importable from here too, loaded on first use.
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
    "CONNECTION_REFUSED_CLOSE_CODE", "DEFAULT_OPS_ROLE", "PASSPORT_HEADER",
    "SESSION_MAX_AGE_CLOSE_CODE", "SESSION_MAX_AGE_CLOSE_REASON", "CommandResult",
    "ComposedService", "DeltaCause", "DuplicateSchemaMember", "GraphQLContext", "LaneNotice",
    "LanesPaused", "LanesResumed", "Live", "LiveRequest", "MutationResult", "OrgMember", "Passport",
    "PassportError", "PassportMalformed", "PassportMissing", "PassportPrincipal", "PassportRefused",
    "ProjectorViewMismatch", "Refusal", "SliceFragment", "SubscriptionUnion",
    "UndeclaredSchemaMember", "UnregisteredProjector", "Views", "compose_service", "graphql_app",
    "merge_streams", "parse_passport", "presence_subscription_union", "require_ok",
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
