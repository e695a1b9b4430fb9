"""The render runtime's live session against real Postgres: a Reset then
contiguous Upserts and Removes, each projector's sessions reached alone
(s129), the connect barrier, a render frame that takes no row lock (s130),
a lost listener or an overflowing channel resetting every live session
(s132), and attach after shutdown. Cohorts are `test_render_cohorts`, paging
`test_render_paging`, repair `test_render_repair`, convergence under
writers `test_render_convergence`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from service_engine import Database
from service_engine.impacts import Impact
from service_engine.impacts.transport import stage_in
from service_engine.render import Remove, Reset, Upsert, WindowReplica
from service_engine.render.stream import SessionStream

from ..support.harness import wait_until
from ..support.render_support import (
    ALICE,
    BOB,
    CAROL,
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
    CardStore,
    CardsView,
    RankQuery,
    delete_card,
    write_card,
)


async def test_reset_then_contiguous_upserts_and_removes(db: Database) -> None:
    """A live session gets a Reset of committed visible state, then Upserts and Removes on
    contiguous revisions; rows of other orgs never reach it."""
    await seed(db, Card("c1", "acme", 1, "one"), Card("x1", "globex", 5, "other org"))
    async with running_engine(db, CardsView()) as engine:
        stream = await engine.attach(ALICE, "cards", window())
        replica: WindowReplica[Any] = WindowReplica()
        (reset,) = await take(stream, 1)
        assert isinstance(reset, Reset)
        replica.apply(reset)
        assert replica.views == {'"c1"': ("acme", 1, "one")}
        deltas = []
        async with db.pool.acquire() as conn:
            # Each change awaited before the next: the render pass coalesces
            # to committed state, so a row created and deleted within one
            # frame would rightly never be shown.
            await write_card(conn, Card("c2", "acme", 2, "two"))
            deltas += await take(stream, 1)
            await write_card(conn, Card("x2", "globex", 3, "invisible"))
            await write_card(conn, Card("c1", "acme", 1, "uno"))
            deltas += await take(stream, 1)
            await delete_card(conn, "c2")
            deltas += await take(stream, 1)
        for delta in deltas:
            replica.apply(delta)
        assert [type(d) for d in deltas] == [Upsert, Upsert, Remove]
        assert [d.revision for d in deltas] == [reset.revision + i for i in (1, 2, 3)]
        assert replica.views == {'"c1"': ("acme", 1, "uno")}


class CardMirror(CardsView):
    """A second projector over the same store as ``CardsView`` under its own
    noun: a delta routed to the wrong projector renders a real row here."""

    NAME = "card_mirror"
    NOUN = "card_mirror"


async def test_s129_an_upsert_reaches_only_its_own_projectors_sessions(db: Database) -> None:
    """s129 (engine level): a write to one noun reaches the sessions of the
    projector rendering that noun and no other, even where the other
    projector reads the same rows."""
    async with running_engine(db, CardsView(), CardMirror()) as engine:
        cards = await engine.attach(ALICE, "cards", window())
        mirror = await engine.attach(ALICE, "card_mirror", window())
        await take(cards, 1)
        await take(mirror, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "card"))  # the "card" noun only
            async with conn.transaction():
                await conn.execute("INSERT INTO sample_card (id, org, rank) VALUES ('m1', 'acme', 0)")
                await stage_in(conn, [Impact.entity("card_mirror", "m1")])
            await write_card(conn, Card("c2", "acme", 2, "card"))
        # Frames are rendered in commit order: a misrouted delta would arrive
        # ahead of each stream's own next one.
        assert [d.key for d in await take(cards, 2)] == ['"c1"', '"c2"']
        assert [d.key for d in await take(mirror, 1)] == ['"m1"']
        await assert_quiet(cards)
        await assert_quiet(mirror)


async def test_connect_barrier_holds_a_write_committed_during_the_snapshot(db: Database) -> None:
    """A write committed after the snapshot's read began is held by the
    barrier and delivered after the Reset: nothing lost, nothing twice."""
    await seed(db, Card("c1", "acme", 1, "one"))

    class RacingView(CardsView):
        NAME = "racing"
        raced = False

        async def populate(self, cx: Any, query: RankQuery) -> Sequence[Any]:
            keys = await super().populate(cx, query)
            if not RacingView.raced:
                RacingView.raced = True
                async with db.pool.acquire() as conn:  # commits mid-snapshot
                    await write_card(conn, Card("c1", "acme", 1, "raced"))
            return keys

    async with running_engine(db, RacingView()) as engine:
        stream = await engine.attach(ALICE, "racing", window())
        reset, upsert = await take(stream, 2)
        assert isinstance(reset, Reset) and reset.views['"c1"'] == ("acme", 1, "one")
        assert isinstance(upsert, Upsert) and upsert.view == ("acme", 1, "raced")
        assert upsert.revision == reset.revision + 1


async def test_a_write_in_the_pass_that_replays_the_barrier_reaches_the_session(
    db: Database,
) -> None:
    """A change routed in the same pass that replays what a new session's
    barrier held is rendered for that session too: a card it holds that
    leaves its orgs in that pass is Removed, and its window equals committed
    state (the pass names the replaying session, so the frame's change must
    travel with its replay rather than through discovery, which skips it)."""
    await seed(db, Card("k1", "acme", 1, "one"), Card("k19", "acme", 19, "nineteen"))
    f_holder: list[Frames] = []

    class Barrier(CardsView):
        NAME = "barrier"
        raced = False

        async def populate(self, cx: Any, query: RankQuery) -> Sequence[Any]:
            if not Barrier.raced:
                Barrier.raced = True
                # While the attach's snapshot is in flight, k1 changes and a
                # pass routes it: the barrier holds it for the replay.
                async with db.pool.acquire() as conn:
                    await write_card(conn, Card("k1", "acme", 1, "uno"))
                f = f_holder[0]
                # A pass of its own (a task holding a read refuses a second connection).
                report = await asyncio.create_task(f.runtime.render_pass(await f.commits(1)))
                assert report.deltas == 0
            return await super().populate(cx, query)

    async with frames(db, Barrier()) as f:
        f_holder.append(f)
        stream = await f.runtime.registry.attach(ALICE, "barrier", window())
        replica: WindowReplica[Any] = WindowReplica()
        (reset,) = await take(stream, 1)
        replica.apply(reset)
        assert replica.views == {'"k1"': ("acme", 1, "uno"), '"k19"': ("acme", 19, "nineteen")}
        assert Barrier.raced
        # The next pass replays the held k1 and routes k19 leaving acme.
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("k19", "globex", 19, "moved"))
        await f.runtime.render_pass(await f.commits(1))
        replica.apply_all(drained(stream))
        assert replica.views == {'"k1"': ("acme", 1, "uno")}
        # Nothing later heals a miss: k19 changes again outside acme.
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("k19", "globex", 20, "again"))
        await f.runtime.render_pass(await f.commits(1))
        replica.apply_all(drained(stream))
        assert replica.views == {'"k1"': ("acme", 1, "uno")}


async def test_a_session_that_goes_live_while_a_pass_loads_gets_none_of_its_older_rows(
    db: Database,
) -> None:
    """A session whose snapshot completes while a pass loads is covered by
    that snapshot (and its replay): the pass, whose rows may predate the
    snapshot, sends it nothing, so its window never steps back to an older
    view after its Reset."""
    await seed(db, Card("k1", "globex", 1, "one"))
    f_holder: list[Frames] = []
    attached: list[SessionStream[Any]] = []

    class RacingStore(CardStore):
        async def read_many(self, conn: Any, keys: Sequence[Any]) -> list[Card]:
            rows = await super().read_many(conn, keys)
            if Late.race and not attached:
                # The pass has read k1; k1 changes again and a session
                # attaches (its snapshot sees the newer row) before the pass
                # renders.
                Late.race = False
                async with db.pool.acquire() as other:
                    await write_card(other, Card("k1", "globex", 1, "moved"))
                attached.append(await f_holder[0].runtime.registry.attach(ALICE, "late", window()))
            return rows

    class Late(CardsView):
        NAME = "late"
        STORE: ClassVar[Any] = RacingStore()
        race = False

    async with frames(db, Late()) as f:
        f_holder.append(f)
        bob = await f.runtime.registry.attach(BOB, "late", window())
        await take(bob, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("k1", "acme", 1, "uno"))
        Late.race = True
        await f.runtime.render_pass(await f.commits(1))
        (stream,) = attached
        (reset,) = await take(stream, 1)
        assert reset.views == {}
        await assert_quiet(stream, within=0.1)
        await f.runtime.render_pass(await f.commits(1))
        assert drained(stream) == []


async def test_s132_a_lost_listener_resets_every_live_session(db: Database) -> None:
    """s132 (sessions): a loss of impact continuity re-snapshots every live
    session from committed state."""
    await seed(db, Card("c1", "acme", 1, "one"))
    async with running_engine(db, CardsView()) as engine:
        a = await engine.attach(ALICE, "cards", window())
        c = await engine.attach(CAROL, "cards", window())
        await take(a, 1)
        await take(c, 1)
        pid = await db.pool.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
        )
        await db.pool.fetchval("SELECT pg_terminate_backend($1)", pid)
        (ra,) = await take(a, 1)
        (rc,) = await take(c, 1)
        assert isinstance(ra, Reset) and ra.views == {'"c1"': ("acme", 1, "one")}
        assert isinstance(rc, Reset) and rc.views == {}


async def test_s130_a_render_frame_takes_no_row_lock(db: Database) -> None:
    """s130: a render frame proceeds while a mutation holds the row's lock."""
    await seed(db, Card("c1", "acme", 1, "one"))
    async with frames(db, CardsView()) as f:
        stream = await f.runtime.registry.attach(ALICE, "cards", window())
        await take(stream, 1)
        async with db.pool.acquire() as locker, locker.transaction():
            await locker.execute("SELECT 1 FROM sample_card WHERE id = 'c1' FOR UPDATE")
            report = await asyncio.wait_for(
                f.runtime.render_pass([[Impact.entity("card", "c1")]]), 5
            )
        assert report.loads == 1 and report.sessions == 1


