"""The reference service's principals share equal values: one frozenset per
distinct set of roles or fact values, one facts bag per distinct bag, held
only while some principal holds it (a pod keeps a principal per session)."""

from __future__ import annotations

import gc

from example_service.kernel import principal
from example_service.kernel.principal import Principal, PrincipalFacts, shared


def test_equal_role_sets_are_one_object_and_unequal_ones_are_not() -> None:
    """Equal inputs (any iterable) give the identical frozenset; a different
    value gives another; the empty set is one object too."""
    a = shared(["board:archive", "board:admin"])
    b = shared(frozenset({"board:admin", "board:archive"}))
    assert a is b and a == {"board:archive", "board:admin"}
    assert shared(["board:archive"]) is not a
    assert shared([]) is shared(frozenset()) and not shared(())


def test_equal_fact_bags_are_one_object_and_keep_their_values() -> None:
    """Two principals loading the same facts hold one bag; a principal's
    facts read as before (a fact never loaded reads empty)."""
    first = Principal(id="a", actor="a", org="o").with_fact("memberships", ["b1", "b2"])
    second = Principal(id="b", actor="b", org="o").with_fact("memberships", ("b2", "b1"))
    assert first.facts is second.facts
    assert first.fact("memberships") == {"b1", "b2"} and first.fact("other") == frozenset()
    assert first != second  # identity differs: only the values are shared
    third = first.with_fact("memberships", ["b3"])
    assert third.facts is not first.facts and third.fact("memberships") == {"b3"}
    assert PrincipalFacts.of({"memberships": ["b1", "b2"]}) is first.facts


def test_a_value_no_principal_holds_is_released() -> None:
    """Sharing keeps nothing alive: once no principal holds a value or a bag,
    the tables (weak references) no longer hold it either."""
    held = shared(["only:here"])
    bag = PrincipalFacts.of({"memberships": ["only-here"]})
    assert frozenset({"only:here"}) in principal._SETS
    assert bag.items in principal._BAGS
    items = bag.items
    del held, bag
    gc.collect()
    assert frozenset({"only:here"}) not in principal._SETS
    assert principal._BAGS.get(items) is None
