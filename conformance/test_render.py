"""The render runtime against real Postgres: sessions, the connect barrier,
cohorts, visibility, paging and repair (s129, s130, s131, s132, s135,
s162-s168)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from service_engine import Database, Engine, EngineConfig, ReadinessHandle
from service_engine.impacts import Cause, Impact
from service_engine.impacts.model import Delivery
from service_engine.impacts.transport import PgListenNotify, stage_in
from service_engine.render import Keys, NoLiveSession, Query, Remove, Reset, Upsert, WindowReplica
from service_engine.render.projector import MissingRlsApplier, PerImpact, RlsRegimeMismatch
from service_engine.render.runtime import RenderRuntime
from service_engine.render.stream import SessionEnded, SessionStream
from service_engine.render.windows import WindowSpec

from .harness import engine_running, listener_running, wait_until
from .sample_cards import (
    Card,
    CardStore,
    CardsView,
    OrgApplier,
    OrgCardsRls,
    Principal,
    RankQuery,
    delete_card,
    write_card,
)

ALICE = Principal("alice", frozenset({"acme"}))
BOB = Principal("bob", frozenset({"acme"}))
CAROL = Principal("carol", frozenset({"globex"}))
FAST = {"beat_interval": timedelta(milliseconds=50), "lease": timedelta(seconds=1)}


def running_engine(
    db: Database, *projectors: Any, **config: Any
) -> contextlib.AbstractAsyncContextManager[Engine]:
    return engine_running(EngineConfig(service="render", **{**FAST, **config}), db, *projectors)


class CardWriters:
    """Writers committing random card upserts and deletes (over 30 keys of
    ``orgs``) until the block ends; ``written`` counts their commits."""

    def __init__(self, db: Database, rng: Any, orgs: Sequence[str], count: int = 3) -> None:
        self._db, self._rng, self._orgs, self._count = db, rng, list(orgs), count
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.written = 0

    async def _write(self, w: int) -> None:
        rng = self._rng
        async with self._db.pool.acquire() as conn:
            while not self._stop.is_set():
                key = f"k{rng.randrange(30)}"
                if rng.random() < 0.2:
                    await delete_card(conn, key)
                else:
                    await write_card(conn, Card(key, rng.choice(self._orgs), rng.randrange(100), f"w{w}"))
                self.written += 1

    def wrote_since(self, mark: int) -> Callable[[], bool]:
        """A predicate: a commit landed after ``mark`` commits."""
        return lambda: self.written > mark

    async def facts_changed(self, *principals: str) -> None:
        """Stage the principal-facts impacts of ``principals`` (whose facts the
        caller just changed), then wait until 20 more commits landed."""
        async with self._db.pool.acquire() as conn, conn.transaction():
            await stage_in(conn, [Impact.principal_facts(p, ["card"]) for p in principals])
        mark = self.written
        await wait_until(lambda: self.written > mark + 20,
                         what="writes after the principal changes")

    async def __aenter__(self) -> CardWriters:
        self._tasks = [asyncio.create_task(self._write(w)) for w in range(self._count)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


class Frames:
    """A runtime driven frame by frame from a real LISTEN channel."""

    def __init__(self, db: Database, **config: Any) -> None:
        self.config = EngineConfig(**config)
        self.listener = PgListenNotify(db, self.config, ReadinessHandle())
        self.runtime = RenderRuntime(db, self.config, self.listener.channel)

    async def commits(self, n: int) -> list[Delivery]:
        """The next ``n`` deliveries the listener received."""
        return [await asyncio.wait_for(self.listener.channel.get(), 10) for _ in range(n)]


@contextlib.asynccontextmanager
async def frames(db: Database, *projectors: Any, **config: Any) -> AsyncIterator[Frames]:
    f = Frames(db, **config)
    for projector in projectors:
        f.runtime.registry.register_projector(projector)
    async with listener_running(f.listener):
        yield f


async def take(stream: SessionStream[Any], n: int) -> list[Any]:
    return [await asyncio.wait_for(stream.next(), 10) for _ in range(n)]


async def assert_quiet(stream: SessionStream[Any], within: float = 0.3) -> None:
    """No delta reaches ``stream`` within the bound."""
    try:
        delta = await asyncio.wait_for(stream.next(), within)
    except TimeoutError:
        return
    raise AssertionError(f"expected no delta, got {delta!r}")


def drained(stream: SessionStream[Any]) -> list[Any]:
    out = []
    while (d := stream.get_nowait()) is not None:
        out.append(d)
    return out


def window(limit: int = 100) -> WindowSpec[Any]:
    return WindowSpec(Query(RankQuery(limit)))


async def seed(db: Database, *cards: Card) -> None:
    async with db.pool.acquire() as conn:
        for card in cards:
            await write_card(conn, card)


# -- the live session over the running engine ----------------------------------------


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


async def test_s164_one_load_per_dirty_key_and_cohort(db: Database) -> None:
    """s164: several sessions in one cohort and two in another never load
    per session: at most once per cohort per frame. Without RLS the rows are
    the same for every cohort, so the whole frame shares one load; under RLS
    each cohort (one principal) loads under its own context."""
    async with frames(db, CardsView()) as f:
        acme = [Principal(f"a{i}", frozenset({"acme"})) for i in range(3)]
        globex = [Principal(f"g{i}", frozenset({"globex"})) for i in range(2)]
        streams = [await f.runtime.registry.attach(p, "cards", window()) for p in acme + globex]
        for s in streams:
            await take(s, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "one"))
        report = await f.runtime.render_pass(await f.commits(1))
        assert report.loads == 1
        assert report.sessions == 3  # globex's sessions see nothing and hold nothing: skipped
        assert report.deltas == 3  # only acme's sessions see the card
        for s in streams[:3]:
            assert [type(d) for d in drained(s)] == [Upsert]


async def test_s164_rls_cohorts_load_once_each(db: Database) -> None:
    """s164 (RLS): with RLS each principal is its own cohort and loads once under its own
    context; sessions that cannot see the row get nothing."""
    async with frames(db, OrgCardsRls()) as f:
        spec: WindowSpec[Any] = WindowSpec(Query(None), rls=True)
        acme = [await f.runtime.registry.attach(Principal(f"a{i}", frozenset({"acme"})), "org_cards_rls",
                                       spec, applier=OrgApplier()) for i in range(3)]
        globex = await f.runtime.registry.attach(CAROL, "org_cards_rls", spec, applier=OrgApplier())
        for s in [*acme, globex]:
            await take(s, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("o1", "acme", 0, "acme card"), table="sample_org_card")
        report = await f.runtime.render_pass(await f.commits(1))
        assert report.loads == 4  # one per principal cohort, each under its RLS context
        assert report.deltas == 3
        assert drained(globex) == []


async def test_s165_a_per_projector_reset_threshold(db: Database) -> None:
    """s165: RESET_THRESHOLD resets a window where the global default still diffs."""

    class Touchy(CardsView):
        NAME = "touchy"
        RESET_THRESHOLD = 2

    async with frames(db, CardsView(), Touchy()) as f:
        plain = await f.runtime.registry.attach(ALICE, "cards", window())
        touchy = await f.runtime.registry.attach(ALICE, "touchy", window())
        await take(plain, 1)
        await take(touchy, 1)
        async with db.pool.acquire() as conn, conn.transaction():
            for i in range(3):
                await conn.execute(
                    "INSERT INTO sample_card (id, org, rank) VALUES ($1, 'acme', $2)", f"c{i}", i
                )
            await stage_in(conn, [Impact.entity("card", f"c{i}") for i in range(3)])
        await f.runtime.render_pass(await f.commits(1))
        assert [type(d) for d in drained(plain)] == [Upsert, Upsert, Upsert]
        (reset,) = drained(touchy)
        assert isinstance(reset, Reset) and len(reset.views) == 3


async def test_s166_per_impact_emission_with_a_causeless_impact(db: Database) -> None:
    """s166: a PerImpact view emits its cause per caused impact (even when
    the view did not change between them), and folds causeless impacts
    coalesced, one cause-less Upsert per key, without faulting; only caused
    impacts are asked for their emission."""
    asked: list[str | None] = []

    class Narrated(CardsView):
        NAME = "narrated"

        def emission(self, impact: Impact) -> Any:
            asked.append(impact.cause.name if impact.cause else None)
            return PerImpact

    await seed(db, Card("c1", "acme", 1, "one"), Card("c2", "acme", 2, "two"))
    async with frames(db, Narrated()) as f:
        stream = await f.runtime.registry.attach(ALICE, "narrated", window())
        (reset,) = await take(stream, 1)
        async with db.pool.acquire() as conn, conn.transaction():
            await conn.execute("UPDATE sample_card SET title = 'moved' WHERE id = 'c1'")
            await conn.execute("UPDATE sample_card SET title = 'touched' WHERE id = 'c2'")
            await stage_in(conn, [
                Impact.entity("card", "c1", Cause("card.moved", {"to": "done"})),
                Impact.entity("card", "c2"),
                Impact.entity("card", "c1", Cause("card.renamed", None)),
                Impact.entity("card", "c2"),
            ])
        report = await f.runtime.render_pass(await f.commits(1))
        assert report.failures == 0
        deltas = drained(stream)
        assert [(type(d), d.key, d.cause.name if d.cause else None) for d in deltas] == [
            (Upsert, '"c1"', "card.moved"),
            (Upsert, '"c1"', "card.renamed"),
            (Upsert, '"c2"', None),  # the two causeless impacts, coalesced into one
        ]
        assert [d.view for d in deltas] == [("acme", 1, "moved"), ("acme", 1, "moved"), ("acme", 2, "touched")]
        assert [d.revision for d in deltas] == [reset.revision + i for i in (1, 2, 3)]
        assert None not in asked and "card.moved" in asked and "card.renamed" in asked


async def test_s135_leaving_a_cohort_removes_and_a_fixed_window_follows_the_principal(
    db: Database,
) -> None:
    """s135 (the Projector surface): a row that leaves the principal's
    cohorts is Removed; when the principal's facts change, a fixed (Keys)
    window and a query window are repopulated in both directions: the rows
    of the org she left are Removed, those of the org she joined Upserted."""
    await seed(db, Card("c1", "acme", 3, "one"), Card("a1", "acme", 1, "stays acme"),
               Card("g1", "globex", 2, "two"))
    facts = {"alice": frozenset({"acme"})}

    async def refresh(principal: Principal) -> Principal:
        return Principal(principal.id, facts[principal.id])

    async with running_engine(db, CardsView()) as engine:
        engine.register_principal_refresh(refresh)
        query = await engine.attach(ALICE, "cards", window())
        fixed = await engine.attach(ALICE, "cards", WindowSpec(Keys(["c1", "a1", "g1"])))
        replicas = {"query": WindowReplica[Any](), "fixed": WindowReplica[Any]()}
        streams = {"query": query, "fixed": fixed}
        for name, stream in streams.items():
            (reset,) = await take(stream, 1)
            replicas[name].apply(reset)
            assert set(replicas[name].views) == {'"c1"', '"a1"'}
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "globex", 3, "moved away"))
        for name, stream in streams.items():
            (left,) = await take(stream, 1)
            assert isinstance(left, Remove) and left.key == '"c1"'
            replicas[name].apply(left)
        facts["alice"] = frozenset({"globex"})
        async with db.pool.acquire() as conn, conn.transaction():
            await stage_in(conn, [Impact.principal_facts("alice", ["card"])])
        for name, stream in streams.items():
            deltas = await take(stream, 3)
            assert {(type(d), d.key) for d in deltas} == {
                (Remove, '"a1"'), (Upsert, '"c1"'), (Upsert, '"g1"'),
            }, name
            for delta in deltas:
                replicas[name].apply(delta)  # raises on a revision gap
            assert dict(replicas[name].views) == {
                '"c1"': ("globex", 3, "moved away"), '"g1"': ("globex", 2, "two"),
            }, name
            await assert_quiet(stream)


async def test_s131_a_failing_principal_refresh_ends_the_session(db: Database) -> None:
    """s131: a principal-facts change whose refresh errors ends the session
    fail-closed."""

    async def refresh(principal: Principal) -> Principal:
        raise RuntimeError("directory unavailable")

    async with running_engine(db, CardsView()) as engine:
        engine.register_principal_refresh(refresh)
        stream = await engine.attach(ALICE, "cards", window())
        await take(stream, 1)
        async with db.pool.acquire() as conn, conn.transaction():
            await stage_in(conn, [Impact.principal_facts("alice", ["card"])])
        with pytest.raises(SessionEnded, match="principal refresh failed"):
            await asyncio.wait_for(stream.next(), 10)


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


async def test_s168_an_rls_assertion_must_match_the_projector(db: Database) -> None:
    """s168: a window asserting an RLS regime the projector does not
    declare, and the reverse, are refused at attach."""
    async with running_engine(db, CardsView(), OrgCardsRls()) as engine:
        with pytest.raises(RlsRegimeMismatch):
            await engine.attach(ALICE, "cards", WindowSpec(Query(RankQuery()), rls=True))
        with pytest.raises(RlsRegimeMismatch):
            await engine.attach(ALICE, "org_cards_rls", WindowSpec(Query(None)), applier=OrgApplier())
        with pytest.raises(MissingRlsApplier):
            await engine.attach(ALICE, "org_cards_rls", WindowSpec(Query(None), rls=True))


async def test_rls_reads_are_scoped_by_the_applier_on_every_path(db: Database) -> None:
    """RLS reads are scoped by the applier on every path: the snapshot and fetch see only
    the principal's org."""
    async with db.pool.acquire() as conn:
        await write_card(conn, Card("o1", "acme", 0, "acme card"), table="sample_org_card")
        await write_card(conn, Card("o2", "globex", 0, "globex card"), table="sample_org_card")
    async with running_engine(db, OrgCardsRls()) as engine:
        stream = await engine.attach(ALICE, "org_cards_rls", WindowSpec(Query(None), rls=True),
                                     applier=OrgApplier())
        (reset,) = await take(stream, 1)
        assert reset.views == {'"o1"': "acme card"}
        assert await engine.fetch("org_cards_rls", "o2", ALICE, OrgApplier()) is None
        assert await engine.fetch("org_cards_rls", "o1", ALICE, OrgApplier()) == "acme card"


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


