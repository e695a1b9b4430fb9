"""The reference service's permits say what its gates say (pure: no database).

A command compiles into the database, so who may rename or delete a board
and advance a card is declared as a `Permit` over the row and the
principal's facts; the view's affordances still run the aggregate's gates.
For every combination of row and principal below, the first failing rule
of the permit is the gate's denial (the same reason, the same action), and
a permit that passes is a gate that allows.
"""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime
from typing import Any

import pytest

from example_service.kernel import Principal
from example_service.slices.board.domain import BOARD_ARCHIVE, BOARD_MEMBERSHIPS, Board
from example_service.slices.board.policy import DELETE_BOARD, RENAME_BOARD
from example_service.slices.card.domain import CARD_ADVANCE, STAGES, Card
from example_service.slices.card.workflow import START_CARD
from service_engine.commands import CheckedCommand, Permit
from service_engine.commands.expr import Env, evaluate, truth


def _permit(command: CheckedCommand) -> Permit:
    [permit] = [c for c in command.requirements if isinstance(c, Permit)]
    return permit


def _verdict(permit: Permit, binding: str, row: Any, principal: Principal) -> tuple[str, str]:
    """``(reason code, action)`` of the permit's first failing rule, ``("", action)``."""
    env = Env({}, {binding: dataclasses.asdict(row)}, None, principal)
    for rule in permit.rules:
        if not any(truth(evaluate(c, env)) for c in rule.conditions):
            return rule.reason.code, permit.action
    return "", permit.action


def _gate(gate: Any, principal: Principal) -> tuple[str, str]:
    verdict = gate(principal)
    return ("" if verdict.reason is None else verdict.reason.code), str(gate.action)


def _people() -> list[Principal]:
    found = []
    for org, roles, member, kind in itertools.product(
        ["acme", "other", None], [frozenset(), frozenset({BOARD_ARCHIVE, CARD_ADVANCE})],
        [False, True], ["person", "service"],
    ):
        who = Principal(id="p", actor="p", org=org, roles=roles, kind=kind)
        found.append(who.with_fact(BOARD_MEMBERSHIPS, ["b-1"] if member else []))
    return found


@pytest.mark.parametrize(("command", "gate"), [(RENAME_BOARD, "can_rename"),
                                               (DELETE_BOARD, "can_delete")])
def test_the_boards_permits_are_its_gates(command: CheckedCommand, gate: str) -> None:
    """Rename and delete: the permit's refusal is the gate's, row by row."""
    permit = _permit(command)
    for archived, principal in itertools.product([False, True], _people()):
        board = Board("b-1", "acme", "t", "owner", archived)
        assert _verdict(permit, "board", board, principal) == _gate(
            getattr(board, gate), principal), (archived, principal)


def test_the_cards_advance_permit_is_its_gate() -> None:
    """Advance: the permit's refusal is the gate's for every stage and principal."""
    permit = _permit(START_CARD)
    for stage, principal in itertools.product(STAGES, _people()):
        card = Card("c-1", "acme", "t", "owner", datetime(2026, 1, 1, tzinfo=UTC), stage=stage)
        assert _verdict(permit, "card", card, principal) == _gate(
            card.can_advance, principal), (stage, principal)
