"""The reference service on the command layer, in process against real
Postgres (and a spawned nats-server for the card slice's reactions).

The card's stage changes are revision-checked transitions with idempotency
keys; the board's title is unique per org and its delete runs under a
declared cascade; the GraphQL surface answers each typed outcome
(``outcome`` and a stable ``error.code``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from example_service.slices.board.policy import MAX_INVITES
from example_service.slices.card.domain import CARD_ADVANCE
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.graphql import Passport

from ..support.example_support import Running, example_config, running
from ..support.nats_support import engine_nats

ALICE = Passport(sub="alice", org="acme", roles=(CARD_ADVANCE,))
BOB = Passport(sub="bob", org="acme")
GINA = Passport(sub="gina", org="globex", roles=(CARD_ADVANCE,))

CARD_RESULT = "success outcome replayed error { code action } card { id stage revision }"
CREATE_CARD = f"mutation($id: ID) {{ createCard(title: \"t\", id: $id) {{ {CARD_RESULT} }} }}"


def _stage_mutation(field: str) -> str:
    return (f"mutation($id: ID!, $rev: Int!, $key: String!) {{ {field}(id: $id, "
            f"expectedRevision: $rev, idempotencyKey: $key) {{ {CARD_RESULT} }} }}")


START, FINISH = _stage_mutation("startCard"), _stage_mutation("finishCard")


@pytest.fixture
async def card(store: ProvisionedDatabase, nats_server: EmbeddedNats) -> AsyncIterator[Running]:
    async with engine_nats(nats_server) as nats, running(store, ["card"], nats=nats) as run:
        yield run


async def owner_fetch(store: ProvisionedDatabase, query: str, *args: Any) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(store.owner_url)
    try:
        return [dict(r) for r in await conn.fetch(query, *args)]
    finally:
        await conn.close()


async def org_boards(store: ProvisionedDatabase, org: str) -> list[dict[str, Any]]:
    """The ``org_board`` projection rows of ``org`` (under its RLS context)."""
    conn = await asyncpg.connect(store.owner_url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.current_org_id', $1, true)", org)
            rows = await conn.fetch("SELECT id, title FROM org_board ORDER BY id")
        return [dict(r) for r in rows]
    finally:
        await conn.close()


async def stage(run: Running, mutation: str, card_id: str, rev: int, key: str,
                who: Passport = ALICE) -> dict[str, Any]:
    field = "startCard" if mutation is START else "finishCard"
    result: dict[str, Any] = (await run.gql(
        mutation, {"id": card_id, "rev": rev, "key": key}, who))[field]
    return result


async def test_card_stage_changes_are_revision_checked_and_idempotent(
    card: Running, store: ProvisionedDatabase
) -> None:
    """startCard / finishCard move a card only from the revision the caller
    names; a stale revision or the wrong stage answers its typed outcome and
    changes nothing; a retry with the key answers the stored outcome without
    running; each move records its fact and emits its event once."""
    created = (await card.gql(CREATE_CARD, {"id": "c-1"}, BOB))["createCard"]
    assert created["card"] == {"id": "c-1", "stage": "todo", "revision": 1}

    started = await stage(card, START, "c-1", 1, "k-start")
    assert (started["success"], started["outcome"], started["replayed"]) == (True, "Started", False)
    assert started["card"] == {"id": "c-1", "stage": "doing", "revision": 2}
    again = await stage(card, START, "c-1", 1, "k-start")  # the lost response, retried
    assert (again["success"], again["outcome"], again["replayed"]) == (True, "Started", True)

    stale = await stage(card, FINISH, "c-1", 1, "k-stale")
    assert (stale["success"], stale["outcome"]) == (False, "StaleRevision")
    assert stale["error"]["code"] == "card.stale_revision"
    assert stale["card"] == {"id": "c-1", "stage": "doing", "revision": 2}
    illegal = await stage(card, START, "c-1", 2, "k-illegal")
    assert (illegal["outcome"], illegal["error"]["code"]) == ("IllegalStage", "card.illegal_stage")
    again = await stage(card, START, "c-1", 2, "k-illegal")
    assert (again["outcome"], again["replayed"]) == ("IllegalStage", True)
    conflict = await stage(card, START, "c-1", 3, "k-illegal")  # other inputs, same key
    assert conflict["error"]["code"] == "card.idempotency_conflict"

    finished = await stage(card, FINISH, "c-1", 2, "k-finish")
    assert (finished["outcome"], finished["card"]) == (
        "Finished", {"id": "c-1", "stage": "done", "revision": 3})
    facts = await owner_fetch(
        store, "SELECT fact_type, payload FROM card_fact WHERE card_id = 'c-1' ORDER BY id")
    assert [(f["fact_type"], json.loads(f["payload"]).get("stage")) for f in facts] == [
        ("card.created", None), ("card.advanced", "doing"), ("card.advanced", "done")]
    events = await owner_fetch(
        store, "SELECT payload, seq FROM service_engine.integration_outbox"
        " WHERE subject LIKE '%.card.advanced' ORDER BY id")
    bodies = [(json.loads(e["payload"]), e["seq"]) for e in events]
    assert [(b["payload"]["stage"], seq) for b, seq in bodies] == [
        ("doing", 2), ("done", 3)]


async def test_card_stage_change_refusals_are_the_gate(card: Running) -> None:
    """A stage change the advance gate refuses answers Refused with the gate's
    reason, the view's affordance, and changes nothing."""
    await card.gql(CREATE_CARD, {"id": "c-g"}, BOB)
    view = (await card.gql("query { card(id: \"c-g\") { affordances { action allowed reason } } }",
                           None, BOB))["card"]
    offered = {a["action"]: a["reason"] for a in view["affordances"]}
    refused = await stage(card, START, "c-g", 1, "k", BOB)
    assert (refused["outcome"], refused["error"]["code"], refused["error"]["action"]) == (
        "Refused", offered["advance"], "advance")
    other_org = await stage(card, START, "c-g", 1, "k", GINA)
    assert other_org["error"]["code"] == "card.forbidden"
    missing = await stage(card, START, "nope", 1, "k2")
    assert missing["error"]["code"] == "card.card_missing"
    assert (await stage(card, START, "c-g", 1, "k3"))["card"]["revision"] == 2


