"""bb03: Reset then Upsert on a contiguous revision over a real WebSocket;
after a reconnect, a Reset rebuilt from committed state.

Both read regimes are observed: the cohort projector (``boards``, the plain
``board`` table) and the RLS projector (``orgBoards``, the fail-closed
``org_board`` projection), which shows a principal with no org nothing at all.
"""

from __future__ import annotations

from typing import Any

import pytest

from service_engine.embedded import ProvisionedDatabase

from ..support.harness import owner_connection
from .harness import (
    ADMIN,
    ARCHIVE,
    BOARDS_SUBSCRIPTION,
    NO_ORG,
    ORG_BOARDS_SUBSCRIPTION,
    OUTSIDER,
    RENAME,
    GqlSocket,
    Pod,
    Pods,
    create_board,
    key,
)

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow


async def committed(store: ProvisionedDatabase) -> dict[str, dict[str, Any]]:
    """The board table, read from Postgres directly (as its owner)."""
    async with owner_connection(store) as conn:
        rows = await conn.fetch("SELECT id, title, archived FROM board ORDER BY id")
    return {key(r["id"]): {"title": r["title"], "archived": r["archived"]} for r in rows}


async def next_of(ws: GqlSocket, op: str) -> dict[str, Any]:
    message: dict[str, Any] = (await ws.next(op))[op]
    return message


async def rename(pod: Pod, board_id: str, title: str) -> None:
    assert (await pod.gql(RENAME, {"id": board_id, "title": title}, ADMIN))["renameBoard"]["success"]


async def test_bb03_reset_then_contiguous_upserts_and_a_reconnect_reset_from_committed_state(
    pods: Pods, store: ProvisionedDatabase
) -> None:
    """bb03: over a real graphql-transport-ws socket, each operation gets a
    Reset then Upserts on a contiguous revision (with their causes); after a
    reconnect, a Reset rebuilt from committed state, live again from there."""
    pod = await pods.spawn("a")
    await create_board(pod, "b-1", "first")
    await create_board(pod, "b-2", "second")

    revisions: dict[str, list[int]] = {"boards": [], "orgBoards": []}
    async with pod.socket(ADMIN) as ws:
        await ws.init()
        await ws.subscribe("boards", BOARDS_SUBSCRIPTION)
        reset = await next_of(ws, "boards")
        await ws.subscribe("orgBoards", ORG_BOARDS_SUBSCRIPTION)
        org_reset = await next_of(ws, "orgBoards")
        for op, message in (("boards", reset), ("orgBoards", org_reset)):
            assert message["__typename"].endswith("Reset"), message
            assert message["keys"] == [key("b-1"), key("b-2")]
            assert [v["title"] for v in message["views"]] == ["first", "second"]
            revisions[op].append(message["revision"])

        await rename(pod, "b-1", "first, renamed")
        await create_board(pod, "b-3", "third")
        assert (await pod.gql(ARCHIVE, {"id": "b-2"}, ADMIN))["archiveBoard"]["success"]
        expected = [
            (key("b-1"), "first, renamed", False, "board.renamed"),
            (key("b-3"), "third", False, "board.created"),
            (key("b-2"), "second", True, "board.archived"),
        ]
        # The two operations share the socket: read until each has its three.
        got: dict[str, list[dict[str, Any]]] = {"boards": [], "orgBoards": []}
        while len(got["boards"]) < 3 or len(got["orgBoards"]) < 3:
            message = await ws.receive()
            assert message["type"] == "next", message
            got[message["id"]].append(message["payload"]["data"][message["id"]])
        for op, messages in got.items():
            assert [m["__typename"] for m in messages] == [f"{op[0].upper()}{op[1:]}Upsert"] * 3
            assert [(m["key"], m["view"]["title"], m["view"]["archived"]) for m in messages] == [
                e[:3] for e in expected
            ]
            revisions[op].extend(m["revision"] for m in messages)
        assert [m["cause"]["name"] for m in got["boards"]] == [e[3] for e in expected]
        # Contiguous, per operation, from the Reset on.
        assert revisions == {"boards": [1, 2, 3, 4], "orgBoards": [1, 2, 3, 4]}

    # Committed while nobody listens.
    await rename(pod, "b-3", "third, renamed offline")
    await create_board(pod, "b-4", "fourth")

    async with pod.socket(ADMIN) as ws:
        await ws.init()
        await ws.subscribe("boards", BOARDS_SUBSCRIPTION)
        reset = await next_of(ws, "boards")
        assert (reset["__typename"], reset["revision"]) == ("BoardsReset", 1)
        state = await committed(store)
        assert set(state) == {key(b) for b in ("b-1", "b-2", "b-3", "b-4")}
        assert reset["keys"] == list(state)
        assert {
            k: {"title": v["title"], "archived": v["archived"]}
            for k, v in zip(reset["keys"], reset["views"], strict=True)
        } == state
        # Live again on the new session's revision.
        await rename(pod, "b-4", "fourth, live")
        upsert = await next_of(ws, "boards")
        assert (upsert["__typename"], upsert["revision"], upsert["key"]) == (
            "BoardsUpsert", 2, key("b-4"))


async def test_bb03_the_rls_projection_shows_nothing_without_an_org_context(pods: Pods) -> None:
    """bb03 (the RLS regime): a principal with no org, or another org, gets
    an empty Reset of the fail-closed projection and no delta for a change
    an org member on the same pod is shown; queries show nothing either."""
    pod = await pods.spawn("a")
    await create_board(pod, "b-1", "acme only")
    for passport in (NO_ORG, OUTSIDER):
        async with pod.socket(passport) as ws, pod.socket(ADMIN) as witness:
            await witness.init()
            await witness.subscribe("orgBoards", ORG_BOARDS_SUBSCRIPTION)
            assert (await next_of(witness, "orgBoards"))["__typename"] == "OrgBoardsReset"
            await ws.init()
            await ws.subscribe("orgBoards", ORG_BOARDS_SUBSCRIPTION)
            reset = await next_of(ws, "orgBoards")
            assert (reset["__typename"], reset["keys"]) == ("OrgBoardsReset", []), passport
            await rename(pod, "b-1", f"renamed while {passport.sub} watches")
            # The member's Upsert says the pod rendered the change's frame.
            upsert = await next_of(witness, "orgBoards")
            assert (upsert["__typename"], upsert["key"]) == ("OrgBoardsUpsert", key("b-1"))
            await ws.quiet(0.2)
        data = await pod.gql('{ orgBoards { id } orgBoard(id: "b-1") { id } }', passport=passport)
        assert data == {"orgBoards": [], "orgBoard": None}
    data = await pod.gql('{ orgBoards { id } }', passport=ADMIN)
    assert data == {"orgBoards": [{"id": "b-1"}]}
