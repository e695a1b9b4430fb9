"""bb04: a full cross-service cycle driven by the spawned twin binary.

The real service and the real twin run as two processes on one Postgres and
one NATS, sharing nothing else. The twin sends ``card.create`` commands with
its own service identity; on each ``card.created`` it sends ``card.advance``
and publishes its own ``review.approved``; the service answers
``card.advanced`` and ``card.reviewed``, and — the deadline the twin asked
for having passed — ``card.overdue``. Observed over public channels only:
the twin's summary, a GraphQL subscription to the cards, Postgres state.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from typing import Any

import pytest

from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.graphql import Passport

from ..support.harness import owner_connection
from .harness import REPO, START_BOUND, Pods

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

CYCLES = 3
TWIN_BOUND = START_BOUND + 30.0
"""The bound on one twin run: its interpreter's start (bounded as a pod's is) and its stream."""
ACME = Passport(sub="dana", org="acme")

CARDS_SUBSCRIPTION = """subscription { cards(limit: 50) {
    __typename
    ... on CardsReset { revision keys views { id stage reviewedBy overdue } }
    ... on CardsUpsert { revision key view { id stage reviewedBy overdue } cause { name } }
    ... on CardsRemove { revision key }
} }"""


def twin_command() -> list[str]:
    """``EXAMPLE_TWIN_BIN`` (a command line) when set, else the module."""
    command = os.environ.get("EXAMPLE_TWIN_BIN")
    if command:
        return shlex.split(command)
    return [sys.executable, "-m", "example_twin"]


async def run_twin(nats_url: str, *args: str) -> tuple[int, str, str]:
    """Run the twin to completion (bounded; killed past the bound)."""
    process = await asyncio.create_subprocess_exec(
        *twin_command(), *args, cwd=REPO, env={**os.environ, "NATS_URL": nats_url},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), TWIN_BOUND)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"the twin did not finish within {TWIN_BOUND}s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def committed(store: ProvisionedDatabase) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The cards and their facts, read from Postgres directly (as its owner)."""
    async with owner_connection(store) as conn:
        cards = await conn.fetch(
            "SELECT id, org, stage, reviewed_by, overdue, owner, version FROM card ORDER BY id")
        facts = await conn.fetch("SELECT card_id, fact_type FROM card_fact ORDER BY id")
    by_card: dict[str, list[str]] = {}
    for row in facts:
        by_card.setdefault(row["card_id"], []).append(row["fact_type"])
    return {r["id"]: dict(r) for r in cards}, by_card


async def test_bb04_the_spawned_twin_closes_the_cross_service_cycle(
    pods: Pods, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """bb04: the spawned twin binary drives full cross-service cycles over NATS against the
    running service; every cycle closes correlated, and the live subscriber sees each
    card reach its final state on a contiguous revision."""
    pod = await pods.spawn("a")
    async with pod.socket(ACME) as ws:
        await ws.init()
        await ws.subscribe("cards", CARDS_SUBSCRIPTION)
        reset = (await ws.next("cards"))["cards"]
        assert (reset["__typename"], reset["keys"]) == ("CardsReset", [])

        code, out, err = await run_twin(
            nats_server.url, "--cycle", str(CYCLES), "--org", "acme", "--due-in", "1",
            "--timeout", "20",
        )
        assert code == 0, (code, out, err, pod.log_tail())
        summary = json.loads(out.strip().splitlines()[-1])
        assert (summary["ok"], summary["cycles"], summary["closed"]) == (True, CYCLES, CYCLES)
        ids = sorted(r["card_id"] for r in summary["results"])
        assert all(r["correlated"] for r in summary["results"])

        # The subscriber saw every card reach its final state, on a contiguous revision.
        final = {"stage": "doing", "reviewedBy": "twin", "overdue": True}
        seen: dict[str, dict[str, Any]] = {}
        revision = reset["revision"]
        while [seen.get(json.dumps(i)) for i in ids] != [{"id": i, **final} for i in ids]:
            message = (await ws.next("cards"))["cards"]
            assert message["revision"] == revision + 1, message
            revision = message["revision"]
            if message["__typename"] == "CardsReset":
                seen = dict(zip(message["keys"], message["views"], strict=True))
            elif message["__typename"] == "CardsUpsert":
                seen[message["key"]] = message["view"]

    cards, facts = await committed(store)
    assert sorted(cards) == ids
    for card_id in ids:
        card = cards[card_id]
        assert (card["org"], card["stage"], card["reviewed_by"], card["overdue"], card["version"]
                ) == ("acme", "doing", "twin", True, 4)
        assert facts[card_id][0] == "card.created"
        assert sorted(facts[card_id][1:]) == ["card.advanced", "card.overdue", "card.reviewed"]
