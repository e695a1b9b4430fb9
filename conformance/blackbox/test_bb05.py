"""bb05: a reply streamed by the spawned twin over the service's accumulated
lane, sealed against its hash inside the running binary.

The twin publishes the reply's chunks on ``stream.example.{reply_id}`` and
then the ``reply.finish`` command; the running binary's ephemeral lane
consumer folds the chunks into Postgres, the finish replays them, verifies
the SHA-256, seals and commits, and the live subscriber sees the finished
reply. Nothing is seeded through Postgres: the only inputs are the twin's
NATS messages and GraphQL.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.graphql import Passport

from ..support.harness import owner_connection
from .harness import Pods
from .test_bb04 import run_twin

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

ACME = Passport(sub="erin", org="acme")
TEXT = "A reply streamed over NATS, chunk by chunk — and sealed: ✓"

REPLY_VIEW = "id status text hash chunks"
REPLIES_SUBSCRIPTION = f"""subscription {{ replies(limit: 20) {{
    __typename
    ... on RepliesReset {{ revision keys views {{ {REPLY_VIEW} }} }}
    ... on RepliesUpsert {{ revision key view {{ {REPLY_VIEW} }} }}
    ... on RepliesRemove {{ revision key }}
}} }}"""


async def _until_finished(ws: Any, revision: int, key: str) -> dict[str, Any]:
    while True:
        message = (await ws.next("replies"))["replies"]
        assert message["revision"] == revision + 1, message
        revision = message["revision"]
        if message["__typename"] == "RepliesUpsert" and message["key"] == key:
            view: dict[str, Any] = message["view"]
            if view["status"] == "finished":
                return view


async def _lane_rows(store: ProvisionedDatabase, reply_id: str) -> tuple[int, Any]:
    async with owner_connection(store) as conn:
        chunks = await conn.fetchval(
            "SELECT count(*) FROM service_engine.accumulator_chunk WHERE key = $1", reply_id
        )
        marker = await conn.fetchrow(
            "SELECT high_water, hash FROM service_engine.accumulator_seal WHERE key = $1",
            reply_id,
        )
    return int(chunks), marker


async def test_bb05_a_reply_the_twin_streams_is_sealed_and_delivered(
    pods: Pods, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """bb05: the twin's chunks reach the running binary over the lane; the finish replays
    them, verifies the hash, commits the seal and the live subscriber gets the finished
    reply (text, hash, chunk count) on a contiguous revision."""
    pod = await pods.spawn("a")
    async with pod.socket(ACME) as ws:
        await ws.init()
        await ws.subscribe("replies", REPLIES_SUBSCRIPTION)
        reset = (await ws.next("replies"))["replies"]
        assert (reset["__typename"], reset["keys"]) == ("RepliesReset", [])

        code, out, err = await run_twin(
            nats_server.url, "--reply", "bb05-reply", "--text", TEXT, "--chunk-size", "7",
            "--org", "acme", "--timeout", "20",
        )
        assert code == 0, (code, out, err, pod.log_tail())
        run = json.loads(out.strip().splitlines()[-1])
        assert (run["ok"], run["failures"], run["finishes"]) == (True, [], 1)

        view = await _until_finished(ws, reset["revision"], json.dumps("bb05-reply"))
    digest = hashlib.sha256(TEXT.encode()).hexdigest()
    chunks = -(-len(TEXT.encode()) // 7)
    assert (view["text"], view["hash"], view["chunks"]) == (TEXT, digest, chunks)
    durable, marker = await _lane_rows(store, "bb05-reply")
    assert durable == 0  # folded and deleted by the seal
    assert (marker["high_water"], marker["hash"]) == (chunks, digest)


async def test_bb05_a_finish_with_a_wrong_hash_is_answered_and_corrected(
    pods: Pods, store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """bb05: a finish whose hash the chunks do not match is answered reply.seal_failed
    (never a silent dead letter); the twin's corrected finish then seals the reply."""
    pod = await pods.spawn("a")
    code, out, err = await run_twin(
        nats_server.url, "--reply", "bb05-wrong", "--text", TEXT, "--chunk-size", "5",
        "--org", "acme", "--wrong-hash", "--timeout", "20",
    )
    assert code == 0, (code, out, err, pod.log_tail())
    run = json.loads(out.strip().splitlines()[-1])
    assert (run["ok"], run["failures"], run["finishes"]) == (True, ["seal_hash_mismatch"], 2)
    response = await pod.gql(
        f'query {{ reply(id: "bb05-wrong") {{ {REPLY_VIEW} }} }}', passport=ACME
    )
    reply = response["reply"]
    assert (reply["status"], reply["text"]) == ("finished", TEXT)
