"""Overload degrades, never stalls writers (issue 11, item 4), against real
Postgres: a subscriber that falls behind reads its latest state on a
contiguous revision, a pass over many sessions yields the loop between
slices, and a pass that is behind folds PerImpact causes to the latest."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service_engine import Database
from service_engine.impacts import Cause, Impact
from service_engine.impacts.transport import stage_in
from service_engine.render import Reset, Upsert, WindowReplica
from service_engine.render import runtime as runtime_module
from service_engine.render.projector import PerImpact
from service_engine.render.stream import BEHIND

from ..support.harness import wait_until
from ..support.render_support import ALICE, drained, frames, running_engine, seed, take, window
from ..support.sample_cards import Card, CardsView, Principal, delete_card, write_card

WRITES = 10 * BEHIND
"""Writes that land while the subscriber does not read: well past `BEHIND`."""
CARDS = 5


async def _committed(db: Database, org: str) -> dict[str, tuple[str, int, str]]:
    """The committed views of ``org``'s cards, as CardsView projects them."""
    async with db.pool.acquire() as conn:
        rows = await conn.fetch("SELECT id, org, rank, title FROM sample_card WHERE org = $1", org)
    return {f'"{r["id"]}"': (r["org"], r["rank"], r["title"]) for r in rows}


async def test_a_subscriber_that_does_not_read_gets_contiguous_revisions_ending_at_committed_state(
    db: Database,
) -> None:
    """While a subscriber reads nothing, many writes land (updates of a few
    cards, one card deleted and re-created, one created and deleted); when it
    reads, its revisions run on contiguously from its Reset, there is no
    second Reset, far fewer deltas than writes reach it (the untaken ones
    collapsed), and its window ends equal to committed state."""
    await seed(db, *(Card(f"c{i}", "acme", i, "start") for i in range(CARDS)))
    async with running_engine(db, CardsView()) as engine:
        stream = await engine.attach(ALICE, "cards", window())
        replica: WindowReplica[Any] = WindowReplica()
        replica.apply_all(await take(stream, 1))
        async with db.pool.acquire() as conn:
            for n in range(WRITES):
                if n == WRITES // 2:
                    await delete_card(conn, "c0")
                    await write_card(conn, Card("gone", "acme", 99, "brief"))
                    await delete_card(conn, "gone")
                    await write_card(conn, Card("c0", "acme", 0, "back"))
                card = n % CARDS
                await write_card(conn, Card(f"c{card}", "acme", card, f"w{n}"))
        committed = await _committed(db, "acme")
        last = f"w{WRITES - 1}"
        # The render side delivers on its own; the subscriber reads only now.
        await wait_until(lambda: stream.collapsed > 0, what="the untaken deltas collapsing")
        taken: list[Any] = []

        async def caught_up() -> bool:
            while (delta := stream.get_nowait()) is not None:
                replica.apply(delta)  # raises RevisionGap on any discontinuity
                taken.append(delta)
            return replica.views == committed

        await wait_until(caught_up, what=f"the window at committed state (last write {last})")
        assert not any(isinstance(d, Reset) for d in taken), "a collapse, not an overflow Reset"
        assert [d.revision for d in taken] == list(range(2, 2 + len(taken)))
        assert len(taken) < WRITES // 2, (len(taken), stream.collapsed)


async def test_a_pass_over_many_sessions_yields_the_loop_between_slices(db: Database) -> None:
    """A pass that gives deltas to many sessions runs in slices and yields
    the event loop between them, so a mutation's request is served while it
    renders: a task counting loop turns advances during the pass."""
    sessions = 6 * runtime_module.SLICE_SESSIONS
    await seed(db, Card("c1", "acme", 1, "one"))
    async with frames(db, CardsView()) as f:
        streams = [await f.runtime.registry.attach(Principal(f"p{i}", frozenset({"acme"})), "cards",
                                          window()) for i in range(sessions)]
        for stream in streams:
            drained(stream)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "moved"))
        deliveries = await f.commits(1)
        turns = 0

        async def count_turns() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.create_task(count_turns())
        await asyncio.sleep(0)
        turns = 0
        try:
            report = await f.runtime.render_pass(deliveries)
        finally:
            counter.cancel()
        assert report.sessions == sessions and report.deltas == sessions
        assert report.slices >= sessions // runtime_module.SLICE_SESSIONS
        assert turns >= report.slices - 1, (turns, report.slices)
        for stream in streams:
            (upsert,) = drained(stream)
            assert isinstance(upsert, Upsert) and upsert.view == ("acme", 1, "moved")


class _Narrated(CardsView):
    NAME = "narrated"

    def emission(self, impact: Impact) -> Any:
        return PerImpact


async def _two_caused_commits(f: Any) -> list[Any]:
    async with f.runtime.registry._db.pool.acquire() as conn:
        for name in ("card.moved", "card.renamed"):
            async with conn.transaction():
                await conn.execute("UPDATE sample_card SET title = $1 WHERE id = 'c1'", name)
                await stage_in(conn, [Impact.entity("card", "c1", Cause(name, None))])
    deliveries: list[Any] = await f.commits(2)
    return deliveries


@pytest.mark.parametrize("shedding", [True, False])
async def test_a_pass_that_is_behind_folds_per_impact_causes_to_the_latest(
    db: Database, monkeypatch: pytest.MonkeyPatch, shedding: bool
) -> None:
    """A pass that drains several commits after a pass that was behind
    renders a PerImpact key once, with its latest cause (the earlier one is
    counted as coalesced); with ``render_shedding`` off every cause is
    delivered. A pass not behind delivers every cause either way."""
    await seed(db, Card("c1", "acme", 1, "one"))
    async with frames(db, _Narrated(), render_shedding=shedding) as f:
        stream = await f.runtime.registry.attach(ALICE, "narrated", window())
        (reset,) = drained(stream)
        report = await f.runtime.render_pass(await _two_caused_commits(f))
        assert not report.behind
        assert [d.cause.name for d in drained(stream)] == ["card.moved", "card.renamed"]
        monkeypatch.setattr(runtime_module, "BEHIND_SECONDS", 0.0)
        await f.runtime.render_pass([])  # this pass "lasted" past the bound
        report = await f.runtime.render_pass(await _two_caused_commits(f))
        deltas = drained(stream)
        if shedding:
            assert report.behind and report.coalesced == 1
            assert [(d.cause.name, d.view) for d in deltas] == [
                ("card.renamed", ("acme", 1, "card.renamed"))]
        else:
            assert not report.behind and report.coalesced == 0
            assert [d.cause.name for d in deltas] == ["card.moved", "card.renamed"]
        assert [d.revision for d in deltas] == list(
            range(reset.revision + 3, reset.revision + 3 + len(deltas)))
