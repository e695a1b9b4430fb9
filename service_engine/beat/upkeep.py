"""The pod's own upkeep: its core loops and the beat steps that watch the pod.

`Upkeep` is the component every engine has: the LISTEN loop, the render
pass and the loop-lag watch run under the supervisor from `Engine.boot` on,
and the beat probes Postgres, keeps the schema-version claim, watches the
listener's queue, gauges the dead letters waiting, fires due scheduled
impacts, sweeps the sessions, hands memory back after a burst of sessions
closed and closes the pool connections nobody needed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from ..config import EngineConfig
from ..db.pool import Database, IdleConnections
from ..db.schema_version import Claim, VersionIdentity, claim_schema_version
from ..failures import ListenerProbeFailed
from ..impacts.transport import PgListenNotify, fire_due
from ..memory import RELEASE_FOLLOW_UP, ReleaseAfterClose, release_free_memory
from ..messaging.dead_letters import DeadLetterSource
from ..metrics import Metrics
from ..ops.queries import dead_letters_waiting
from ..readiness import REASON_MISSING_GRANT, REASON_SCHEMA_VERSION_DISPLACED, ReadinessHandle
from ..render.runtime import RenderRuntime
from ..supervisor import Worker
from .component import BeatStep

__all__ = [
    "DEAD_LETTER_GAUGE_EVERY", "LOOP_LAG_INTERVAL", "Upkeep", "UpkeepBounds", "check_grants",
    "missing_grants", "probe_listener",
]

DEAD_LETTER_GAUGE_EVERY = 5.0
"""The most seconds between reads of the dead letters waiting (a GROUP BY per pod)."""
LOOP_LAG_INTERVAL = 0.05
"""How often the loop-lag worker asks for a wake (20 a second): each wake's
lateness is one ``service_engine_loop_lag_seconds`` observation."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UpkeepBounds:
    """What the pod's upkeep reads of the config."""

    pod_id: str
    service: str | None
    beat_interval: timedelta
    probe_timeout: timedelta
    """The bound of a Postgres probe (``listener_probe_timeout``)."""
    schema_version_liveness: timedelta

    @classmethod
    def of(cls, config: EngineConfig) -> UpkeepBounds:
        return cls(
            config.pod_id, config.service, config.beat_interval,
            config.listener_probe_timeout, config.schema_version_liveness,
        )


async def probe_listener(db: Database, timeout_after: timedelta) -> None:
    """LISTEN on a dedicated connection and NOTIFY it from the pool.

    Behind a transaction-mode pooler the LISTEN is released with its
    transaction and the notification never arrives: `ListenerProbeFailed`.
    """
    channel = f"service_engine_probe_{secrets.token_hex(6)}"
    arrived = asyncio.get_running_loop().create_future()

    def on_notify(*_: object) -> None:
        if not arrived.done():
            arrived.set_result(None)

    timeout = timeout_after.total_seconds()
    conn = await db.connect_dedicated()
    try:
        await conn.add_listener(channel, on_notify)
        await db.pool.execute("SELECT pg_notify($1, 'probe')", channel)
        try:
            await asyncio.wait_for(arrived, timeout)
        except TimeoutError:
            raise ListenerProbeFailed(
                f"a self-NOTIFY did not arrive on the LISTEN connection within {timeout:g}s;"
                " a transaction-mode pooler between the engine and Postgres drops LISTEN"
            ) from None
    finally:
        await conn.close()


_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")

_MISSING_PRIVILEGES = """
SELECT t AS table, to_regclass(t) IS NOT NULL AS present, current_user AS role,
       ARRAY(SELECT p FROM unnest($2::text[]) WITH ORDINALITY AS q(p, i)
             WHERE NOT has_table_privilege(to_regclass(t), p) ORDER BY i) AS missing
FROM unnest($1::text[]) AS t"""


async def missing_grants(db: Database, tables: Iterable[str]) -> list[str]:
    """What the app role (the pool's) lacks on ``tables`` for a store to read
    and write them: one ``GRANT ... ON <table> TO <role>`` per table missing
    a privilege, or a note for a table that does not exist. Empty: all held."""
    wanted = list(dict.fromkeys(tables))
    if not wanted:
        return []
    async with db.pool.acquire() as conn:
        rows = await conn.fetch(_MISSING_PRIVILEGES, wanted, list(_PRIVILEGES))
    problems: list[str] = []
    for row in rows:
        if not row["present"]:
            problems.append(f"table {row['table']} does not exist (apply the migrations)")
        elif row["missing"]:
            problems.append(
                f"GRANT {', '.join(row['missing'])} ON {row['table']} TO {row['role']}"
            )
    return problems


async def check_grants(db: Database, readiness: ReadinessHandle, tables: Iterable[str]) -> bool:
    """Hold readiness DOWN under `REASON_MISSING_GRANT`, naming each missing
    GRANT, when the app role cannot read and write a registered store's
    table (checked once, at `Engine.run`: grant, then restart the pod).
    Answers whether every table is usable."""
    problems = await missing_grants(db, tables)
    if not problems:
        return True
    detail = (
        "the app role cannot read and write the tables of registered stores; as the "
        "schema owner run: " + "; ".join(problems) + " (then restart the pod)"
    )
    _log.error("%s", detail)
    readiness.set_down(REASON_MISSING_GRANT, detail)
    return False


