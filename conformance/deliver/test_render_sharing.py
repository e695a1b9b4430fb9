"""Shared views against real Postgres: a projector's declared `view_key` lets a
render pass (and an attach batch) project a row once per key, and every
session still holds exactly its own principal's views of committed state."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import pytest

from service_engine import Database
from service_engine.render import Keys, Query, Upsert, WindowReplica
from service_engine.render.sharing import InvalidViewKey
from service_engine.render.stream import SessionStream
from service_engine.render.windows import WindowSpec

from ..support.harness import wait_until
from ..support.render_support import CardWriters, drained, frames, running_engine, seed, take
from ..support.sample_cards import Card, CardsView, RankQuery, write_card


@dataclass(frozen=True)
class Member:
    """A principal with orgs (the visibility) and a tier (what the view reads)."""

    id: str
    orgs: frozenset[str] = field(default_factory=frozenset)
    tier: str = "basic"


class TieredCards(CardsView):
    """A card's view carries the reader's tier: it reads the tier and
    nothing else of the principal, and says so."""

    NAME = "tiered"

    def project(self, row: Card, principal: Any) -> Any:
        return (row.org, row.rank, row.title, principal.tier)

    def view_key(self, principal: Any) -> Hashable:
        tier: Hashable = principal.tier
        return tier

    def cohort(self, principal: Any) -> Any:
        return super(CardsView, self).cohort(principal)  # one cohort per principal


class Misdeclared(TieredCards):
    """The view reads the principal's id; the key claims the tier alone."""

    NAME = "misdeclared"

    def project(self, row: Card, principal: Any) -> Any:
        return (row.org, row.rank, row.title, principal.id)


def _view(row: Any, principal: Member) -> Any:
    return (row["org"], row["rank"], row["title"], principal.tier)


@pytest.mark.parametrize("seed_value", [5, 13])
async def test_shared_views_windows_equal_each_principals_own_committed_state(
    db: Database, seed_value: int
) -> None:
    """Writers storm while sessions of a few principals per view key attach
    (discovering, fixed and authoritative windows) and two principals change
    tier and orgs: every window, rebuilt from its deltas with contiguous
    revisions, equals the committed rows its principal sees, each projected
    for that principal — sharing a projection never hands one principal
    another's view."""
    rng = random.Random(seed_value)
    orgs = ["acme", "globex", "initech"]
    tiers = ["basic", "gold"]
    people = {
        f"p{i}": Member(f"p{i}", frozenset({orgs[i % 3]}), tiers[i % 2]) for i in range(9)
    }
    people["p8"] = Member("p8", frozenset({"acme", "globex"}), "gold")
    fixed = [f"k{j}" for j in range(0, 30, 3)]
    shapes = [
        WindowSpec(Query(RankQuery(100))),
        WindowSpec(Keys(fixed)),
        WindowSpec(Query(RankQuery(100)).with_keys()),
    ]

    async def refresh(principal: Member) -> Member:
        return people[principal.id]

    async with running_engine(db, TieredCards()) as engine:
        engine.register_principal_refresh(refresh)
        sessions: list[tuple[str, int, SessionStream[Any]]] = []
        async with CardWriters(db, rng, orgs) as writers:
            for i, pid in enumerate(people):
                for shape in range(3) if i % 3 == 0 else (i % 3,):
                    stream = await engine.attach(people[pid], "tiered", shapes[shape])
                    sessions.append((pid, shape, stream))
                await wait_until(writers.wrote_since(writers.written),
                                 what="a write between attaches")
            people["p0"] = Member("p0", frozenset({"globex", "initech"}), "gold")
            people["p3"] = Member("p3", frozenset({"acme"}), "basic")
            await writers.facts_changed("p0", "p3")
        rows = {r["id"]: r for r in await db.pool.fetch("SELECT * FROM sample_card")}

        def expected(pid: str, shape: int) -> dict[str, Any]:
            who = people[pid]
            keys = fixed if shape == 1 else rows.keys()
            return {f'"{k}"': _view(rows[k], who)
                    for k in keys if k in rows and rows[k]["org"] in who.orgs}

        for pid, shape, stream in sessions:
            replica: WindowReplica[Any] = WindowReplica()
            want = expected(pid, shape)

            def settled(stream: SessionStream[Any] = stream,
                        replica: WindowReplica[Any] = replica,
                        want: dict[str, Any] = want) -> bool:
                while (d := stream.get_nowait()) is not None:
                    replica.apply(d)  # raises on a revision gap
                return dict(replica.views) == want

            await wait_until(settled, what=f"window of {pid} (shape {shape}) equals its own state")