ADMIN = Passport(sub="root", org="acme", roles=("board:archive",))
OTHER_ADMIN = Passport(sub="gus", org="globex", roles=("board:archive",))
BOARD_RESULT = "success error { code action } board { id title }"
CREATE_BOARD = ("mutation($id: ID, $title: String!) { createBoard(id: $id, title: $title) { "
                + BOARD_RESULT + " } }")
RENAME_BOARD = ("mutation($id: ID!, $title: String!) { renameBoard(id: $id, title: $title) { "
                + BOARD_RESULT + " } }")
ARCHIVE_BOARD = "mutation($id: ID!) { archiveBoard(id: $id) { success } }"
DELETE_BOARD = "mutation($id: ID!) { deleteBoard(id: $id) { " + BOARD_RESULT + " } }"
INVITE = "mutation($id: ID!) { inviteToBoard(id: $id) { success token } }"
ACCEPT = "mutation($token: String!) { acceptInvite(token: $token) { success } }"


@pytest.fixture
async def board(store: ProvisionedDatabase) -> AsyncIterator[Running]:
    async with running(store, ["board"]) as run:
        yield run


async def _create(run: Running, board_id: str, title: str,
                  who: Passport = ADMIN) -> dict[str, Any]:
    result: dict[str, Any] = (await run.gql(CREATE_BOARD, {"id": board_id, "title": title},
                                            who))["createBoard"]
    return result


