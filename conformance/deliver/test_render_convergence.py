"""The render runtime's convergence against real Postgres: randomized
windows, and sessions attached amid concurrent writers, equal committed
state."""

from __future__ import annotations

from typing import Any

import pytest

from service_engine import Database
from service_engine.render import Keys, WindowReplica
from service_engine.render.stream import SessionStream
from service_engine.render.windows import WindowSpec

from ..support.harness import wait_until
from ..support.render_support import (
    CardWriters,
    running_engine,
    window,
)
from ..support.sample_cards import (
    CardsView,
    Principal,
)


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