class Upkeep:
    """The pod's core loops and its watching beat steps."""

    def __init__(
        self,
        db: Database,
        bounds: UpkeepBounds,
        readiness: ReadinessHandle,
        metrics: Metrics,
        version: VersionIdentity,
        *,
        transport: PgListenNotify,
        render: RenderRuntime,
    ) -> None:
        self._db = db
        self._bounds = bounds
        self._readiness = readiness
        self._metrics = metrics
        self._version = version
        self._transport = transport
        self._render = render
        self._dead_letters_gauged_at = float("-inf")
        self.release = ReleaseAfterClose(follow_up=RELEASE_FOLLOW_UP)
        self._idle_connections = IdleConnections()

    async def start(self) -> None:
        return None

    def tasks(self) -> Mapping[str, Worker]:
        return {
            "listener": self._transport.run,
            "render": self._render.run,
            "loop_lag": self._watch_loop_lag,
        }

    def beat_steps(self) -> Mapping[str, BeatStep]:
        return {
            "postgres": self._probe_postgres,
            "schema_version": self._refresh_schema_version,
            "listener_queue": self._transport.check_queue,
            "dead_letters_waiting": self._gauge_dead_letters,
            "scheduled_impacts": self._fire_due,
            "sessions": self._render.beat,
            "memory": self._release_after_close,
            "idle_connections": self._close_unneeded_connections,
        }

    async def aclose(self) -> None:
        return None

    async def _watch_loop_lag(self) -> None:
        """``service_engine_loop_lag_seconds``: every `LOOP_LAG_INTERVAL`,
        how late the wake ran past its deadline (a callback or a collection
        holding the loop shows here as the time every write, NOTIFY and
        frame due meanwhile waited)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LOOP_LAG_INTERVAL
            await asyncio.sleep(LOOP_LAG_INTERVAL)
            self._metrics.observe_loop_lag(max(0.0, loop.time() - due))

    async def _fire_due(self) -> None:
        await fire_due(self._db, self._metrics)

    async def _probe_postgres(self) -> None:
        """``dependency_up{postgres}``: one bounded round trip on the pool."""
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can drop
            # the beat's cancellation when it races the probe's answer.
            async with asyncio.timeout(self._bounds.probe_timeout.total_seconds()):
                await self._db.pool.fetchval("SELECT 1")
        except BaseException:
            self._metrics.set_dependency("postgres", False)
            raise
        self._metrics.set_dependency("postgres", True)

    async def _release_after_close(self) -> None:
        """Once many sessions closed (`ReleaseAfterClose`), hand the heap's
        free pages back to the OS: a pod returns toward its idle footprint."""
        registry = self._render.registry
        live = len(registry.sessions)
        if self.release.observe(live, registry.take_peak()):
            started = time.perf_counter()
            closed = 0
            if self.release.due_in:  # a fall, not its follow-up (the pool has its floor again)
                closed = await self._db.close_idle_connections()  # the burst's, and its statements
                await asyncio.sleep(0)  # their transports are let go in the next loop turn
            released = release_free_memory()
            if released:
                self._metrics.add_memory_release()
            _log.info("sessions fell to %d: %d idle pool connections closed, free memory %s"
                      " in %.1f ms", live, closed,
                      "released" if released else "not releasable here",
                      (time.perf_counter() - started) * 1e3)

    async def _close_unneeded_connections(self) -> None:
        """Close the pool connections the last `IDLE_CONNECTION_WINDOW`
        never needed at once (the pool arms no idle timer per release)."""
        keep = self._idle_connections.observe(
            asyncio.get_running_loop().time(), self._db.in_use()
        )
        if keep is not None:
            closed = await self._db.close_idle_above(keep)
            if closed:
                _log.info("%d pool connections unneeded for %.0f s closed", closed,
                          self._idle_connections.window)

    async def _gauge_dead_letters(self) -> None:
        """``dead_letters_waiting{source}``, read every ten beats (at most
        every `DEAD_LETTER_GAUGE_EVERY` seconds)."""
        now = asyncio.get_running_loop().time()
        every = min(DEAD_LETTER_GAUGE_EVERY, 10 * self._bounds.beat_interval.total_seconds())
        if now < self._dead_letters_gauged_at + every:
            return
        self._dead_letters_gauged_at = now
        waiting = await dead_letters_waiting(self._db)
        for source in DeadLetterSource:
            self._metrics.set_dead_letters_waiting(source.value, waiting.get(source.value, 0))

    async def _refresh_schema_version(self) -> None:
        async with self._db.pool.acquire() as conn:
            result = await claim_schema_version(
                conn, self._version, pod_id=self._bounds.pod_id,
                service=self._bounds.service, liveness=self._bounds.schema_version_liveness,
            )
        if result.claim is Claim.DISPLACED:
            self._readiness.set_down(
                REASON_SCHEMA_VERSION_DISPLACED,
                f"this pod runs {self._version}; a live pod holds the store at {result.holder}",
            )
        else:
            self._readiness.clear(REASON_SCHEMA_VERSION_DISPLACED)
