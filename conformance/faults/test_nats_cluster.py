"""Scale-out on a real three-node NATS cluster (loopback, routed, R3 streams):
two pods against it lose the stream leader's node to a SIGKILL mid-load and
lose no acknowledged message, run no effect twice, and recover without a
restart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from service_engine import Database, Engine, ReadinessHandle
from service_engine.embedded import EmbeddedNatsCluster
from service_engine.errors import WorkerStopped
from service_engine.messaging.envelope import (
    HEADER_MESSAGE_ID,
    HEADER_NATS_MSG_ID,
    Actor,
    EventMetadata,
    build_command,
    publish_headers,
)
from service_engine.messaging.nats import open_nats

from ..support.harness import wait_until
from ..support.inbound_support import fast_config
from ..support.sample_orders import OrdersView, PlaceOrder, place_order

# Spawns processes or servers for seconds: started first in a parallel run.
pytestmark = pytest.mark.slow

COMMANDS = 600
KILL_AFTER = 200


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmbeddedNatsCluster]:
    nodes = EmbeddedNatsCluster(tmp_path / "cluster")
    await asyncio.to_thread(nodes.start)
    try:
        await nodes.provision(buckets=["PUBLISHED_orders"])
        yield nodes
    finally:
        await asyncio.to_thread(nodes.stop)


@contextlib.asynccontextmanager
async def pod(db: Database, url: str, name: str) -> AsyncIterator[tuple[Engine, ReadinessHandle]]:
    """A pod connected to one node of the cluster (it learns the others)."""
    conn = await open_nats(url, publish_ack_timeout=timedelta(seconds=2), ping_interval=1)
    try:
        readiness = ReadinessHandle()
        config = fast_config(pod_id=name, ack_wait=timedelta(seconds=5),
                             publish_ack_timeout=timedelta(seconds=2))
        engine = await Engine.boot(config, db, conn, readiness)
        engine.register_projector(OrdersView())
        engine.register_reaction(place_order(name))
        task = asyncio.create_task(engine.run())
        try:
            await wait_until(lambda: readiness.is_up or task.done(), timeout=20,
                             what=f"{name} UP")
            if task.done():
                task.result()
            yield engine, readiness
        finally:
            engine.shutdown()
            with contextlib.suppress(WorkerStopped):
                await asyncio.wait_for(task, 20)
    finally:
        await conn.aclose()


async def publish_until_acked(client: Client, order: str) -> None:
    """Publish one command; on no answer publish it again with the same
    Nats-Msg-Id (the broker deduplicates) until it is acknowledged."""
    message = build_command(
        PlaceOrder(order_id=order), service="twin",
        metadata=EventMetadata.originating(Actor.service("twin")), occurred_at=datetime.now(UTC),
    )
    headers = publish_headers(message.message_id)
    body = message.body_json().encode()
    js = client.jetstream(timeout=2)
    for _ in range(100):
        try:
            await js.publish(message.subject, body, headers=headers)
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise AssertionError(f"command {order} was never acknowledged")


async def effect_counts(db: Database) -> dict[str, int]:
    rows = await db.pool.fetch(
        "SELECT order_id, count(*) AS n FROM sample_order_effect GROUP BY order_id"
    )
    return {r["order_id"]: int(r["n"]) for r in rows}


async def effects_by_pod(db: Database) -> dict[str, int]:
    rows = await db.pool.fetch("SELECT pod, count(*) AS n FROM sample_order_effect GROUP BY pod")
    return {r["pod"]: int(r["n"]) for r in rows}


async def test_two_pods_survive_the_stream_leaders_node_killed_mid_load(
    db: Database, cluster: EmbeddedNatsCluster
) -> None:
    """With R3 streams on three routed nodes, SIGKILL of INTEGRATION_CMD's
    leader node mid-load: every acknowledged command's effect lands exactly
    once, every confirmation reaches INTEGRATION_EVT exactly once, and both
    pods (one of them connected to the killed node or not) keep working and
    end UP without a restart."""
    client = await nats.connect(cluster.urls, connect_timeout=5, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.2)
    run = uuid.uuid4().hex[:6]
    orders = [f"{run}-{i}" for i in range(COMMANDS)]
    try:
        async with (
            pod(db, cluster.node_url(0), "pod-a") as (_, ready_a),
            pod(db, cluster.node_url(1), "pod-b") as (_, ready_b),
        ):
            slots = asyncio.Semaphore(32)

            async def send(order: str) -> None:
                async with slots:
                    await publish_until_acked(client, order)

            await asyncio.gather(*(send(o) for o in orders[:KILL_AFTER]))
            info = await client.jetstream().stream_info("INTEGRATION_CMD")
            assert info.cluster is not None and info.cluster.leader is not None
            assert info.config.num_replicas == 3
            leader = cluster.node_of(info.cluster.leader)
            at_kill = await effects_by_pod(db)
            await asyncio.to_thread(cluster.kill_node, leader)
            await asyncio.gather(*(send(o) for o in orders[KILL_AFTER:]))

            async def all_effects() -> bool:
                return len(await effect_counts(db)) == COMMANDS

            await wait_until(all_effects, timeout=90, what="every acknowledged command's effect")
            await wait_until(lambda: ready_a.is_up and ready_b.is_up, timeout=30,
                             what="both pods UP after the node loss")
            after = await effects_by_pod(db)
            for name in ("pod-a", "pod-b"):
                assert after.get(name, 0) > at_kill.get(name, 0), f"{name} stopped working"

            async def drained() -> bool:
                pending = await db.pool.fetchval(
                    "SELECT count(*) FROM service_engine.integration_outbox"
                    " WHERE status <> 'PUBLISHED'"
                )
                return int(pending) == 0

            await wait_until(drained, timeout=60, what="every confirmation published")
        counts = await effect_counts(db)
        assert set(counts) == set(orders)
        assert {n for n in counts.values()} == {1}, "an effect ran twice"

        # A command redelivered after its claim re-sends its stored
        # confirmation (fresh dedup token, the original logical id): one
        # logical confirmation per order, none missing.
        js = client.jetstream(timeout=5)
        evt = await js.stream_info("INTEGRATION_EVT")
        logical: dict[str, set[str]] = {}
        tokens: list[str] = []
        for seq in range(evt.state.first_seq, evt.state.last_seq + 1):
            msg = await js.get_msg("INTEGRATION_EVT", seq)
            headers = msg.headers or {}
            order = json.loads(msg.data or b"{}")["payload"]["order_id"]
            logical.setdefault(order, set()).add(headers[HEADER_MESSAGE_ID])
            tokens.append(headers[HEADER_NATS_MSG_ID])
        assert len(tokens) == len(set(tokens)), "one outbox row stored twice"
        assert set(logical) == set(orders), "a confirmation lost"
        assert all(len(ids) == 1 for ids in logical.values()), "an order confirmed twice"
    finally:
        await client.close()
