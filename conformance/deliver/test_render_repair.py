"""The render runtime's repair against real Postgres: a failing render
repairs and then ends after its repair attempts, a repaired session resets
from committed state, and one failing projector leaves the other sessions
untouched."""

from __future__ import annotations

import asyncio

import pytest

from service_engine import Database
from service_engine.render import Reset, Upsert
from service_engine.render.stream import SessionEnded

from ..support.render_support import (
    ALICE,
    BOB,
    running_engine,
    seed,
    take,
    window,
)
from ..support.sample_cards import (
    Card,
    CardsView,
    Principal,
    write_card,
)


async def test_a_failing_render_repairs_then_ends_after_repair_attempts(db: Database) -> None:
    """A failed render sends the session to repair (retried by the beat) and
    ends it after repair_attempts failures, never serving a Reset rebuilt
    from the stale last-sent view."""

    class Fragile(CardsView):
        NAME = "fragile"

        def project(self, row: Card, principal: Principal) -> tuple[str, int, str]:
            if row.title == "poison":
                raise ValueError("cannot render")
            return super().project(row, principal)

    await seed(db, Card("c1", "acme", 1, "one"))
    async with running_engine(db, Fragile(), repair_attempts=3) as engine:
        stream = await engine.attach(ALICE, "fragile", window())
        await take(stream, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "poison"))
        with pytest.raises(SessionEnded, match="consecutive failures"):
            while True:
                delta = await asyncio.wait_for(stream.next(), 10)
                assert not isinstance(delta, Reset), "a Reset served from a failing render"


async def test_a_repaired_session_resets_from_committed_state(db: Database) -> None:
    """A session whose render failed once is repaired with a Reset from committed state."""
    class Flaky(CardsView):
        NAME = "flaky"
        failures = 1

        def project(self, row: Card, principal: Principal) -> tuple[str, int, str]:
            if row.title == "flaky" and Flaky.failures:
                Flaky.failures -= 1
                raise ValueError("transient")
            return super().project(row, principal)

    async with running_engine(db, Flaky(), repair_attempts=3) as engine:
        stream = await engine.attach(ALICE, "flaky", window())
        await take(stream, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "flaky"))
        (reset,) = await take(stream, 1)
        assert isinstance(reset, Reset) and reset.views == {'"c1"': ("acme", 1, "flaky")}


async def test_one_failing_projector_leaves_other_sessions_untouched(db: Database) -> None:
    """A projector that fails to render leaves the sessions of other projectors untouched:
    they still get the change."""
    class Broken(CardsView):
        NAME = "broken"

        def project(self, row: Card, principal: Principal) -> tuple[str, int, str]:
            if row.title == "boom":
                raise ValueError("broken projector")
            return super().project(row, principal)

    async with running_engine(db, Broken(), CardsView()) as engine:
        broken = await engine.attach(ALICE, "broken", window())
        healthy = await engine.attach(BOB, "cards", window())
        await take(broken, 1)
        await take(healthy, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "boom"))
        (delta,) = await take(healthy, 1)
        assert isinstance(delta, Upsert) and delta.view == ("acme", 1, "boom")
