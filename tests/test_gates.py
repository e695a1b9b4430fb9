"""Gates and affordances: one declaration serves the affordance pass and the deny check."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service_engine.gates import (
    ActionName,
    Affordances,
    BoundGate,
    Gate,
    GateFn,
    Reason,
    Refused,
    affordances,
    check_gates_match_affordances,
    gated,
    gates_of,
)

LOCKED = Reason("door.locked", "the door is locked")
FORBIDDEN = Reason("forbidden")


@dataclass
class User:
    name: str
    admin: bool = False


class Door:
    def __init__(self, locked: bool) -> None:
        self.locked = locked
        self.calls = 0

    @gated("open")
    def can_open(self, user: User) -> Gate:
        self.calls += 1
        return Gate.deny(LOCKED) if self.locked else Gate.allow()

    @gated("lock")
    def can_lock(self, user: User) -> Gate:
        if not user.admin:
            return Gate.deny(FORBIDDEN)
        return Gate.deny("door.already_locked") if self.locked else Gate.allow()


class StrongDoor(Door):
    @gated("open")
    def can_open(self, user: User) -> Gate:  # overrides the inherited gate
        return Gate.deny(FORBIDDEN) if not user.admin else Gate.allow()

    @gated("break_in")
    def can_break_in(self, user: User) -> Gate:
        return Gate.deny(FORBIDDEN)


def test_reason_codes_are_stable_lowercase_words() -> None:
    """A reason code is dotted lowercase words, compared by code alone; anything else is refused."""
    assert Reason("counter.frozen").to_wire() == "counter.frozen"
    assert Reason("a_b.c2") == Reason("a_b.c2", "message is not identity")
    for bad in ("", "Frozen", "a..b", ".a", "a.", "a-b", "1a", "a b"):
        with pytest.raises(ValueError):
            Reason(bad)


@given(st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z][a-z0-9_]{0,8}){0,3}", fullmatch=True))
def test_every_valid_code_round_trips_through_json(code: str) -> None:
    """Every valid reason code round-trips through its JSON wire form (property test)."""
    reason = Reason(code)
    assert Reason(json.loads(json.dumps(reason.to_wire()))) == reason


def test_gate_allow_and_deny() -> None:
    """An allowing gate passes require; a denying one carries its reason and message, and require
    raises Refused naming the action and the code."""
    assert Gate.allow().allowed and Gate.allow().reason is None
    denied = Gate.deny("door.locked", "why")
    assert not denied.allowed
    assert denied.reason == LOCKED and denied.reason.message == "why"
    Gate.allow().require(ActionName("open"))
    with pytest.raises(Refused) as refused:
        denied.require(ActionName("open"))
    assert refused.value.reason == LOCKED
    assert refused.value.action == "open"
    assert "open refused: door.locked" in str(refused.value)


def test_gated_declares_once_for_class_and_instance() -> None:
    """A gated method is declared once: the deny check and the affordance both call the one
    function, bound or not."""
    assert isinstance(Door.can_open, GateFn)
    assert Door.can_open.action == "open"
    door = Door(locked=True)
    bound = door.can_open
    assert isinstance(bound, BoundGate) and bound.action == "open"
    # The deny check and the affordance pass call the one declared function.
    with pytest.raises(Refused):
        bound.require(User("ann"))
    assert affordances(door, User("ann"))[ActionName("open")] == Gate.deny(LOCKED)
    assert door.calls == 2


def test_gates_of_walks_the_hierarchy() -> None:
    """gates_of lists a class's gates by action, inherited ones included and overrides winning, as a
    read-only mapping."""
    assert list(gates_of(Door)) == ["lock", "open"]
    assert list(gates_of(StrongDoor)) == ["break_in", "lock", "open"]
    assert gates_of(StrongDoor)[ActionName("open")] is StrongDoor.__dict__["can_open"]
    with pytest.raises(TypeError):
        gates_of(Door)[ActionName("x")] = Door.can_open  # type: ignore[index]


def test_one_action_declared_twice_is_refused() -> None:
    """Two gates declaring one action are refused."""
    class Twice:
        @gated("go")
        def first(self, user: User) -> Gate:
            return Gate.allow()

        @gated("go")
        def second(self, user: User) -> Gate:
            return Gate.allow()

    with pytest.raises(TypeError, match="'go' twice"):
        gates_of(Twice)


def test_action_names_are_identifiers() -> None:
    """An action name that is not an identifier is refused."""
    for bad in ("", "two words", "a-b", "1st"):
        with pytest.raises(ValueError):
            gated(bad)


def test_a_gate_must_answer_a_gate() -> None:
    """A gated method answering anything but a Gate raises TypeError."""
    class Sloppy:
        @gated("go")
        def can_go(self, user: User) -> Gate:
            return True  # type: ignore[return-value]

    with pytest.raises(TypeError, match="not a Gate"):
        Sloppy().can_go(User("x"))


def test_affordances_serialise_to_the_client_wire() -> None:
    """Affordances serialise to the client's wire form (allowed and reason per action), JSON-stable."""
    offered = affordances(Door(locked=True), User("root", admin=True))
    assert isinstance(offered, Affordances)
    assert offered.to_wire() == {
        "lock": {"allowed": False, "reason": "door.already_locked"},
        "open": {"allowed": False, "reason": "door.locked"},
    }
    assert json.loads(json.dumps(offered.to_wire())) == offered.to_wire()
    open_door = affordances(Door(locked=False), User("root", admin=True))
    assert open_door.to_wire() == {
        "lock": {"allowed": True, "reason": None}, "open": {"allowed": True, "reason": None},
    }
    assert open_door.allowed("open") and len(open_door) == 2


def test_check_gates_match_affordances() -> None:
    """check_gates_match_affordances lists every disagreement between the affordances offered and
    the mutations' outcomes, and actions offered but never attempted or attempted but undeclared."""
    offered = affordances(Door(locked=True), User("ann"))
    agree = {ActionName("open"): LOCKED, ActionName("lock"): FORBIDDEN}
    assert check_gates_match_affordances(offered, agree) == []

    problems = check_gates_match_affordances(
        offered, {ActionName("open"): None, ActionName("lock"): Reason("other")}
    )
    assert problems == [
        "lock: affordance reason 'forbidden', mutation 'other'",
        "open: affordance says 'door.locked', mutation succeeded",
    ]
    missing = check_gates_match_affordances(
        offered, {ActionName("open"): LOCKED, ActionName("fly"): None}
    )
    assert missing == [
        "fly: attempted but not declared as a gate",
        "lock: offered but never attempted",
    ]
    allowed = affordances(Door(locked=False), User("root", admin=True))
    assert check_gates_match_affordances(
        allowed, {ActionName("open"): FORBIDDEN, ActionName("lock"): None}
    ) == ["open: affordance says 'allowed', mutation refused with 'forbidden'"]
