"""Register the composed service with an engine. Names no slice."""

from __future__ import annotations

from service_engine import Engine
from service_engine.graphql import ComposedService

from .kernel import PrincipalDirectory
from .slices import SERVICE


def register(engine: Engine, service: ComposedService = SERVICE) -> PrincipalDirectory:
    """Run every slice's registration; answer the principal directory the
    slices contributed their facts to (the GraphQL app resolves passports
    with it, and the engine re-resolves principals with it)."""
    directory = PrincipalDirectory.of(engine)
    service.register(engine)
    engine.register_principal_refresh(directory.refresh)
    return directory