@pytest.mark.parametrize("seed_value", [7, 11, 23])
async def test_randomized_windows_equal_committed_state(db: Database, seed_value: int) -> None:
    """Concurrent writers, attaches during the write storm and principal
    changes: every session's window, rebuilt from its deltas with contiguous
    revisions, equals the committed state filtered by its visibility."""
    import random

    rng = random.Random(seed_value)
    orgs = ["acme", "globex", "initech"]
    facts = {f"p{i}": frozenset({orgs[i % 3]}) for i in range(6)}
    facts["p5"] = frozenset({"acme", "initech"})  # two memberships

    async def refresh(principal: Principal) -> Principal:
        return Principal(principal.id, facts[principal.id])

    async with running_engine(db, CardsView()) as engine:
        engine.register_principal_refresh(refresh)
        streams: list[tuple[str, SessionStream[Any]]] = []
        replicas: list[WindowReplica[Any]] = []
        async with CardWriters(db, rng, orgs) as writers:
            for i, pid in enumerate(facts):
                spec = window() if i % 2 else WindowSpec(Keys([f"k{j}" for j in range(0, 30, 2)]))
                streams.append((pid, await engine.attach(Principal(pid, facts[pid]), "cards", spec)))
                replicas.append(WindowReplica())
                await wait_until(writers.wrote_since(writers.written),
                                 what="a write between attaches")
            facts["p0"] = frozenset({"globex", "initech"})
            facts["p3"] = frozenset()
            await writers.facts_changed("p0", "p3")

        rows = {r["id"]: r for r in await db.pool.fetch("SELECT * FROM sample_card")}

        def expected(pid: str, index: int) -> dict[str, Any]:
            allowed = facts[pid]
            keys = rows.keys() if index % 2 else [f"k{j}" for j in range(0, 30, 2)]
            return {
                f'"{k}"': (rows[k]["org"], rows[k]["rank"], rows[k]["title"])
                for k in keys if k in rows and rows[k]["org"] in allowed
            }

        for index, ((pid, stream), replica) in enumerate(zip(streams, replicas, strict=True)):
            want = expected(pid, index)

            async def settled(stream: SessionStream[Any] = stream, replica: WindowReplica[Any] = replica, want: dict[str, Any] = want) -> bool:
                while (d := stream.get_nowait()) is not None:
                    replica.apply(d)  # raises on a revision gap
                return dict(replica.views) == want

            await wait_until(settled, what=f"window of {pid} equals committed state")


