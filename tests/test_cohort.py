"""Cohort keys: collision-free by construction, grouping, and the debug check."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service_engine.impacts.model import Impact, canonical_json
from service_engine.render import (
    CohortKey,
    CohortMismatch,
    InvalidCohortPart,
    InvalidPrincipalId,
    check_cohort,
    group_by_cohort,
    principal_key,
)
from service_engine.render.projector import (
    InvalidProjector,
    Projector,
    Unrestricted,
    check_projector,
    cohort_of,
)

_text = st.text(alphabet=st.sampled_from("ab\x00\x01\x02\x08é😀:|"), max_size=6)
_parts = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    _text,
    st.binary(max_size=6),
    st.uuids(),
)
_ids = st.one_of(st.integers(), _text, st.lists(st.integers(), max_size=3).map(tuple))


def _typed(parts: tuple[Any, ...]) -> tuple[tuple[type, Any], ...]:
    # Equality of parts as the key must see it: 1, True and "1" differ.
    return tuple((type(p), p) for p in parts)


@settings(max_examples=300)
@given(a=st.lists(_parts, max_size=4).map(tuple), b=st.lists(_parts, max_size=4).map(tuple))
def test_declared_cohorts_equal_exactly_when_parts_equal(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    """Two declared cohorts are equal exactly when their parts are equal with their types (property
    test)."""
    assert (CohortKey.of_parts(*a) == CohortKey.of_parts(*b)) == (_typed(a) == _typed(b))


@settings(max_examples=200)
@given(a=_ids, b=_ids)
def test_principal_cohorts_equal_exactly_when_ids_equal(a: Any, b: Any) -> None:
    """Two per-principal cohorts are equal exactly when the ids' canonical JSON is equal (property
    test)."""
    assert (CohortKey.of_principal(a) == CohortKey.of_principal(b)) == (
        canonical_json(a) == canonical_json(b)
    )


@settings(max_examples=200)
@given(principal=_ids, parts=st.lists(_parts, max_size=4).map(tuple))
def test_principal_and_declared_cohorts_never_meet(principal: Any, parts: tuple[Any, ...]) -> None:
    """A per-principal cohort never equals a declared one (property test)."""
    assert CohortKey.of_principal(principal) != CohortKey.of_parts(*parts)


@settings(max_examples=200)
@given(st.lists(_text, min_size=1, max_size=4))
def test_concatenations_never_collide(pieces: list[str]) -> None:
    """Cutting one string into parts differently, or adding an empty part, gives a different cohort
    (property test)."""
    # Every way of cutting one string into parts is a different cohort.
    whole = "".join(pieces)
    assert CohortKey.of_parts(*pieces) != CohortKey.of_parts(whole) or len(pieces) == 1
    assert CohortKey.of_parts(*pieces) != CohortKey.of_parts(*pieces, "")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("ab", "c"), ("a", "bc")),
        (("a", ""), ("a",)),
        ((1,), ("1",)),
        ((1,), (True,)),
        ((0,), (False,)),
        (("1",), (b"1",)),
        ((None,), ("",)),
        ((None,), ()),
        ((uuid.UUID(int=0),), (b"\x00" * 16,)),
        # A part whose bytes spell a length-prefixed second part.
        (("a\x00\x00\x00\x00\x00\x00\x00\x01b",), ("a", "b")),
    ],
)
def test_known_collision_tricks_are_distinct(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    """Known collision tricks (moved bytes, empty parts, 1 vs "1" vs True, None vs "", a part
    spelling a length prefix) give distinct cohorts."""
    assert CohortKey.of_parts(*a) != CohortKey.of_parts(*b)


def test_principal_tricks_are_distinct() -> None:
    """Per-principal cohorts tell 1 from "1" and trailing spaces apart, and a UUID equals its
    string."""
    assert CohortKey.of_principal(1) != CohortKey.of_principal("1")
    assert CohortKey.of_principal("a") != CohortKey.of_principal("a ")
    u = uuid.uuid4()
    assert CohortKey.of_principal(u) == CohortKey.of_principal(str(u))


def test_floats_and_other_types_are_refused() -> None:
    """A float or a list as a cohort part is refused with InvalidCohortPart."""
    with pytest.raises(InvalidCohortPart):
        CohortKey.of_parts(0.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidCohortPart):
        CohortKey.of_parts(["list"])  # type: ignore[arg-type]


def test_cohort_keys_hash_as_their_bytes_and_print_readably() -> None:
    """Equal cohort keys hash alike, print as their constructor call, and say whether they are per
    principal."""
    key = CohortKey.of_principal("alice")
    assert {key: 1}[CohortKey.of_principal("alice")] == 1
    assert repr(key) == 'CohortKey.of_principal("alice")'
    assert key.is_principal and not CohortKey.of_parts("org", 1).is_principal


def test_a_principal_id_json_cannot_carry_is_refused_by_name() -> None:
    """A principal id JSON cannot carry (an object, NaN, a set) is refused with InvalidPrincipalId."""
    for bad in (object(), float("nan"), {1, 2}):
        with pytest.raises(InvalidPrincipalId):
            principal_key(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidPrincipalId):
            CohortKey.of_principal(bad)  # type: ignore[arg-type]


def test_principal_key_matches_the_principal_facts_impact() -> None:
    """A principal's key text equals the key of its principal-facts impact, so the impact reaches
    its sessions."""
    u = uuid.uuid4()
    assert principal_key(u) == Impact.principal_facts(str(u), ["card"]).key_json
    assert principal_key(7) == Impact.principal_facts(7, []).key_json


@dataclass
class _S:
    name: str
    cohort: CohortKey


def test_group_by_cohort_keeps_arrival_order() -> None:
    """Grouping sessions by cohort keeps the cohorts' and the sessions' arrival order."""
    org1, org2 = CohortKey.of_parts("org", 1), CohortKey.of_parts("org", 2)
    sessions = [_S("a", org1), _S("b", org2), _S("c", org1), _S("d", org1)]
    groups = group_by_cohort(sessions)
    assert list(groups) == [org1, org2]
    assert [s.name for s in groups[org1]] == ["a", "c", "d"]
    assert [s.name for s in groups[org2]] == ["b"]


def test_check_cohort_raises_when_the_cohort_is_not_a_pure_function() -> None:
    """check_cohort raises CohortMismatch when the cohort recomputed differs."""
    key = CohortKey.of_parts("org", 1)
    check_cohort(key, lambda: CohortKey.of_parts("org", 1))
    with pytest.raises(CohortMismatch):
        check_cohort(key, lambda: CohortKey.of_parts("org", 2))


# -- the projector's cohort hook --------------------------------------------------


@dataclass(frozen=True)
class _Principal:
    id: str
    org: int


class _Store:
    async def read_many(self, conn: Any, keys: Any) -> list[Any]:
        return []

    def key_of(self, row: Any) -> Any:
        return row


class _PerPrincipal(Projector[Any, Any, _Principal, None]):
    NAME = "per_principal"
    NOUN = "card"
    STORE = _Store()  # type: ignore[assignment]
    VISIBILITY = Unrestricted()

    async def populate(self, cx: Any, query: None) -> list[Any]:
        return []

    def project(self, row: Any, principal: _Principal) -> Any:
        return row


class _PerOrg(_PerPrincipal):
    NAME = "per_org"

    def cohort(self, principal: _Principal) -> CohortKey:
        return CohortKey.of_parts("org", principal.org)


class _RlsPerOrg(_PerOrg):
    NAME = "rls_per_org"
    RLS = True


def test_default_cohort_is_the_principal_and_a_declared_one_is_shared() -> None:
    """A projector's cohort is per principal by default; a declared cohort is shared by principals
    with equal parts."""
    alice, bob = _Principal("alice", 1), _Principal("bob", 1)
    assert cohort_of(_PerPrincipal(), alice) == CohortKey.of_principal("alice")
    assert cohort_of(_PerPrincipal(), alice) != cohort_of(_PerPrincipal(), bob)
    assert cohort_of(_PerOrg(), alice) == cohort_of(_PerOrg(), bob)


def test_an_rls_projector_always_renders_per_principal() -> None:
    """An RLS projector renders per principal whatever cohort it declares, and overriding its cohort
    is refused."""
    alice, bob = _Principal("alice", 1), _Principal("bob", 1)
    assert cohort_of(_RlsPerOrg(), alice) != cohort_of(_RlsPerOrg(), bob)
    with pytest.raises(InvalidProjector, match="may not override cohort"):
        check_projector(_RlsPerOrg())
    check_projector(_PerOrg())
