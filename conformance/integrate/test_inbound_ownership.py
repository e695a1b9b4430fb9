"""The inbound loop's ownership of a message across pods and crashes,
against a real Postgres and a spawned nats-server per test: two pods share
one durable and handle each message once, ack-after-durable with a crash on
either side of the commit (a spawned pod SIGKILLed), shutdown naks the
frames in hand, and a handler slower than ack_wait keeps its frame."""


import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from service_engine import Database
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
)
from service_engine.pipeline import Reaction

from ..support.harness import assert_nothing, wait_until
from ..support.inbound_support import (
    CMD,
    DURABLE,
    PLACED,
    claim_confirmations,
    consumer_names,
    consumer_state,
    count_is,
    effects,
    fast_config,
    place_settled,
    pod,
    producer,
)
from ..support.sample_orders import (
    PlaceOrder,
    place_order,
)

REPO = Path(__file__).resolve().parents[2]
POD_START_BOUND = 90.0
"""Seconds a pod process has to import the engine and say ready (a loaded
machine takes tens of seconds, as the black-box pods' bound allows)."""


# -- ownership across pods and crashes -------------------------------------------------


async def test_two_pods_share_one_durable_and_each_message_is_handled_once(
    db: Database, streams: EmbeddedNats
) -> None:
    """Two engines over one store bind the same durable: every message is
    handled by exactly one pod, and both pods take work."""
    started: set[str] = set()
    both = asyncio.Event()

    def held_until_both_pods_work(pod_name: str) -> Any:
        async def before(cx: Reaction[Any], _: BaseModel) -> None:
            # Each pod holds its first frames until the other pod has taken
            # one: a pod that never gets work fails the bounded wait.
            started.add(pod_name)
            if len(started) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), 10)

        return before

    n = 40
    a = place_order("a", before=held_until_both_pods_work("a"), concurrency=2)
    b = place_order("b", before=held_until_both_pods_work("b"), concurrency=2)
    async with pod(db, streams, [a]), pod(db, streams, [b]), producer(streams) as twin:
        for i in range(n):
            await twin.command(PlaceOrder(order_id=f"o{i}"))
        await wait_until(lambda: count_is(effects(db), n), timeout=30, what="every effect")
        await wait_until(lambda: place_settled(streams), what="every frame settled")
        rows = await effects(db)
        consumers = await consumer_names(streams.url, CMD)
    assert sorted(r["order_id"] for r in rows) == sorted(f"o{i}" for i in range(n))
    assert {r["pod"] for r in rows} == {"a", "b"}
    assert consumers == [DURABLE]


async def _spawn_pod(
    database: ProvisionedDatabase, server: EmbeddedNats, name: str, kill_at: str,
    log: Path,
) -> asyncio.subprocess.Process:
    err = await asyncio.to_thread(log.open, "ab")
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "conformance.support.inbound_pod", database.app_url, server.url,
            name, kill_at, "2", cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=err,
        )
    finally:
        err.close()
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), POD_START_BOUND)
        assert line == b"ready\n", f"the pod did not start: {line!r} (see {log})"
    except BaseException:  # a pod that never got ready is not left running
        if process.returncode is None:
            process.kill()
        await process.wait()
        raise
    return process


