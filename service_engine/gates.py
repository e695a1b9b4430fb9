"""Gates and affordances: one declaration, two uses.

A *gate* answers "may this principal perform this action on this aggregate
now?" with a `Gate`: allowed, or denied with a `Reason` (a stable code the
client can branch on). Declare each gate once with `gated`::

    class Counter:
        @gated("increment")
        def can_increment(self, principal: Principal) -> Gate:
            if self.frozen:
                return Gate.deny(Reason("counter.frozen"))
            return Gate.allow()

The same function then serves both sides, so they cannot disagree:

* the view's **affordance pass**: `affordances(counter, principal)` runs every
  gate declared on the aggregate's type and returns `Affordances`, which
  serialises to the client wire (``{"increment": {"allowed": false,
  "reason": "counter.frozen"}}``);
* the mutation's **deny check**: ``cx.require(counter.can_increment)`` in a
  handler (or `BoundGate.require`) raises `Refused` carrying the reason,
  which the pipeline answers as a `MutationError` with that code.

`check_gates_match_affordances` is the battery's check that the two agree
for every action. This module is pure: no I/O.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, NewType, TypedDict, TypeVar, overload

from .failures import EngineError

__all__ = [
    "ActionName",
    "Affordance",
    "Affordances",
    "BoundGate",
    "Gate",
    "GateFn",
    "Reason",
    "Refused",
    "affordances",
    "check_gates_match_affordances",
    "gated",
    "gates_of",
]

ActionName = NewType("ActionName", str)
"""The name of a gated action (``"increment"``), as the client wire spells it."""

A = TypeVar("A")
P = TypeVar("P")

_CODE = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*")
_ACTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Reason:
    """Why an action is refused: a stable, serialisable code.

    ``code`` is what clients branch on and never changes once published:
    lowercase words separated by ``_`` and dotted namespaces
    (``"forbidden"``, ``"counter.frozen"``). ``message`` is an optional
    human explanation; it is not part of the reason's identity.
    """

    code: str
    message: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if type(self.code) is not str or not _CODE.fullmatch(self.code):
            raise ValueError(
                f"a Reason code is lowercase dotted words ([a-z][a-z0-9_]*), got {self.code!r}"
            )

    def to_wire(self) -> str:
        """The code, as it travels to the client."""
        return self.code


class Refused(EngineError):
    """A gate (or the domain) refused the command; the transaction rolls back.

    Raised by the deny check (`BoundGate.require`, ``cx.require``) or by a
    handler that refuses for a domain reason; the pipeline answers it as a
    `MutationError` carrying ``reason.code``.
    """

    def __init__(self, reason: Reason, action: ActionName | None = None) -> None:
        what = f"{action} refused" if action else "refused"
        detail = f" ({reason.message})" if reason.message else ""
        super().__init__(f"{what}: {reason.code}{detail}")
        self.reason = reason
        self.action = action


@dataclass(frozen=True, slots=True)
class Gate:
    """The answer of a gate: allowed (``reason is None``) or denied with a reason."""

    reason: Reason | None = None

    @staticmethod
    def allow() -> Gate:
        return _ALLOWED

    @staticmethod
    def deny(reason: Reason | str, message: str = "") -> Gate:
        """Deny with ``reason`` (a `Reason` or its code)."""
        return Gate(reason if isinstance(reason, Reason) else Reason(reason, message))

    @property
    def allowed(self) -> bool:
        return self.reason is None

    def require(self, action: ActionName | None = None) -> None:
        """Deny mode: raise `Refused` when this gate is denied."""
        if self.reason is not None:
            raise Refused(self.reason, action)


_ALLOWED = Gate()


class GateFn(Generic[A, P]):
    """A gate declared with `gated`: ``(aggregate, principal) -> Gate``.

    Read from the class it is the declaration (``Counter.can_increment``);
    read from an instance it is a `BoundGate` waiting for the principal.
    """

    def __init__(self, action: ActionName, fn: Callable[[A, P], Gate]) -> None:
        self.action = action
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", action)

    def __call__(self, aggregate: A, principal: P) -> Gate:
        result = self.fn(aggregate, principal)
        if not isinstance(result, Gate):
            raise TypeError(f"gate {self.action!r} returned {result!r}, not a Gate")
        return result

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> GateFn[A, P]: ...
    @overload
    def __get__(self, instance: A, owner: type[Any]) -> BoundGate[P]: ...
    def __get__(self, instance: A | None, owner: type[Any]) -> GateFn[A, P] | BoundGate[P]:
        if instance is None:
            return self
        return BoundGate(self, instance)

    def __repr__(self) -> str:
        return f"<gate {self.action!r} {self.__name__}>"


@dataclass(frozen=True, slots=True)
class BoundGate(Generic[P]):
    """A gate bound to one aggregate; call it with the principal."""

    gate: GateFn[Any, P]
    aggregate: object

    @property
    def action(self) -> ActionName:
        return self.gate.action

    def __call__(self, principal: P) -> Gate:
        return self.gate(self.aggregate, principal)

    def require(self, principal: P) -> None:
        """Deny mode: raise `Refused` (with this action) unless allowed."""
        self(principal).require(self.action)


def gated(action: str) -> Callable[[Callable[[A, P], Gate]], GateFn[A, P]]:
    """Declare the gate of ``action`` on an aggregate class, once.

    Decorate a method ``(self, principal) -> Gate``. The action name must be
    an identifier and unique among the gates of the class (checked by
    `gates_of`).
    """
    if type(action) is not str or not _ACTION.fullmatch(action):
        raise ValueError(f"an action name is an identifier, got {action!r}")

    def declare(fn: Callable[[A, P], Gate]) -> GateFn[A, P]:
        return GateFn(ActionName(action), fn)

    return declare


_GATES: weakref.WeakKeyDictionary[type, Mapping[ActionName, GateFn[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)


def gates_of(cls: type) -> Mapping[ActionName, GateFn[Any, Any]]:
    """Every gate declared on ``cls`` and its bases, by action name.

    A subclass may redefine an inherited gate under the same attribute name;
    two attributes declaring one action is a mistake and raises `TypeError`.
    """
    cached = _GATES.get(cls)
    if cached is not None:
        return cached
    found: dict[ActionName, GateFn[Any, Any]] = {}
    where: dict[ActionName, str] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if name in seen:
                continue  # overridden further down the hierarchy
            seen.add(name)
            if not isinstance(value, GateFn):
                continue
            if value.action in found:
                raise TypeError(
                    f"{cls.__qualname__} declares action {value.action!r} twice "
                    f"({where[value.action]} and {name})"
                )
            found[value.action] = value
            where[value.action] = name
    gates = MappingProxyType(dict(sorted(found.items())))
    _GATES[cls] = gates
    return gates


class Affordance(TypedDict):
    """One action on the client wire."""

    allowed: bool
    reason: str | None


@dataclass(frozen=True, slots=True)
class Affordances(Mapping[ActionName, Gate]):
    """What a principal may do with one aggregate, action by action."""

    gates: Mapping[ActionName, Gate]

    def __getitem__(self, action: ActionName) -> Gate:
        return self.gates[action]

    def __iter__(self) -> Iterator[ActionName]:
        return iter(self.gates)

    def __len__(self) -> int:
        return len(self.gates)

    def allowed(self, action: str) -> bool:
        return self.gates[ActionName(action)].allowed

    def to_wire(self) -> dict[str, Affordance]:
        """``{action: {"allowed": bool, "reason": code | None}}``."""
        return {
            action: {
                "allowed": gate.reason is None,
                "reason": None if gate.reason is None else gate.reason.code,
            }
            for action, gate in self.gates.items()
        }


def affordances(aggregate: object, principal: object) -> Affordances:
    """The affordance pass: run every gate declared on the aggregate's type."""
    return Affordances(
        {action: gate(aggregate, principal) for action, gate in gates_of(type(aggregate)).items()}
    )


def check_gates_match_affordances(
    offered: Affordances, attempted: Mapping[ActionName, Reason | None]
) -> list[str]:
    """Compare the affordance pass with what the mutations actually did.

    ``attempted`` maps every action to the outcome of really running its
    mutation from the same state: ``None`` when it succeeded, else the
    refusal's `Reason`. Returns one line per disagreement (an affordance
    that says allowed for a refused mutation, a reason code that differs,
    an action missing on either side); an empty list means they agree.
    """
    problems: list[str] = []
    for action in sorted(set(offered) | set(attempted)):
        if action not in attempted:
            problems.append(f"{action}: offered but never attempted")
            continue
        if action not in offered:
            problems.append(f"{action}: attempted but not declared as a gate")
            continue
        said = offered[action].reason
        did = attempted[action]
        if (said is None) != (did is None):
            problems.append(
                f"{action}: affordance says {'allowed' if said is None else said.code!r}, "
                f"mutation {'succeeded' if did is None else 'refused with ' + repr(did.code)}"
            )
        elif said is not None and did is not None and said.code != did.code:
            problems.append(f"{action}: affordance reason {said.code!r}, mutation {did.code!r}")
    return problems
