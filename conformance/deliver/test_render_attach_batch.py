"""Attaches arriving together share their first snapshot, and lose nothing.

Attaches of one projector queued while a batch waits for its turn are
snapshotted in one read-only transaction: each cohort's populate once, one
``read_many`` for the union of their keys. The connect barrier holds for
every member (interest before the snapshot, what commits meanwhile replayed
after the Reset), and a member whose own read fails fails alone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from service_engine import Database
from service_engine.db.errors import DatabaseError
from service_engine.render import Populate, Reset, WindowReplica
from service_engine.render.cohort import CohortKey
from service_engine.render.stream import SessionStream
from service_engine.render.windows import Query, WindowSpec

from ..support.harness import wait_until
from ..support.render_support import CardWriters, frames, running_engine, seed, take, window
from ..support.sample_cards import (
    Card,
    CardsView,
    OrgApplier,
    OrgCardsRls,
    Principal,
    RankQuery,
    write_card,
)


class CountingCards(CardsView):
    """CardsView counting its populates; a principal named ``bad`` breaks its
    own populate with an SQL error (which aborts the transaction it runs in)."""

    def __init__(self) -> None:
        self.populates = 0

    async def populate(self, cx: Populate[Principal], query: RankQuery) -> Sequence[Any]:
        self.populates += 1
        if cx.principal.id == "bad":
            await cx.conn.fetch("SELECT 1 / 0")
        return await super().populate(cx, query)

    def cohort(self, principal: Principal) -> CohortKey:
        return CohortKey.of_parts(*sorted(principal.orgs))


ORGS = ["acme", "globex", "initech", "umbrella"]


async def test_attaches_arriving_together_populate_once_per_cohort(db: Database) -> None:
    """Forty attaches in four cohorts, arriving in one loop turn, run four
    populates (not forty), and each session's Reset is its cohort's window."""
    await seed(db, *(Card(f"c{i}", ORGS[i % 4], i, f"t{i}") for i in range(12)))
    view = CountingCards()
    async with frames(db, view) as f:
        principals = [Principal(f"p{i}", frozenset({ORGS[i % 4]})) for i in range(40)]
        streams = await asyncio.gather(
            *(f.runtime.registry.attach(p, "cards", window()) for p in principals))
        assert view.populates == len(ORGS)
        for principal, stream in zip(principals, streams, strict=True):
            (reset,) = await take(stream, 1)
            assert isinstance(reset, Reset) and reset.revision == 1
            (org,) = principal.orgs
            assert {v[0] for v in reset.views.values()} == {org}
            assert len(reset.views) == 3


async def test_a_member_whose_read_fails_fails_alone(db: Database) -> None:
    """One member's populate fails the shared transaction: the others still
    go live (each read again alone) and only that attach raises."""
    await seed(db, Card("c1", "acme", 1, "one"))
    async with frames(db, CountingCards()) as f:
        principals = [
            Principal("a", frozenset({"acme"})), Principal("bad", frozenset({"acme", "x"})),
            Principal("b", frozenset({"acme"})), Principal("c", frozenset({"acme", "y"})),
        ]
        results = await asyncio.gather(
            *(f.runtime.registry.attach(p, "cards", window()) for p in principals),
            return_exceptions=True)
        assert isinstance(results[1], DatabaseError)
        live = [r for r in results if isinstance(r, SessionStream)]
        assert len(live) == 3
        for stream in live:
            (reset,) = await take(stream, 1)
            assert isinstance(reset, Reset) and list(reset.views) == ['"c1"']
        assert {s.session.principal.id for s in f.runtime.registry.sessions.values()} == {"a", "b", "c"}


async def test_an_attach_without_a_task_calls_back_as_attach_returns(db: Database) -> None:
    """attach_soon (the socket's attach, no task of its own): ``done`` gets each
    session's stream, its first delta the Reset of its cohort's window; a member whose
    read fails gets its error, its session detached; a cancelled attach is detached and
    ``done`` is never called."""
    await seed(db, Card("c1", "acme", 1, "one"), Card("c2", "globex", 2, "two"))
    async with frames(db, CountingCards()) as f:
        registry = f.runtime.registry
        got: dict[str, Any] = {}

        def answer(name: str) -> Callable[[object], None]:
            return lambda result: got.__setitem__(name, result)

        principals = [
            Principal("a", frozenset({"acme"})), Principal("bad", frozenset({"acme", "x"})),
            Principal("g", frozenset({"globex"})), Principal("gone", frozenset({"acme"})),
        ]
        pending = {
            p.id: registry.attach_soon(p, "cards", window(), answer(p.id), session_id=p.id)
            for p in principals
        }
        pending["gone"].cancel()
        await wait_until(lambda: len(got) == 3, what="every attach but the cancelled one answered")
        assert isinstance(got["bad"], DatabaseError)
        for name, key in (("a", '"c1"'), ("g", '"c2"')):
            stream = got[name]
            assert isinstance(stream, SessionStream)
            (reset,) = await take(stream, 1)
            assert isinstance(reset, Reset) and reset.revision == 1 and list(reset.views) == [key]
        await wait_until(lambda: set(registry.sessions) == {"a", "g"},
                         what="the failed and the cancelled attaches detached")
        assert "gone" not in got


async def test_an_rls_attach_without_a_task_reads_under_its_own_principal(
    db: Database,
) -> None:
    """attach_soon of an RLS projector: each session's snapshot reads alone under its
    own principal's context (its Reset holds only its org's rows), and ``done`` gets its
    stream; a cancelled one is detached."""
    async with db.pool.acquire() as conn:
        for card in (Card("o1", "acme", 0, "acme card"), Card("o2", "globex", 0, "globex card")):
            await write_card(conn, card, table="sample_org_card")
    async with frames(db, OrgCardsRls()) as f:
        registry = f.runtime.registry
        spec: WindowSpec[Any] = WindowSpec(Query(None), rls=True)
        got: dict[str, Any] = {}

        def answer(name: str) -> Callable[[object], None]:
            return lambda result: got.__setitem__(name, result)

        pending = {
            name: registry.attach_soon(Principal(name, frozenset({org})), "org_cards_rls", spec,
                                       answer(name), session_id=name, applier=OrgApplier())
            for name, org in (("a", "acme"), ("g", "globex"), ("gone", "acme"))
        }
        pending["gone"].cancel()
        await wait_until(lambda: len(got) == 2, what="both attaches answered")
        for name, title in (("a", "acme card"), ("g", "globex card")):
            (reset,) = await take(got[name], 1)
            assert isinstance(reset, Reset) and list(reset.views.values()) == [title]
        await wait_until(lambda: set(registry.sessions) == {"a", "g"},
                         what="the cancelled attach detached")
        assert "gone" not in got


async def test_the_registry_keeps_the_most_sessions_attached_at_once(db: Database) -> None:
    """take_peak answers the most sessions attached at once since the last call (a
    burst attached and detached in between included), then starts again from those
    attached now: what the memory release's beat reads."""
    await seed(db, Card("c1", "acme", 1, "one"))
    async with frames(db, CountingCards()) as f:
        registry = f.runtime.registry
        registry.take_peak()
        streams = await asyncio.gather(*(registry.attach(Principal(f"p{i}", frozenset({"acme"})),
                                                         "cards", window()) for i in range(5)))
        for stream in streams[1:]:
            registry.detach(stream.id, "closed")
        assert len(registry.sessions) == 1
        assert registry.take_peak() == 5
        assert registry.take_peak() == 1


