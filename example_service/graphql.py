"""The service's HTTP surface over the composed schema. Names no slice."""

from __future__ import annotations

from starlette.applications import Starlette

from service_engine import Engine
from service_engine.graphql import ComposedService
from service_engine.server import graphql_app

from .kernel import principal_of
from .slices import SERVICE


def build_app(
    engine: Engine,
    service: ComposedService = SERVICE,
    *,
    passport_from_connection_params: bool = False,
) -> Starlette:
    """GraphQL (and GraphiQL) on ``/graphql``, subscriptions on
    ``/graphql/ws``, ``/readyz`` and ``/metrics``.

    ``passport_from_connection_params`` lets a browser (GraphiQL) send its
    passport in the socket's ``connection_init`` payload: development only,
    never behind a gateway.
    """
    return graphql_app(
        engine,
        service.schema(),
        principal_of,
        passport_from_connection_params=passport_from_connection_params,
    )
