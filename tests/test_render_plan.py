"""The render pass's plan: which sessions a routed frame renders, and with
what change, decided without I/O from the frame, the replays, the Interest
table and the cohort indexes (`service_engine.render.plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service_engine.impacts.model import Impact, JsonValue, Reconnected
from service_engine.render import (
    CohortKey,
    Dirty,
    Interest,
    Keys,
    Ordered,
    Population,
    Query,
    RenderFrame,
    Route,
    Session,
    SessionId,
    principal_key,
)
from service_engine.render.cohort_index import CohortIndex
from service_engine.render.plan import batches, plan_frame

AnySession = Session[Any, Any]


@dataclass(frozen=True)
class Principal:
    id: str


def _interest(*projectors: str) -> Interest[AnySession]:
    interest: Interest[AnySession] = Interest()
    for name in projectors:
        interest.register(Route(name, {"card": None}))
    return interest


def _session(
    interest: Interest[AnySession],
    sid: str,
    *,
    principal: str = "u1",
    projector: str = "cards",
    population: Population[Any] | None = None,
    live: bool = True,
    cohort: CohortKey | None = None,
) -> AnySession:
    population = population if population is not None else Ordered(None)
    session: AnySession = Session(
        SessionId(sid), projector, Principal(principal), principal_key(principal),
        cohort if cohort is not None else CohortKey.of_principal(principal), population,
        repair_attempts=3,
    )
    keys = list(population.keys) if isinstance(population, Keys) else None
    interest.watch(session, projector, principal_key(principal), keys)
    if live:
        session.begin_snapshot()
        session.go_live(None if isinstance(population, Keys) else {}, {})
    return session


def _frame(interest: Interest[AnySession], *impacts: Impact) -> RenderFrame:
    return interest.route([list(impacts)])


def _keys(*keys: JsonValue) -> list[str]:
    return [Impact.entity("card", key).key_json for key in keys]


def test_a_changed_key_reaches_every_discovering_session_and_only_the_keyed_holders() -> None:
    """A changed key is planned for every discovering session and for the fixed windows holding it,
    and for no other."""
    interest = _interest("cards")
    wide = _session(interest, "wide")
    holder = _session(interest, "holder", population=Keys([1, 2]))
    other = _session(interest, "other", population=Keys([3]))
    frame = _frame(interest, Impact.entity("card", 1))

    plan = plan_frame(frame, [], interest, {})

    dirties = plan.projectors["cards"].dirties
    assert set(dirties) == {wide, holder}
    assert other not in dirties
    assert list(dirties[wide].keys) == _keys(1)
    assert plan.holds == []
    assert plan.projectors["cards"].discover is None


def test_a_session_not_yet_live_holds_the_change_instead_of_rendering() -> None:
    """A session still attaching gets the change to hold, not to render."""
    interest = _interest("cards")
    attaching = _session(interest, "attaching", live=False)
    live = _session(interest, "live")
    frame = _frame(interest, Impact.entity("card", 7))

    plan = plan_frame(frame, [], interest, {})

    assert set(plan.projectors["cards"].dirties) == {live}
    assert [(session, list(dirty.keys)) for session, dirty in plan.holds] == [
        (attaching, _keys(7))
    ]


def test_planning_changes_no_session_and_shares_the_frames_dirty_set() -> None:
    """Planning changes no session, is repeatable, and hands every session the frame's one dirty set
    (not a copy each)."""
    interest = _interest("cards")
    first = _session(interest, "first")
    second = _session(interest, "second")
    attaching = _session(interest, "attaching", live=False)
    frame = _frame(interest, Impact.entity("card", 1))
    before = (first.revision, second.revision, attaching.holding, attaching.take_held)

    plan = plan_frame(frame, [], interest, {})
    again = plan_frame(frame, [], interest, {})

    assert (first.revision, second.revision, attaching.holding, attaching.take_held) == before
    dirties = plan.projectors["cards"].dirties
    assert dirties[first] is dirties[second] is frame.projectors["cards"]
    assert dirties == again.projectors["cards"].dirties
    assert plan.holds == again.holds


def test_a_replay_merges_into_a_copy_never_into_the_frames_dirty_set() -> None:
    """A session's replay merges with the frame's change into a copy; neither the frame's set nor
    the replay is changed."""
    interest = _interest("cards")
    session = _session(interest, "s")
    frame = _frame(interest, Impact.entity("card", 1))
    replay = Dirty()
    replay.keys.update({text: int(text) for text in _keys(2)})

    plan = plan_frame(frame, [(session, replay)], interest, {})

    merged = plan.projectors["cards"].dirties[session]
    assert list(merged.keys) == _keys(1, 2)
    assert list(frame.projectors["cards"].keys) == _keys(1)
    assert list(replay.keys) == _keys(2)


def test_a_replay_renders_only_a_live_session() -> None:
    """A replay is planned only for a live session, not an ended one."""
    interest = _interest("cards")
    live = _session(interest, "live")
    ended = _session(interest, "ended")
    ended.end("closed")
    replay = Dirty(everything=True)

    plan = plan_frame(RenderFrame(), [(live, replay), (ended, replay)], interest, {})

    assert plan.projectors["cards"].dirties == {live: replay}


def test_a_frame_that_lost_continuity_plans_nothing() -> None:
    """A frame that lost continuity (a Reconnected) plans no render and no hold."""
    interest = _interest("cards")
    session = _session(interest, "s")
    _session(interest, "attaching", live=False)
    frame = interest.route([[Impact.entity("card", 1)], Reconnected("listener reconnected")])

    plan = plan_frame(frame, [(session, Dirty(everything=True))], interest, {})

    assert plan.projectors == {} and plan.holds == []


def test_principal_facts_reach_only_that_principals_sessions() -> None:
    """A principal-facts change is planned only for that principal's sessions, marked with its
    principal."""
    interest = _interest("cards")
    alice = _session(interest, "alice", principal="alice")
    _session(interest, "bob", principal="bob")
    frame = _frame(interest, Impact.principal_facts("alice", ["card"]))

    plan = plan_frame(frame, [], interest, {})

    assert set(plan.projectors["cards"].dirties) == {alice}
    assert plan.projectors["cards"].dirties[alice].principals == {principal_key("alice")}


def test_each_projector_plans_apart() -> None:
    """Each projector's sessions are planned apart."""
    interest = _interest("cards", "titles")
    card = _session(interest, "card", projector="cards")
    title = _session(interest, "title", projector="titles")
    frame = _frame(interest, Impact.entity("card", 1))

    plan = plan_frame(frame, [], interest, {})

    assert {name: set(work.dirties) for name, work in plan.projectors.items()} == {
        "cards": {card}, "titles": {title},
    }


