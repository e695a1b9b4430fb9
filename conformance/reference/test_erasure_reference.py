"""Erasure in the reference service: every slice holding person data is
Erasable. The board slice (a person's memberships go, and with them the
BoardMemberships fact; a board they own stays, re-offered without their
name), the ledger slice (their events rewritten in the log and the
snapshot), the card slice (their name off cards and facts) and the reply
slice (their replies, lane-A chunks and typing marks)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from example_service.slices.board.commands import create_board
from example_service.slices.board.offer import BOARD_BUCKET
from example_service.slices.card.commands import create_card, rename_card
from example_service.slices.ledger.commands import open_ledger, post_to_ledger
from example_service.slices.ledger.domain import Ledger
from example_service.slices.ledger.views import LEDGERS
from example_service.slices.reply.commands import start_reply
from example_service.slices.reply.domain import REPLY_TEXT
from example_service.slices.reply.views import TYPING
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.errors import KeySealed
from service_engine.graphql import Passport

from ..blackbox.harness import provision_kv, provision_lanes
from ..support.example_support import person, running
from ..support.harness import owner_connection, wait_until
from ..support.nats_support import engine_nats

BOUND = 10.0



async def test_the_board_slice_erases_a_persons_memberships(store: ProvisionedDatabase) -> None:
    """Erasing a person removes their board memberships only; their
    principal facts, reloaded by the engine's loader, no longer list the
    board; a second erase is a no-op that answers not fresh."""
    async with owner_connection(store) as conn:
        await conn.execute("INSERT INTO board (id, org, title, owner) VALUES ('b1', 'acme', 'Plans', 'ann')")
        await conn.executemany(
            "INSERT INTO board_member (id, board_id, person) VALUES ($1, 'b1', $2)",
            [("m1", "zoe"), ("m2", "yan")],
        )
    async with running(store, ["board"]) as run:
        zoe = person("zoe", "other")
        assert (await run.engine.load_principal_facts(zoe)).fact("board_memberships") == {"b1"}
        first = await run.engine.erase("zoe")
        assert first.fresh
        assert (await run.engine.load_principal_facts(zoe)).fact("board_memberships") == frozenset()
        assert (await run.engine.load_principal_facts(person("yan", "other"))).fact(
            "board_memberships"
        ) == {"b1"}
        assert not (await run.engine.erase("zoe")).fresh


async def _residue(store: ProvisionedDatabase, needle: str) -> list[str]:
    """Where ``needle`` still appears in the ledgers' event log or snapshots."""
    async with owner_connection(store) as conn:
        rows = await conn.fetch(
            """SELECT 'log ' || key || ' #' || seq AS at FROM service_engine.event_log
                WHERE noun = 'ledger' AND payload::text LIKE '%' || $1 || '%'
               UNION ALL
               SELECT 'snapshot ' || key FROM service_engine.event_snapshot
                WHERE noun = 'ledger' AND state::text LIKE '%' || $1 || '%'""",
            needle,
        )
    return [r["at"] for r in rows]


async def test_the_ledger_slice_erases_a_person_from_the_log_and_the_snapshot(
    store: ProvisionedDatabase,
) -> None:
    """`Engine.erase` runs the ledger slice's Erasable (the in-log erasure
    kit): no trace of the person stays in the event log nor in a snapshot
    that lags it; the amounts still replay and the other poster stays."""
    async with running(store, ["ledger"]) as run:
        alice, bob = person("alice"), person("bob")
        await run.executor.execute(alice, open_ledger, "shared")
        for i in range(Ledger.SNAPSHOT_EVERY + 3):
            author = alice if i % 2 == 0 else bob
            await run.executor.execute(author, post_to_ledger, "shared", 10, f"{author.id} #{i}")
        async with owner_connection(store) as conn:
            assert await conn.fetchval(
                "SELECT count(*) FROM service_engine.event_snapshot WHERE noun = 'ledger'"
            ) == 1
        assert await _residue(store, "alice")
        before = await run.engine.fetch(LEDGERS, ["acme", "shared"], bob)
        assert before is not None

        assert (await run.engine.erase("alice")).fresh
        assert await _residue(store, "alice") == []
        after = await run.engine.fetch(LEDGERS, ["acme", "shared"], bob)
        assert after is not None
        assert (after.balance, after.postings, after.owner) == (
            before.balance, before.postings, "erased")
        assert any(e.by == "bob" for e in after.recent)
        # The rewritten log still takes writes.
        await run.executor.execute(bob, post_to_ledger, "shared", 1)


