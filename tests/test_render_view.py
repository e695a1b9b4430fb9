"""The ergonomic projector surface: one visibility rule, hooks, attach checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service_engine.errors import AttachError, ConfigError
from service_engine.impacts.model import Cause, Impact, canonical_json
from service_engine.render import Emission, Interest, Keys, WindowSpec
from service_engine.render.projector import (
    Coalesced,
    InvalidProjector,
    MissingRlsApplier,
    PerImpact,
    Projector,
    RlsRegimeMismatch,
    Unrestricted,
    Visibility,
    VisibilityMismatch,
    check_projector,
    check_window_matches_visibility,
    check_window_spec,
    reset_threshold_for,
    route_of,
)


@dataclass(frozen=True)
class Board:
    id: int
    org: int
    members: frozenset[str] = frozenset()


@dataclass(frozen=True)
class User:
    id: str
    orgs: frozenset[int]


class BoardCohorts(Visibility[Board, User]):
    """A board is seen by its org and by its named members (cross-org)."""

    def cohorts(self, row: Board) -> list[Any]:
        return [("org", row.org), *(("member", m) for m in row.members)]

    def memberships(self, principal: User) -> list[Any]:
        return [("member", principal.id), *(("org", o) for o in principal.orgs)]


class _Store:
    async def read_many(self, conn: Any, keys: Any) -> list[Board]:
        return []

    def key_of(self, row: Board) -> int:
        return row.id


class BoardsView(Projector[Board, dict[str, Any], User, None]):
    NAME = "boards"
    NOUN = "board"
    STORE = _Store()  # type: ignore[assignment]
    VISIBILITY = BoardCohorts()

    async def populate(self, cx: Any, query: None) -> list[Any]:
        return []

    def project(self, row: Board, principal: User) -> dict[str, Any]:
        return {"id": row.id}


class OwnBoardsOnly(BoardsView):
    NAME = "own_boards"

    def visible(self, row: Board, principal: User) -> bool:
        return super().visible(row, principal) and principal.id in row.members


class PerImpactBoards(BoardsView):
    NAME = "per_impact_boards"
    RESET_THRESHOLD = 3

    def emission(self, impact: Impact) -> Emission:
        return PerImpact


class RlsBoards(BoardsView):
    NAME = "rls_boards"
    VISIBILITY = Unrestricted()  # type: ignore[assignment]
    RLS = True


_boards = st.builds(Board, st.integers(0, 20), st.integers(0, 3), st.frozensets(st.sampled_from("abc"), max_size=2))
_users = st.builds(User, st.sampled_from("abcd"), st.frozensets(st.integers(0, 3), max_size=2))


@given(board=_boards, user=_users)
def test_one_rule_gives_the_filter_the_gate_and_visible(board: Board, user: User) -> None:
    """One visibility rule gives the same answer as visible, as the gate, as the projector's render
    gate and as the window's cohort filter (property test)."""
    visibility = BoardCohorts()
    expected = board.org in user.orgs or user.id in board.members
    assert visibility.visible(board, user) is expected
    assert visibility.gate(user)(board) is expected
    assert BoardsView().render_gate(user)(board) is expected
    window = visibility.window(user)
    assert window is not None and (not window.isdisjoint(visibility.cohorts(board))) is expected


@given(board=_boards, user=_users)
def test_an_overridden_visible_narrows_the_render_gate(board: Board, user: User) -> None:
    """A projector overriding visible renders through it, and never shows a row its visibility's
    cohorts hide (property test)."""
    projector = OwnBoardsOnly()
    assert projector.render_gate(user)(board) is projector.visible(board, user)
    if projector.visible(board, user):
        assert BoardCohorts().visible(board, user)


def test_unrestricted_is_an_explicit_open_gate() -> None:
    """Unrestricted lets every row through and puts no cohort filter on the window."""
    open_gate = Unrestricted()
    assert open_gate.visible(Board(1, 1), User("x", frozenset()))
    assert open_gate.gate(User("x", frozenset()))(Board(1, 1))
    assert open_gate.window(User("x", frozenset())) is None


