"""What the synchronous channel answers: `Success`, `MutationError`, `OneShot`.

A mutation answers its caller with exactly one of:

* `Success` (``{"success": true}`` on the wire) when it committed;
* a value the handler returned, possibly a `OneShot` secret meant for the
  caller alone;
* a `MutationError`: a typed refusal carrying a stable code (the gate's
  `Reason` code for a refusal), or a retryable outcome (``lock_timeout``),
  or the generic ``mutation failed: database`` for a fault of the pipeline
  itself, whose cause is logged server-side and never sent.

These are values a caller branches on, not exceptions. This module is pure.

`ANSWERED` is the one table of the engine errors a handler's run is answered
by (rather than propagated as a bug): the mutation executor turns each into
its `MutationError` (`mutation_error`), the reaction classifier into a dead
letter or a nak; both read the wire code from the error's ``code``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NoReturn, TypeAlias, TypeVar, final

from ..db.errors import ConstraintViolation, DatabaseError
from ..failures import CauseTooLarge, EngineError, TooManyImpacts
from ..gates import ActionName, Reason, Refused
from ..lanes.accumulated.errors import SealError
from ..persistence.base import HydrationFailed, NotFound

__all__ = [
    "ANSWERED",
    "DATABASE_FAULT_MESSAGE",
    "MutationError",
    "MutationOutcome",
    "OneShot",
    "SecretSpent",
    "Success",
    "mutation_error",
]

T = TypeVar("T")

DATABASE_FAULT_MESSAGE = "mutation failed: database"
"""The one message a fault of the pipeline itself shows its caller."""


@dataclass(frozen=True, slots=True)
class Success:
    """The mutation committed."""

    def to_wire(self) -> dict[str, bool]:
        return {"success": True}


@dataclass(frozen=True, slots=True)
class MutationError:
    """The mutation did not commit, and why, in terms a client may see.

    ``code`` is stable and machine-readable: a gate's `Reason` code
    (``"counter.frozen"``), or one of the engine's codes: ``not_found``,
    ``unique_violation`` / ``foreign_key_violation`` / ``check_violation`` /
    ``not_null_violation`` / ``exclusion_violation``, ``lock_timeout`` and
    ``serialization_failure`` (``retryable``), ``too_many_impacts``,
    ``hydration_failed``, ``shutting_down`` (``retryable``) and ``database``.
    ``retryable`` says that running the same command again may succeed: a
    retryable outcome is never terminal (a reaction naks it; a client may
    resubmit). ``message`` never carries driver internals.
    """

    code: str
    message: str
    retryable: bool = False
    action: ActionName | None = None

    DATABASE: ClassVar[str] = "database"

    @classmethod
    def refused(cls, reason: Reason, action: ActionName | None = None) -> MutationError:
        """The answer to a gate's or the domain's refusal."""
        text = reason.message or (f"{action} refused: {reason.code}" if action else reason.code)
        return cls(reason.code, text, False, action)

    @classmethod
    def database(cls, *, retryable: bool = False) -> MutationError:
        """The generic answer to a fault of the pipeline itself."""
        return cls(cls.DATABASE, DATABASE_FAULT_MESSAGE, retryable)

    @property
    def reason(self) -> Reason:
        """The code as a `Reason` (what `check_gates_match_affordances` compares)."""
        return Reason(self.code, self.message)

    def to_wire(self) -> dict[str, Any]:
        """``{"code", "message", "retryable"}`` (plus ``"action"`` when known)."""
        wire: dict[str, Any] = {
            "code": self.code, "message": self.message, "retryable": self.retryable,
        }
        if self.action is not None:
            wire["action"] = self.action
        return wire


ANSWERED: tuple[type[EngineError], ...] = (
    Refused,
    NotFound,
    HydrationFailed,
    TooManyImpacts,
    CauseTooLarge,
    DatabaseError,
    SealError,
)
"""The engine errors a handler's run is answered by, under their ``code``:
a `MutationError` for a mutation, a dead letter (or a nak, for a retryable
`DatabaseError`) for a reaction. Anything else a handler raises is a bug."""


def mutation_error(exc: EngineError) -> MutationError:
    """The `MutationError` a mutation answers for ``exc`` (one of `ANSWERED`).

    A refusal carries its `Reason`; a constraint its ``<kind>_violation``; a
    retryable database error its own code; any other database fault the
    generic ``database``; never driver internals."""
    if isinstance(exc, Refused):
        return MutationError.refused(exc.reason, exc.action)
    if isinstance(exc, ConstraintViolation):
        return MutationError(exc.code, f"mutation refused: {exc.kind} violation")
    if isinstance(exc, DatabaseError):
        if exc.retryable and exc.code != MutationError.DATABASE:
            return MutationError(exc.code, f"mutation not applied: {exc.code}", True)
        return MutationError.database(retryable=exc.retryable)
    if isinstance(exc, NotFound):
        return MutationError(exc.code, f"not found: {exc.key!r}")
    if isinstance(exc, HydrationFailed):
        return MutationError(exc.code, "mutation failed: an aggregate did not load")
    return MutationError(exc.code, str(exc))


class SecretSpent(EngineError):
    """`OneShot.reveal` was called a second time."""


def _refuse(what: str) -> NoReturn:
    raise TypeError(
        f"a OneShot secret cannot be {what}: it reaches the caller alone, never a view, "
        "impact, offer, event or outbox row"
    )


@final
class OneShot(Generic[T]):
    """A secret a mutation returns to its caller, and to nobody else.

    Return it from a handler through `MutationExecutor.execute`; the caller
    calls `reveal` once to put the value in its own response. By
    construction it cannot travel anywhere else: it is not JSON (``json``
    refuses it), not picklable or copyable, refused as a pydantic field and
    by pydantic serialisation, not subclassable, and its ``repr``/``str``
    never show the value. An `Impact`, `Cause`, `DomainEvent` or outbox row
    holding one is refused because it is not JSON.
    """

    __slots__ = ("__spent", "__value")

    def __init__(self, value: T) -> None:
        self.__value = value
        self.__spent = False

    def reveal(self) -> T:
        """Hand the secret over; a second call raises `SecretSpent`."""
        if self.__spent:
            raise SecretSpent("this OneShot secret was already revealed")
        self.__spent = True
        value = self.__value
        del self.__value
        return value

    @property
    def spent(self) -> bool:
        return self.__spent

    def __repr__(self) -> str:
        return "OneShot(<secret>)"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        _refuse("subclassed")

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        _refuse("pickled or copied")

    def __reduce__(self) -> NoReturn:
        _refuse("pickled or copied")

    def __getstate__(self) -> NoReturn:
        _refuse("pickled or copied")

    def __copy__(self) -> NoReturn:
        _refuse("copied")

    def __deepcopy__(self, memo: Any) -> NoReturn:
        _refuse("copied")

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> NoReturn:
        _refuse("a field of a pydantic model")


MutationOutcome: TypeAlias = Success | MutationError
"""What `MutationExecutor.ack` answers."""