async def test_the_card_slice_erases_a_persons_name_from_cards_and_facts(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """The card slice's Erasable keeps the org's cards but leaves the
    person's name on none of them, nor on any of their facts."""
    async with engine_nats(nats_server) as conn, running(store, ["card"], nats=conn) as run:
        ann, bob = person("ann"), person("bob")
        await run.executor.execute(ann, create_card, "first", "c-1")
        await run.executor.execute(bob, create_card, "second", "c-2")
        await run.executor.execute(bob, rename_card, "c-1", "renamed by bob")
        await run.executor.execute(ann, rename_card, "c-2", "renamed by ann")
        await run.engine.erase("ann")
        async with owner_connection(store) as pg:
            cards = {r["id"]: r["owner"] for r in await pg.fetch("SELECT id, owner FROM card")}
            leaks = await pg.fetchval(
                "SELECT count(*) FROM card_fact WHERE payload::text LIKE '%\"ann\"%'"
            )
            bobs = await pg.fetchval("SELECT count(*) FROM card_fact WHERE payload->>'by' = 'bob'")
            leak_rows = await pg.fetchval(
                "SELECT count(*) FROM card WHERE owner = 'ann' OR reviewed_by = 'ann'"
            )
        assert cards == {"c-1": "erased", "c-2": "bob"}
        assert (leaks, leak_rows) == (0, 0)
        assert bobs == 2


async def test_the_board_offer_loses_an_erased_owner(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """Erasing a board's owner re-offers the board: its image in
    PUBLISHED_example no longer names them (the erasure dirties the offer
    in its own transaction; the leader's drain republishes it)."""
    await provision_kv(nats_server.url)
    async with engine_nats(nats_server) as conn, running(store, ["board"], nats=conn) as run:
        await run.executor.execute(person("zoe"), create_board, "Plans", "b-z")
        client = await nats.connect(nats_server.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            bucket = await client.jetstream().key_value(BOARD_BUCKET)

            async def owner() -> str | None:
                try:
                    entry = await bucket.get("example.board.b-z")
                except KeyNotFoundError:
                    return None
                value = json.loads(entry.value or b"{}")
                return str(value.get("owner"))

            await wait_until(lambda: _is(owner, "zoe"), timeout=BOUND, what="the board offered")
            await run.engine.erase("zoe")
            await wait_until(lambda: _is(owner, "erased"), timeout=BOUND, what="the board re-offered")
        finally:
            await client.close()


async def _is(read: Callable[[], Awaitable[str | None]], expected: str) -> bool:
    return await read() == expected


async def test_the_reply_slice_erases_replies_chunks_and_typing_marks(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """The reply slice's Erasable deletes the person's replies, purges their
    lane-A chunks (the key stays sealed) and clears their typing mark on
    another's streaming reply (a live typing window sees it removed); other
    people's replies stay."""
    await provision_lanes(nats_server.url)
    await provision_kv(nats_server.url)
    zoe, ann = person("zoe"), person("ann")
    async with engine_nats(nats_server) as conn, running(store, ["reply"], nats=conn) as run:
        await run.executor.execute(zoe, start_reply, "r-z")
        await run.executor.execute(ann, start_reply, "r-a")
        await run.engine.push_chunk(REPLY_TEXT, "r-z", 0, b"zoe's words")
        passport = Passport(sub="ann", org="acme")
        async with run.socket(passport) as ws:
            await ws.subscribe("typing", """subscription { replyTyping(id: "r-a") {
                __typename
                ... on ReplyTypingUpsert { key }
                ... on ReplyTypingRemove { key }
            } }""")
            await ws.next("typing")  # the reset
            typed = await run.gql('mutation { replyTyping(id: "r-a") { success } }',
                                  passport=Passport(sub="zoe", org="acme"))
            assert typed["replyTyping"]["success"]
            upsert = (await ws.next("typing"))["replyTyping"]
            assert upsert == {"__typename": "ReplyTypingUpsert", "key": json.dumps("r-a.zoe")}

            result = await run.engine.erase("zoe")
            assert result.purged
            assert result.manifest.presence == {TYPING: {"r-z.zoe", "r-a.zoe"}}
            removed = (await ws.next("typing"))["replyTyping"]
            assert removed == {"__typename": "ReplyTypingRemove", "key": json.dumps("r-a.zoe")}
        async with owner_connection(store) as db:
            replies = {r["id"] for r in await db.fetch("SELECT id FROM reply")}
            chunks = await db.fetchval(
                "SELECT count(*) FROM service_engine.accumulator_chunk WHERE key = 'r-z'"
            )
        assert (replies, chunks) == ({"r-a"}, 0)
        with pytest.raises(KeySealed):
            await run.engine.push_chunk(REPLY_TEXT, "r-z", 1, b"late")


ERASE_PERSON = """mutation($p: ID!) { erasePerson(person: $p) {
    success person fresh purged error { code retryable }
} }"""


async def test_the_operator_erases_a_person_over_graphql_with_the_ops_role_only(
    store: ProvisionedDatabase,
) -> None:
    """``erasePerson`` over HTTP: refused (nothing erased) without the ops
    role, the role ``/ops`` gates on; with it the person is erased across
    the Erasable slices and the typed result says fresh and purged; sent
    again, it succeeds not fresh."""
    async with owner_connection(store) as conn:
        await conn.execute("INSERT INTO board (id, org, title, owner) VALUES ('b1', 'acme', 'Plans', 'ann')")
        await conn.execute("INSERT INTO board_member (id, board_id, person) VALUES ('m1', 'b1', 'zoe')")
    async with running(store, ["board", "operator"]) as run:
        member = Passport(sub="mia", org="acme", roles=("member",))
        refused = (await run.gql(ERASE_PERSON, {"p": "zoe"}, member))["erasePerson"]
        assert refused == {"success": False, "person": None, "fresh": False, "purged": False,
                           "error": {"code": "operator.ops_role_required", "retryable": False}}
        anonymous = await run.post(ERASE_PERSON, {"p": "zoe"})
        assert anonymous["data"] is None
        assert [e["extensions"]["code"] for e in anonymous["errors"]] == ["passport_missing"]
        async with owner_connection(store) as conn:
            assert await conn.fetchval("SELECT count(*) FROM board_member") == 1
            assert await conn.fetchval("SELECT count(*) FROM service_engine.person_erasure") == 0

        operator = Passport(sub="olga", org="acme", roles=("ops",))
        done = (await run.gql(ERASE_PERSON, {"p": "zoe"}, operator))["erasePerson"]
        assert done == {"success": True, "person": "zoe", "fresh": True, "purged": True,
                        "error": None}
        again = (await run.gql(ERASE_PERSON, {"p": "zoe"}, operator))["erasePerson"]
        assert (again["success"], again["fresh"]) == (True, False)
        bad = (await run.gql(ERASE_PERSON, {"p": ""}, operator))["erasePerson"]
        assert bad["error"]["code"] == "operator.person_invalid"
        async with owner_connection(store) as conn:
            assert await conn.fetchval("SELECT count(*) FROM board_member") == 0
            assert await conn.fetchval(
                "SELECT purged_at IS NOT NULL FROM service_engine.person_erasure WHERE person = 'zoe'"
            )