def test_route_of_calls_emission_only_when_overridden() -> None:
    """A projector's route carries an emission only when it overrides it; the default emission
    coalesces."""
    assert route_of(BoardsView()).emission is None
    assert route_of(BoardsView()).nouns == {"board": None}
    per_impact = route_of(PerImpactBoards())
    assert per_impact.emission is not None
    assert per_impact.emission(Impact.entity("board", 1, Cause("x"))) is PerImpact
    assert BoardsView().emission(Impact.entity("board", 1)) is Coalesced


def test_a_per_impact_view_folds_causeless_impacts_coalesced() -> None:  # s166
    """A per-impact view gets each caused impact apart and folds causeless ones coalesced (s166)."""
    interest: Interest[str] = Interest()
    interest.register(route_of(PerImpactBoards()))
    interest.watch("s", "per_impact_boards", '"a"', None)
    created = Cause("board.created")
    frame = interest.route([[Impact.entity("board", 1, created), Impact.entity("board", 2)]])
    dirty = frame.projectors["per_impact_boards"]
    assert dirty.caused == [("1", created)]
    assert dirty.keys == {"1": 1, "2": 2}


def test_reset_threshold_per_projector_overrides_the_global() -> None:  # s165
    """A projector's own RESET_THRESHOLD overrides the engine's (s165)."""
    assert reset_threshold_for(BoardsView(), 64) == 64
    assert reset_threshold_for(PerImpactBoards(), 64) == 3


def test_window_rls_assertion_is_validated_at_attach() -> None:  # s168
    """A window's RLS assertion must match its projector's regime, and an RLS projector needs an
    applier; both refusals are AttachErrors (s168)."""
    applier = object()
    check_window_spec(BoardsView(), WindowSpec(Keys([1])), None)
    check_window_spec(RlsBoards(), WindowSpec(Keys([1]), rls=True), applier)  # type: ignore[arg-type]
    with pytest.raises(RlsRegimeMismatch):
        check_window_spec(BoardsView(), WindowSpec(Keys([1]), rls=True), applier)  # type: ignore[arg-type]
    with pytest.raises(RlsRegimeMismatch):
        check_window_spec(RlsBoards(), WindowSpec(Keys([1])), applier)  # type: ignore[arg-type]
    with pytest.raises(MissingRlsApplier):
        check_window_spec(RlsBoards(), WindowSpec(Keys([1]), rls=True), None)
    assert issubclass(RlsRegimeMismatch, AttachError) and issubclass(MissingRlsApplier, AttachError)


def test_incomplete_declarations_are_refused() -> None:
    """A projector missing NAME, NOUN, STORE or VISIBILITY, or with a reset threshold of 0, is
    refused naming them (an InvalidProjector is a ConfigError)."""
    class Bare(Projector[Any, Any, Any, Any]):
        async def populate(self, cx: Any, query: Any) -> list[Any]:
            return []

        def project(self, row: Any, principal: Any) -> Any:
            return row

    class BadThreshold(BoardsView):
        RESET_THRESHOLD = 0

    with pytest.raises(InvalidProjector) as info:
        check_projector(Bare())
    message = str(info.value)
    for attr in ("NAME", "NOUN", "STORE", "VISIBILITY"):
        assert attr in message
    with pytest.raises(InvalidProjector, match="RESET_THRESHOLD"):
        check_projector(BadThreshold())
    assert issubclass(InvalidProjector, ConfigError)
    check_projector(BoardsView())
    check_projector(RlsBoards())


def test_check_window_matches_visibility() -> None:
    """check_window_matches_visibility refuses a window holding an invisible or unknown row, or
    lacking a visible one, naming the keys."""
    user = User("a", frozenset({1}))
    rows = {canonical_json(b.id): b for b in [Board(1, 1), Board(2, 2), Board(3, 2, frozenset({"a"}))]}
    check_window_matches_visibility(BoardsView(), user, rows, ["1", "3"])
    with pytest.raises(VisibilityMismatch, match=r"invisible or unknown \['2'\]"):
        check_window_matches_visibility(BoardsView(), user, rows, ["1", "2", "3"])
    with pytest.raises(VisibilityMismatch, match=r"lacks visible \['3'\]"):
        check_window_matches_visibility(BoardsView(), user, rows, ["1"])