@pytest.mark.parametrize("seed_value", [3, 5, 8])
async def test_a_session_attached_amid_writers_converges_on_committed_state(
    db: Database, seed_value: int
) -> None:
    """A session attached while three writers commit, with only a few commits
    after its attach, still ends on committed state: no write committed during
    the attach is lost."""
    import random

    rng = random.Random(seed_value)
    orgs = ["acme", "globex", "initech"]
    alice = Principal("alice", frozenset({"acme", "initech"}))
    async with running_engine(db, CardsView()) as engine:
        async with CardWriters(db, rng, orgs) as writers:
            await wait_until(lambda: writers.written > 20, what="the writers under way")
            stream = await engine.attach(alice, "cards", window())
            mark = writers.written
            await wait_until(lambda: writers.written > mark + 3, what="a few writes after the attach")
        rows = await db.pool.fetch("SELECT * FROM sample_card")
        want = {f'"{r["id"]}"': (r["org"], r["rank"], r["title"]) for r in rows if r["org"] in alice.orgs}
        replica: WindowReplica[Any] = WindowReplica()

        def settled() -> bool:
            while (d := stream.get_nowait()) is not None:
                replica.apply(d)  # raises on a revision gap
            return dict(replica.views) == want

        await wait_until(settled, timeout=5, what="the window to equal committed state")