@contextlib.asynccontextmanager
async def crashing_pod(
    database: ProvisionedDatabase, server: EmbeddedNats, kill_at: str, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await _spawn_pod(database, server, "crashed", kill_at, log)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_a_crash_after_the_commit_before_the_ack_lands_the_effect_once(
    db: Database, database: ProvisionedDatabase, streams: EmbeddedNats, tmp_path: Path
) -> None:
    """Ack-after-durable: the handling process is SIGKILLed between the
    commit and the ack. The frame is redelivered to another pod, whose claim
    makes it a no-op that re-emits the stored confirmation: the effect
    landed exactly once."""
    async with crashing_pod(database, streams, "committed", tmp_path / "pod.log") as crashed:
        async with producer(streams) as twin:
            sent = await twin.command(PlaceOrder(order_id="o1"))
        assert await asyncio.wait_for(crashed.wait(), 30) == -signal.SIGKILL
    assert [e["pod"] for e in await effects(db)] == ["crashed"]
    [stored] = await claim_confirmations(db, sent.envelope_id, "place_order")
    assert not await place_settled(streams), "the frame was acked before the crash"

    async with pod(db, streams, [place_order("survivor")]):
        await wait_until(lambda: place_settled(streams), timeout=20, what="the redelivery")
        rows = await db.pool.fetch(
            """SELECT message_id, headers::text AS headers FROM service_engine.integration_outbox
                WHERE subject = $1 ORDER BY id""",
            PLACED,
        )
    assert [e["pod"] for e in await effects(db)] == ["crashed"]
    # The original confirmation and its replay: one logical message, two
    # dedup tokens.
    assert len(rows) == 2
    assert str(rows[0]["message_id"]) == stored["message_id"]
    assert json.loads(rows[1]["headers"]) == {HEADER_MESSAGE_ID: stored["message_id"]}
    assert rows[1]["message_id"] != rows[0]["message_id"]


async def test_a_crash_before_the_commit_runs_the_effect_once_on_redelivery(
    db: Database, database: ProvisionedDatabase, streams: EmbeddedNats, tmp_path: Path
) -> None:
    """Killed with the effect written but not committed, the pod leaves
    nothing behind: no effect, no claim; the redelivery applies it once."""
    async with crashing_pod(database, streams, "before_commit", tmp_path / "pod.log") as crashed:
        async with producer(streams) as twin:
            sent = await twin.command(PlaceOrder(order_id="o1"))
        assert await asyncio.wait_for(crashed.wait(), 30) == -signal.SIGKILL
    assert await effects(db) == []
    assert await claim_confirmations(db, sent.envelope_id, "place_order") is None

    async with pod(db, streams, [place_order("survivor")]):
        await wait_until(lambda: place_settled(streams), timeout=20, what="the redelivery")
    assert [e["pod"] for e in await effects(db)] == ["survivor"]
    assert await claim_confirmations(db, sent.envelope_id, "place_order") is not None


async def test_shutdown_naks_the_frames_in_hand_so_another_pod_takes_them_at_once(
    db: Database, streams: EmbeddedNats
) -> None:
    """A pod shutting down mid-frame rolls the frame back and naks it: a
    live pod handles it long before ack_wait (30 s here) would redeliver it."""
    config = fast_config(ack_wait=timedelta(seconds=30))
    started = asyncio.Event()

    async def hang(cx: Reaction[Any], _: BaseModel) -> None:
        started.set()
        await asyncio.Event().wait()

    async with producer(streams) as twin:
        async with pod(db, streams, [place_order("a", before=hang)], config=config):
            await twin.command(PlaceOrder(order_id="o1"))
            await asyncio.wait_for(started.wait(), 10)
        assert await effects(db) == []
        async with pod(db, streams, [place_order("b")], config=config):
            await wait_until(lambda: count_is(effects(db), 1), timeout=10, what="the handover")
    assert [e["pod"] for e in await effects(db)] == ["b"]


async def test_a_handler_slower_than_ack_wait_keeps_its_frame(
    db: Database, streams: EmbeddedNats
) -> None:
    """A frame in hand is reported in progress, so JetStream does not hand
    it to the other pod while a slow handler (1.5 x ack_wait) works on it."""
    calls: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    release = asyncio.Event()
    ack_wait = fast_config().ack_wait.total_seconds()

    def slow(pod_name: str) -> Any:
        async def before(cx: Reaction[Any], _: BaseModel) -> None:
            calls.put_nowait((pod_name, cx.delivered))
            await asyncio.wait_for(release.wait(), 30)

        return before

    a, b = place_order("a", before=slow("a")), place_order("b", before=slow("b"))
    async with pod(db, streams, [a]), pod(db, streams, [b]), producer(streams) as twin:
        await twin.command(PlaceOrder(order_id="o1"))
        _, delivered = await asyncio.wait_for(calls.get(), 10)
        assert delivered == 1
        # The frame stays in hand past ack_wait: nobody is handed it again.
        await assert_nothing(calls, within=1.5 * ack_wait)
        release.set()
        await wait_until(lambda: count_is(effects(db), 1), what="the slow effect")
        await wait_until(lambda: place_settled(streams), what="the frame acked")
        info = await consumer_state(streams.url, CMD, DURABLE)
    assert calls.empty()
    assert info.delivered.consumer_seq == 1, "the frame was redelivered while in hand"
