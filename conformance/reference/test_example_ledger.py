"""The reference service's ledger slice (full EDA through the engine's kit),
in process against real Postgres.

Each test states the property it proves: an older event version is upcast
at read time and never rewritten; the hydration barrier refuses a log the
gates could not have produced (no write, no render); erasure rewrites the
person out of the log and the lagging snapshot alike; the gates hold the
invariants the generic log cannot declare; a live window follows the log.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from example_service.slices.ledger.commands import (
    close_ledger,
    erase_person,
    open_ledger,
    post_to_ledger,
)
from example_service.slices.ledger.domain import LEDGER_ERASE, Ledger
from example_service.slices.ledger.views import LEDGERS, LedgersQuery
from service_engine import MutationError, Query, WindowSpec
from service_engine.embedded import ProvisionedDatabase
from service_engine.errors import HydrationFailed
from service_engine.graphql import Passport
from service_engine.render import Reset, Upsert

from ..support.example_support import Running, person, running
from ..support.harness import owner_connection

ALICE = person("alice")
BOB = person("bob")
CAROL = person("carol", "acme", LEDGER_ERASE)
GLOBEX = person("gina", "globex")
BOUND = 5.0



@pytest.fixture
async def ledger(store: ProvisionedDatabase) -> AsyncIterator[Running]:
    async with running(store, ["ledger"]) as run:
        yield run


def key_text(org: str, name: str) -> str:
    return json.dumps([org, name], separators=(",", ":"))


async def append_raw(store: ProvisionedDatabase, org: str, name: str,
                     events: list[tuple[int, str, int, dict[str, Any]]]) -> None:
    """Write ``(seq, type, version, payload)`` rows straight into the log, as
    an older build (or a corruption) left them."""
    async with owner_connection(store) as conn:
        await conn.executemany(
            """INSERT INTO service_engine.event_log (noun, key, seq, event_type, event_version,
                                                     payload)
               VALUES ('ledger', $1, $2, $3, $4, $5::text::jsonb)""",
            [(key_text(org, name), seq, kind, version, json.dumps(payload))
             for seq, kind, version, payload in events],
        )


async def log_of(store: ProvisionedDatabase, org: str, name: str) -> list[tuple[int, str, int]]:
    async with owner_connection(store) as conn:
        rows = await conn.fetch(
            "SELECT seq, event_type, event_version FROM service_engine.event_log"
            " WHERE noun = 'ledger' AND key = $1 ORDER BY seq", key_text(org, name),
        )
    return [(r["seq"], r["event_type"], r["event_version"]) for r in rows]


async def test_a_version_1_posting_is_upcast_at_read_and_left_as_written(
    ledger: Running, store: ProvisionedDatabase
) -> None:
    """A version-1 posting is upcast when read (by the view and by the write side) and left
    as written in the log; new postings append at the current version."""
    await append_raw(store, "acme", "old", [
        (1, "opened", 1, {"org": "acme", "name": "old", "owner": "alice"}),
        (2, "posted", 1, {"amount": "12.34", "note": "rent", "by": "alice"}),
        (3, "posted", 1, {"amount": "-2.30", "by": "bob"}),
    ])
    view = await ledger.engine.fetch(LEDGERS, ["acme", "old"], ALICE)
    assert view is not None
    assert (view.balance, view.postings) == (1004, 2)
    assert [(e.cents, e.memo, e.by) for e in view.recent] == [(-230, "", "bob"), (1234, "rent", "alice")]

    # The write side loads the same upcast state and appends at the current version.
    assert await ledger.executor.execute(BOB, post_to_ledger, "old", 96, "top-up") == ("acme", "old")
    assert await log_of(store, "acme", "old") == [
        (1, "opened", 1), (2, "posted", 1), (3, "posted", 1), (4, "posted", 2),
    ]
    view = await ledger.engine.fetch(LEDGERS, ["acme", "old"], ALICE)
    assert view is not None and view.balance == 1100


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        ([(1, "posted", 2, {"cents": 100, "memo": "", "by": "bob"})], "no opening event"),
        ([(1, "opened", 2, {"org": "acme", "name": "bad", "owner": "alice"}),
          (2, "posted", 2, {"cents": -500, "memo": "", "by": "bob"})], "balance is negative"),
        ([(1, "opened", 2, {"org": "acme", "name": "bad", "owner": "alice"}),
          (3, "posted", 2, {"cents": 5, "memo": "", "by": "bob"})], "jumps from seq 1 to 3"),
        ([(1, "opened", 3, {"org": "acme", "name": "bad", "owner": "alice"})], "newer than this code"),
    ],
    ids=["no-opening", "negative-balance", "gap", "too-new"],
)
async def test_the_hydration_barrier_refuses_the_load_on_both_sides(
    ledger: Running, store: ProvisionedDatabase, events: list[Any], problem: str
) -> None:
    """A log the hydration barrier refuses fails the write (hydration_failed, nothing
    appended) and the read (HydrationFailed)."""
    await append_raw(store, "acme", "bad", events)
    before = await log_of(store, "acme", "bad")

    outcome = await ledger.executor.execute(ALICE, post_to_ledger, "bad", 100)
    assert isinstance(outcome, MutationError) and outcome.code == "hydration_failed", outcome
    assert await log_of(store, "acme", "bad") == before  # nothing was appended

    with pytest.raises(HydrationFailed, match=problem):
        await ledger.engine.fetch(LEDGERS, ["acme", "bad"], ALICE)


async def test_the_gates_hold_what_the_generic_log_cannot_declare(ledger: Running) -> None:
    """The ledger's gates refuse what the generic log cannot: a duplicate open, an overdraw,
    a zero amount, another org's ledger, closing by a non-owner or unsettled, posting to
    a closed ledger."""
    run = ledger.executor
    assert await run.execute(ALICE, open_ledger, "ops") == ("acme", "ops")
    again = await run.execute(BOB, open_ledger, "ops")
    assert isinstance(again, MutationError) and again.code == "unique_violation"

    overdraw = await run.execute(BOB, post_to_ledger, "ops", -1)
    assert isinstance(overdraw, MutationError) and overdraw.code == "ledger.insufficient_funds"
    zero = await run.execute(BOB, post_to_ledger, "ops", 0)
    assert isinstance(zero, MutationError) and zero.code == "ledger.amount_invalid"
    # Another org addresses its own "ops", which does not exist.
    foreign = await run.execute(GLOBEX, post_to_ledger, "ops", 10)
    assert isinstance(foreign, MutationError) and foreign.code == "not_found"

    assert await run.execute(BOB, post_to_ledger, "ops", 50) == ("acme", "ops")
    not_owner = await run.execute(BOB, close_ledger, "ops")
    assert isinstance(not_owner, MutationError) and not_owner.code == "ledger.owner_only"
    unsettled = await run.execute(ALICE, close_ledger, "ops")
    assert isinstance(unsettled, MutationError) and unsettled.code == "ledger.not_settled"
    assert await run.execute(ALICE, post_to_ledger, "ops", -50) == ("acme", "ops")
    assert await run.execute(ALICE, close_ledger, "ops") == ("acme", "ops")
    closed = await run.execute(BOB, post_to_ledger, "ops", 1)
    assert isinstance(closed, MutationError) and closed.code == "ledger.closed"

    view = await ledger.engine.fetch(LEDGERS, ["acme", "ops"], BOB)
    assert view is not None and view.closed
    assert {a.action: a.allowed for a in view.affordances} == {"post": False, "close": False}
    assert await ledger.engine.fetch(LEDGERS, ["acme", "ops"], GLOBEX) is None


async def residue(store: ProvisionedDatabase, needle: str) -> list[str]:
    """Where ``needle`` still appears in the ledgers' log or snapshots."""
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


