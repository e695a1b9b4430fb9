"""What a command answers: one `CommandOutcome` value (pure).

Every outcome is typed and travels as a value, never as a generic error:
the declared success (`Return`), a declared zero-mutation outcome
(``PostMissing``, ``StaleRevision``, ``IllegalState``, ``TitleTaken``, ...),
or one of the engine's own two: ``Refused`` (a gate or row policy denied;
``data.reason`` is the gate's `Reason` code, equal to the affordance's) and
``IdempotencyConflict`` (the key was used with other inputs).

A replayed outcome (``replayed``) is the one stored by the key's first run,
with the service values sealed then.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..impacts.model import JsonValue

__all__ = ["IDEMPOTENCY_CONFLICT", "REFUSED", "CommandOutcome"]

_WORD = re.compile(r"(?<!^)(?=[A-Z])")

REFUSED = "Refused"
IDEMPOTENCY_CONFLICT = "IdempotencyConflict"


@dataclass(frozen=True, slots=True)
class CommandOutcome:
    """The outcome of one command.

    ``name`` is the declared outcome; ``ok`` is true only for the command's
    `Return`; ``data`` its JSON fields; ``sealed`` the service values sampled
    for the run (JSON: a uuid and an ISO instant as text). ``replayed`` says
    the outcome was answered from the idempotency record (not part of
    equality: a replay equals the original).
    """

    command: str
    name: str
    ok: bool
    data: Mapping[str, JsonValue] = field(default_factory=dict)
    sealed: Mapping[str, JsonValue] = field(default_factory=dict)
    replayed: bool = field(default=False, compare=False)

    @property
    def mutated(self) -> bool:
        """Whether this run changed anything (only a first, successful run does)."""
        return self.ok and not self.replayed

    def code(self, namespace: str) -> str | None:
        """The stable error code of a refusal, None for a success: the gate's
        `Reason` code for ``Refused``, else ``namespace`` and the outcome in
        snake case (``"card"`` and ``StaleRevision``: ``card.stale_revision``)."""
        if self.ok:
            return None
        if self.name == REFUSED:
            reason = self.data.get("reason")
            if isinstance(reason, str):
                return reason
        return f"{namespace}.{_snake(self.name)}"

    def to_wire(self) -> dict[str, Any]:
        """``{"outcome", "ok", "data", "sealed", "replayed"}``."""
        return {
            "outcome": self.name, "ok": self.ok, "data": dict(self.data),
            "sealed": dict(self.sealed), "replayed": self.replayed,
        }

    def to_record(self) -> dict[str, Any]:
        """What the idempotency record stores."""
        return {"name": self.name, "ok": self.ok, "data": dict(self.data)}

    @classmethod
    def from_record(
        cls, command: str, record: Mapping[str, Any], sealed: Mapping[str, JsonValue]
    ) -> CommandOutcome:
        return cls(
            command, str(record["name"]), bool(record["ok"]), dict(record.get("data", {})),
            dict(sealed), replayed=True,
        )


def _snake(name: str) -> str:
    return _WORD.sub("_", name).lower()

