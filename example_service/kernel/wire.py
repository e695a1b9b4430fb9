"""Wire shapes every slice serves the same way: affordances and refusals."""

from __future__ import annotations

import strawberry

from service_engine import MutationError, affordances

__all__ = ["Affordance", "Refusal", "affordance_list", "refusal_of"]


@strawberry.type(description="One action the caller may (or may not) take on what a view shows.")
class Affordance:
    action: str
    allowed: bool
    reason: str | None = strawberry.field(
        description="The refusal code when not allowed: the code the mutation answers with."
    )


@strawberry.type(description="Why a mutation did not commit.")
class Refusal:
    code: str
    message: str
    retryable: bool
    action: str | None = None


def affordance_list(aggregate: object, principal: object) -> list[Affordance]:
    """Every gate declared on ``aggregate``'s type, evaluated for ``principal``:
    the same functions the mutations require, so the two cannot disagree."""
    return [
        Affordance(action=action, allowed=wire["allowed"], reason=wire["reason"])
        for action, wire in affordances(aggregate, principal).to_wire().items()
    ]


def refusal_of(error: MutationError) -> Refusal:
    return Refusal(
        code=error.code, message=error.message, retryable=error.retryable, action=error.action
    )
