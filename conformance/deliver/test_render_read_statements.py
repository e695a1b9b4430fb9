"""What a render pass sends to Postgres for one commit, statement by statement.

A pass whose only read is a `CrudStore`'s batched ``read_many`` (no member
populates, no RLS setting to apply) sends that one statement: one statement
is its own snapshot, so no ``BEGIN ... REPEATABLE READ READ ONLY``, no
``COMMIT`` and no release reset (the pool's ``RESET ALL`` / unlisten round
trip). A snapshot, whose populate and load must agree, keeps its read-only
transaction.
"""

from __future__ import annotations

from service_engine import Database, EngineConfig
from service_engine.impacts.model import Cause, Impact
from service_engine.impacts.transport import ImpactChannel
from service_engine.render.deltas import Reset, Upsert
from service_engine.render.runtime import RenderRuntime
from service_engine.render.windows import Query, WindowSpec

from ..support.harness import Statements
from ..support.sample_cards import Card, CardsView, Principal, RankQuery, write_card

ALICE = Principal("alice", frozenset({"acme"}))


async def test_a_pass_over_one_changed_row_sends_one_statement(
    logged: tuple[Database, Statements],
) -> None:
    """The pass rendering one committed change of a card (a discovering
    window, a CrudStore, no RLS) sends exactly its ``read_many`` SELECT on
    the pooled connection, and the session still gets the Upsert; the
    attach's snapshot read (populate and load) ran in one read-only
    repeatable-read transaction."""
    db, statements = logged
    async with db.pool.acquire() as conn:
        await write_card(conn, Card("c1", "acme", 1, "one"))
    config = EngineConfig()
    runtime = RenderRuntime(db, config, ImpactChannel(config.listener_channel_capacity))
    runtime.registry.register_projector(CardsView())
    try:
        statements.take()
        stream = await runtime.registry.attach(ALICE, "cards", WindowSpec(Query(RankQuery(10))))
        snapshot = statements.take_own()
        assert snapshot[0].startswith("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        assert any(s.startswith("COMMIT") for s in snapshot)
        first = stream.get_nowait()
        assert isinstance(first, Reset)
        async with db.pool.acquire() as conn:
            await write_card(conn, Card("c2", "acme", 2, "two"))
        statements.take()

        await runtime.render_pass([[Impact.entity("card", "c2", Cause("card.written", {}))]])

        sent = statements.take_own()
        assert len(sent) == 1, sent
        assert sent[0].startswith("SELECT") and "sample_card" in sent[0], sent
        delta = stream.get_nowait()
        assert isinstance(delta, Upsert) and delta.key == '"c2"' and delta.revision == 2
    finally:
        runtime.registry.end_all("test over")
