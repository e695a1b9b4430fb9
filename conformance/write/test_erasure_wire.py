"""Erasure on the wire and in live windows: `PersonErased` reaches a
subscriber written to the specification's subject
(``integration.evt.{service}.person.erased.v1``) through the running
engine's outbox relay; the reference board slice's erasure re-gates the
erased member's live sessions; a principal-facts dependency that names no
registered noun is refused where it is staged."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta

import nats
import pytest
from nats.aio.msg import Msg

from example_service.slices.board.domain import BOARD_MEMBERSHIPS, NOUN, Board
from service_engine import Database, Engine, ReadinessHandle
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.erasure import Erase, person_erased_subject
from service_engine.errors import WorkerStopped
from service_engine.graphql import Passport
from service_engine.impacts import UnknownFactDependency
from service_engine.pipeline import Mutation

from ..blackbox.harness import BOARDS_SUBSCRIPTION
from ..support.example_support import person, running
from ..support.harness import fast_engine_config, owner_connection, wait_until
from ..support.nats_support import engine_nats, stream_messages

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



async def test_erasure_regates_live_windows(store: ProvisionedDatabase) -> None:
    """An erased member's live sessions lose the boards they had joined:
    the board slice's erasure stages its principal-facts impact on the
    ``board`` noun, so the running engine re-resolves the person and their
    open window receives a Remove of the cross-org board (another member's
    window keeps it)."""
    async with owner_connection(store) as conn:
        await conn.execute(
            "INSERT INTO board (id, org, title, owner) VALUES ('b1', 'acme', 'Plans', 'ann')"
        )
        await conn.executemany(
            "INSERT INTO board_member (id, board_id, person) VALUES ($1, 'b1', $2)",
            [("m1", "zoe"), ("m2", "yan")],
        )
    async with (
        running(store, ["board"]) as run,
        run.socket(Passport(sub="zoe", org="other")) as zoe,
        run.socket(Passport(sub="yan", org="other")) as yan,
    ):
        for ws in (zoe, yan):
            await ws.subscribe("boards", BOARDS_SUBSCRIPTION)
            reset = (await ws.next("boards"))["boards"]
            assert (reset["__typename"], reset["keys"]) == ("BoardsReset", [json.dumps("b1")])

        assert (await run.engine.erase("zoe")).fresh
        removed = (await zoe.next("boards"))["boards"]
        assert (removed["__typename"], removed["key"]) == ("BoardsRemove", json.dumps("b1"))
        assert removed["revision"] == reset["revision"] + 1
        await yan.quiet(0.5)


async def test_a_fact_name_is_refused_as_a_principal_facts_dependency(
    store: ProvisionedDatabase,
) -> None:
    """On the running engine a mutation staging ``impact_principal_facts``
    with a dependency no registered projector reads (a fact name, not a
    noun) raises UnknownFactDependency at the staging line and commits
    nothing; the registered noun is accepted."""
    async with running(store, ["board"]) as run:

        async def join(cx: Mutation[object], deps: list[str]) -> None:
            await cx.create(Board("b9", "acme", "Nine", "ann"))
            cx.impact_principal_facts("zoe", deps)

        with pytest.raises(UnknownFactDependency) as refused:
            await run.executor.execute(person("ann"), join, [NOUN, BOARD_MEMBERSHIPS])
        assert refused.value.unknown == (BOARD_MEMBERSHIPS,)
        assert NOUN in str(refused.value)
        assert await run.engine.fetch("boards", "b9", person("ann")) is None
        assert await run.executor.execute(person("ann"), join, [NOUN]) is None
        assert await run.engine.fetch("boards", "b9", person("ann")) is not None
