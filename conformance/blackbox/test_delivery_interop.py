"""The delivery plan changes no byte a standard client receives.

Two pods of the reference service on one store: one serves live events
through the delivery plan (the default), the other with
``SERVICE_ENGINE_GRAPHQL_DELIVERY_PLAN=false`` (graphql-core's execution
per subscriber per event). A standard graphql-transport-ws client (the
``websockets`` library) subscribes on both with the same documents
(``__typename``, aliases, inline and named fragments, variables in
``@include`` / ``@skip``, the RLS-read projector); after each write, every
operation's frames must be the same text on both sockets.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from typing import Any

from websockets.asyncio.client import ClientConnection

from .harness import (
    ADMIN,
    ARCHIVE,
    BOARDS_SUBSCRIPTION,
    ORG_BOARDS_SUBSCRIPTION,
    RENAME,
    Pods,
    create_board,
)

ALIASED = """subscription { mine: boards(limit: 50) {
  kind: __typename
  ... on BoardsUpsert { rev: revision k: key v: view { t: title id archived a: affordances { allowed action } } why: cause { name } }
  ... on BoardsReset { n: revision keys views { id } }
  ... on BoardsRemove { r: revision key }
} }"""

FRAGMENTS = """
fragment View on BoardView { id title ...Owner affordances { ...Aff } }
fragment Owner on BoardView { owner member org }
fragment Aff on Affordance { action allowed reason }
fragment Tag on BoardsMessage { __typename }
subscription Live($withTitle: Boolean!, $noKey: Boolean!) { boards {
  ...Tag
  ... on BoardsUpsert { revision key @skip(if: $noKey) view { ...View title @include(if: $withTitle) } }
  ... on BoardsReset { revision views { ...View } }
} }
"""

DOCUMENTS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "full": (BOARDS_SUBSCRIPTION, None),
    "aliased": (ALIASED, None),
    "fragments": (FRAGMENTS, {"withTitle": True, "noKey": True}),
    "org": (ORG_BOARDS_SUBSCRIPTION, None),
}

QUIET = 0.5
"""How long a socket must stay quiet for a write's frames to count as all in."""


async def _drain(ws: ClientConnection, into: dict[str, list[str]]) -> None:
    """Every frame that arrives until the socket is quiet, by operation id."""
    while True:
        try:
            raw = await asyncio.wait_for(ws.recv(), QUIET)
        except TimeoutError:
            return
        assert isinstance(raw, str)
        into[json.loads(raw)["id"]].append(raw)


async def test_planned_and_executed_delivery_send_the_same_bytes(pods: Pods) -> None:
    """Each write's frames, per operation, are the same text from the pod serving the delivery
    plan and from the pod executing every event through graphql-core."""
    planned = await pods.spawn("planned")
    executed = await pods.spawn(
        "executed", env={"SERVICE_ENGINE_GRAPHQL_DELIVERY_PLAN": "false"})
    frames: dict[str, dict[str, list[str]]] = {
        "planned": defaultdict(list), "executed": defaultdict(list)}
    async with planned.socket(ADMIN) as on_p, executed.socket(ADMIN) as on_e:
        sockets = {"planned": on_p, "executed": on_e}
        for ws in sockets.values():
            await ws.init()
            for op_id, (query, variables) in DOCUMENTS.items():
                await ws.subscribe(op_id, query, variables)

        async def settle() -> None:
            for name, ws in sockets.items():
                await _drain(ws.ws, frames[name])
            assert frames["planned"] == frames["executed"]

        await settle()
        assert set(frames["planned"]) == set(DOCUMENTS)
        await create_board(planned, "b-interop", "Interop \u00e9 \"quoted\"")
        await settle()
        await planned.gql(RENAME, {"id": "b-interop", "title": "renamed"}, ADMIN)
        await settle()
        await executed.gql(ARCHIVE, {"id": "b-interop"}, ADMIN)
        await settle()
        await create_board(executed, "b-interop-2", "second")
        await settle()
    # Every operation received its Reset and at least one change.
    assert all(len(v) >= 2 for v in frames["planned"].values()), frames["planned"]
