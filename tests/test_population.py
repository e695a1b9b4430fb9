"""Populations and Interest routing, down to windows that converge."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_engine.errors import DuplicateRegistration
from service_engine.impacts.model import Cause, Impact, JsonValue, Reconnected, canonical_json
from service_engine.render import (
    Dirty,
    Emission,
    Interest,
    InvalidRoute,
    InvalidWindow,
    Keys,
    Membership,
    MembershipRule,
    Ordered,
    Pages,
    PopulateRequired,
    Query,
    Remove,
    Route,
    UnknownProjector,
    Upsert,
    keyed,
)
from tests.render_support import Model, Principal, RankQuery, Row


def k(key: JsonValue) -> str:
    return canonical_json(key)


# -- shapes -------------------------------------------------------------------------


def test_keys_dedupe_by_canonical_text_and_keep_order() -> None:
    """A Keys window dedupes its keys by canonical JSON text keeping first order; a bare string is
    refused as InvalidWindow."""
    keys = Keys([3, 1, {"b": 1, "a": 2}, 3, {"a": 2, "b": 1}])
    assert list(keys.keys) == ["3", "1", '{"a":2,"b":1}']
    with pytest.raises(InvalidWindow):
        Keys("abc")


def test_rules_of_the_shapes() -> None:
    """Keys is a fixed window, Ordered and Query discover, and a Query with keys is authoritative
    and keeps its query."""
    assert Keys([1]).rule is MembershipRule.FIXED
    assert Ordered("q").rule is MembershipRule.DISCOVERY
    assert Query("q").rule is MembershipRule.DISCOVERY
    assert Query("q").with_keys().rule is MembershipRule.AUTHORITATIVE
    assert Query("q").with_keys().query == "q"


def test_keyed_keeps_first_position() -> None:
    """keyed maps canonical key text to the key, first occurrence first, telling 2 and "2" apart."""
    assert keyed([2, 1, 2, "2"]) == {"2": 2, "1": 1, '"2"': "2"}


# -- Interest routing ---------------------------------------------------------------


def _interest(**emission: Any) -> Interest[str]:
    interest: Interest[str] = Interest()
    interest.register(Route("cards", {"card": None}, emission.get("cards")))
    interest.register(Route("boards", {"board": None, "card": lambda key: [f"board-of-{key}"]}))
    interest.register(Route("people", {"known_person": None, "board": lambda key: None}))
    return interest


def test_duplicate_and_unknown_projectors_are_refused() -> None:
    """Registering a projector twice, watching an unknown one or registering a route with no noun is
    refused."""
    interest = _interest()
    with pytest.raises(DuplicateRegistration):
        interest.register(Route("cards", {"card": None}))
    with pytest.raises(UnknownProjector):
        interest.watch("s", "nope", '"u"', None)
    with pytest.raises(InvalidRoute):
        interest.register(Route("empty", {}))


def test_entity_impacts_reach_the_projectors_reading_the_noun() -> None:
    """Entity impacts dirty their keys (deduplicated) on the projectors reading the noun, through a
    route's inverse where one is declared, and on no other."""
    interest = _interest()
    for name in ("cards", "boards", "people"):
        interest.watch(f"s-{name}", name, '"u"', None)
    frame = interest.route([[Impact.entity("card", 7), Impact.entity("card", 7)], [Impact.entity("card", 8)]])
    assert frame.impacts == 3
    assert frame.projectors["cards"].keys == {"7": 7, "8": 8}
    # Through the inverse: the boards projector re-renders the affected board.
    assert frame.projectors["boards"].keys == {'"board-of-7"': "board-of-7", '"board-of-8"': "board-of-8"}
    assert "people" not in frame.projectors


def test_an_inverse_answering_none_dirties_everything() -> None:
    """A route inverse answering None dirties every key of the projector."""
    interest = _interest()
    interest.watch("s", "people", '"u"', None)
    frame = interest.route([[Impact.entity("board", 1)]])
    assert frame.projectors["people"].everything


def test_foreign_impacts_route_like_entities_without_a_cause() -> None:
    """A foreign impact dirties its key like an entity impact, with no cause."""
    interest = _interest()
    interest.watch("s", "people", '"u"', None)
    frame = interest.route([[Impact.foreign("known_person", "p-1")]])
    dirty = frame.projectors["people"]
    assert dirty.keys == {'"p-1"': "p-1"} and dirty.caused == []


def test_projector_reset_dirties_every_key_of_the_noun() -> None:
    """A projector-reset impact dirties everything on every projector reading the noun."""
    interest = _interest()
    interest.watch("s1", "cards", '"u"', None)
    interest.watch("s2", "boards", '"u"', None)
    frame = interest.route([[Impact.reset("card")]])
    assert frame.projectors["cards"].everything
    assert frame.projectors["boards"].everything