async def test_attach_after_shutdown_is_refused(db: Database) -> None:
    """An attach after shutdown is refused with AttachShuttingDown, which is a ShuttingDown."""
    from service_engine.errors import AttachShuttingDown, ShuttingDown

    async with running_engine(db, CardsView()) as engine:
        engine.shutdown()
        with pytest.raises(AttachShuttingDown):
            await engine.attach(ALICE, "cards", window())
        with pytest.raises(ShuttingDown):
            await engine.attach(ALICE, "cards", window())


async def test_s132_a_channel_overflow_resets_every_live_session(db: Database) -> None:
    """s132: a listener channel overflow (a stalled consumer) yields one
    Reconnected, and the next frame re-snapshots every live session."""
    await seed(db, Card("c1", "acme", 1, "one"))
    async with frames(db, CardsView(), listener_channel_capacity=2) as f:
        a = await f.runtime.registry.attach(ALICE, "cards", window())
        c = await f.runtime.registry.attach(CAROL, "cards", window())
        await take(a, 1)
        await take(c, 1)
        async with db.pool.acquire() as conn:
            for i in range(6):  # nobody renders meanwhile: the channel overflows
                await write_card(conn, Card("c1", "acme", 1, f"v{i}"))
        await wait_until(lambda: f.listener.channel.overflows >= 1, what="overflow")
        await wait_until(lambda: len(f.listener.channel) >= 1, what="queued")
        deliveries = []
        while (item := f.listener.channel.get_nowait()) is not None:
            deliveries.append(item)
        report = await f.runtime.render_pass(deliveries)
        assert report.resets == 2
        (ra,) = drained(a)
        (rc,) = drained(c)
        assert isinstance(ra, Reset) and ra.views == {'"c1"': ("acme", 1, "v5")}
        assert isinstance(rc, Reset) and rc.views == {}
