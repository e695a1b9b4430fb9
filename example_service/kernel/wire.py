"""Wire shapes every slice serves the same way: the resolvers' ``Info`` and
affordances. (A mutation's refusal is the kit's:
`service_engine.graphql.MutationResult` / `Refusal`.)"""

from __future__ import annotations

from typing import TypeAlias

import strawberry

from service_engine import affordances
from service_engine.graphql import GraphQLContext

from .principal import Principal

__all__ = ["Affordance", "Info", "affordance_list"]

Info: TypeAlias = strawberry.Info[GraphQLContext[Principal], None]
"""What every slice's resolvers take: ``info.context`` holds the engine and
the caller's `Principal`."""


@strawberry.type(description="One action the caller may (or may not) take on what a view shows.")
class Affordance:
    action: str
    allowed: bool
    reason: str | None = strawberry.field(
        description="The refusal code when not allowed: the code the mutation answers with."
    )


def affordance_list(aggregate: object, principal: object) -> list[Affordance]:
    """Every gate declared on ``aggregate``'s type, evaluated for ``principal``:
    the same functions the mutations require, so the two cannot disagree."""
    return [
        Affordance(action=action, allowed=wire["allowed"], reason=wire["reason"])
        for action, wire in affordances(aggregate, principal).to_wire().items()
    ]
