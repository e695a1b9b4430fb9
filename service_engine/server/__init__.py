"""The server of a service's GraphQL surface: the Starlette app and its
routes (`graphql_app`), the passport, the engine's own graphql-transport-ws
socket (`service_engine.server.wire`, on its pure protocol
`service_engine.server.wire_protocol`), the ops page, and the host that runs
an engine with its HTTP server (`service_engine.server.host`), and
`serve_embedded`, a service on a developer's machine in one call. It serves
the schema the author's kit (`service_engine.graphql`) composed."""

from .app import (
    CONNECTION_REFUSED_CLOSE_CODE,
    SESSION_MAX_AGE_CLOSE_CODE,
    SESSION_MAX_AGE_CLOSE_REASON,
    graphql_app,
)
from .develop import serve_embedded
from .host import PodSlot, bind_listener, run_pods, run_with, run_with_listener
from .ops_page import DEFAULT_OPS_ROLE
from .passport import (
    PASSPORT_HEADER,
    OrgMember,
    Passport,
    PassportError,
    PassportMalformed,
    PassportMissing,
    PassportPrincipal,
    PassportRefused,
    parse_passport,
)

__all__ = [
    "CONNECTION_REFUSED_CLOSE_CODE", "DEFAULT_OPS_ROLE", "PASSPORT_HEADER",
    "SESSION_MAX_AGE_CLOSE_CODE", "SESSION_MAX_AGE_CLOSE_REASON", "OrgMember", "Passport",
    "PassportError", "PassportMalformed", "PassportMissing", "PassportPrincipal", "PassportRefused",
    "PodSlot", "bind_listener", "graphql_app", "parse_passport", "run_pods", "run_with",
    "run_with_listener", "serve_embedded",
]
