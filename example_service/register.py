"""Register the composed service with an engine. Names no slice."""

from __future__ import annotations

from service_engine import Engine
from service_engine.graphql import ComposedService

from .slices import SERVICE


def register(engine: Engine, service: ComposedService = SERVICE) -> None:
    """Run every slice's registration: its projectors, reactions, offers,
    principal fact loaders and scope contributions all go to the engine."""
    service.register(engine)
