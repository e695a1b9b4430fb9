"""Erase a person: one transaction across the slices under a strict RLS
policy, PersonErased staged once through the outbox, a durable purge the
beat completes when the erasing pod died after the commit, idempotent."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from service_engine import Database, Engine, ReadinessHandle
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.erasure import Erase, person_erased_subject
from service_engine.errors import WorkerStopped

from ..support.accumulator_support import (
    chunk_rows,
    lane_pod,
    producer,
    provision,
    seal_row,
    text_accumulator,
)
from ..support.harness import assert_never, fast_engine_config, owner_connection, wait_until

STREAM = "notes_stream"


class Notes:
    """A slice holding person data: notes (strict RLS) and a lane-A stream."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls = 0

    async def erase(self, cx: Erase, person: str) -> None:
        self.calls += 1
        await cx.execute("DELETE FROM sample_person_note WHERE person = $1", person)
        cx.erased.stream(STREAM, f"{person}.draft")
        if self.fail:
            raise RuntimeError("this slice cannot erase now")


class Audit:
    """A second slice: proves every slice runs in the one transaction."""

    async def erase(self, cx: Erase, person: str) -> None:
        await cx.execute(
            "INSERT INTO sample_person_note (id, person, body) VALUES ($1, $2, 'erased')"
            " ON CONFLICT (id) DO NOTHING",
            f"audit-{person}", "auditor",
        )


async def seed(store: ProvisionedDatabase, person: str) -> None:
    async with owner_connection(store) as conn:
        await conn.execute("SET app.erasing = 'on'")
        await conn.executemany(
            "INSERT INTO sample_person_note (id, person, body) VALUES ($1, $2, $3)",
            [(f"{person}-1", person, "hello"), (f"{person}-2", person, "world"),
             ("other-1", "bob", "kept")],
        )
        await conn.executemany(
            "INSERT INTO service_engine.accumulator_chunk (accumulator, key, seq, chunk)"
            " VALUES ($1, $2, $3, $4)",
            [(STREAM, f"{person}.draft", seq, b"chunk") for seq in range(3)],
        )


async def notes_of(store: ProvisionedDatabase) -> list[str]:
    async with owner_connection(store) as conn:
        await conn.execute("SET app.erasing = 'on'")
        return sorted(r["id"] for r in await conn.fetch("SELECT id FROM sample_person_note"))


@contextlib.asynccontextmanager
async def running(db: Database, *erasables: tuple[str, object]) -> AsyncIterator[Engine]:
    readiness = ReadinessHandle()
    engine = await Engine.boot(
        fast_engine_config("sample", lock_timeout=timedelta(seconds=1)), db, None, readiness
    )
    for name, erasable in erasables:
        engine.register_erasable(name, erasable)  # type: ignore[arg-type]
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: readiness.is_up, what="the engine UP")
        yield engine
    finally:
        engine.shutdown()
        with contextlib.suppress(WorkerStopped):
            await asyncio.wait_for(task, 10)


async def erased_events(db: Database) -> list[dict[str, object]]:
    rows = await db.pool.fetch(
        "SELECT subject, payload FROM service_engine.integration_outbox"
        " WHERE subject = $1", person_erased_subject("sample")
    )
    return [as_json(r["payload"]) for r in rows]


def as_json(value: object) -> dict[str, object]:
    decoded = json.loads(value) if isinstance(value, str | bytes) else value
    assert isinstance(decoded, dict)
    return decoded


