"""A mutation's outcome on the wire: one refusal type and the base every
slice's result type extends::

    @strawberry.type(description="The outcome of a board mutation.")
    class BoardResult(MutationResult):
        board: BoardView | None = None

    type BoardResult { success: Boolean!  error: Refusal  board: BoardView }
    type Refusal     { code: String!  message: String!  retryable: Boolean!  action: String }

``code`` is the error's stable code (a gate's `Reason` code, a declared
outcome's ``<noun>.<outcome>``, or the engine's: ``not_found``,
``lock_timeout``, ...); ``retryable`` says the same mutation may succeed
when sent again; ``action`` names the gated action that refused, if one did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import strawberry

from ..commands.outcomes import CommandOutcome
from ..gates import ActionName, Reason, Refused
from ..persistence.base import NotFound
from ..pipeline import MutationError

__all__ = ["CommandResult", "MutationResult", "Refusal", "require_ok"]


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

    @classmethod
    def of_outcome(cls, outcome: CommandOutcome, noun: str) -> Refusal:
        """The wire form of a declared command's refusal: its code under
        ``noun`` (`CommandOutcome.code`), the gate's action when a gate
        refused; never retryable (the same inputs meet the same state)."""
        return cls(
            code=outcome.code(noun) or outcome.name,
            message=f"{outcome.command}: {outcome.name}", retryable=False,
            action=_action(outcome),
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

    @classmethod
    def of(
        cls, outcome: object, into: str | None = None, /, *, noun: str | None = None,
        **fields: Any,
    ) -> Self:
        """The answer to what a mutation's executor (or `CommandRunner`)
        answered: a `MutationError` is `refused` (``fields`` unset: nothing
        of the mutation holds); a `CommandOutcome` answers its success or
        its declared refusal (`Refusal.of_outcome` under ``noun``), with
        ``fields`` (and, on a `CommandResult`, the outcome's name and
        ``replayed``); any other value is a success with ``fields``, the
        value itself in the field ``into`` when named."""
        if isinstance(outcome, MutationError):
            return cls.refused(outcome)
        if isinstance(outcome, CommandOutcome):
            if noun is None:
                raise TypeError(f"{cls.__name__}.of: a command's outcome needs its noun")
            if issubclass(cls, CommandResult):
                fields = {"outcome": outcome.name, "replayed": outcome.replayed, **fields}
            error = None if outcome.ok else Refusal.of_outcome(outcome, noun)
            return cls(success=outcome.ok, error=error, **fields)
        if into is not None:
            fields[into] = outcome
        return cls(success=True, **fields)


@strawberry.type(description="The outcome of a declared command.")
class CommandResult(MutationResult):
    """The base of a declared command's result type: a `MutationResult`
    that also names the typed outcome and whether it was replayed
    (`MutationResult.of` fills both)."""

    outcome: str | None = strawberry.field(
        default=None,
        description="The typed outcome of a declared command (Started, StaleRevision, ...); "
                    "null for the other mutations and for a failure of the pipeline.",
    )
    replayed: bool = strawberry.field(
        default=False,
        description="The outcome was answered from the idempotency key's first run.",
    )


def require_ok(
    outcome: CommandOutcome, noun: str, *, reasons: Mapping[str, Reason] | None = None,
    missing: tuple[str, str, object] | None = None,
) -> CommandOutcome:
    """``outcome`` when it is the command's success; else raise the
    pipeline's typed refusal, so the handler's transaction rolls back and
    the caller is answered the declared code: `NotFound` (``not_found``)
    for the outcome ``missing`` names (``(outcome, store type, key)``), else
    `Refused` with the outcome's code under ``noun`` (the reason of that
    code in ``reasons`` when given, for its message) and the gate's action."""
    if outcome.ok:
        return outcome
    if missing is not None and outcome.name == missing[0]:
        raise NotFound(missing[1], missing[2])
    code = outcome.code(noun) or outcome.name
    reason = (reasons or {}).get(code) or Reason(code, f"{outcome.command}: {outcome.name}")
    action = _action(outcome)
    raise Refused(reason, None if action is None else ActionName(action))


def _action(outcome: CommandOutcome) -> str | None:
    action = outcome.data.get("action")
    return action if isinstance(action, str) else None