def test_principal_facts_reach_that_principals_sessions_on_dependent_projectors() -> None:
    """A principal-facts impact reaches only that principal's sessions on projectors reading its
    nouns; with no nouns, every watched projector re-gates."""
    interest = _interest()
    interest.watch("alice-cards", "cards", '"alice"', None)
    interest.watch("bob-cards", "cards", '"bob"', None)
    interest.watch("alice-people", "people", '"alice"', None)
    frame = interest.route([[Impact.principal_facts("alice", ["card"])]])
    assert frame.principals == {'"alice"': "alice"}
    assert frame.projectors["cards"].principals == {'"alice"'}
    assert "people" not in frame.projectors  # people does not read card
    assert interest.sessions_for("cards", frame.projectors["cards"]) == {"alice-cards"}
    # No deps: every projector re-gates.
    frame = interest.route([[Impact.principal_facts("alice", [])]])
    assert set(frame.projectors) == {"cards", "people"}


def test_per_impact_lists_caused_impacts_and_folds_causeless_ones() -> None:
    """A per-impact projector gets each caused impact in order and causeless ones folded into the
    dirty keys; its emission is asked only about caused impacts."""
    asked: list[Impact] = []

    def emission(impact: Impact) -> Emission:
        asked.append(impact)
        return Emission.PER_IMPACT

    interest = _interest(cards=emission)
    interest.watch("s", "cards", '"u"', None)
    moved = Cause("card.moved", {"to": 3})
    frame = interest.route([[Impact.entity("card", 1, moved), Impact.entity("card", 2)], [Impact.entity("card", 1, moved)]])
    dirty = frame.projectors["cards"]
    assert dirty.caused == [("1", moved), ("1", moved)]
    assert dirty.keys == {"1": 1, "2": 2}  # the causeless one is folded coalesced
    assert len(asked) == 2  # emission is asked only about caused impacts


def test_reconnected_marks_the_frame() -> None:
    """A Reconnected among the deliveries marks the routed frame, and the impacts around it still
    route."""
    interest = _interest()
    interest.watch("s", "cards", '"u"', None)
    frame = interest.route([[Impact.entity("card", 1)], Reconnected("lost"), [Impact.entity("card", 2)]])
    assert frame.reconnected == Reconnected("lost")
    assert frame.projectors["cards"].keys == {"1": 1, "2": 2}


def test_sessions_for_keys_windows_and_discovering_windows() -> None:
    """A dirty key reaches discovering sessions and the fixed windows holding it; everything reaches
    all; principals reach theirs; unwatch is idempotent."""
    interest = _interest()
    interest.watch("wide", "cards", '"u"', None)
    interest.watch("fixed-1", "cards", '"u"', ["1", "2"])
    interest.watch("fixed-9", "cards", '"v"', ["9"])
    assert interest.sessions_for("cards", Dirty(keys={"1": 1})) == {"wide", "fixed-1"}
    assert interest.sessions_for("cards", Dirty(keys={"9": 9, "5": 5})) == {"wide", "fixed-9"}
    many: dict[str, JsonValue] = {str(i): i for i in range(50)}
    assert interest.sessions_for("cards", Dirty(keys=many)) == {"wide", "fixed-1", "fixed-9"}
    assert interest.sessions_for("cards", Dirty(everything=True)) == {"wide", "fixed-1", "fixed-9"}
    assert interest.sessions_for("cards", Dirty(principals={'"v"'})) == {"fixed-9"}
    interest.unwatch("fixed-1")
    interest.unwatch("fixed-1")  # idempotent
    assert interest.sessions_for("cards", Dirty(keys={"1": 1})) == {"wide"}
    assert len(interest) == 2


def test_unwatched_projectors_cost_nothing_in_routing() -> None:
    """Impacts for projectors nobody watches route to nothing (principal facts are still noted)."""
    interest = _interest()
    frame = interest.route([[Impact.entity("card", 1), Impact.reset("card"), Impact.principal_facts("u", [])]])
    assert frame.projectors == {}
    assert frame.principals == {'"u"': "u"}


# -- membership plans ----------------------------------------------------------------


def test_keys_window_renders_only_its_members() -> None:
    """A fixed window never populates, renders only its members' dirty keys (all of them on a
    re-gate), and keeps an invisible key as a member."""
    membership = Membership(Keys([1, 2]))
    pages = Pages()
    assert not membership.needs_populate(Dirty(everything=True), refreshed=True)
    assert dict(membership.plan(Dirty(keys={"2": 2, "3": 3}), pages).scope) == {"2": 2}
    assert dict(membership.plan(Dirty(principals={'"u"'}), pages, refreshed=True).scope) == {"1": 1, "2": 2}
    membership.settle(membership.plan(Dirty(keys={"1": 1}), pages), {}, pages)
    assert list(membership.head) == ["1", "2"]  # an invisible key stays a member


