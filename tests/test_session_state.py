"""The session state machine, the connect barrier, repair, ids and expiry."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_engine.errors import AttachError, ConfigError
from service_engine.impacts.model import Impact
from service_engine.render import (
    CohortKey,
    Dirty,
    IllegalTransition,
    InvalidSessionId,
    Keys,
    Ordered,
    PrincipalChanged,
    Query,
    Reset,
    Session,
    SessionId,
    SessionState,
    Upsert,
    new_session_id,
    parse_session_id,
)
from tests.render_support import Model, Principal, RankQuery, Row


def _session(population: Any = None, *, attempts: int = 3, capacity: int = 10_000) -> Session[str, str]:
    return Session(
        SessionId("s1"), "cards", "alice", '"alice"', CohortKey.of_principal("alice"),
        population if population is not None else Keys([1, 2]),
        repair_attempts=attempts, barrier_capacity=capacity, now=100.0,
    )


def _live(session: Session[str, str], window: dict[str, str] | None = None) -> Session[str, str]:
    session.begin_snapshot()
    session.go_live(None, window or {})
    return session


# -- transitions ---------------------------------------------------------------------


def test_attach_goes_live_with_a_reset_at_revision_one() -> None:
    """A new session holds changes while attaching, snapshots its window's keys, and goes live with
    a Reset at revision 1 that becomes its last sent window."""
    session = _session()
    assert session.state is SessionState.ATTACHING and session.holding
    session.begin_snapshot()
    assert session.snapshot_keys(None) == {"1": 1, "2": 2}
    reset = session.go_live(None, {"1": "a"})
    assert reset == Reset(1, {"1": "a"})
    assert session.live and not session.holding and session.last_sent == {"1": "a"}


@pytest.mark.parametrize(
    ("prepare", "transition"),
    [
        ("attaching", lambda s: s.go_live(None, {})),  # no snapshot begun
        ("attaching", lambda s: s.repaired(None, {})),
        ("attaching", lambda s: s.resnapshot(None, {})),
        ("attaching", lambda s: s.render(s.membership.plan(Dirty(), s.pages), {}, threshold=1)),
        ("attaching", lambda s: s.plan(Dirty())),
        ("attaching", lambda s: s.take_held()),
        ("attaching", lambda s: s.open_page(None)),
        ("live", lambda s: s.hold(Dirty())),
        ("live", lambda s: s.go_live(None, {})),
        ("live", lambda s: s.snapshot_keys(None)),
        ("snapshotting", lambda s: s.begin_snapshot()),
        ("snapshotting", lambda s: s.plan(Dirty())),
        ("snapshotting", lambda s: s.go_live(None, {})),
        ("repair_pending", lambda s: s.plan(Dirty())),
        ("ended", lambda s: s.end("again")),
        ("ended", lambda s: s.fail("again")),
        ("ended", lambda s: s.begin_snapshot()),
        ("ended", lambda s: s.hold(Dirty())),
        ("ended", lambda s: s.refresh_principal("alice", '"alice"', s.cohort)),
    ],
)
def test_illegal_transitions_raise(prepare: str, transition: Any) -> None:
    """Each transition out of order for the session's state (live before a snapshot, planning while
    attaching, anything once ended, ...) raises IllegalTransition."""
    session = _session()
    if prepare in ("live", "snapshotting"):
        _live(session)
    if prepare == "snapshotting":
        session.begin_snapshot()
    if prepare == "repair_pending":
        session.fail("boom")
    if prepare == "ended":
        session.end("bye")
    with pytest.raises(IllegalTransition):
        transition(session)


def test_resnapshot_keeps_revisions_contiguous() -> None:
    """A re-snapshot of a live session holds changes meanwhile and sends a Reset on the next
    revision."""
    session = _live(_session(), {"1": "a"})
    plan = session.plan(Dirty(keys={"1": 1}))
    assert session.render(plan, {"1": "b"}, threshold=5) == [Upsert(2, "1", "b")]
    session.begin_snapshot()
    assert session.holding and not session.live
    assert session.resnapshot(None, {"1": "c", "2": "d"}) == Reset(3, {"1": "c", "2": "d"})


# -- repair -------------------------------------------------------------------------


def test_failures_are_retried_then_the_session_ends() -> None:
    """A failure moves the session to repair with an empty last sent window; after repair_attempts
    consecutive failures it ends, naming the count."""
    session = _live(_session(attempts=3), {"1": "a"})
    assert session.fail("render failed") is SessionState.REPAIR_PENDING
    assert session.last_sent == {}  # never the base of a later Reset
    assert session.holding
    session.begin_snapshot()
    assert session.fail("repair failed") is SessionState.REPAIR_PENDING
    session.begin_snapshot()
    assert session.fail("repair failed again") is SessionState.ENDED
    assert session.ended and "3 consecutive failures" in (session.end_reason or "")


def test_a_successful_repair_resets_the_count_and_sends_a_fresh_reset() -> None:
    """A successful repair sends a Reset of committed state on the next revision and restarts the
    failure count."""
    session = _live(_session(attempts=2), {"1": "a"})
    session.fail("render failed")
    session.begin_snapshot()
    assert session.repaired(None, {"1": "committed"}) == Reset(2, {"1": "committed"})
    assert session.attempts == 0 and session.live
    assert session.fail("once more") is SessionState.REPAIR_PENDING  # count restarted


def test_an_attach_whose_snapshot_fails_goes_to_repair() -> None:
    """An attach whose snapshot fails goes to repair, and the repair goes live with a Reset at
    revision 1."""
    session = _session()
    session.begin_snapshot()
    assert session.fail("populate failed") is SessionState.REPAIR_PENDING
    session.begin_snapshot()
    assert session.repaired(None, {}) == Reset(1, {})


def test_repair_attempts_must_be_positive() -> None:
    """A session with repair_attempts 0 is refused with ConfigError."""
    with pytest.raises(ConfigError):
        _session(attempts=0)


# -- the connect barrier -----------------------------------------------------------


def test_changes_during_the_snapshot_are_held_and_replayed_once() -> None:
    """Changes arriving during the snapshot are merged and handed back once after going live."""
    session = _session(Query("q"))
    session.begin_snapshot()
    session.hold(Dirty(keys={"5": 5}))
    session.hold(Dirty(keys={"6": 6}, principals={'"alice"'}))
    session.go_live(Dirty().keys, {})
    held = session.take_held()
    assert held is not None and held.keys == {"5": 5, "6": 6} and held.principals == {'"alice"'}
    assert session.take_held() is None


def test_begin_snapshot_drops_what_the_snapshot_will_cover() -> None:
    """Changes held before the snapshot begins are dropped: the snapshot's reads cover them."""
    session = _session(attempts=3)
    session.hold(Dirty(keys={"1": 1}))  # before the snapshot's reads
    session.begin_snapshot()
    session.go_live(None, {})
    assert session.take_held() is None