@pytest.mark.parametrize("seed_value", [2, 7])
async def test_sessions_attached_together_amid_writers_converge_on_committed_state(
    db: Database, seed_value: int
) -> None:
    """Thirty sessions attached at once while three writers commit all end on
    committed state: no write committed during the shared snapshot is lost or
    applied out of order (the replica refuses a revision gap)."""
    rng = random.Random(seed_value)
    async with running_engine(db, CardsView()) as engine:
        principals = [
            Principal(f"p{i}", frozenset({ORGS[i % 4], ORGS[(i + 1) % 4]})) for i in range(30)
        ]
        async with CardWriters(db, rng, ORGS) as writers:
            await wait_until(lambda: writers.written > 20, what="the writers under way")
            streams = await asyncio.gather(
                *(engine.attach(p, "cards", window()) for p in principals))
            mark = writers.written
            await wait_until(lambda: writers.written > mark + 5,
                             what="a few writes after the attaches")
        rows = await db.pool.fetch("SELECT * FROM sample_card")
        replicas: list[WindowReplica[Any]] = [WindowReplica() for _ in streams]

        def settled() -> bool:
            done = True
            for principal, stream, replica in zip(principals, streams, replicas, strict=True):
                while (d := stream.get_nowait()) is not None:
                    replica.apply(d)  # raises on a revision gap
                want = {
                    f'"{r["id"]}"': (r["org"], r["rank"], r["title"])
                    for r in rows if r["org"] in principal.orgs
                }
                done = done and dict(replica.views) == want
            return done

        await wait_until(settled, timeout=10, what="every window to equal committed state")
