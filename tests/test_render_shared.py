"""One render per window held, not per session (`Session.render_shared`).

Sessions of one pass's group share the plan, the views and the causes; those
holding equal windows are diffed once and share the result. These tests hold
that sharing changes nothing a subscriber can see: every session's deltas
(their kind, key, view and cause, in order), its revision, its window and its
head are what rendering it alone gives, pass after pass, and a session that
later changes its window alone (a page, a render of its own) never changes
another's.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service_engine.impacts.model import Cause
from service_engine.render import (
    CohortKey,
    Keys,
    Ordered,
    Remove,
    Reset,
    Session,
    SessionId,
    Upsert,
)
from service_engine.render.membership import RenderPlan
from service_engine.render.window_diff import SHARED_RENDERS, SharedRender, SharedWindow
from tests.render_support import RankQuery

_KEYS = ["1", "2", "3", "4", "5"]
_keys = st.sampled_from(_KEYS)
_views = st.sampled_from(["a", "b", "c"])
_windows = st.dictionaries(_keys, _views, max_size=5)


def _session(name: str, population: Any) -> Session[str, str]:
    return Session(
        SessionId(name), "cards", name, f'"{name}"', CohortKey.of_principal(name),
        population, repair_attempts=3, now=0.0,
    )


def _live(name: str, population: Any, window: dict[str, str]) -> Session[str, str]:
    session = _session(name, population)
    session.begin_snapshot()
    if isinstance(population, Keys):
        session.go_live(None, window)
    else:
        session.go_live(dict.fromkeys(window, 0), window)
    return session


def _shape(deltas: list[Any]) -> list[tuple[Any, ...]]:
    """What a subscriber sees of deltas, their revisions aside (a stream
    numbers what its reader takes)."""
    out: list[tuple[Any, ...]] = []
    for delta in deltas:
        if isinstance(delta, Upsert):
            out.append(("upsert", delta.key, delta.view, delta.cause))
        elif isinstance(delta, Remove):
            out.append(("remove", delta.key, delta.cause))
        else:
            assert isinstance(delta, Reset)
            out.append(("reset", delta.revision, dict(delta.views)))
    return out


_passes = st.lists(
    st.tuples(
        st.dictionaries(_keys, st.just(0), min_size=1, max_size=5),  # the change (scope)
        _windows,  # the views that render
        st.lists(_keys, max_size=2),  # caused keys
        st.integers(min_value=1, max_value=6),  # the reset threshold
    ),
    min_size=1, max_size=6,
)


@settings(max_examples=120, deadline=None)
@given(
    starts=st.lists(st.sampled_from([{}, {"1": "a"}, {"1": "a", "2": "b"}, {"3": "c"}]),
                    min_size=1, max_size=8),
    passes=_passes,
    fixed=st.booleans(),
)
def test_shared_render_equals_rendering_each_session_alone(
    starts: list[dict[str, str]], passes: list[Any], fixed: bool
) -> None:
    """Every session rendered through a group's shared memo gets the deltas,
    revision, window and head it gets rendered alone, over several passes."""

    def population() -> Any:
        return Keys(_KEYS[:3]) if fixed else Ordered(RankQuery())

    shared = [_live(f"s{i}", population(), dict(w)) for i, w in enumerate(starts)]
    alone = [_live(f"s{i}", population(), dict(w)) for i, w in enumerate(starts)]
    cause = Cause("card.moved")
    for scope, rendered, caused_keys, threshold in passes:
        plan = RenderPlan(scope)
        visible = {k: v for k, v in rendered.items() if k in scope}
        caused = [(k, cause) for k in caused_keys]
        renders: list[SharedRender[str]] = []
        for one, other in zip(shared, alone, strict=True):
            got = one.render_shared(plan, visible, threshold=threshold, caused=caused,
                                    renders=renders)
            want = other.render(plan, visible, threshold=threshold, caused=caused)
            assert _shape(got) == _shape(want)
            assert one.revision == other.revision
            assert one.last_sent == other.last_sent
            assert list(one.last_sent) == list(other.last_sent)  # window order too
            assert one.membership.head == other.membership.head
        assert len(renders) <= SHARED_RENDERS


def test_equal_windows_are_diffed_once_and_share_their_result() -> None:
    """Sessions holding equal windows take one render: the same delta
    objects, one window object and one head object between them."""
    sessions = [_live(f"s{i}", Ordered(RankQuery()), {"1": "a"}) for i in range(3)]
    renders: list[SharedRender[str]] = []
    plan = RenderPlan({"1": 0, "2": 0})
    results = [s.render_shared(plan, {"1": "b", "2": "c"}, threshold=10, renders=renders)
               for s in sessions]
    assert len(renders) == 1
    assert all(r is results[0] for r in results)
    assert _shape(results[0]) == [("upsert", "1", "b", None), ("upsert", "2", "c", None)]
    assert all(s.last_sent is sessions[0].last_sent for s in sessions)
    assert all(s.membership.head is sessions[0].membership.head for s in sessions)
    assert [s.revision for s in sessions] == [3, 3, 3]


def test_a_session_changing_its_shared_window_alone_leaves_the_others_as_they_were() -> None:
    """Copy on write: after a shared render, one session's own render (or
    page) changes its window and head only."""
    first, second = (_live(f"s{i}", Ordered(RankQuery()), {"1": "a"}) for i in range(2))
    renders: list[SharedRender[str]] = []
    plan = RenderPlan({"2": 0})
    for session in (first, second):
        session.render_shared(plan, {"2": "b"}, threshold=10, renders=renders)
    assert first.last_sent is second.last_sent
    deltas = first.render(RenderPlan({"1": 0, "3": 0}), {"3": "c"}, threshold=10)
    assert _shape(deltas) == [("remove", "1", None), ("upsert", "3", "c", None)]
    assert first.last_sent == {"2": "b", "3": "c"}
    assert second.last_sent == {"1": "a", "2": "b"}
    assert second.membership.head == {"1": 0, "2": 0}
    assert first.membership.head == {"2": 0, "3": 0}

    # A page settles into its own copy too.
    third, fourth = (_live(f"t{i}", Ordered(RankQuery()), {"1": "a"}) for i in range(2))
    renders = []
    for session in (third, fourth):
        session.render_shared(RenderPlan({"2": 0}), {"2": "b"}, threshold=10, renders=renders)
    ticket = third.open_page(None)
    third.settle_page(ticket, {"4": 0}, {"4": "d"}, capacity=10)
    assert third.last_sent == {"1": "a", "2": "b", "4": "d"}
    assert fourth.last_sent == {"1": "a", "2": "b"}


def test_a_session_with_pages_or_a_page_in_flight_renders_alone() -> None:
    """A window with pages, or a page being read, takes no shared render
    and adds none (its pages and page tickets are its own)."""
    paged = _live("p", Ordered(RankQuery()), {"1": "a"})
    ticket = paged.open_page(None)
    renders: list[SharedRender[str]] = []
    paged.render_shared(RenderPlan({"2": 0}), {"2": "b"}, threshold=10, renders=renders)
    assert renders == []
    assert "2" in ticket.touched
    paged.settle_page(ticket, {"4": 0}, {"4": "d"}, capacity=10)
    assert len(paged.pages)
    paged.render_shared(RenderPlan({"2": 0}), {"2": "c"}, threshold=10, renders=renders)
    assert renders == []
    assert paged.last_sent["2"] == "c"


def test_snapshots_completing_with_equal_windows_hold_one_window() -> None:
    """Sessions of one snapshot batch that complete with equal windows (and
    heads, in the same order) hold one window and one head; each still gets
    its own Reset, and a later render of its own copies before it changes."""
    shares: list[SharedWindow[str]] = []
    sessions = [_session(f"s{i}", Ordered(RankQuery())) for i in range(3)]
    resets = []
    for session in sessions:
        session.begin_snapshot()
        resets.append(session.go_live({"1": 0, "2": 0}, {"1": "a", "2": "b"}, shares))
    other = _session("o", Ordered(RankQuery()))
    other.begin_snapshot()
    other.go_live({"2": 0, "1": 0}, {"2": "b", "1": "a"}, shares)  # another order
    assert len(shares) == 2
    assert all(s.last_sent is sessions[0].last_sent for s in sessions)
    assert all(s.membership.head is sessions[0].membership.head for s in sessions)
    assert other.last_sent is not sessions[0].last_sent
    assert list(other.last_sent) == ["2", "1"]
    assert all(r == Reset(1, {"1": "a", "2": "b"}) for r in resets)
    assert len({id(r) for r in resets}) == 3
    sessions[0].render(RenderPlan({"1": 0}), {}, threshold=10)
    assert sessions[0].last_sent == {"2": "b"}
    assert sessions[1].last_sent == {"1": "a", "2": "b"}
    assert sessions[1].membership.head == {"1": 0, "2": 0}
