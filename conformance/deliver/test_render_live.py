"""Window membership through the running engine, against real Postgres: an
authoritative query (`Query.with_keys`) removes a key that leaves its
result, and a paged history survives a principal refresh and a reconnect
Reset. Every change reaches the session by a commit the engine's LISTEN
loop delivers, never by a call into the render runtime."""

from __future__ import annotations

from typing import Any

from service_engine import Database
from service_engine.impacts import Impact
from service_engine.impacts.transport import stage_in
from service_engine.render import Query, Remove, Reset, Upsert, WindowReplica
from service_engine.render.windows import WindowSpec

from ..support.harness import wait_until
from ..support.render_support import ALICE, BOB, assert_quiet, running_engine, seed, take
from ..support.sample_cards import Card, CardsView, Principal, RankQuery, delete_card, write_card


async def test_with_keys_removes_a_key_that_leaves_the_result(db: Database) -> None:
    """A window built with `Query.with_keys` is authoritative: when a commit
    changes the noun, its membership becomes exactly populate's result plus
    the keys that commit discovered, so a key that leaves the result (still
    existing, still visible) is Removed and the window stays bounded by the
    query's limit. A discovery-only `Query` over the same rows keeps it."""
    await seed(db, *(Card(f"c{i}", "acme", i, f"t{i}") for i in (1, 2, 3)))
    async with running_engine(db, CardsView()) as engine:
        exact = await engine.attach(ALICE, "cards", WindowSpec(Query(RankQuery(2)).with_keys()))
        grows = await engine.attach(BOB, "cards", WindowSpec(Query(RankQuery(2))))
        replicas = {"exact": WindowReplica[Any](), "grows": WindowReplica[Any]()}
        for name, stream in (("exact", exact), ("grows", grows)):
            (reset,) = await take(stream, 1)
            assert isinstance(reset, Reset)
            replicas[name].apply(reset)
            assert set(replicas[name].views) == {'"c3"', '"c2"'}, name

        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c4", "acme", 4, "t4"))  # pushes c2 out of the top two
        deltas = await take(exact, 2)
        assert {(type(d), d.key) for d in deltas} == {(Upsert, '"c4"'), (Remove, '"c2"')}
        for delta in deltas:
            replicas["exact"].apply(delta)  # raises on a revision gap
        (entered,) = await take(grows, 1)
        assert (type(entered), entered.key) == (Upsert, '"c4"')
        replicas["grows"].apply(entered)

        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c5", "acme", 5, "t5"))  # and then c3
        deltas = await take(exact, 2)
        assert {(type(d), d.key) for d in deltas} == {(Upsert, '"c5"'), (Remove, '"c3"')}
        for delta in deltas:
            replicas["exact"].apply(delta)
        (entered,) = await take(grows, 1)
        replicas["grows"].apply(entered)
        await assert_quiet(exact)
        await assert_quiet(grows)
        assert dict(replicas["exact"].views) == {
            '"c5"': ("acme", 5, "t5"), '"c4"': ("acme", 4, "t4"),
        }
        assert set(replicas["grows"].views) == {'"c5"', '"c4"', '"c3"', '"c2"'}


async def test_paged_history_survives_refresh_and_reconnect(db: Database) -> None:
    """Older pages appended behind a live window stay held through a
    principal-facts refresh (the re-resolved principal's new rows enter, no
    paged key is Removed) and through a reconnect of the engine's LISTEN
    connection (the Reset that re-snapshots the session carries the paged
    keys): a paged row deleted afterwards still reaches its holder as a
    Remove, which only a key the window holds can get."""
    await seed(db, *(Card(f"c{i}", "acme", i, f"t{i}") for i in range(10)),
               Card("g1", "globex", 50, "joined"))
    facts = {"alice": frozenset({"acme"})}

    async def refresh(principal: Principal) -> Principal:
        return Principal(principal.id, facts[principal.id])

    async with running_engine(db, CardsView(), window_capacity=100) as engine:
        engine.register_principal_refresh(refresh)
        stream = await engine.attach(ALICE, "cards", WindowSpec(Query(RankQuery(2))))
        replica = WindowReplica[Any]()
        (reset,) = await take(stream, 1)
        replica.apply(reset)
        assert set(replica.views) == {'"c9"', '"c8"'}
        await engine.page(str(stream.id), ALICE, 8)
        await engine.page(str(stream.id), ALICE, 6)
        for delta in await take(stream, 4):
            assert isinstance(delta, Upsert)
            replica.apply(delta)
        paged = {'"c7"', '"c6"', '"c5"', '"c4"'}
        assert set(replica.views) == {'"c9"', '"c8"'} | paged

        # A principal-facts refresh: alice joins globex.
        facts["alice"] = frozenset({"acme", "globex"})
        async with db.pool.acquire() as conn, conn.transaction():
            await stage_in(conn, [Impact.principal_facts("alice", ["card"])])
        (joined,) = await take(stream, 1)
        assert (type(joined), joined.key) == (Upsert, '"g1"')
        replica.apply(joined)
        await assert_quiet(stream)  # nothing paged was Removed
        async with db.pool.acquire() as conn:
            await delete_card(conn, "c6")
        (removed,) = await take(stream, 1)
        assert (type(removed), removed.key) == (Remove, '"c6"')
        replica.apply(removed)

        # A reconnect: the LISTEN connection is cut; the engine reconnects
        # and re-snapshots the session from committed state.
        await _cut_the_listener(db)
        (resnapshot,) = await take(stream, 1)
        assert isinstance(resnapshot, Reset)
        replica.apply(resnapshot)
        # The head is populate's again (g1, c9); every paged key still held is in it.
        assert {'"g1"', '"c9"', '"c7"', '"c5"', '"c4"'} <= set(replica.views)
        assert '"c6"' not in replica.views
        async with db.pool.acquire() as conn:
            await delete_card(conn, "c4")
            await write_card(conn, Card("c5", "acme", 5, "edited"))
        deltas = await take(stream, 2)
        assert {(type(d), d.key) for d in deltas} == {(Remove, '"c4"'), (Upsert, '"c5"')}
        for delta in deltas:
            replica.apply(delta)
        assert replica.views['"c5"'] == ("acme", 5, "edited")
        await assert_quiet(stream)


async def _cut_the_listener(db: Database) -> None:
    """Terminate the backend that LISTENs for impacts (as a failover or a
    network cut would), from another connection of the same role."""
    sql = """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()
                AND query ILIKE 'LISTEN%'"""

    async def cut() -> bool:
        return bool(await db.pool.fetch(sql))

    await wait_until(cut, what="the LISTEN backend terminated")