async def test_an_impure_cohort_is_caught_by_the_debug_check(db: Database) -> None:
    """In debug the pass recomputes each grouped session's cohort key: a
    cohort() that is not a pure function of the principal fails the render
    instead of landing the session in two cohorts."""

    class Drifting(CardsView):
        NAME = "drifting"
        calls = 0

        def cohort(self, principal: Principal) -> Any:
            Drifting.calls += 1
            from service_engine import CohortKey

            return CohortKey.of_parts("drift", Drifting.calls)

    async with frames(db, Drifting()) as f:
        stream = await f.runtime.registry.attach(ALICE, "drifting", WindowSpec(Keys(["c1"])))
        await take(stream, 1)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "one"))
        report = await f.runtime.render_pass(await f.commits(1))
        assert report.failures == 1


async def test_a_joined_noun_reaches_the_keys_its_inverse_names(db: Database) -> None:
    """The escape hatch for views that join nouns: a change of a joined noun
    re-renders the projector keys its inverse maps it to."""

    class Flagged(CardsView):
        NAME = "flagged"
        JOINS: ClassVar[Mapping[str, Any]] = {
            "card_flag": lambda key: [key],
            "org_theme": lambda key: None,  # every key may be affected
        }

    await seed(db, Card("c1", "acme", 1, "one"), Card("c2", "acme", 2, "two"))
    async with frames(db, Flagged()) as f:
        stream = await f.runtime.registry.attach(ALICE, "flagged", window())
        await take(stream, 1)
        async with db.pool.acquire() as conn, conn.transaction():
            await conn.execute("UPDATE sample_card SET title = 'flagged' WHERE id = 'c1'")
            await stage_in(conn, [Impact.entity("card_flag", "c1")])
        await f.runtime.render_pass(await f.commits(1))
        (delta,) = drained(stream)
        assert delta.key == '"c1"' and delta.view == ("acme", 1, "flagged")
        async with db.pool.acquire() as conn, conn.transaction():
            await conn.execute("UPDATE sample_card SET title = 'themed'")
            await stage_in(conn, [Impact.entity("org_theme", "acme")])
        await f.runtime.render_pass(await f.commits(1))
        assert {d.key for d in drained(stream)} == {'"c1"', '"c2"'}
