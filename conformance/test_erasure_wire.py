"""Erasure on the wire: `PersonErased` reaches a subscriber written to the
specification's subject (``integration.evt.{service}.person.erased.v1``)
through the running engine's outbox relay."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta

import nats
from nats.aio.msg import Msg

from service_engine import (
    Database,
    Engine,
    ReadinessHandle,
    WorkerStopped,
    person_erased_subject,
)
from service_engine.embedded import EmbeddedNats
from service_engine.erasure import Erase

from .harness import fast_engine_config, wait_until
from .nats_support import engine_nats, stream_messages

BOUND = 10.0


class Forgets:
    """A slice whose erase has nothing of its own to remove."""

    async def erase(self, cx: Erase, person: str) -> None:
        await cx.fetch("SELECT 1")


async def test_person_erased_subject_is_versioned(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A fresh erasure publishes PersonErased exactly once on
    ``integration.evt.{service}.person.erased.v1``: a plain NATS
    subscriber to that subject receives the envelope (type
    ``person.erased``, version 1, the person in its payload) and the
    integration stream stores it under that subject only; erasing again
    publishes nothing more."""
    subject = person_erased_subject("sample")
    assert subject == "integration.evt.sample.person.erased.v1"
    listener = await nats.connect(nats_server.url, connect_timeout=5, max_reconnect_attempts=0)
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_message(msg: Msg) -> None:
        await received.put(msg.data)

    await listener.subscribe(subject, cb=on_message)
    await listener.flush()
    try:
        async with engine_nats(nats_server) as conn:
            readiness = ReadinessHandle()
            config = fast_engine_config("sample", lock_timeout=timedelta(seconds=1))
            engine = await Engine.boot(config, db, conn, readiness)
            engine.register_erasable("forgets", Forgets())
            task = asyncio.create_task(engine.run())
            try:
                await wait_until(lambda: readiness.is_up, what="the engine UP")
                assert (await engine.erase("ann")).fresh
                envelope = json.loads(await asyncio.wait_for(received.get(), BOUND))
                assert (envelope["type"], envelope["version"]) == ("person.erased", 1)
                assert envelope["payload"] == {"person": "ann"}

                assert not (await engine.erase("ann")).fresh
                assert not (await engine.erase("ann")).fresh
                stored = [
                    m for m in await stream_messages(nats_server.url, "INTEGRATION_EVT")
                    if "person" in m.subject
                ]
                assert [m.subject for m in stored] == [subject]
                await wait_until(
                    lambda: _all_published(db), timeout=BOUND, what="the outbox drained"
                )
                assert received.empty()
            finally:
                engine.shutdown()
                with contextlib.suppress(WorkerStopped):
                    await asyncio.wait_for(task, BOUND)
    finally:
        await listener.close()


async def _all_published(db: Database) -> bool:
    pending = await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.integration_outbox WHERE status = 'PENDING'"
    )
    return bool(pending == 0)
