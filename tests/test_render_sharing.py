"""SharedViews: the memo a load's rows are projected through, once per view key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service_engine.errors import ConfigError
from service_engine.render import Projector, Unrestricted
from service_engine.render.sharing import InvalidViewKey, SharedViews, view_key_of


@dataclass(frozen=True)
class Who:
    id: str
    tier: int


def project(row: tuple[str, int], principal: Who) -> tuple[str, int, int]:
    return (row[0], row[1], principal.tier)


calls = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), st.integers(0, 2)),
    max_size=40,
)


@given(calls, st.booleans())
def test_shared_views_equal_each_principals_own_projection(
    seq: list[tuple[str, int, int]], check: bool
) -> None:
    """With a view key that determines the view, every view handed out
    equals the principal's own projection, equal keys get the one object,
    and ``project`` runs once per (key, row) plus at most one check each."""
    rows = {text: (text, len(text)) for text in "abc"}
    views = SharedViews(project, check=check)
    seen: dict[tuple[int, str], Any] = {}
    for text, who, tier in seq:
        principal = Who(f"p{who}", tier)
        view = views.view(tier, text, rows[text], principal)
        assert view == project(rows[text], principal)
        first = seen.setdefault((tier, text), view)
        assert view is first
    distinct = len(seen)
    assert views.shares and views.mismatch is None
    assert distinct <= views.projections <= (2 * distinct if check else distinct)


def test_no_view_key_projects_every_call() -> None:
    """A session without a view key (None) projects its own view each time."""
    views = SharedViews(project, check=True)
    a = views.view(None, "a", ("a", 1), Who("p", 1))
    b = views.view(None, "a", ("a", 1), Who("q", 1))
    assert a == b and a is not b and views.projections == 2


def test_a_wrong_view_key_is_caught_on_the_first_reuse_and_sharing_stops() -> None:
    """In debug, the first reuse of a shared view re-projects it for the
    second principal: a difference turns sharing off, that principal gets
    its own view, and every later call projects."""

    def by_id(row: tuple[str, int], principal: Who) -> tuple[str, str]:
        return (row[0], principal.id)

    views = SharedViews(by_id, check=True)
    assert views.view(0, "a", ("a", 1), Who("p", 0)) == ("a", "p")
    assert views.view(0, "a", ("a", 1), Who("q", 0)) == ("a", "q")
    assert not views.shares and views.mismatch is not None and "view_key 0" in views.mismatch
    assert views.view(0, "a", ("a", 1), Who("r", 0)) == ("a", "r")
    assert views.verify(0, {"a": ("a", "p")}, {"a": ("a", 1)}, Who("s", 0)) is False


def test_verify_checks_a_shared_map_against_the_second_principal() -> None:
    """`verify` re-projects a shared map of views for another session of the
    key (in debug): True while they agree."""
    views = SharedViews(project, check=True)
    rows = {"a": ("a", 1), "b": ("b", 1)}
    shared = {t: views.view(1, t, rows[t], Who("p", 1)) for t in rows}
    assert views.verify(1, shared, rows, Who("q", 1)) is True
    assert views.projections == 4
    assert views.verify(1, shared, rows, Who("r", 1)) is True
    assert views.projections == 4  # each shared view is checked once


class _Rows:
    async def read_many(self, conn: object, keys: Any) -> list[Any]:
        return []

    def key_of(self, row: Any) -> Any:
        return row


class _Plain(Projector[Any, Any, Any, Any]):
    NAME = "plain"
    NOUN = "thing"
    STORE: ClassVar[Any] = _Rows()
    VISIBILITY = Unrestricted()

    async def populate(self, cx: Any, query: Any) -> list[Any]:
        return []

    def project(self, row: Any, principal: Any) -> Any:
        return row


def test_view_key_of_defaults_to_none_and_refuses_an_unhashable_key() -> None:
    """No declaration: no key (the hook is not even called). A declared key
    that is not hashable is a typed declaration error (a ConfigError)."""

    class Listed(_Plain):
        def view_key(self, principal: Any) -> Any:
            return [principal]

    class Keyed(_Plain):
        def view_key(self, principal: Any) -> Any:
            return ("tier", principal)

    assert view_key_of(_Plain(), "p") is None
    assert view_key_of(Keyed(), "p") == ("tier", "p")
    with pytest.raises(InvalidViewKey) as raised:
        view_key_of(Listed(), "p")
    assert isinstance(raised.value, ConfigError) and "'plain'" in str(raised.value)
