"""A pod whose sessions all closed is back to idle (issue 11, item 5): the engine's
per-session structures are empty, their containers are back to the size they had at
boot, the beat has released the heap's free pages, and the next frame renders the one
session still open. RSS itself is measured, not asserted (``bench/idle_return.py``)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from service_engine import Database, Engine
from service_engine.memory import RELEASE_MIN_CLOSED, release_free_memory
from service_engine.render.cohort_index import CohortIndex
from service_engine.render.deltas import Reset, Upsert

from .harness import wait_until
from .sample_cards import Card, CardsView, Principal, write_card
from .test_render import running_engine, take, window

MANY = RELEASE_MIN_CLOSED + 100
"""Sessions opened and closed: enough to grow every table well past its idle size
and for the beat's release to be due."""


def footprint(obj: object) -> int:
    """Bytes of the containers ``obj`` is or holds (dicts, sets, lists, tuples,
    nested), their hash tables and arrays included; other objects count nothing."""
    if isinstance(obj, dict):
        return sys.getsizeof(obj) + sum(footprint(v) for v in obj.values())
    if isinstance(obj, set | frozenset | list | tuple):
        return sys.getsizeof(obj) + sum(footprint(v) for v in obj)
    return 0


def session_containers(engine: Engine) -> dict[str, int]:
    """The footprint of each container of the render side that grows with sessions."""
    render: Any = engine.render
    sizes = {
        "sessions": footprint(render._sessions),
        "attaching": footprint(render._attaching),
        "interest": footprint(vars(render._interest)),
    }
    for name, index in render._indexes.items():
        sizes[f"index:{name}"] = footprint({s: getattr(index, s) for s in CohortIndex.__slots__})
    return sizes


async def test_closing_every_session_returns_the_render_side_to_its_boot_size(
    db: Database,
) -> None:
    """MANY sessions in 30 cohorts attach, go live and close: no session is left in the
    registry, its interest routes or its cohort index, each of those containers is back
    to its footprint at boot (not merely emptied with its grown table), the beat saw
    the fall and released free memory, and a session opened afterwards is routed and
    rendered as on a fresh pod."""
    async with db.pool.acquire() as conn:
        await write_card(conn, Card("c1", "acme", 1, "one"))
    async with running_engine(db, CardsView()) as engine:
        idle = session_containers(engine)
        principals = [Principal(f"p{i}", frozenset({"acme", f"org{i % 30}"}))
                      for i in range(MANY)]
        streams = await asyncio.gather(*(engine.attach(p, "cards", window()) for p in principals))
        for stream in streams:
            (reset,) = await take(stream, 1)
            assert isinstance(reset, Reset)
        held = session_containers(engine)
        assert all(held[name] > idle[name] for name in ("sessions", "interest", "index:cards"))
        await wait_until(lambda: engine._release.peak >= MANY, what="the beat saw the peak")

        for stream in streams:
            await stream.aclose()
        assert len(engine.render.sessions) == 0
        assert len(engine.render._interest) == 0
        after = session_containers(engine)
        assert all(after[name] <= idle[name] for name in idle), (after, idle)
        # The beat observed the settled fall and released (its peak restarts from 0).
        await wait_until(lambda: engine._release.peak == 0, what="the release after the close")
        if release_free_memory():  # glibc: the release is counted
            assert engine.metrics.sample("service_engine_memory_releases_total") == 1

        survivor = await engine.attach(Principal("last", frozenset({"acme"})), "cards", window())
        (reset,) = await take(survivor, 1)
        assert isinstance(reset, Reset) and reset.views == {'"c1"': ("acme", 1, "one")}
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "uno"))
        (upsert,) = await take(survivor, 1)
        assert isinstance(upsert, Upsert) and upsert.view == ("acme", 1, "uno")
        assert engine.render.last_report.sessions == 1