async def test_a_board_title_is_unique_per_org(board: Running, store: ProvisionedDatabase) -> None:
    """Two boards of one org never share a title (board.title_taken, nothing
    written), another org may hold it, and a rename frees the old title."""
    assert (await _create(board, "b-1", "roadmap"))["success"]
    taken = await _create(board, "b-2", "roadmap")
    assert (taken["success"], taken["error"]["code"]) == (False, "board.title_taken")
    assert await owner_fetch(store, "SELECT id FROM board WHERE id = 'b-2'") == []
    assert (await _create(board, "g-1", "roadmap", OTHER_ADMIN))["success"]
    exists = await _create(board, "b-1", "another")
    assert exists["error"]["code"] == "board.board_exists"

    renamed = (await board.gql(RENAME_BOARD, {"id": "b-1", "title": "plan"}, ADMIN))["renameBoard"]
    assert renamed["success"] and renamed["board"]["title"] == "plan"
    assert (await _create(board, "b-2", "roadmap"))["success"]
    onto = (await board.gql(RENAME_BOARD, {"id": "b-2", "title": "plan"}, ADMIN))["renameBoard"]
    assert (onto["error"]["code"], onto["error"]["action"]) == ("board.title_taken", None)
    assert await org_boards(store, "acme") == [{"id": "b-1", "title": "plan"},
                                               {"id": "b-2", "title": "roadmap"}]
    assert await org_boards(store, "globex") == [{"id": "g-1", "title": "roadmap"}]


async def test_concurrent_creates_of_one_board_title_one_wins(store: ProvisionedDatabase) -> None:
    """Twenty concurrent createBoard calls with one title in one org: one succeeds."""
    # They queue on the title's lock one after another: a lock timeout no
    # loaded machine reaches, so every loser answers the title, not the wait.
    config = example_config(lock_timeout=timedelta(seconds=10), ack_wait=timedelta(seconds=30))
    async with running(store, ["board"], config=config) as board:
        results = await asyncio.gather(*(_create(board, f"b-{n}", "same") for n in range(20)))
    codes = sorted("ok" if r["success"] else r["error"]["code"] for r in results)
    assert codes == ["board.title_taken"] * 19 + ["ok"], codes


async def test_a_board_delete_cascades_within_its_maximum(
    board: Running, store: ProvisionedDatabase
) -> None:
    """Deleting an archived board takes its memberships, invites and
    projection row in one commit and frees its title; the delete needs the
    gate; a board with more invites than the cascade's maximum answers
    board.too_many_attached and keeps everything."""
    guest = Passport(sub="bob", org="globex")
    assert (await _create(board, "b-del", "doomed"))["success"]
    token = (await board.gql(INVITE, {"id": "b-del"}, ADMIN))["inviteToBoard"]["token"]
    assert (await board.gql(ACCEPT, {"token": token}, guest))["acceptInvite"]["success"]
    await board.gql(INVITE, {"id": "b-del"}, ADMIN)
    refused = (await board.gql(DELETE_BOARD, {"id": "b-del"}, ADMIN))["deleteBoard"]
    assert (refused["error"]["code"], refused["error"]["action"]) == (
        "board.not_archived", "delete")
    assert (await board.gql(ARCHIVE_BOARD, {"id": "b-del"}, ADMIN))["archiveBoard"]["success"]
    deleted = (await board.gql(DELETE_BOARD, {"id": "b-del"}, ADMIN))["deleteBoard"]
    assert deleted["success"], deleted
    assert await owner_fetch(store, "SELECT 1 FROM board WHERE id = 'b-del'") == []
    assert [r["id"] for r in await org_boards(store, "acme")] == []
    for table in ("board_member", "board_invite"):
        assert await owner_fetch(
            store, f"SELECT 1 FROM {table} WHERE board_id = 'b-del'") == []
    assert (await _create(board, "b-new", "doomed"))["success"]

    assert (await _create(board, "b-big", "crowded"))["success"]
    conn = await asyncpg.connect(store.owner_url)
    try:
        await conn.executemany(
            "INSERT INTO board_invite (token_hash, board_id, created_by) VALUES ($1, 'b-big', 'x')",
            [(f"h{n}",) for n in range(MAX_INVITES + 1)],
        )
    finally:
        await conn.close()
    await board.gql(ARCHIVE_BOARD, {"id": "b-big"}, ADMIN)
    too_many = (await board.gql(DELETE_BOARD, {"id": "b-big"}, ADMIN))["deleteBoard"]
    assert too_many["error"]["code"] == "board.too_many_attached"
    assert len(await owner_fetch(
        store, "SELECT 1 FROM board_invite WHERE board_id = 'b-big'")) == MAX_INVITES + 1
    assert await owner_fetch(store, "SELECT 1 FROM board WHERE id = 'b-big'") != []
