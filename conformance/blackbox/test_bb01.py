"""bb01: readiness, the boot scope handshake, and a second pod on the same
store converging.

Each pod declares the slices' scopes to Identity (the harness answers it)
before it is UP; a declaration Identity rejects keeps the pod from serving.
Two processes of the real service share one Postgres and one NATS and no
other state: a write through either pod reaches a live subscriber on the
other, and a pod stopped with SIGTERM exits cleanly while the other stays UP.
"""

from __future__ import annotations

import pytest

from service_engine.embedded import ProvisionedDatabase

from ..support.harness import owner_connection
from .harness import (
    ADMIN,
    BOARDS_SUBSCRIPTION,
    IDENTITY_SCOPES,
    RENAME,
    Pods,
    create_board,
    key,
)

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow


async def test_bb01_readiness_and_a_second_pod_converges(
    pods: Pods, store: ProvisionedDatabase
) -> None:
    """bb01: the spawned binary answers /readyz UP, a second pod on the same store boots UP
    beside it, and a write through one pod reaches subscribers on both."""
    a = await pods.spawn("a")
    ready = await a.readyz()
    assert (ready.status_code, ready.json()) == (200, {"status": "UP"})
    b = await pods.spawn("b")
    ready = await b.readyz()
    assert (ready.status_code, ready.json()) == (200, {"status": "UP"})
    # Each pod declared the slices' scopes once and was confirmed before UP.
    assert pods.identity is not None
    declared = {r.pod_id: r.declaration for r in pods.identity.requests}
    assert set(declared) == {"bb-a", "bb-b"}
    assert all(d.service == "example" and d.scopes == IDENTITY_SCOPES for d in declared.values())

    async with b.socket(ADMIN) as on_b, a.socket(ADMIN) as on_a:
        await on_b.init()
        await on_a.init()
        await on_b.subscribe("boards", BOARDS_SUBSCRIPTION)
        await on_a.subscribe("boards", BOARDS_SUBSCRIPTION)
        for ws in (on_a, on_b):
            reset = (await ws.next("boards"))["boards"]
            assert (reset["__typename"], reset["revision"], reset["keys"]) == ("BoardsReset", 1, [])

        # A write through pod A reaches the subscriber on pod B (and A's own).
        await create_board(a, "b-bb01", "made on a")
        for ws in (on_a, on_b):
            upsert = (await ws.next("boards"))["boards"]
            assert upsert["__typename"] == "BoardsUpsert"
            assert (upsert["revision"], upsert["key"]) == (2, key("b-bb01"))
            assert upsert["view"]["title"] == "made on a"
            assert upsert["cause"]["name"] == "board.created"

        # And the other way round.
        renamed = await b.gql(RENAME, {"id": "b-bb01", "title": "renamed on b"}, ADMIN)
        assert renamed["renameBoard"]["success"], renamed
        for ws in (on_a, on_b):
            upsert = (await ws.next("boards"))["boards"]
            assert (upsert["revision"], upsert["view"]["title"]) == (3, "renamed on b")
            assert upsert["cause"] == {
                "name": "board.renamed",
                "data": {"board": "b-bb01", "by": "alice", "title": "renamed on b"},
            }

    # Both pods read the one committed state.
    async with owner_connection(store) as conn:
        title = await conn.fetchval("SELECT title FROM board WHERE id = 'b-bb01'")
    assert title == "renamed on b"
    for pod in (a, b):
        board = (await pod.gql('{ board(id: "b-bb01") { title } }', passport=ADMIN))["board"]
        assert board == {"title": title}

    # A pod stopped with SIGTERM shuts down cleanly; the other stays UP.
    assert await pods.stop(a) == 0, a.log_tail()
    ready = await b.readyz()
    assert (ready.status_code, ready.json()) == (200, {"status": "UP"})


async def test_bb01_a_rejected_scope_declaration_fails_the_deploy(pods: Pods) -> None:
    """bb01: when Identity rejects the declaration the pod never comes UP; it
    exits naming the rejection (a scope typo is a failed deploy)."""
    await pods.spawn("ok")  # starts the harness's Identity
    assert pods.identity is not None
    pods.identity.decide = lambda declaration: "unknown scopes: card:advance"
    with pytest.raises(AssertionError) as failed:
        await pods.spawn("rejected")
    assert "ScopeRejected" in str(failed.value) or "unknown scopes" in str(failed.value)
