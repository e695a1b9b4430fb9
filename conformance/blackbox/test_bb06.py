"""bb06: the subscription socket is closed at session_max_age, measured from
the handshake, with 1001; the client reconnects with a fresh passport and
resumes from committed state.

The pod runs with a small ``session_max_age`` (6 s: room for the init,
the subscription, its Reset and a write's Upsert on a loaded machine). The client holds back
its ``connection_init`` for a while after the upgrade: the bound still
counts from the handshake, not from the init or the subscription.
"""

from __future__ import annotations

from typing import Any

import pytest

from service_engine.graphql import Passport

from .harness import ADMIN, BOARDS_SUBSCRIPTION, RENAME, Pods, create_board, key

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

MAX_AGE = 6.0
INIT_DELAY = 2.0
MARGIN = 1.5
"""Scheduling slack allowed past the bound; below INIT_DELAY, so a bound
counted from the init (or the subscription) would fail the test."""

CAROL = Passport(sub="carol", org="acme")
CAROL_REFRESHED = Passport(sub="carol", org="acme", roles=("board:archive",))


def archive_affordance(view: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(a for a in view["affordances"] if a["action"] == "archive")
    return found


async def test_bb06_the_socket_closes_at_session_max_age_and_the_client_resumes(
    pods: Pods,
) -> None:
    """bb06: the graphql-transport-ws socket stays live until session_max_age measured from
    the handshake, is closed then (1001 session_max_age), and the client reconnecting
    with a fresh passport resumes under it from a Reset of committed state."""
    pod = await pods.spawn("a", env={
        "SERVICE_ENGINE_SESSION_MAX_AGE": str(MAX_AGE),
        "SERVICE_ENGINE_SESSION_TTL": "1",
    })
    await create_board(pod, "b-1", "before")

    async with pod.socket(CAROL) as ws:
        await ws.quiet(INIT_DELAY)  # the upgrade is accepted; nothing is said yet
        await ws.init()
        await ws.subscribe("boards", BOARDS_SUBSCRIPTION)
        reset = (await ws.next("boards"))["boards"]
        assert (reset["__typename"], reset["revision"], reset["keys"]) == ("BoardsReset", 1, [key("b-1")])
        assert archive_affordance(reset["views"][0]) == {
            "action": "archive", "allowed": False, "reason": "board.archive_scope_required"}
        # The socket is live until the bound.
        renamed = await pod.gql(RENAME, {"id": "b-1", "title": "during"}, ADMIN)
        assert renamed["renameBoard"]["success"]
        upsert = (await ws.next("boards"))["boards"]
        assert (upsert["revision"], upsert["view"]["title"]) == (2, "during")

        close, at, before = await ws.closed(timeout=MAX_AGE + 5)
        assert all(m.get("type") == "complete" for m in before), before
        assert close.rcvd is not None
        assert (close.rcvd.code, close.rcvd.reason) == (1001, "session_max_age")
        # The server's handshake lies between `opening` and `opened`.
        assert at - ws.opening >= MAX_AGE, at - ws.opening
        assert at - ws.opened < MAX_AGE + MARGIN, at - ws.opened

    # Committed while the client was away.
    renamed = await pod.gql(RENAME, {"id": "b-1", "title": "after"}, ADMIN)
    assert renamed["renameBoard"]["success"]

    # The gateway hands the reconnecting client a fresh passport (here: a
    # new scope), which the new socket serves under.
    async with pod.socket(CAROL_REFRESHED) as ws:
        await ws.init()
        await ws.subscribe("boards", BOARDS_SUBSCRIPTION)
        reset = (await ws.next("boards"))["boards"]
        assert (reset["__typename"], reset["revision"], reset["keys"]) == ("BoardsReset", 1, [key("b-1")])
        assert reset["views"][0]["title"] == "after"
        assert archive_affordance(reset["views"][0]) == {
            "action": "archive", "allowed": True, "reason": None}
        renamed = await pod.gql(RENAME, {"id": "b-1", "title": "resumed"}, ADMIN)
        assert renamed["renameBoard"]["success"]
        upsert = (await ws.next("boards"))["boards"]
        assert (upsert["revision"], upsert["view"]["title"]) == (2, "resumed")
