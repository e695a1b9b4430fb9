"""`CommandRunner` and `run_in`: a checked command's run, its compiled function.

One command is one pipeline transaction: BEGIN, one call of the command's
generated function (`compile`: it locks, reads, decides and writes in
order and answers the outcome) and COMMIT with the impacts and emitted
events it staged. A declared outcome commits only the idempotency record
(when a key was given); a failure of the pipeline (a lock timeout, ...)
commits nothing and answers the pipeline's `MutationError`. The functions
are installed by the schema owner (`install`); a missing one raises
`CommandNotInstalled` naming the command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..pipeline import Mutation, MutationError, MutationExecutor, Ops
from .checked import CheckedCommand
from .compile import compiled, run_compiled
from .config import CommandConfig
from .errors import ValueMissing
from .outcomes import CommandOutcome
from .plan import InvalidInput, validate_inputs

__all__ = ["INVALID_INPUT", "CommandRunner", "run_in"]

INVALID_INPUT = "invalid_input"
"""The `MutationError` code of inputs that do not match the declaration."""

_DEFAULT_CONFIG = CommandConfig()


@dataclass(frozen=True, slots=True)
class CommandRunner:
    """Runs checked commands over one engine's `MutationExecutor`."""

    executor: MutationExecutor
    config: CommandConfig = field(default_factory=CommandConfig)

    async def run(
        self, command: CheckedCommand, principal: Any, inputs: Mapping[str, object]
    ) -> CommandOutcome | MutationError:
        """Run ``command`` as ``principal`` with ``inputs``: its typed outcome,
        or the pipeline's `MutationError` (``invalid_input`` for inputs that do
        not match the declaration, ``value_missing`` for a value that
        evaluated to nothing: see `ValueMissing`)."""
        retention = self.config.idempotency_retention
        function = compiled(command)
        try:
            values = validate_inputs(command, inputs)

            async def handler(cx: Mutation[Any]) -> CommandOutcome:
                return await run_compiled(cx, function, cx.principal, values, retention)

            return await self.executor.execute(principal, handler)
        except InvalidInput as exc:
            # Before the pipeline, or from a set effect (rolled back).
            return MutationError(INVALID_INPUT, str(exc))
        except ValueMissing as exc:  # rolled back: nothing of it was written
            return MutationError(ValueMissing.code, str(exc))


async def run_in(
    cx: Ops,
    command: CheckedCommand,
    inputs: Mapping[str, object],
    *,
    principal: Any = None,
    config: CommandConfig | None = None,
) -> CommandOutcome:
    """Run ``command`` inside a transaction a handler already holds (a
    reaction under its message claim, a mutation doing more around it).

    ``principal`` defaults to the context's own (``cx.principal`` of a
    mutation, the resolved sender of a reaction). A declared zero-mutation
    outcome writes nothing of the command's but its idempotency record; the
    caller's own writes commit as the caller decides. Raises `InvalidInput`
    for inputs that do not match the declaration.
    """
    if principal is None:
        principal = getattr(cx, "try_principal", None) or getattr(cx, "principal", None)
    retention = (config or _DEFAULT_CONFIG).idempotency_retention
    return await run_compiled(cx, compiled(command), principal, inputs, retention)