def test_a_barrier_overflow_collapses_to_everything() -> None:
    """More held keys than the barrier's capacity collapse to dirty everything."""
    session = _session(capacity=3)
    session.begin_snapshot()
    session.hold(Dirty(keys={str(i): i for i in range(5)}))
    session.go_live(None, {})
    held = session.take_held()
    assert held is not None and held.everything and not held.keys


def test_held_dirty_sets_are_copied_not_aliased() -> None:
    """A held dirty set is a copy: the frame's later changes to its own set do not reach it."""
    session = _session()
    frame_dirty = Dirty(keys={"1": 1})
    session.hold(frame_dirty)
    frame_dirty.keys["2"] = 2
    session.begin_snapshot()  # drops it anyway; hold again during the snapshot
    session.hold(frame_dirty)
    frame_dirty.keys["3"] = 3
    session.go_live(None, {})
    held = session.take_held()
    assert held is not None and held.keys == {"1": 1, "2": 2}


_storm = st.lists(
    st.tuples(
        st.sampled_from(["before_populate", "before_load", "after_load"]),
        st.integers(0, 6),
        st.sampled_from(["red", "blue"]),
        st.booleans(),
    ),
    max_size=20,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(storm=_storm, shape=st.sampled_from(["keys", "ordered", "auth"]))
def test_a_write_storm_during_attach_loses_nothing_and_sends_nothing_twice(
    storm: list[tuple[str, int, str, bool]], shape: str
) -> None:
    """Writers commit before populate, between populate and the load, and
    after the load while the snapshot is still in flight; the listener
    delivers each commit at some point during the attach. After the replay
    the window equals committed state, and every delta moves something."""
    model = Model(threshold=1000)
    model.principals["alice"] = Principal("alice", frozenset({"red"}))
    for key in range(4):
        model.rows[key] = Row(key, "red", key)
    population: Any = {
        "keys": Keys([0, 1, 2, 5, 6]),
        "ordered": Ordered(RankQuery()),
        "auth": Query(RankQuery(min_rank=1)).with_keys(),
    }[shape]
    session = model.new_session("s", "alice", population)
    counter = iter(range(1000))

    def write(phase: str) -> None:
        for when, key, cohort, delete in storm:
            if when != phase:
                continue
            if delete:
                impacts = model.delete(key)
            else:
                impacts = model.write(Row(key, cohort, key % 3, f"v{next(counter)}"))
            model.deliver(impacts)  # routed now: held by the barrier

    # The attach, spelled out so writers can land between its steps.
    session.begin_snapshot()
    write("before_populate")
    populated = model.populate(session.principal, model.query_of(session)) if session.membership.populates else None
    write("before_load")
    rendered = model.render(session, session.snapshot_keys(populated))
    write("after_load")
    model.replicas[session.id].apply(session.go_live(populated, rendered))
    held = session.take_held()
    deltas = model.render_session(session, held) if held is not None else []
    assert model.replicas[session.id].views == model.expected(session)
    # Nothing delivered twice: each delta changes what the subscriber holds.
    replica_before = dict(rendered)
    for delta in deltas:
        assert not isinstance(delta, Reset)
        if isinstance(delta, Upsert):
            assert replica_before.get(delta.key) != delta.view
            replica_before[delta.key] = delta.view
        else:
            assert delta.key in replica_before
            replica_before.pop(delta.key)
    # And the session stays correct afterwards.
    model.deliver(model.write(Row(0, "red", 2, "after")))
    assert model.replicas[session.id].views == model.expected(session)


def test_a_principal_change_during_attach_is_applied_after_the_snapshot() -> None:
    """A principal-facts change arriving during the attach is held and applied after the snapshot,
    so the window ends at the new cohorts' view."""
    model = Model()
    model.principals["alice"] = Principal("alice", frozenset({"red"}))
    model.rows[1] = Row(1, "red", 1)
    model.rows[2] = Row(2, "blue", 1)
    session = model.new_session("s", "alice", Keys([1, 2]))
    session.begin_snapshot()
    rendered = model.render(session, session.snapshot_keys(None))
    model.deliver(model.set_cohorts("alice", frozenset({"blue"})))
    model.replicas[session.id].apply(session.go_live(None, rendered))
    held = session.take_held()
    assert held is not None
    model.render_session(session, held)
    assert model.replicas[session.id].views == {"2": (2, "", 1)}


def test_reconnected_resnapshot_resets_from_committed_state() -> None:
    """A re-snapshot after a lost connection resets the window to committed state, including a
    commit whose impact was lost."""
    model = Model()
    model.principals["alice"] = Principal("alice", frozenset({"red"}))
    model.rows[1] = Row(1, "red", 1)
    session = model.new_session("s", "alice", Ordered(RankQuery()))
    model.snapshot(session)
    # A commit whose impact was lost with the connection.
    model.rows[2] = Row(2, "red", 2)
    model.snapshot(session)
    assert model.replicas[session.id].views == model.expected(session)
    assert session.revision == 2


# -- principal, ids, expiry ------------------------------------------------------------


def test_refresh_principal_keeps_the_id() -> None:
    """A session may refresh its principal's facts and cohort under the same id; a different id
    raises PrincipalChanged."""
    session = _live(_session())
    session.refresh_principal("alice v2", '"alice"', CohortKey.of_parts("org", 2))
    assert session.principal == "alice v2" and session.cohort == CohortKey.of_parts("org", 2)
    with pytest.raises(PrincipalChanged):
        session.refresh_principal("bob", '"bob"', session.cohort)


def test_session_ids() -> None:
    """New session ids are distinct; a client's id is accepted when it is 1-128 printable ASCII
    characters without space, else InvalidSessionId (an AttachError)."""
    assert new_session_id() != new_session_id()
    assert parse_session_id("4f9a-b_c.d:e~f") == "4f9a-b_c.d:e~f"
    for bad in ["", "a" * 129, "a b", "é", None, 7]:
        with pytest.raises(InvalidSessionId):
            parse_session_id(bad)
    assert issubclass(InvalidSessionId, AttachError)


def test_expiry() -> None:
    """A session expires past its TTL since the last touch (session_ttl), and past its maximum age
    whatever the touches (session_max_age)."""
    session = _session()
    assert session.expiry(150.0, ttl=60, max_age=3600) is None
    assert session.expiry(160.0, ttl=60, max_age=3600) == "session_ttl"
    session.touch(3000.0)
    assert session.expiry(3650.0, ttl=900, max_age=3600) is None
    assert session.expiry(3700.0, ttl=900, max_age=3600) == "session_max_age"


def test_principal_facts_impact_is_holdable_as_a_dirty_set() -> None:
    """A routed principal-facts impact can be held by a session and marks the held set as a
    principal refresh."""
    # A sanity check of the runtime's path: route, then hold per session.
    model = Model()
    model.principals["alice"] = Principal("alice", frozenset({"red"}))
    session = model.new_session("s", "alice", Keys([1]))
    frame = model.interest.route([[Impact.principal_facts("alice", ["card"])]])
    session.hold(frame.projectors["cards"])
    session.begin_snapshot()
    session.hold(frame.projectors["cards"])
    session.go_live(None, {})
    held = session.take_held()
    assert held is not None and session.refreshed_by(held)