async def test_erasure_leaves_no_residue_in_the_log_nor_the_lagging_snapshot(
    ledger: Running, store: ProvisionedDatabase
) -> None:
    """Erasing a person leaves no residue in the log nor in a snapshot that lags it, and the
    view still renders."""
    run = ledger.executor
    await run.execute(ALICE, open_ledger, "shared")
    await run.execute(BOB, open_ledger, "bobs")
    # Alice's postings cross the SNAPSHOT_EVERY boundary, so she is folded
    # into a snapshot that lags the log; Bob's stay.
    for i in range(Ledger.SNAPSHOT_EVERY + 3):
        author = ALICE if i % 2 == 0 else BOB
        assert await run.execute(author, post_to_ledger, "shared", 10, f"{author.id} #{i}") \
            == ("acme", "shared")
    await run.execute(ALICE, post_to_ledger, "bobs", 7, "alice was here")
    assert await residue(store, "alice")
    before = await ledger.engine.fetch(LEDGERS, ["acme", "shared"], CAROL)
    assert before is not None

    touched = await run.execute_bulk(CAROL, erase_person, "alice")
    assert not isinstance(touched, MutationError)
    assert sorted(touched) == [("acme", "bobs"), ("acme", "shared")]
    assert await residue(store, "alice") == []

    after = await ledger.engine.fetch(LEDGERS, ["acme", "shared"], CAROL)
    assert after is not None
    # The amounts still replay; only the person is gone.
    assert (after.balance, after.postings) == (before.balance, before.postings)
    assert after.owner == "erased"
    assert all(e.by in {"bob", "erased"} for e in after.recent)
    assert all("alice" not in e.memo for e in after.recent)
    assert any(e.by == "bob" and e.memo.startswith("bob #") for e in after.recent)
    # The rewritten log still hydrates on the write side, and erasure is idempotent.
    assert await run.execute(BOB, post_to_ledger, "shared", 1) == ("acme", "shared")
    assert await run.execute_bulk(CAROL, erase_person, "alice") == []


