"""What sessions share instead of holding copies: held views across loads,
interned view keys, one gate per set of cohorts, the lone delta of a stream."""

from __future__ import annotations

import gc
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from hypothesis import given
from hypothesis import strategies as st

from service_engine.render import Projector, Unrestricted
from service_engine.render.cohort_index import SharedGates
from service_engine.render.deltas import Remove, Reset, Upsert, new_upsert
from service_engine.render.interest import Interest, Route
from service_engine.render.projector import Visibility
from service_engine.render.sharing import HeldViews, Interned, SharedViews
from service_engine.render.stream import Backlog


@dataclass(frozen=True)
class View:
    title: str


def project(row: str, principal: object) -> View:
    return View(row)


def test_a_later_load_hands_out_the_view_an_earlier_one_projected() -> None:
    """Two loads (two snapshot batches) of an unchanged row give sessions of
    one view key the same object; a changed row gives a new one, which the
    next load then shares; a view nobody holds is not kept."""
    held = HeldViews()
    first = SharedViews(project, check=False, held=held).view("k", "a", "t1", None)
    second = SharedViews(project, check=False, held=held).view("k", "a", "t1", None)
    assert second is first
    changed = SharedViews(project, check=False, held=held).view("k", "a", "t2", None)
    assert changed == View("t2") and changed is not first
    assert SharedViews(project, check=False, held=held).view("k", "a", "t2", None) is changed
    other_key = SharedViews(project, check=False, held=held).view("j", "a", "t2", None)
    assert other_key is not changed
    del first, second, changed, other_key
    gc.collect()
    assert len(held) == 0


def test_views_that_cannot_be_weakly_held_are_handed_out_unheld() -> None:
    """A projector whose views are tuples still renders; nothing is held."""
    held = HeldViews()
    views = SharedViews(lambda row, who: (row,), check=False, held=held)
    assert views.view("k", "a", "x", None) == ("x",)
    assert not held.weak and len(held) == 0


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=60))
def test_interned_values_are_one_object_while_held(ops: list[tuple[bool, int]]) -> None:
    """Every take of an equal value returns one object while any holder is
    left; the table empties when every take was released."""
    interned = Interned()
    holding: list[tuple[int, ...]] = []
    for take, n in ops:
        if take or not holding:
            value = interned.take(tuple(range(n)))
            assert value == tuple(range(n))
            for other in holding:
                if other == value:
                    assert other is value
            holding.append(value)
        else:
            interned.release(holding.pop())
    for value in holding:
        interned.release(value)
    assert len(interned) == 0
    assert interned.take(None) is None


@dataclass(frozen=True)
class Who:
    id: str
    orgs: frozenset[str]


class OrgRows(Visibility[str, Who]):
    def cohorts(self, row: str) -> Iterable[Hashable]:
        return (row.split(":")[0],)

    def memberships(self, principal: Who) -> Iterable[Hashable]:
        return principal.orgs


class Rows(Projector[str, str, Who, None]):
    NAME = "rows"
    NOUN = "row"
    STORE: ClassVar[Any] = None
    VISIBILITY: ClassVar[Any] = OrgRows()

    async def populate(self, cx: Any, query: None) -> list[str]:
        return []

    def project(self, row: str, principal: Who) -> str:
        return row


class OpenRows(Rows):
    NAME = "open_rows"
    VISIBILITY: ClassVar[Any] = Unrestricted()


class OwnGateRows(Rows):
    NAME = "own_gate_rows"

    def render_gate(self, principal: Who) -> Any:
        return lambda row: row.endswith(principal.id)


def test_a_projector_with_its_own_render_gate_gets_each_principals_gate() -> None:
    """A projector overriding `render_gate` may read more of the principal
    than its memberships: two principals of the same orgs get their own gates."""
    gates = SharedGates()
    proj = OwnGateRows()
    alice, bob = Who("a", frozenset({"acme"})), Who("b", frozenset({"acme"}))
    gate_a, _ = gates.take(proj, alice)
    gate_b, _ = gates.take(proj, bob)
    assert gate_a("acme:a") and not gate_b("acme:a") and len(gates) == 0


