"""Cron ticks: once per slot across racing pods, the tick's writes commit
with its slot, a failing tick retries then dead-letters (source Cron)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from service_engine import Database
from service_engine.beat.cron import Cron, CronScheduler, Tick
from service_engine.db.types import Conn
from service_engine.messaging.dead_letters import DeadLetters, DeadLetterSource
from service_engine.messaging.envelope import Actor
from service_engine.metrics import Metrics

from ..support.harness import wait_until


async def record_tick(conn: Conn, tick: Tick) -> None:
    """The tick's effect: one fact row, written on the slot's transaction."""
    await conn.execute(
        """INSERT INTO sample_counter_soft_fact (counter_id, fact_type, payload)
           VALUES ($1, 'tick', $2::text::jsonb)""",
        tick.cron, json.dumps({"slot": tick.slot.isoformat(), "attempt": tick.attempt}),
    )


async def facts(db: Database) -> list[dict[str, object]]:
    rows = await db.pool.fetch(
        "SELECT payload::text AS p FROM sample_counter_soft_fact WHERE fact_type = 'tick' ORDER BY id"
    )
    return [json.loads(r["p"]) for r in rows]


def scheduler(db: Database, holder: str, metrics: Metrics | None = None) -> CronScheduler:
    return CronScheduler(db, DeadLetters(db, metrics), holder=holder, service="cards")


async def test_two_pods_racing_fire_each_slot_once(db: Database) -> None:
    """Two pods racing to fire the same cron fire each slot exactly once, every fired slot
    recorded FIRED by one of them."""
    pods = [scheduler(db, "pod-a"), scheduler(db, "pod-b")]
    for pod in pods:
        pod.register(Cron("sweep", timedelta(milliseconds=150), record_tick))

    async def race() -> bool:
        await asyncio.gather(*(p.fire_due() for p in pods for _ in range(3)))
        return len({f["slot"] for f in await facts(db)}) >= 4

    await wait_until(race, timeout=10, what="four slots fired")
    fired = await facts(db)
    slots = [f["slot"] for f in fired]
    assert len(slots) == len(set(slots)), "a slot fired twice"
    rows = await db.pool.fetch("SELECT slot, status, holder FROM service_engine.cron_slot WHERE cron = 'sweep'")
    assert {r["slot"].isoformat() for r in rows} == set(slots)
    assert {r["status"] for r in rows} == {"FIRED"}
    assert {r["holder"] for r in rows} <= {"pod-a", "pod-b"}


async def test_a_tick_acts_as_the_service(db: Database) -> None:
    """A cron tick runs as the service's actor on its first attempt, and a fired slot is not
    fired again."""
    seen: list[Tick] = []

    async def capture(_conn: Conn, tick: Tick) -> None:
        seen.append(tick)

    pod = scheduler(db, "pod-a")
    pod.register(Cron("who", timedelta(hours=1), capture))
    [outcome] = await pod.fire_due()
    assert outcome.outcome == "fired"
    assert seen[0].actor == Actor.service("cards") and seen[0].attempt == 1
    assert (await pod.fire_due())[0].outcome == "done"


async def test_a_failing_tick_rolls_back_retries_then_dead_letters(db: Database) -> None:
    """A failing tick's writes roll back; the slot is retried up to max_attempts, then dead-
    lettered (source Cron) and counted once."""
    metrics = Metrics("cards", "pod-a")

    async def broken(conn: Conn, tick: Tick) -> None:
        await record_tick(conn, tick)
        raise RuntimeError("downstream refused")

    pod = scheduler(db, "pod-a", metrics)
    pod.register(Cron("broken", timedelta(hours=1), broken, max_attempts=2))
    assert [o.outcome for o in await pod.fire_due()] == ["retry"]
    assert [o.outcome for o in await pod.fire_due()] == ["dead"]
    assert [o.outcome for o in await pod.fire_due()] == ["done"]
    assert await facts(db) == [], "a failed tick's writes committed"
    [letter] = await DeadLetters(db).list(DeadLetterSource.CRON)
    assert letter.work == "broken" and letter.attempts == 2 and "downstream refused" in letter.detail
    assert metrics.sample("service_engine_dead_letters_total", source="Cron") == 1


async def test_a_slot_left_to_retry_fires_after_its_period_passed(db: Database) -> None:
    """A slot left to retry still fires (on its second attempt) after its period has passed."""
    failures = {"left": 1}

    async def flaky(conn: Conn, tick: Tick) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("not yet")
        await record_tick(conn, tick)

    pod = scheduler(db, "pod-a")
    pod.register(Cron("flaky", timedelta(milliseconds=300), flaky, max_attempts=3))
    [first] = await pod.fire_due()
    assert first.outcome == "retry"

    async def retried() -> bool:
        await pod.fire_due()
        return any(f["slot"] == first.slot.isoformat() for f in await facts(db))

    await wait_until(retried, timeout=5, what="the retried slot to fire")
    status = await db.pool.fetchrow(
        "SELECT status, attempts FROM service_engine.cron_slot WHERE cron = 'flaky' AND slot = $1", first.slot
    )
    assert status is not None and (status["status"], status["attempts"]) == ("FIRED", 2)
