"""A mutation's outcome on the wire: one refusal type and the base every
slice's result type extends.

A slice's result type names what the mutation answers with on success; the
kit gives it ``success`` and ``error``::

    @strawberry.type(description="The outcome of a board mutation.")
    class BoardResult(MutationResult):
        board: BoardView | None = None

    type BoardResult { success: Boolean!  error: Refusal  board: BoardView }
    type Refusal     { code: String!  message: String!  retryable: Boolean!  action: String }

A resolver answers a `MutationError` with ``BoardResult.refused(outcome)``
and a commit with ``BoardResult(success=True, board=...)``. ``code`` is the
error's stable code (a gate's `Reason` code or one of the engine's:
``not_found``, ``lock_timeout``, ``database``, ...); ``retryable`` says the
same mutation may succeed when sent again; ``action`` names the gated action
that refused, when one did.
"""

from __future__ import annotations

from typing import Any, Self

import strawberry

from ..pipeline import MutationError

__all__ = ["MutationResult", "Refusal"]


@strawberry.type(description="Why a mutation did not commit.")
class Refusal:
    code: str
    message: str
    retryable: bool
    action: str | None = None

    @classmethod
    def of(cls, error: MutationError) -> Refusal:
        """The wire form of ``error``."""
        return cls(
            code=error.code, message=error.message, retryable=error.retryable, action=error.action
        )


@strawberry.type(description="The outcome of a mutation.")
class MutationResult:
    """The base of a mutation's result type: ``success``, and the `Refusal`
    when it did not commit. Subclass it (decorated with ``@strawberry.type``)
    and add what a success answers with, each field with a default."""

    success: bool
    error: Refusal | None = None

    @classmethod
    def refused(cls, error: MutationError, **fields: Any) -> Self:
        """The answer to a mutation that did not commit (``fields`` set the
        subclass's other fields, if any)."""
        return cls(success=False, error=Refusal.of(error), **fields)