def test_principals_of_one_cohort_set_share_one_gate_until_the_last_leaves() -> None:
    """Two principals of the same orgs get one gate and one memberships set,
    which gates as each principal's own would; a principal of other orgs
    gets its own; an unrestricted projector's gate is never shared."""
    gates = SharedGates()
    proj = Rows()
    alice, bob, carol = (Who("a", frozenset({"acme"})), Who("b", frozenset({"acme"})),
                         Who("c", frozenset({"zeta"})))
    gate_a, member_a = gates.take(proj, alice)
    gate_b, member_b = gates.take(proj, bob)
    gate_c, member_c = gates.take(proj, carol)
    assert gate_a is gate_b and member_a is member_b
    assert gate_c is not gate_a and member_c == frozenset({"zeta"})
    for row in ("acme:1", "zeta:1"):
        assert gate_a(row) is proj.render_gate(alice)(row)
        assert gate_c(row) is proj.render_gate(carol)(row)
    assert len(gates) == 2
    for memberships in (member_a, member_b, member_c):
        gates.release(proj, memberships)
    assert len(gates) == 0
    gate, memberships = gates.take(OpenRows(), alice)
    assert memberships is None and gate("zeta:9") and len(gates) == 0


@given(st.lists(st.one_of(st.none(), st.sampled_from(["a", "b"]), st.just("reset")),
                max_size=50))
def test_a_lone_delta_is_taken_exactly_as_an_entry_would_be(ops: list[str | None]) -> None:
    """Puts and takes in any order (None: take) give, with nothing to
    collapse, every delta in put order on contiguous revisions, whether a
    delta waited alone or behind others."""
    backlog: Backlog[int] = Backlog(behind=1000)
    put: list[Any] = []
    taken: list[Any] = []
    revision = 0
    for op in ops:
        if op is None:
            delta = backlog.take()
            if delta is not None:
                taken.append(delta)
            continue
        revision += 1
        made: Any = Reset(revision, {}) if op == "reset" else (
            new_upsert(revision, op, revision) if revision % 3 else Remove(revision, op))
        backlog.put(made)
        put.append(made)
    while (delta := backlog.take()) is not None:
        taken.append(delta)
    assert taken == put
    assert [d.revision for d in taken] == list(range(1, len(put) + 1))
    assert len(backlog) == 0


def test_new_upsert_is_an_upsert() -> None:
    """The slot-built Upsert equals, hashes and prints as the constructed one."""
    built, made = new_upsert(3, "k", "v"), Upsert(3, "k", "v", None)
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)


def test_a_principals_sessions_are_found_whether_it_holds_one_or_several() -> None:
    """The routing of a principal's facts change finds every session of
    that principal as its sessions come and go (one: a 1-tuple; several: a set)."""
    interest: Interest[str] = Interest()
    interest.register(Route("p", {"card": None}))
    interest.watch("s1", "p", "alice", None)
    assert interest.principal_sessions("p", ["alice"]) == {"s1"}
    interest.watch("s2", "p", "alice", None)
    interest.watch("s3", "p", "bob", None)
    assert interest.principal_sessions("p", ["alice"]) == {"s1", "s2"}
    interest.unwatch("s1")
    assert interest.principal_sessions("p", ["alice", "bob"]) == {"s2", "s3"}
    interest.unwatch("s3")
    interest.unwatch("s2")
    assert interest.principal_sessions("p", ["alice", "bob"]) == set()
    interest.watch("s1", "p", "alice", None)
    interest.watch("s1", "p", "alice", None)  # a second watch replaces the first
    interest.unwatch("s1")
    assert interest.principal_sessions("p", ["alice"]) == set()
