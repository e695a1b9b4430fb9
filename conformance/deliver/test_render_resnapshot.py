"""Re-snapshots in batches against real Postgres: a lost listener (or a
stream overflow) resets many sessions of one projector in shared reads, as
attaches do, and a session's own failure still fails it alone."""

from __future__ import annotations

from typing import Any

from service_engine import Database
from service_engine.impacts.model import Reconnected
from service_engine.render import Keys, Reset, WindowReplica
from service_engine.render.windows import WindowSpec

from ..support.render_support import drained, frames, seed, window
from ..support.sample_cards import Card, CardsView, OrgApplier, OrgCardsRls, Principal, write_card


async def test_s132_a_lost_listener_resets_many_sessions_in_one_read(db: Database) -> None:
    """Twelve live sessions of one projector in three orgs: a Reconnected
    resets every one from committed state (the writes since their snapshot
    included) with one ``read_many``, not twelve, counted as reconnect
    resets; revisions stay contiguous."""
    await seed(db, Card("c1", "acme", 1, "one"), Card("c2", "globex", 2, "two"))
    orgs = ["acme", "globex", "initech"]
    people = [Principal(f"p{i}", frozenset({orgs[i % 3]})) for i in range(12)]
    async with frames(db, CardsView()) as f:
        streams = [await f.runtime.registry.attach(p, "cards", window()) for p in people]
        replicas: list[WindowReplica[Any]] = []
        for stream in streams:
            replica: WindowReplica[Any] = WindowReplica()
            replica.apply_all(drained(stream))
            replicas.append(replica)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c1", "acme", 1, "uno"))
            await write_card(conn, Card("c3", "initech", 3, "three"))
        report = await f.runtime.render_pass([Reconnected("test")])
        assert report.resets == 12 and report.loads == 1 and report.failures == 0
        want = {
            "acme": {'"c1"': ("acme", 1, "uno")},
            "globex": {'"c2"': ("globex", 2, "two")},
            "initech": {'"c3"': ("initech", 3, "three")},
        }
        for person, stream, replica in zip(people, streams, replicas, strict=True):
            (delta,) = drained(stream)
            assert isinstance(delta, Reset)
            replica.apply(delta)  # the next revision
            (org,) = person.orgs
            assert dict(replica.views) == want[org]


async def test_rls_sessions_reset_each_under_its_own_context(db: Database) -> None:
    """An RLS projector's sessions are never read together: each resets
    under its own principal's RLS context, one read each."""
    async with db.pool.acquire() as conn:
        await write_card(conn, Card("o1", "acme", 0, "acme's"), table="sample_org_card")
        await write_card(conn, Card("o2", "globex", 0, "globex's"), table="sample_org_card")
    people = [Principal("a", frozenset({"acme"})), Principal("g", frozenset({"globex"}))]
    async with frames(db, OrgCardsRls()) as f:
        streams = [
            await f.runtime.registry.attach(p, "org_cards_rls", WindowSpec(Keys(["o1", "o2"]), rls=True),
                                   applier=OrgApplier())
            for p in people
        ]
        for stream in streams:
            drained(stream)
        report = await f.runtime.render_pass([Reconnected("test")])
        assert report.resets == 2 and report.loads == 2
        (a,) = drained(streams[0])
        (g,) = drained(streams[1])
        assert dict(a.views) == {'"o1"': "acme's"} and dict(g.views) == {'"o2"': "globex's"}


async def test_a_failing_populate_in_a_shared_resnapshot_fails_only_its_session(
    db: Database
) -> None:
    """One session whose populate raises fails the shared read: every other
    session is then read alone and reset; only that one goes to repair."""

    class Fussy(CardsView):
        NAME = "fussy"
        failing = False

        async def populate(self, cx: Any, query: Any) -> Any:
            if Fussy.failing and cx.principal.id == "p1":
                raise RuntimeError("populate refused")
            return await super().populate(cx, query)

    await seed(db, Card("c1", "acme", 1, "one"))
    # p1 alone in its org: its populate is its own (equal cohorts share one).
    people = [Principal(f"p{i}", frozenset({"globex" if i == 1 else "acme"})) for i in range(4)]
    async with frames(db, Fussy()) as f:
        streams = [await f.runtime.registry.attach(p, "fussy", window()) for p in people]
        for stream in streams:
            drained(stream)
        Fussy.failing = True
        report = await f.runtime.render_pass([Reconnected("test")])
        assert report.resets == 3 and report.failures == 1
        states = {rec.session.principal.id: rec.session.state.value
                  for rec in f.runtime.registry.sessions.values()}
        assert states == {"p0": "live", "p1": "repair_pending", "p2": "live", "p3": "live"}
        for i, stream in enumerate(streams):
            got = drained(stream)
            if i != 1:
                assert [type(d) for d in got] == [Reset]
                assert dict(got[0].views) == {'"c1"': ("acme", 1, "one")}
