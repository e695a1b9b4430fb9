"""The render runtime's cohorts and visibility against real Postgres: one
load per dirty key and cohort (s164), a per-projector Reset threshold
(s165), per-impact emission (s166), leaving a cohort (s135), a failing
principal refresh (s131), RLS assertions and scoping (s168), the impure
cohort check, and a joined noun reaching the keys its inverse names."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from service_engine import Database
from service_engine.impacts import Cause, Impact
from service_engine.impacts.transport import stage_in
from service_engine.render import Keys, Query, Remove, Reset, Upsert, WindowReplica
from service_engine.render.projector import MissingRlsApplier, PerImpact, RlsRegimeMismatch
from service_engine.render.stream import SessionEnded
from service_engine.render.windows import WindowSpec

from ..support.render_support import (
    ALICE,
    CAROL,
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
    OrgApplier,
    OrgCardsRls,
    Principal,
    RankQuery,
    write_card,
)


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