async def test_a_pass_projects_a_row_once_per_view_key(db: Database) -> None:
    """Forty sessions of two view keys (twenty principals each, one cohort
    each): an attach batch and a render pass project each row once per view
    key (plus the debug check's one re-projection per shared view), and the
    sessions of one key are handed the one view object."""
    await seed(db, Card("c1", "acme", 1, "one"))
    members = [Member(f"m{i}", frozenset({"acme"}), "gold" if i % 2 else "basic")
               for i in range(40)]
    async with frames(db, TieredCards()) as f:
        streams = [await f.runtime.registry.attach(m, "tiered", WindowSpec(Query(RankQuery(10))))
                   for m in members]
        for member, stream in zip(members, streams, strict=True):
            (reset,) = drained(stream)
            assert dict(reset.views) == {'"c1"': ("acme", 1, "one", member.tier)}
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 2, "two"))
        report = await f.runtime.render_pass(await f.commits(1))
        assert report.deltas == 40 and report.failures == 0
        assert report.projections == 2 + 2  # one per view key, one debug check each
        upserts = [drained(stream) for stream in streams]
        views: dict[str, set[int]] = {"basic": set(), "gold": set()}
        for member, (delta,) in zip(members, upserts, strict=True):
            assert isinstance(delta, Upsert)
            assert delta.view == ("acme", 2, "two", member.tier)
            views[member.tier].add(id(delta.view))
        assert len(views["basic"]) == 1 and len(views["gold"]) == 1


async def test_a_view_key_that_does_not_determine_the_view_stops_sharing_loudly(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A view key that leaves out something `project` reads is caught by the
    debug check the first time a shared view is handed to a second session:
    it logs the mismatch, that session gets its own view, and from then on
    the projector's views are projected per session — no principal is shown
    another's."""
    await seed(db, Card("c1", "acme", 1, "one"))
    members = [Member(f"m{i}", frozenset({"acme"})) for i in range(5)]
    async with frames(db, Misdeclared()) as f:
        with caplog.at_level(logging.ERROR, logger="service_engine.render.registry"):
            # Attached at once: one attach batch, one snapshot read for all.
            streams = await asyncio.gather(*(
                f.runtime.registry.attach(m, "misdeclared", WindowSpec(Keys(["c1"]))) for m in members))
            assert any("view_key does not determine the view" in r.getMessage()
                       for r in caplog.records)
        for member, stream in zip(members, streams, strict=True):
            (reset,) = await take(stream, 1)
            assert dict(reset.views) == {'"c1"': ("acme", 1, "one", member.id)}
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 2, "two"))
        report = await f.runtime.render_pass(await f.commits(1))
        assert report.projections == len(members)
        for member, stream in zip(members, streams, strict=True):
            (delta,) = drained(stream)
            assert delta.view == ("acme", 2, "two", member.id)


async def test_an_unhashable_view_key_refuses_the_attach(db: Database) -> None:
    """A view key that cannot key the memo is a declaration error, refused at
    attach with a typed error before the session exists."""

    class Unhashable(TieredCards):
        NAME = "unhashable"

        def view_key(self, principal: Any) -> Any:
            return [principal.tier]

    async with frames(db, Unhashable()) as f:
        with pytest.raises(InvalidViewKey):
            await f.runtime.registry.attach(Member("m", frozenset({"acme"})), "unhashable",
                                   WindowSpec(Keys(["c1"])))
        assert not f.runtime.registry.sessions
