"""A pod in its own process, for the crash scenarios of the inbound battery.

    python -m conformance.support.inbound_pod DB_URL NATS_URL POD KILL_AT ACK_WAIT_S

Runs an engine with the orders sample's ``place_order`` reaction and prints
``ready`` once it is UP. At ``KILL_AT`` (``before_commit`` or ``committed``,
an `InboundPoint`) of the first frame it handles, the process SIGKILLs
itself: no cleanup, no ack, no nak, exactly like a crashed pod.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from datetime import timedelta

from service_engine import Engine, ReadinessHandle, connect_pool
from service_engine.inbound.dispatch import InboundPoint
from service_engine.messaging.nats import open_nats

from .inbound_support import fast_config
from .sample_orders import OrdersView, place_order


async def main(db_url: str, nats_url: str, pod_name: str, kill_at: str, ack_wait: float) -> None:
    kill_point = InboundPoint(kill_at)

    async def hook(point: InboundPoint, reaction: str, message_id: uuid.UUID) -> None:
        if point is kill_point:
            os.kill(os.getpid(), signal.SIGKILL)

    db = await connect_pool(db_url, max_size=4)
    conn = await open_nats(nats_url, ping_interval=1)
    readiness = ReadinessHandle()
    engine = await Engine.boot(
        fast_config(ack_wait=timedelta(seconds=ack_wait), pod_id=pod_name), db, conn, readiness
    )
    engine.register_projector(OrdersView())
    engine.register_reaction(place_order(pod_name))
    engine.set_inbound_hook(hook)
    task = asyncio.create_task(engine.run())
    while not readiness.is_up:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    db_url, nats_url, pod_name, kill_at, ack_wait = sys.argv[1:6]
    asyncio.run(main(db_url, nats_url, pod_name, kill_at, float(ack_wait)))
