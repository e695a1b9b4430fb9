"""The render runtime's paging against real Postgres: a page appends without
a Reset and releases silently (s162, s163), paging someone else's session
is refused (s167), and a page loses no race to a concurrent pass (s183)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from service_engine import Database
from service_engine.render import NoLiveSession, Remove, Upsert

from ..support.render_support import (
    ALICE,
    BOB,
    Frames,
    assert_quiet,
    drained,
    frames,
    running_engine,
    seed,
    take,
    window,
)
from ..support.sample_cards import (
    Card,
    CardsView,
    RankQuery,
    delete_card,
    write_card,
)


async def test_s162_s163_paging_appends_without_reset_and_releases_silently(
    db: Database,
) -> None:
    """s162: a page appends older keys behind the live window as Upserts on
    the contiguous revision, and an edit to a paged row reaches its holder.
    s163: past window_capacity the oldest page is released with no Remove,
    the live head retained."""
    await seed(db, *(Card(f"c{i}", "acme", i, f"t{i}") for i in range(10)))
    async with running_engine(db, CardsView(), window_capacity=6) as engine:
        stream = await engine.attach(ALICE, "cards", window(limit=2), session_id=None)
        (reset,) = await take(stream, 1)
        assert list(reset.views) == ['"c9"', '"c8"']
        result = await engine.page(str(stream.id), ALICE, 8)
        assert [d.key for d in result.deltas] == ['"c7"', '"c6"']
        assert [d.revision for d in result.deltas] == [reset.revision + 1, reset.revision + 2]
        paged = await take(stream, 2)
        assert all(isinstance(d, Upsert) for d in paged)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c6", "acme", 6, "edited"))
        (edit,) = await take(stream, 1)
        assert edit.key == '"c6"' and edit.view == ("acme", 6, "edited")
        await engine.page(str(stream.id), ALICE, 6)   # c5, c4 -> 6 keys held
        second = await take(stream, 2)
        third = await engine.page(str(stream.id), ALICE, 4)  # c3, c2: releases c7, c6
        assert set(third.released) == {'"c7"', '"c6"'}
        later = await take(stream, 2)
        assert all(isinstance(d, Upsert) for d in second + later)
        await assert_quiet(stream)  # the release is silent: no Remove
        async with db.pool.acquire() as conn:  # the live head is still held
            await write_card(conn, Card("c9", "acme", 9, "head edited"))
            await delete_card(conn, "c8")  # only a key still held can be Removed
        edited, removed = await take(stream, 2)
        assert isinstance(edited, Upsert) and edited.key == '"c9"' and edited.view == ("acme", 9, "head edited")
        assert isinstance(removed, Remove) and removed.key == '"c8"'
        await assert_quiet(stream)


async def test_s167_paging_someone_elses_session_is_refused(db: Database) -> None:
    """s167: a page for a live session the caller does not own is refused
    with NoLiveSession, nothing reaches the victim's wire, and the caller
    still pages her own session."""
    await seed(db, *(Card(f"c{i}", "acme", i) for i in range(4)))
    async with running_engine(db, CardsView()) as engine:
        victim = await engine.attach(BOB, "cards", window(limit=2))
        mine = await engine.attach(ALICE, "cards", window(limit=2))
        await take(victim, 1)
        await take(mine, 1)
        with pytest.raises(NoLiveSession):
            await engine.page(str(victim.id), ALICE, 2)
        with pytest.raises(NoLiveSession):
            await engine.page("not-a-session", ALICE, 2)
        result = await engine.page(str(mine.id), ALICE, 2)
        assert len(result.deltas) == 2
        assert drained(victim) == []


async def test_s183_a_page_loses_no_race_to_a_concurrent_pass(db: Database) -> None:
    """s183: a key written while its page renders settles on the committed
    view the render pass delivered, never on the stale page render."""
    await seed(db, *(Card(f"c{i}", "acme", i, "old") for i in range(4)))
    f_holder: list[Frames] = []

    class Racing(CardsView):
        NAME = "racing_page"

        async def populate(self, cx: Any, query: RankQuery) -> Sequence[Any]:
            keys = await super().populate(cx, query)
            if cx.cursor is not None:
                # While the page reads, c1 changes and a pass delivers it.
                async with db.pool.acquire() as conn:
                    await write_card(conn, Card("c1", "acme", 1, "new"))
                f = f_holder[0]
                # A pass of its own (a task holding a read refuses a second connection).
                await asyncio.create_task(f.runtime.render_pass(await f.commits(1)))
            return keys

    async with frames(db, Racing()) as f:
        f_holder.append(f)
        stream = await f.runtime.registry.attach(ALICE, "racing_page", window(limit=2))
        (reset,) = await take(stream, 1)
        assert set(reset.views) == {'"c3"', '"c2"'}
        result = await f.runtime.registry.page(str(stream.id), ALICE, 2)
        assert '"c1"' in result.skipped
        deltas = drained(stream)
        c1 = [d for d in deltas if d.key == '"c1"']
        assert len(c1) == 1 and c1[0].view == ("acme", 1, "new")
        assert [d.revision for d in deltas] == list(
            range(reset.revision + 1, reset.revision + 1 + len(deltas))
        )
