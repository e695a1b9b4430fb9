"""Timestamp round-trips through Postgres timestamptz equal (property test)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import asyncpg
from hypothesis import given, settings
from hypothesis import strategies as st

from service_engine import Timestamp
from service_engine.embedded import ProvisionedDatabase

instants = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]),
)


def test_timestamp_round_trips_through_timestamptz(database: ProvisionedDatabase) -> None:
    """Any Timestamp round-trips through a Postgres timestamptz unchanged, to the
    microsecond."""

    @settings(max_examples=25, deadline=None)
    @given(st.lists(instants, min_size=1, max_size=40))
    def round_trip(values: list[datetime]) -> None:
        stamps = [Timestamp(v) for v in values]

        async def through_postgres() -> list[datetime]:
            conn = await asyncpg.connect(database.app_url)
            try:
                rows = await conn.fetch(
                    "SELECT t FROM unnest($1::timestamptz[]) WITH ORDINALITY AS u(t, i) ORDER BY i",
                    [s.value for s in stamps],
                )
                return [r["t"] for r in rows]
            finally:
                await conn.close()

        back = asyncio.run(through_postgres())
        assert [Timestamp(b) for b in back] == stamps
        assert all(Timestamp(b).epoch_micros == s.epoch_micros for b, s in zip(back, stamps, strict=True))

    round_trip()


def test_timestamp_is_utc_and_refuses_naive() -> None:
    """A Timestamp is always UTC (an aware value is converted) and refuses a naive datetime."""
    import pytest

    local = datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    assert Timestamp(local).value.tzinfo is UTC
    assert Timestamp(local) == Timestamp(datetime(2026, 1, 1, 10, tzinfo=UTC))
    with pytest.raises(ValueError):
        Timestamp(datetime(2026, 1, 1))
