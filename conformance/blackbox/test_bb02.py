"""bb02: the affordance == gate identity, observed from outside.

For every board action, principal and board state, the affordance the view
serves says "allowed" exactly when the mutation, run from that same state,
succeeds, and a refused mutation answers with the affordance's reason code.
A principal who is served no view at all can perform no action. The gate
and the affordance are one function inside the service; this proves it over
the wire. Along the way, the invite's one-shot token reaches its caller and
is stored only as a hash.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import pytest

from service_engine.embedded import ProvisionedDatabase
from service_engine.graphql import Passport

from ..support.harness import owner_connection
from .harness import (
    ACCEPT,
    ADMIN,
    ARCHIVE,
    BOARD,
    DELETE,
    GUEST,
    INVITE,
    MEMBER,
    NO_ORG,
    OUTSIDER,
    RENAME,
    UNARCHIVE,
    Pod,
    Pods,
    create_board,
)

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

ACTIONS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # action -> (mutation, its root field, extra variables)
    "rename": (RENAME, "renameBoard", {"title": "a new title"}),
    "archive": (ARCHIVE, "archiveBoard", {}),
    "unarchive": (UNARCHIVE, "unarchiveBoard", {}),
    "invite": (INVITE, "inviteToBoard", {}),
    "delete": (DELETE, "deleteBoard", {}),
}
PRINCIPALS = {"admin": ADMIN, "member": MEMBER, "guest": GUEST, "outsider": OUTSIDER,
              "no_org": NO_ORG}
STATES = ("active", "archived")


async def board_in_state(
    pod: Pod, board_id: str, state: str, viewer: Passport, tokens: list[str]
) -> None:
    """A fresh acme board in ``state``; ``viewer`` joins it when they are the guest."""
    await create_board(pod, board_id, f"board {board_id}")
    if viewer is GUEST:
        token = (await pod.gql(INVITE, {"id": board_id}, ADMIN))["inviteToBoard"]["token"]
        tokens.append(token)
        joined = (await pod.gql(ACCEPT, {"token": token}, GUEST))["acceptInvite"]
        assert joined["success"] and joined["board"]["member"], joined
    if state == "archived":
        assert (await pod.gql(ARCHIVE, {"id": board_id}, ADMIN))["archiveBoard"]["success"]


async def test_bb02_every_affordance_is_true_exactly_when_its_mutation_succeeds(
    pods: Pods, store: ProvisionedDatabase,
) -> None:
    """bb02: for every principal, board state and action, the served affordance is allowed
    exactly when running its mutation succeeds, and a refusal names the affordance's
    reason."""
    pod = await pods.spawn("a")
    tokens: list[str] = []
    served_actions: set[str] = set()
    outcomes: dict[tuple[str, str, str], tuple[bool, str | None]] = {}
    for n, (who, state, action) in enumerate(itertools.product(PRINCIPALS, STATES, ACTIONS)):
        principal = PRINCIPALS[who]
        board_id = f"b-bb02-{n}"
        await board_in_state(pod, board_id, state, principal, tokens)
        view = (await pod.gql(BOARD, {"id": board_id}, principal))["board"]

        mutation, field, extra = ACTIONS[action]
        variables = {"id": board_id, **extra}
        if "title" in variables:  # a title is unique per org: one of its own per board
            variables["title"] = f"{variables['title']} for {board_id}"
        result = (await pod.gql(mutation, variables, principal))[field]
        succeeded = result["success"]
        code = None if succeeded else result["error"]["code"]
        outcomes[(who, state, action)] = (succeeded, code)
        case = f"{who} / {state} board / {action}: view {view}, mutation {result}"

        if view is None:
            assert not succeeded, f"no view served, yet the mutation succeeded: {case}"
            continue
        offered = {a["action"]: a for a in view["affordances"]}
        served_actions.update(offered)
        assert offered[action]["allowed"] is succeeded, case
        assert offered[action]["reason"] == code, case

    # Every gated action the views serve is exercised here, and vice versa.
    assert served_actions == set(ACTIONS)
    # The table is not degenerate: each action succeeds for someone and is
    # refused for someone, with more than one reason across the table.
    for action in ACTIONS:
        results = [outcomes[(w, s, action)] for w in PRINCIPALS for s in STATES]
        assert any(ok for ok, _ in results) and not all(ok for ok, _ in results), action
    codes = {code for _, code in outcomes.values() if code is not None}
    assert {"board.forbidden", "board.archived", "board.not_archived",
            "board.archive_scope_required", "board.org_only"} <= codes, codes

    # The invite's one-shot secret reached its caller only: the store keeps
    # a hash of each token and never the token.
    async with owner_connection(store) as conn:
        stored = [dict(r) for r in await conn.fetch("SELECT * FROM board_invite")]
    assert tokens and len(stored) >= len(tokens)
    assert {hashlib.sha256(t.encode()).hexdigest() for t in tokens} <= {r["token_hash"] for r in stored}
    assert not any(t in str(r) for t in tokens for r in stored)
