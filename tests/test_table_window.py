"""`TableWindow`, the default populate: its pure parts (the cohort values it
filters by, the page size, the cursor's place, the SQL it builds) and the
projector declaration it completes."""

from __future__ import annotations

from typing import Any

import pytest

from service_engine import Projector, TableWindow, Unrestricted
from service_engine.errors import ConfigError, InvalidProjector
from service_engine.render.projector import check_projector
from service_engine.render.table_window import cohort_values


def test_cohort_values_are_the_plain_cohorts_or_those_of_one_kind() -> None:
    """Without a kind the plain cohorts; with one, the values of its pairs."""
    cohorts = frozenset({"acme", ("org", "globex"), ("board", "b1")})
    assert cohort_values(cohorts) == ["acme"]
    assert cohort_values(cohorts, "org") == ["globex"]
    assert cohort_values(None, "org") == []


def test_a_page_is_clamped_to_one_through_the_limit() -> None:
    """A query's limit asks for fewer keys, never more than ``limit``, never none."""
    window = TableWindow("note", cohort="org", limit=50)
    assert [window.page_size(asked) for asked in (None, 0, 7, 500)] == [50, 1, 7, 50]


def test_a_cursor_places_the_page_after_its_order_values() -> None:
    """A cursor is the order columns' values (a key alone for a key order);
    one of another shape is refused."""
    assert TableWindow("note").place("n1") == '{"id":"n1"}'
    assert TableWindow("note").place(None) is None
    dated = TableWindow("card", order=("created_at", "id"), descending=True)
    assert dated.place(["2026-01-01", "c1"]) == '{"created_at":"2026-01-01","id":"c1"}'
    with pytest.raises(ConfigError):
        dated.place(["2026-01-01", "c1", "extra"])


def test_the_sql_filters_by_cohort_orders_and_pages() -> None:
    """The query filters the cohort column by ``$1`` (or nothing), compares
    the order columns with the cursor's in the order's direction, and limits."""
    sql = TableWindow("card", cohort="org", order=("created_at", "id"), descending=True).sql(
        filtered=True
    )
    assert 't."org" = ANY($1)' in sql
    assert '(t."created_at", t."id") < (p."created_at", p."id")' in sql
    assert sql.endswith('ORDER BY t."created_at" DESC, t."id" DESC LIMIT $3')
    assert "$1::int IS NULL" in TableWindow("note", cohort="org").sql(filtered=False)


def test_a_name_that_is_not_an_identifier_is_refused() -> None:
    """Table and column names are quoted identifiers, never SQL."""
    with pytest.raises(ConfigError):
        TableWindow("note; DROP TABLE note")
    with pytest.raises(ConfigError):
        TableWindow("note", order=())


class _Store:
    async def read_many(self, conn: Any, keys: Any) -> list[Any]:
        return []

    def key_of(self, row: Any) -> Any:
        return row


class _Declared(Projector[Any, Any, Any, None]):
    NAME = "declared"
    NOUN = "note"
    STORE = _Store()  # type: ignore[assignment]
    VISIBILITY = Unrestricted()

    def project(self, row: Any, principal: Any) -> Any:
        return row


def test_a_projector_declares_a_window_or_implements_populate() -> None:
    """A projector with neither ``WINDOW`` nor its own populate is refused
    at registration; one ``WINDOW`` completes it."""
    with pytest.raises(InvalidProjector, match="WINDOW"):
        check_projector(_Declared())

    class Windowed(_Declared):
        WINDOW = TableWindow("note")

    check_projector(Windowed())