async def test_s137_erasure_under_a_strict_deny_when_unset_rls_policy(
    db: Database, database: ProvisionedDatabase
) -> None:
    """s137: under the low-privilege app role a plain DELETE sees none of a
    person's rows (deny when unset); the erasure, setting app.erasing for
    its own transaction, removes them across every slice, records the
    durable fact with its manifest, stages PersonErased once, and purges the
    person's chunks keeping the key sealed. Erasing again is idempotent."""
    await seed(database, "alice")
    assert await db.pool.execute("DELETE FROM sample_person_note WHERE person = 'alice'") == "DELETE 0"
    async with running(db, ("notes", Notes()), ("audit", Audit())) as engine:
        first = await engine.erase("alice")
        assert first.fresh and first.purged
        assert await notes_of(database) == ["audit-alice", "other-1"]
        row = await db.pool.fetchrow(
            "SELECT manifest, purged_at FROM service_engine.person_erasure WHERE person = 'alice'"
        )
        assert row is not None and row["purged_at"] is not None
        assert as_json(row["manifest"])["streams"] == {STREAM: ["alice.draft"]}
        assert await db.pool.fetchval(
            "SELECT count(*) FROM service_engine.accumulator_chunk WHERE key = 'alice.draft'"
        ) == 0
        seal = await db.pool.fetchrow(
            "SELECT high_water FROM service_engine.accumulator_seal"
            " WHERE accumulator = $1 AND key = 'alice.draft'", STREAM,
        )
        assert seal is not None and seal["high_water"] == 3  # still sealed past its chunks
        events = await erased_events(db)
        assert len(events) == 1 and events[0]["payload"] == {"person": "alice"}
        assert events[0]["type"] == "person.erased"

        again = await engine.erase("alice")
        assert not again.fresh and again.purged
        assert len(await erased_events(db)) == 1  # PersonErased published once


async def test_a_failing_slice_rolls_the_whole_erasure_back(
    db: Database, database: ProvisionedDatabase
) -> None:
    """A slice that raises rolls back every slice's erase, the durable fact
    and the event: nothing is erased, nothing is recorded."""
    await seed(database, "carol")
    async with running(db, ("audit", Audit()), ("notes", Notes(fail=True))) as engine:
        with pytest.raises(RuntimeError):
            await engine.erase("carol")
    assert await notes_of(database) == ["carol-1", "carol-2", "other-1"]
    assert await db.pool.fetchval("SELECT count(*) FROM service_engine.person_erasure") == 0
    assert await erased_events(db) == []


async def test_s138_the_beat_completes_a_purge_the_erase_never_finished(
    db: Database, database: ProvisionedDatabase
) -> None:
    """s138: a pod that committed the erasure and died before its purge
    leaves the row unpurged with its manifest; the beat of a running pod
    drains it (the chunks go, the row is marked purged)."""
    await seed(database, "dave")
    async with running(db, ("notes", Notes())) as dying:
        result = await dying.eraser().erase("dave", purge=False)  # the pod dies here
        assert result.fresh and not result.purged
    assert await db.pool.fetchval(
        "SELECT purged_at FROM service_engine.person_erasure WHERE person = 'dave'"
    ) is None
    assert await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.accumulator_chunk WHERE key = 'dave.draft'"
    ) == 3

    async def purged() -> bool:
        return await db.pool.fetchval(
            "SELECT purged_at IS NOT NULL FROM service_engine.person_erasure WHERE person = 'dave'"
        ) is True

    async with running(db, ("notes", Notes())):
        await wait_until(purged, timeout=20, what="the beat draining the unfinished purge")
    assert await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.accumulator_chunk WHERE key = 'dave.draft'"
    ) == 0


async def test_s141_erasing_a_person_purges_their_chunks_from_the_lane_a_stream(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s141: a person's chunks, durable in Postgres and retained on the
    lane-A NATS stream, are gone from both after the erasure; the key stays
    sealed, so a late chunk of it is refused rather than stored again."""
    accumulator = text_accumulator("reply_text")
    await provision(nats_server)

    class Replies:
        async def erase(self, cx: Erase, person: str) -> None:
            cx.erased.stream(accumulator.name, f"{person}-reply")

    async with lane_pod(db, nats_server, [accumulator]) as pod, producer(nats_server) as source:
        pod.engine.register_erasable("replies", Replies())
        for seq, text in enumerate(("a", "b", "c")):
            await source.send("erin-reply", seq, text, accumulator.name)

        async def durable() -> bool:
            return len(await chunk_rows(db, "erin-reply")) == 3

        await wait_until(durable, what="the chunks durable")
        assert await source.subject_count("erin-reply") == 3

        result = await pod.engine.erase("erin")
        assert result.purged
        assert await chunk_rows(db, "erin-reply") == []
        assert await source.subject_count("erin-reply") == 0
        marker = await seal_row(db, "erin-reply")
        assert marker is not None and marker["stream_purged"]

        await source.send("erin-reply", 3, "late", accumulator.name)
        await assert_never(lambda: _has_chunks(db, "erin-reply"), within=0.5)


async def _has_chunks(db: Database, key: str) -> bool:
    return bool(await chunk_rows(db, key))
