"""Closed sessions cost nothing: after many sessions attach and close, the
runtime holds none of them and the next render frame renders none of them."""

from __future__ import annotations

import asyncio

from service_engine import Database

from ..support.render_support import frames, take, window
from ..support.sample_cards import Card, CardsView, Principal, write_card

MANY = 300


async def test_closing_every_session_leaves_the_next_frame_touching_none_of_them(
    db: Database,
) -> None:
    """MANY sessions attach (in one cohort and many), go live and close: the registry, its
    interest routes and cohort index hold none of them, and the next frame for a write in
    their cohort renders exactly the one session still open."""
    async with db.pool.acquire() as conn:
        await write_card(conn, Card("c1", "acme", 1, "one"))
    async with frames(db, CardsView()) as f:
        runtime = f.runtime
        principals = [Principal(f"p{i}", frozenset({"acme", f"org{i % 30}"})) for i in range(MANY)]
        streams = await asyncio.gather(*(runtime.registry.attach(p, "cards", window()) for p in principals))
        for stream in streams:
            await take(stream, 1)
        assert len(runtime.registry.sessions) == MANY
        for stream in streams:
            await stream.aclose()
        assert len(runtime.registry.sessions) == 0
        assert len(runtime.registry.interest) == 0
        for index in runtime.registry.indexes.values():
            assert not index.members and not index.snapshotting and not index.authoritative

        survivor = await runtime.registry.attach(Principal("last", frozenset({"acme"})), "cards", window())
        await take(survivor, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "uno"))
        report = await runtime.render_pass(await f.commits(1))
        assert report.sessions == 1
        (upsert,) = await take(survivor, 1)
        assert upsert.view == ("acme", 1, "uno")
