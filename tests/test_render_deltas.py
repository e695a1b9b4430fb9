"""Deltas: the minimal diff, contiguous revisions, Reset past the threshold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service_engine.impacts.model import Cause, canonical_json
from service_engine.render import (
    CohortKey,
    Dirty,
    Keys,
    Remove,
    RenderPlan,
    Reset,
    RevisionGap,
    Session,
    SessionId,
    Upsert,
    WindowReplica,
    apply_change,
    decode_key,
    diff_window,
    keyed,
)

_keys = st.integers(min_value=0, max_value=12).map(canonical_json)
_views = st.one_of(st.none(), st.integers(min_value=0, max_value=3), st.text(max_size=2))
_windows = st.dictionaries(_keys, _views, max_size=10)


def _apply(last: dict[str, object], changes: list[Any]) -> dict[str, object]:
    window = dict(last)
    for change in changes:
        apply_change(window, change)
    return window


def test_equal_windows_diff_to_nothing() -> None:
    """Two equal windows diff to no delta."""
    window = {"1": "a", "2": "b"}
    assert diff_window(window, dict(window), revision=7) == []


def test_changed_added_and_removed_keys() -> None:
    """The diff sends Removes of vanished keys, then Upserts of changed and new ones, on revisions
    counting on from the given one."""
    last = {"1": "a", "2": "b", "3": "c"}
    rendered = {"1": "a", "2": "B", "4": "d"}
    assert diff_window(last, rendered, revision=10) == [
        Remove(11, "3"),
        Upsert(12, "2", "B"),
        Upsert(13, "4", "d"),
    ]


def test_views_compare_by_value_not_identity() -> None:
    """Views are compared by value: an equal view sends nothing, a changed one an Upsert."""
    @dataclass(frozen=True)
    class View:
        title: str
        tags: tuple[str, ...]

    last = {"1": View("t", ("x",))}
    assert diff_window(last, {"1": View("t", ("x",))}, revision=0) == []
    assert diff_window(last, {"1": View("t", ("y",))}, revision=0) == [
        Upsert(1, "1", View("t", ("y",)))
    ]


def test_a_none_view_is_a_view_not_an_absence() -> None:
    """A None view is a view: appearing is an Upsert, staying None nothing, leaving a Remove."""
    assert diff_window({}, {"1": None}, revision=0) == [Upsert(1, "1", None)]
    assert diff_window({"1": None}, {"1": None}, revision=0) == []
    assert diff_window({"1": None}, {}, revision=0) == [Remove(1, "1")]


def test_scope_limits_the_diff_to_the_keys_looked_at() -> None:
    """A scoped diff touches only the scoped keys; a key outside the scope is left alone though
    rendered lacks it."""
    last = {"1": "a", "2": "b", "3": "c"}
    # "3" is outside the scope: left alone although rendered lacks it.
    changes = diff_window(last, {"1": "A", "5": "e"}, revision=0, scope=["1", "2", "5"])
    assert changes == [Upsert(1, "1", "A"), Remove(2, "2"), Upsert(3, "5", "e")]


def test_scoped_key_absent_everywhere_sends_nothing() -> None:
    """A scoped key absent from both windows sends nothing."""
    assert diff_window({"1": "a"}, {}, revision=0, scope=["9"]) == []


def test_decode_key_round_trips_canonical_text() -> None:
    """decode_key reads a key back from its canonical JSON text."""
    for key in [1, "a", [1, "b"], {"z": 1, "a": [2]}]:
        assert decode_key(canonical_json(key)) == key


@settings(max_examples=150)
@given(last=_windows, rendered=_windows, revision=st.integers(min_value=0, max_value=10**6))
def test_full_diff_applied_yields_rendered_exactly(
    last: dict[str, object], rendered: dict[str, object], revision: int
) -> None:
    """Applying a full diff to the last window gives the rendered one, on contiguous revisions, with
    one delta per differing key and none for the rest (property test)."""
    changes = diff_window(last, rendered, revision=revision)
    assert _apply(last, changes) == rendered
    assert [c.revision for c in changes] == list(range(revision + 1, revision + 1 + len(changes)))
    # Minimal: one delta per key that differs, none for the rest.
    differing = {k for k in last.keys() | rendered.keys() if last.get(k, ...) != rendered.get(k, ...)}
    assert sorted(c.key for c in changes) == sorted(differing)


@settings(max_examples=150)
@given(last=_windows, rendered=_windows, scope=st.sets(_keys, max_size=8))
def test_scoped_diff_moves_exactly_the_scope(
    last: dict[str, object], rendered: dict[str, object], scope: set[str]
) -> None:
    """A scoped diff brings exactly the scoped keys to their rendered state and leaves every other
    key as it was (property test)."""
    changes = diff_window(last, rendered, revision=0, scope=scope)
    after = _apply(last, changes)
    for key in scope:
        assert after.get(key, ...) == rendered.get(key, ...)
    for key in last.keys() - scope:
        assert after[key] == last[key]
    assert all(c.key in scope for c in changes)


def test_replica_requires_a_reset_first_and_contiguous_revisions() -> None:
    """A replica refuses a delta before its first Reset and any revision gap, and applies contiguous
    Upserts and Removes."""
    replica: WindowReplica[str] = WindowReplica()
    with pytest.raises(RevisionGap):
        replica.apply(Upsert(1, "1", "a"))
    replica.apply(Reset(1, {"1": "a"}))
    with pytest.raises(RevisionGap):
        replica.apply(Upsert(3, "2", "b"))
    with pytest.raises(RevisionGap):
        replica.apply(Remove(2, "9"))
    replica.apply(Upsert(2, "2", "b"))
    replica.apply(Remove(3, "1"))
    assert replica.views == {"2": "b"} and replica.revision == 3


def _live_session(window: dict[str, object]) -> Session[object, object]:
    session: Session[object, object] = Session(
        SessionId("s"), "p", object(), '"u"', CohortKey.of_principal("u"),
        Keys(decode_key(k) for k in window), repair_attempts=3,
    )
    session.begin_snapshot()
    session.go_live(None, window)
    return session


@settings(max_examples=100)
@given(
    start=_windows,
    frames=st.lists(_windows, min_size=1, max_size=6),
    threshold=st.integers(min_value=0, max_value=6),
)
def test_session_render_keeps_replica_equal_and_revisions_contiguous(
    start: dict[str, object], frames: list[dict[str, object]], threshold: int
) -> None:
    """Over any sequence of renders a replica fed the session's deltas equals what the session sent,
    revisions stay contiguous, and more changes than the threshold become one Reset of the whole
    window (property test)."""
    universe = keyed(range(13))
    session: Session[object, object] = Session(
        SessionId("s"), "p", object(), '"u"', CohortKey.of_principal("u"),
        Keys(universe.values()), repair_attempts=3,
    )
    session.begin_snapshot()
    replica: WindowReplica[object] = WindowReplica()
    replica.apply(session.go_live(None, start))
    for rendered in frames:
        dirty = Dirty(keys=dict(universe))
        plan = session.plan(dirty)
        before = session.revision
        deltas = session.render(plan, rendered, threshold=threshold)
        replica.apply_all(deltas)
        assert replica.views == session.last_sent == rendered
        assert session.revision == before + len(deltas)
        if deltas and isinstance(deltas[0], Reset):
            # A Reset replaces, alone, more deltas than the threshold allows,
            # and carries the whole window.
            assert len(deltas) == 1 and deltas[0].views == rendered
        else:
            assert len(deltas) <= threshold


def test_reset_threshold_sends_one_reset_with_the_whole_window() -> None:
    """More changes than the threshold send one Reset carrying the whole window; fewer send Upserts."""
    session = _live_session({"1": "a", "2": "b", "3": "c"})
    plan = RenderPlan(keyed([1, 2, 3]))
    deltas = session.render(plan, {"1": "A", "2": "B", "3": "C"}, threshold=2)
    assert deltas == [Reset(2, {"1": "A", "2": "B", "3": "C"})]
    deltas = session.render(plan, {"1": "A", "2": "B", "3": "x"}, threshold=2)
    assert deltas == [Upsert(3, "3", "x")]


def test_reset_views_are_not_aliased_to_last_sent() -> None:
    """A Reset's views are not the session's own window: later renders do not change a Reset already
    sent."""
    session = _live_session({"1": "a"})
    reset = session.render(RenderPlan(keyed([1, 2])), {"1": "b", "2": "c"}, threshold=0)[0]
    assert isinstance(reset, Reset)
    session.render(RenderPlan(keyed([1])), {"1": "z"}, threshold=10)
    assert reset.views == {"1": "b", "2": "c"}


def test_per_impact_cause_rides_each_caused_delta() -> None:
    """A per-impact render sends one delta per caused impact, each carrying its cause, even where
    the view did not change."""
    session = _live_session({"1": "a", "2": "b"})
    moved, renamed = Cause("card.moved", {"to": 2}), Cause("card.renamed")
    plan = RenderPlan(keyed([1, 2]))
    deltas = session.render(
        plan, {"1": "a2", "2": "b"}, threshold=10,
        caused=[("1", moved), ("1", renamed), ("2", renamed)],
    )
    # One delta per caused impact, even where the view did not change.
    assert deltas == [
        Upsert(2, "1", "a2", moved),
        Upsert(3, "1", "a2", renamed),
        Upsert(4, "2", "b", renamed),
    ]


def test_per_impact_remove_carries_its_cause_once() -> None:
    """A key removed under several causes is one Remove carrying the cause."""
    session = _live_session({"1": "a"})
    gone = Cause("card.deleted")
    deltas = session.render(RenderPlan(keyed([1])), {}, threshold=10, caused=[("1", gone), ("1", gone)])
    assert deltas == [Remove(2, "1", gone)]


def test_caused_impacts_outside_the_scope_are_ignored() -> None:
    """A caused impact for a key outside the plan's scope sends nothing."""
    session = _live_session({"1": "a"})
    deltas = session.render(
        RenderPlan(keyed([1])), {"1": "a"}, threshold=10, caused=[("2", Cause("x"))]
    )
    assert deltas == []


@settings(max_examples=150)
@given(last=_windows, rendered=_windows, scope=st.lists(_keys, max_size=8, unique=True))
def test_session_render_is_diff_window_applied(
    last: dict[str, object], rendered: dict[str, object], scope: list[str]
) -> None:
    """Session.render sends exactly the reference diff's deltas and ends at the window that diff
    leads to (property test)."""
    # Session.render fuses the diff and its application for speed; it must
    # send exactly what the reference diff says, and end where it leads.
    session = _live_session(last)
    expected = diff_window(last, rendered, revision=1, scope=scope)
    deltas = session.render(RenderPlan(dict.fromkeys(scope)), rendered, threshold=100)
    assert deltas == expected
    assert session.last_sent == _apply(last, expected)