def test_an_indexed_projector_names_only_keyed_authoritative_and_refreshed_sessions() -> None:
    """On an indexed projector the plan names keyed and authoritative sessions, leaves discovering
    ones to the pass's discovery, and holds for a snapshotting one."""
    interest = _interest("cards")
    index = CohortIndex()
    discovering = _session(interest, "discovering")
    authoritative = _session(interest, "authoritative", population=Query(None).with_keys())
    keyed = _session(interest, "keyed", population=Keys([1]))
    snapshotting = _session(interest, "snapshotting")
    for session in (discovering, authoritative, keyed, snapshotting):
        index.join(session, frozenset({"org"}))
    snapshotting.begin_snapshot()
    index.snapshotting.add(snapshotting)
    frame = _frame(interest, Impact.entity("card", 1))

    plan = plan_frame(frame, [], interest, {"cards": index})

    work = plan.projectors["cards"]
    # The discovering session is found later, from the loaded rows' cohorts.
    assert set(work.dirties) == {authoritative, keyed}
    assert work.discover is frame.projectors["cards"]
    assert [session for session, _ in plan.holds] == [snapshotting]


def test_a_replaying_session_on_an_indexed_projector_also_renders_the_frames_change() -> None:
    """A discovering session named for its replay on an indexed projector also carries the frame's
    change (the discovery step skips it), in a copy."""
    # The pass's discovery step skips every session the plan names, so a
    # discovering session named for its replay must carry the frame's change
    # itself, or a key it holds that changed in this frame is never rendered.
    interest = _interest("cards")
    index = CohortIndex()
    replaying = _session(interest, "replaying")
    refreshed = _session(interest, "refreshed", principal="alice")
    for session in (replaying, refreshed):
        index.join(session, frozenset({"org"}))
    frame = _frame(
        interest, Impact.entity("card", 19), Impact.principal_facts("alice", ["card"])
    )
    replay = Dirty()
    replay.keys.update({text: int(text) for text in _keys(1)})

    plan = plan_frame(frame, [(replaying, replay), (refreshed, replay)], interest, {"cards": index})

    work = plan.projectors["cards"]
    assert work.discover is frame.projectors["cards"]
    assert set(work.dirties) == {replaying, refreshed}
    for session in (replaying, refreshed):
        assert list(work.dirties[session].keys) == _keys(19, 1)
    assert work.dirties[refreshed].principals == {principal_key("alice")}
    assert list(frame.projectors["cards"].keys) == _keys(19)
    assert list(replay.keys) == _keys(1)


def test_an_indexed_projector_reset_reaches_every_session_as_unindexed() -> None:
    """A projector reset on an indexed projector reaches every session directly, with no discovery
    step."""
    interest = _interest("cards")
    index = CohortIndex()
    discovering = _session(interest, "discovering")
    index.join(discovering, frozenset({"org"}))
    frame = _frame(interest, Impact.reset("card"))

    plan = plan_frame(frame, [], interest, {"cards": index})

    assert set(plan.projectors["cards"].dirties) == {discovering}
    assert plan.projectors["cards"].discover is None


def test_batches_share_one_load_without_rls_and_one_per_cohort_under_rls() -> None:
    """Without RLS all cohorts share one load (one even with none, for discovery); under RLS each
    cohort loads apart."""
    groups = {CohortKey.of_parts("a"): ["s1", "s2"], CohortKey.of_parts("b"): ["s3"]}

    assert batches(False, groups) == [["s1", "s2", "s3"]]
    assert batches(True, groups) == [["s1", "s2"], ["s3"]]
    assert batches(False, {}) == [[]]  # discovery alone still loads once
    assert batches(True, {}) == []
