"""Paging behind a live window: Upserts only, capacity, races, ownership."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_engine.impacts.model import canonical_json
from service_engine.render import (
    IllegalTransition,
    Keys,
    NoLiveSession,
    NotPageable,
    Ordered,
    PageInterrupted,
    PageResult,
    Pages,
    Query,
    Remove,
    Reset,
    Session,
    Upsert,
    authorize_page,
    keyed,
)
from tests.render_support import Model, Principal, RankQuery, Row, View, project, visible

HEAD_FROM = 20  # the live head lists rows ranked 20 and up


def _model(rows: int = 30, *, capacity: int = 1000, threshold: int = 64) -> Model:
    model = Model(capacity=capacity, threshold=threshold)
    model.principals["alice"] = Principal("alice", frozenset({"red"}))
    model.principals["bob"] = Principal("bob", frozenset({"red"}))
    for key in range(rows):
        model.rows[key] = Row(key, "red", key)
    return model


def _attach(model: Model, sid: str = "s", principal: str = "alice", population: Any = None) -> Session[Principal, View]:
    session = model.new_session(sid, principal, population or Ordered(RankQuery(min_rank=HEAD_FROM)))
    model.snapshot(session)
    return session


def _page(model: Model, session: Session[Principal, View], before: int, size: int) -> PageResult[View]:
    ticket = session.open_page(before)
    keys = model.populate(session.principal, RankQuery(before=before, limit=size))
    rendered = model.render(session, keys)
    result = session.settle_page(ticket, keys, rendered, capacity=model.capacity)
    replica = model.replicas[session.id]
    replica.release(result.released)
    replica.apply_all(result.deltas)
    return result


def test_a_page_appends_older_keys_as_upserts_never_a_reset() -> None:
    """A page appends the older keys as Upserts on the next revisions, never a Reset (even past the
    reset threshold), recorded as one page."""
    model = _model(threshold=0)  # even past the reset threshold
    session = _attach(model)
    assert session.revision == 1 and len(session.last_sent) == 10
    result = _page(model, session, before=HEAD_FROM, size=5)
    assert all(isinstance(d, Upsert) for d in result.deltas)
    assert [d.revision for d in result.deltas] == [2, 3, 4, 5, 6]
    assert [d.key for d in result.deltas] == ["19", "18", "17", "16", "15"]
    assert session.pages.pages() == [("19", "18", "17", "16", "15")]
    assert model.replicas[session.id].views == session.last_sent


def test_an_edit_to_an_old_paged_row_reaches_its_holder() -> None:  # s162
    """An edit to a paged row reaches the session holding it as an Upsert, a delete as a Remove that
    drops it from the pages (s162)."""
    model = _model()
    session = _attach(model)
    _page(model, session, before=HEAD_FROM, size=5)
    deltas = model.deliver(model.write(Row(16, "red", 16, "edited")))[session.id]
    assert deltas == [Upsert(7, "16", (16, "edited", 16))]
    deltas = model.deliver(model.delete(17))[session.id]
    assert deltas == [Remove(8, "17")]
    assert "17" not in session.pages
    assert model.replicas[session.id].views == session.last_sent


def test_window_capacity_releases_the_oldest_page_silently() -> None:  # s163
    """Past the window's capacity the oldest page is released without a Remove or Reset, the live
    head kept, the replica still equal (s163)."""
    model = _model(capacity=18)
    session = _attach(model)  # head: 10 keys
    head = dict(session.membership.head)
    first = _page(model, session, before=20, size=4)
    second = _page(model, session, before=16, size=4)
    assert first.released == second.released == ()
    third = _page(model, session, before=12, size=4)
    assert third.released == ("19", "18", "17", "16")
    assert not any(isinstance(d, Remove | Reset) for d in third.deltas)
    assert dict(session.membership.head) == head  # the live head is retained
    assert len(session.last_sent) == 18 and all(k not in session.last_sent for k in third.released)
    assert model.replicas[session.id].views == session.last_sent
    # A released key is no longer held: its edits are the window's business
    # again only if the head rediscovers it.
    assert session.pages.pages() == [("15", "14", "13", "12"), ("11", "10", "9", "8")]


def test_a_page_larger_than_the_room_behind_the_head_is_truncated() -> None:
    """A page larger than the room left behind the head is truncated; a later page releases the
    oldest to make room; no room accepts nothing."""
    pages = Pages()
    appended = pages.append(keyed(range(5)), head_size=8, capacity=10)
    assert appended.accepted == ("0", "1") and appended.truncated == 3
    appended = pages.append(keyed(range(5, 9)), head_size=8, capacity=10)
    assert appended.released == ("0", "1") and appended.accepted == ("5", "6")
    assert pages.append(keyed([1]), head_size=12, capacity=10).accepted == ()


def test_a_key_delivered_by_a_concurrent_pass_is_skipped() -> None:  # s183
    """A paged key that a concurrent render pass delivered, deleted or hid meanwhile is skipped, so
    the committed view wins and no ghost is left (s183)."""
    model = _model()
    session = _attach(model)
    ticket = session.open_page(HEAD_FROM)
    keys = model.populate(session.principal, RankQuery(before=HEAD_FROM, limit=4))  # 19..16
    rendered = model.render(session, keys)  # outside the lock: reads the old rows
    # Meanwhile a render pass delivers an edit of 18, a delete of 17 and
    # makes 16 invisible.
    model.deliver(model.write(Row(18, "red", 18, "new")), model.delete(17), model.write(Row(16, "blue", 16)))
    result = session.settle_page(ticket, keys, rendered, capacity=model.capacity)
    replica = model.replicas[session.id]
    replica.apply_all(result.deltas)
    assert set(result.skipped) == {"18", "17", "16"}
    assert [d.key for d in result.deltas] == ["19"]
    assert session.last_sent["18"] == (18, "new", 18)  # the committed view won
    assert "17" not in session.last_sent and "16" not in session.last_sent  # no ghosts
    assert replica.views == session.last_sent


def test_a_page_interrupted_by_a_resnapshot_must_run_again() -> None:
    """A page interrupted by a re-snapshot raises PageInterrupted, settles at most once, and cannot
    open while a snapshot runs."""
    model = _model()
    session = _attach(model)
    ticket = session.open_page(HEAD_FROM)
    model.snapshot(session)  # a reconnect Reset while the page renders
    with pytest.raises(PageInterrupted):
        session.settle_page(ticket, {}, {}, capacity=10)
    with pytest.raises(IllegalTransition):
        session.settle_page(ticket, {}, {}, capacity=10)  # settled once already
    session.begin_snapshot()
    with pytest.raises(PageInterrupted):
        session.open_page(HEAD_FROM)


def test_a_keys_window_has_no_pages() -> None:
    """A fixed Keys window cannot page: NotPageable."""
    model = _model()
    session = _attach(model, population=Keys([1, 2]))
    with pytest.raises(NotPageable):
        session.open_page(None)


def test_paged_history_survives_a_principal_refresh_and_a_reconnect() -> None:
    """Paged history survives a principal refresh (losing only what became invisible) and a
    reconnect Reset."""
    model = _model()
    session = _attach(model)
    _page(model, session, before=HEAD_FROM, size=5)
    model.rows[18] = Row(18, "blue", 18)  # only visible to blue
    model.deliver(model.set_cohorts("alice", frozenset({"red"})))  # facts refresh
    assert session.pages.pages() == [("19", "17", "16", "15")]
    assert model.replicas[session.id].views == session.last_sent
    model.snapshot(session)  # reconnect Reset
    reset_keys = set(model.replicas[session.id].views)
    assert {"19", "17", "16", "15"} <= reset_keys and "18" not in reset_keys
    assert session.pages.pages() == [("19", "17", "16", "15")]


def test_a_page_of_an_authoritative_window_survives_repopulation() -> None:
    """A page of an authoritative window survives its populate running again."""
    model = _model()
    session = _attach(model, population=Query(RankQuery(min_rank=HEAD_FROM)).with_keys())
    _page(model, session, before=HEAD_FROM, size=3)
    model.deliver(model.write(Row(25, "red", 25, "x")))  # re-runs populate
    assert session.pages.pages() == [("19", "18", "17")]
    assert {"19", "18", "17"} <= set(session.last_sent)


def test_paging_is_refused_for_a_session_the_caller_does_not_own() -> None:  # s167
    """Paging another principal's session, or one that is not live, is refused with the same
    NoLiveSession as a missing one, and changes nothing (s167)."""
    model = _model()
    victim = _attach(model, "victim", "alice")
    mine = _attach(model, "mine", "bob")
    revision = victim.revision
    errors = []
    for session, principal in [(None, '"bob"'), (victim, '"bob"')]:
        with pytest.raises(NoLiveSession) as info:
            authorize_page(session, principal)
        errors.append(str(info.value))
    assert errors[0] == errors[1]  # knowing the id buys nothing
    assert victim.revision == revision and victim.pages.page_count == 0
    assert authorize_page(mine, '"bob"') is mine
    _page(model, mine, before=HEAD_FROM, size=2)
    victim.fail("render failed")
    with pytest.raises(NoLiveSession):
        authorize_page(victim, '"alice"')


_actions = st.lists(
    st.one_of(
        st.tuples(st.just("page"), st.integers(1, 6)),
        st.tuples(st.just("write"), st.integers(0, 39), st.sampled_from(["red", "blue"]), st.integers(0, 39)),
        st.tuples(st.just("delete"), st.integers(0, 39)),
    ),
    max_size=20,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=_actions, capacity=st.integers(1, 20))
def test_paging_respects_capacity_and_keeps_the_window_true(
    actions: list[tuple[Any, ...]], capacity: int
) -> None:
    """Under any paging, writes and deletes the window keeps its live head, stays within capacity,
    shows exactly the visible committed views of its members, and its replica equals it (property
    test)."""
    model = _model(rows=40, capacity=capacity)
    session = _attach(model)
    cursor = HEAD_FROM
    for action in actions:
        if action[0] == "page":
            head_before = dict(session.membership.head)
            result = _page(model, session, before=cursor, size=action[1])
            cursor = max(cursor - action[1], 0)
            assert dict(session.membership.head) == head_before  # never drops the live head
            assert not set(result.released) & set(head_before)
            held = len(session.membership.head) + len(session.pages)
            assert held <= max(capacity, len(session.membership.head))
        elif action[0] == "write":
            _, key, cohort, rank = action
            model.deliver(model.write(Row(key, cohort, rank, f"w{rank}")))
        else:
            model.deliver(model.delete(action[1]))
        replica = model.replicas[session.id]
        assert replica.views == session.last_sent
        assert replica.revision == session.revision
        # Every view held is the committed, visible row's view: nothing stale.
        principal = session.principal
        for text, view in replica.views.items():
            row = model.rows.get(int(text))
            assert row is not None and visible(row, principal) and project(row, principal) == view
        # Every member whose row is visible is shown.
        for text in [*session.membership.head, *session.pages]:
            row = model.rows.get(int(text))
            if row is not None and visible(row, principal):
                assert text in replica.views
        assert not set(session.membership.head) & set(session.pages)
        assert all(canonical_json(int(k)) == k for k in session.last_sent)


def test_a_page_after_the_head_grew_past_capacity_releases_the_oldest_page() -> None:
    """A discovering head may grow behind held pages; the next page gesture
    restores ``window_capacity`` by releasing the oldest page silently, even
    when it appends nothing, and never drops the live head."""
    model = _model(rows=40, capacity=20)
    session = _attach(model)
    model.deliver(model.delete(20))  # the head holds 19 keys: room for one paged key
    _page(model, session, before=5, size=3)
    assert session.pages.pages() == [("4",)]
    model.deliver(model.write(Row(0, "red", 1, "w1")))  # discovered: the head is 20 again
    assert len(session.membership.head) == 20
    head = dict(session.membership.head)
    result = _page(model, session, before=2, size=1)  # lists key 0, already in the head
    assert result.deltas == () and result.released == ("4",)
    assert session.pages.pages() == [] and dict(session.membership.head) == head
    assert model.replicas[session.id].views == session.last_sent
