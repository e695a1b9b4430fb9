"""Cron: a callable fired once per period slot across every pod.

A `Cron` names a period (``every``); the slots are the period's multiples
on the *database* clock since the epoch. `CronScheduler.fire_due` (a beat
step on every pod) fires each cron's current slot, and any slot left to
retry, in one transaction that:

1. takes a per-(cron, slot) advisory lock without waiting (a pod firing the
   same slot right now wins; the others skip it);
2. skips a slot whose ``service_engine.cron_slot`` row is final;
3. runs the tick in a savepoint, on the transaction's connection, so its
   writes (an outbox row, a table update) commit with the FIRED row: a
   slot's effect lands exactly once;
4. on failure rolls the savepoint back and marks the slot RETRY, or past
   ``max_attempts`` DEAD with a dead letter (source Cron).

Slots missed while every pod was down are not caught up: a cron is a
periodic trigger, not a queue of due work (use scheduled messages for that).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from ..db.locks import advisory_key
from ..db.pool import Database
from ..db.types import Conn
from ..failures import ConfigError, DuplicateRegistration
from ..messaging.dead_letters import DeadLetter, DeadLetters, DeadLetterSource, Recorded
from ..messaging.envelope import Actor, check_token

_log = logging.getLogger(__name__)

CRON_LOCK_DOMAIN = "service_engine.cron"


@dataclass(frozen=True, slots=True)
class Tick:
    """One firing: the cron, its slot (the period's start on the database
    clock), the attempt (1 on the first try) and the actor the tick acts as
    (the service identity; None when no service is configured)."""

    cron: str
    slot: datetime
    attempt: int
    actor: Actor | None


TickFn = Callable[[Conn, Tick], Awaitable[None]]
"""A cron's body: runs inside the slot's transaction on ``conn``. Write
through ``conn`` (stage outbox rows, update tables); raise to fail the
attempt (its writes roll back)."""


@dataclass(frozen=True, slots=True)
class Cron:
    """A named periodic tick. ``name`` is one subject token; ``every`` the
    period; ``max_attempts`` the failures a slot survives before it is
    dead-lettered."""

    name: str
    every: timedelta
    run: TickFn
    max_attempts: int = 3

    def __post_init__(self) -> None:
        check_token(self.name, "cron name")
        if self.every <= timedelta(0):
            raise ConfigError(f"cron {self.name}: every must be positive")
        if self.max_attempts < 1:
            raise ConfigError(f"cron {self.name}: max_attempts must be positive")


Fired = Literal["fired", "retry", "dead", "done", "busy"]


@dataclass(frozen=True, slots=True)
class SlotOutcome:
    cron: str
    slot: datetime
    outcome: Fired


_CURRENT_SLOT = """
SELECT to_timestamp(floor(extract(epoch FROM clock_timestamp()) / $1) * $1)
"""

_UPSERT = """
INSERT INTO service_engine.cron_slot AS c (cron, slot, status, attempts, holder, last_error)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (cron, slot) DO UPDATE
   SET status = EXCLUDED.status, attempts = EXCLUDED.attempts, holder = EXCLUDED.holder,
       last_error = EXCLUDED.last_error, updated_at = now()
"""


class CronScheduler:
    """The crons of one engine; register `beat` as a beat step.

    ``holder`` names this pod in the slot rows (`EngineConfig.pod_id`);
    ``service`` gives ticks their service actor. Final slot rows older than
    ``keep`` are pruned.
    """

    def __init__(
        self,
        db: Database,
        dead_letters: DeadLetters,
        *,
        holder: str,
        service: str | None = None,
        keep: timedelta = timedelta(days=1),
    ) -> None:
        self.db = db
        self.dead_letters = dead_letters
        self.holder = holder
        self.actor = Actor.service(service) if service else None
        self.keep = keep
        self._crons: dict[str, Cron] = {}
        self._next_prune = 0.0

    def register(self, cron: Cron) -> None:
        """Add ``cron``; raises `DuplicateRegistration` for a name in use."""
        if cron.name in self._crons:
            raise DuplicateRegistration("cron", cron.name)
        self._crons[cron.name] = cron

    async def beat(self) -> None:
        await self.fire_due()

    async def fire_due(self) -> list[SlotOutcome]:
        """Fire every cron's current slot and its slots left to retry."""
        outcomes: list[SlotOutcome] = []
        for cron in list(self._crons.values()):
            current = await self.db.pool.fetchval(_CURRENT_SLOT, cron.every.total_seconds())
            retries = await self.db.pool.fetch(
                """SELECT slot FROM service_engine.cron_slot
                    WHERE cron = $1 AND status = 'RETRY' ORDER BY slot""",
                cron.name,
            )
            slots = [r["slot"] for r in retries if r["slot"] != current] + [current]
            for slot in slots:
                outcomes.append(SlotOutcome(cron.name, slot, await self._fire(cron, slot)))
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + 60.0
            await self.db.pool.execute(
                """DELETE FROM service_engine.cron_slot
                    WHERE status <> 'RETRY' AND slot < now() - $1::interval""",
                self.keep,
            )
        return outcomes

    async def _fire(self, cron: Cron, slot: datetime) -> Fired:
        recorded: Recorded | None = None
        async with self.db.pool.acquire() as conn, conn.transaction():
            lock = advisory_key(CRON_LOCK_DOMAIN, cron.name, slot.isoformat())
            if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", lock):
                return "busy"
            row = await conn.fetchrow(
                """SELECT status, attempts FROM service_engine.cron_slot
                    WHERE cron = $1 AND slot = $2""",
                cron.name, slot,
            )
            if row is not None and row["status"] != "RETRY":
                return "done"
            attempt = (0 if row is None else int(row["attempts"])) + 1
            error: Exception | None = None
            try:
                async with conn.transaction():  # a savepoint: a failed tick leaves nothing
                    await cron.run(conn, Tick(cron.name, slot, attempt, self.actor))
            except Exception as exc:
                error = exc
            if error is None:
                await conn.execute(_UPSERT, cron.name, slot, "FIRED", attempt, self.holder, None)
                return "fired"
            detail = f"{type(error).__name__}: {error}"
            status: Fired = "retry" if attempt < cron.max_attempts else "dead"
            await conn.execute(
                _UPSERT, cron.name, slot, status.upper(), attempt, self.holder, detail
            )
            if status == "dead":
                recorded = await self.dead_letters.record(
                    conn,
                    DeadLetter.for_work(
                        DeadLetterSource.CRON, cron.name, reason="tick failed", detail=detail,
                        key=slot.isoformat(), attempts=attempt,
                    ),
                )
        if recorded is not None:
            self.dead_letters.committed(recorded)
        log = _log.error if status == "dead" else _log.warning
        log("cron %s slot %s failed (attempt %s of %s): %s",
            cron.name, slot.isoformat(), attempt, cron.max_attempts, detail)
        return status