def test_discovery_window_scope_is_every_dirty_key() -> None:
    """A discovering window's scope is every dirty key (shared, not copied); visible keys join,
    invisible ones leave; dirtying everything requires a populate."""
    membership = Membership(Query(RankQuery()))
    pages = Pages()
    dirty = Dirty(keys={"1": 1, "2": 2})
    plan = membership.plan(dirty, pages)
    assert plan.scope is dirty.keys  # shared, not copied
    membership.settle(plan, {"1": "view", "2": "view"}, pages)
    assert list(membership.head) == ["1", "2"]  # discovered
    membership.settle(membership.plan(Dirty(keys={"1": 1}), pages), {}, pages)
    assert list(membership.head) == ["2"]  # gone: membership stays bounded
    with pytest.raises(PopulateRequired):
        membership.plan(Dirty(everything=True), pages)


def test_authoritative_window_membership_is_populates_result() -> None:
    """An authoritative window's members are populate's result plus the keys discovered this pass:
    keys leaving it are removed, entering ones rendered."""
    membership = Membership(Query(RankQuery()).with_keys())
    pages = Pages()
    membership.settle_snapshot(keyed([1, 2, 3]), {"1": "a", "2": "b"}, pages)
    assert list(membership.head) == ["1", "2", "3"]
    plan = membership.plan(Dirty(keys={"9": 9}), pages, populated=keyed([2, 3, 4]))
    assert plan.leaving == ("1",)
    assert dict(plan.scope) == {"4": 4}  # entered the result; 9 is not a member
    membership.settle(plan, {"4": "d"}, pages)
    assert list(membership.head) == ["2", "3", "4"]
    # Keys discovered this pass join populate's result.
    plan = membership.plan(Dirty(keys={"7": 7}), pages, populated=keyed([2]), discovered=keyed([7]))
    assert set(plan.leaving) == {"3", "4"} and "7" in plan.scope
    membership.settle(plan, {"7": "g"}, pages)
    assert list(membership.head) == ["2", "7"]


# -- windows converge on committed state -------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 7), st.sampled_from(["red", "blue"]), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("delete"), st.integers(0, 7)),
        st.tuples(st.just("facts"), st.sampled_from(["alice", "bob"]), st.sets(st.sampled_from(["red", "blue"]))),
        st.tuples(st.just("reset")),
        st.tuples(st.just("flush")),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, threshold=st.integers(0, 5), caused=st.booleans())
def test_every_window_rebuilt_from_its_deltas_equals_committed_state(
    ops: list[tuple[Any, ...]], threshold: int, caused: bool
) -> None:
    """After any sequence of writes, deletes, fact changes and resets, every window rebuilt from its
    deltas equals committed state seen by its principal, at the session's revision (property
    test)."""
    model = Model(threshold=threshold, emission=(lambda _i: Emission.PER_IMPACT) if caused else None)
    model.principals["alice"] = Principal("alice", frozenset({"red"}))
    model.principals["bob"] = Principal("bob", frozenset({"blue"}))
    for key in range(4):
        model.rows[key] = Row(key, "red" if key % 2 else "blue", key)
    sessions = [
        model.new_session("keys", "alice", Keys([0, 1, 2, 5])),
        model.new_session("ordered", "alice", Ordered(RankQuery())),
        model.new_session("query", "bob", Query(RankQuery())),
        model.new_session("auth", "alice", Query(RankQuery(min_rank=2)).with_keys()),
        model.new_session("auth-bob", "bob", Query(RankQuery(min_rank=1)).with_keys()),
    ]
    for session in sessions:
        model.snapshot(session)
    pending: list[list[Impact]] = []
    for op in [*ops, ("flush",)]:
        if op[0] == "write":
            _, key, cohort, rank, with_cause = op
            cause = Cause("card.edited", {"k": key}) if with_cause else None
            pending.append(model.write(Row(key, cohort, rank, f"t{len(pending)}"), cause))
        elif op[0] == "delete":
            pending.append(model.delete(op[1]))
        elif op[0] == "facts":
            pending.append(model.set_cohorts(op[1], frozenset(op[2])))
        elif op[0] == "reset":
            pending.append([Impact.reset("card")])
        else:
            model.deliver(*pending)
            pending = []
            for session in sessions:
                assert model.replicas[session.id].views == model.expected(session), session.id
                assert model.replicas[session.id].revision == session.revision


def test_a_row_leaving_its_cohort_is_removed_and_one_entering_is_upserted() -> None:
    """A row moving out of the principal's cohorts is Removed and one moving in Upserted; a facts
    change re-gates a fixed window both ways (s135)."""
    model = Model()
    model.principals["alice"] = Principal("alice", frozenset({"red"}))
    model.rows[1] = Row(1, "red", 1)
    model.rows[2] = Row(2, "blue", 1)
    session = model.new_session("s", "alice", Keys([1, 2]))
    model.snapshot(session)
    assert model.replicas[session.id].views == {"1": (1, "", 1)}
    deltas = model.deliver(model.write(Row(1, "blue", 1)), model.write(Row(2, "red", 1)))[session.id]
    assert deltas == [Remove(2, "1"), Upsert(3, "2", (2, "", 1))]
    # A principal-facts change re-gates a fixed window in both directions (s135).
    deltas = model.deliver(model.set_cohorts("alice", frozenset({"blue"})))[session.id]
    assert deltas == [Upsert(4, "1", (1, "", 1)), Remove(5, "2")]