async def test_the_erase_mutation_needs_its_scope_and_rerenders_the_live_windows(
    ledger: Running
) -> None:
    """The erase mutation needs its scope, and a live window re-renders without the erased
    person's postings."""
    await ledger.executor.execute(ALICE, open_ledger, "live")
    await ledger.executor.execute(ALICE, post_to_ledger, "live", 30, "alice's lunch")
    erase = """mutation($p: String!) { eraseLedgerPerson(person: $p) {
        success ledgers error { code } } }"""
    carol = Passport(sub="carol", org="acme", roles=(LEDGER_ERASE,))
    view = "name owner recent { memo by }"
    subscription = (f"subscription {{ ledgers {{ __typename ... on LedgersReset {{ revision "
                    f"views {{ {view} }} }} ... on LedgersUpsert {{ revision view {{ {view} }} }} }} }}")
    async with ledger.socket(carol) as ws:
        await ws.subscribe("l", subscription)
        reset = (await ws.next("l"))["ledgers"]
        assert reset["__typename"] == "LedgersReset"
        assert reset["views"][0]["recent"] == [{"memo": "alice's lunch", "by": "alice"}]

        refused = (await ledger.gql(erase, {"p": "alice"}, Passport(sub="bob", org="acme")))
        assert refused["eraseLedgerPerson"] == {
            "success": False, "ledgers": 0, "error": {"code": "ledger.erase_scope_required"}}
        done = (await ledger.gql(erase, {"p": "alice"}, carol))["eraseLedgerPerson"]
        assert done == {"success": True, "ledgers": 1, "error": None}

        # The reset impact re-renders every window of the noun: the erased
        # view reaches the live subscriber, revisions contiguous. The writes
        # made before the subscription may still be delivered first (their
        # impacts can land after the snapshot that already showed them).
        revision = reset["revision"]
        while True:
            again = (await ws.next("l"))["ledgers"]
            assert again["revision"] == revision + 1
            revision = again["revision"]
            shown = again["view"] if again["__typename"] == "LedgersUpsert" else again["views"][0]
            if shown["owner"] == "erased":
                break
            assert shown["recent"] == [{"memo": "alice's lunch", "by": "alice"}]
        assert shown == {"name": "live", "owner": "erased", "recent": [{"memo": "", "by": "erased"}]}


async def test_a_live_window_follows_the_log_with_caused_upserts(ledger: Running) -> None:
    """A live window over the event log receives each caused change as an Upsert on the next
    revision with its cause, and another org's ledger never reaches it."""
    stream = await ledger.engine.attach(BOB, LEDGERS, WindowSpec(Query(LedgersQuery())))
    try:
        reset = await asyncio.wait_for(stream.next(), BOUND)
        assert isinstance(reset, Reset) and list(reset.views) == []
        # Opened after the snapshot, so its impact is delivered to the live window
        # deterministically (opened before attach, it may race the snapshot).
        await ledger.executor.execute(ALICE, open_ledger, "a")
        opened = await asyncio.wait_for(stream.next(), BOUND)
        assert isinstance(opened, Upsert) and opened.key == key_text("acme", "a")
        assert opened.revision == reset.revision + 1
        assert opened.cause is not None and opened.cause.name == "ledger.opened"
        await ledger.executor.execute(BOB, post_to_ledger, "a", 25, "coffee")
        upsert = await asyncio.wait_for(stream.next(), BOUND)
        assert isinstance(upsert, Upsert)
        assert (upsert.revision, upsert.key) == (opened.revision + 1, key_text("acme", "a"))
        assert upsert.view.balance == 25
        assert upsert.cause is not None and upsert.cause.name == "ledger.posted"
        # Another org's ledger never reaches this window.
        await ledger.executor.execute(GLOBEX, open_ledger, "theirs")
        await ledger.executor.execute(BOB, open_ledger, "b")
        created = await asyncio.wait_for(stream.next(), BOUND)
        assert isinstance(created, Upsert) and created.key == key_text("acme", "b")
    finally:
        await stream.aclose()
