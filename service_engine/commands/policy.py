"""Boolean row policies, evaluated the way gates are (pure: no I/O).

A `RowPolicy` is one predicate over the row, the principal's facts and
constants. `check_row` is its evaluation (only the boolean ``True``
allows; a missing field, a mistyped fact, a non-boolean result denies with
the policy's reason). `row_policy_gate` turns the same policy into a `gated`
action on the aggregate class, so the affordance pass and the command's
check run one function and cannot disagree::

    class Board(Aggregate):
        can_update = row_policy_gate("update", BOARD_UPDATE, BOARD_FIELDS)

An update must satisfy its policy for the current row (what the affordance
shows) and for the proposed row (what the command would write).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..gates import Gate, GateFn, gated
from .declaration import RowPolicy
from .expr import Env, evaluate, truth

__all__ = ["check_row", "row_of", "row_policy_gate"]

_ABSENT = object()


def row_of(aggregate: object, fields: Iterable[str]) -> dict[str, Any]:
    """The row a policy sees: the named attributes ``aggregate`` has."""
    row: dict[str, Any] = {}
    for name in fields:
        value = getattr(aggregate, name, _ABSENT)
        if value is not _ABSENT and not callable(value):
            row[name] = value
    return row


def check_row(policy: RowPolicy, row: Mapping[str, Any], principal: object) -> Gate:
    """Allow when the predicate is the boolean ``True`` over ``row``; deny
    with the policy's reason otherwise (nothing is coerced)."""
    value = evaluate(policy.predicate, Env({}, {}, row, principal))
    return Gate.allow() if truth(value) else Gate.deny(policy.reason)


def row_policy_gate(
    action: str, policy: RowPolicy, fields: Iterable[str]
) -> GateFn[Any, Any]:
    """A gate for ``action`` that evaluates ``policy`` on the aggregate's
    current row (the fields named): declare it on the aggregate class."""
    names = tuple(fields)

    def gate(aggregate: Any, principal: Any) -> Gate:
        return check_row(policy, row_of(aggregate, names), principal)

    gate.__name__ = f"can_{action}"
    return gated(action)(gate)
