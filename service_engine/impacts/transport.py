"""Impact transport over PostgreSQL LISTEN/NOTIFY (PgListenNotify).

Write side: `stage_in` frames a commit's impacts and ``pg_notify``s them in
the caller's transaction, so nothing is delivered unless it commits;
`schedule_in` / `fire_due` deliver impacts when the database clock passes a
due time.

Read side: `PgListenNotify.run` owns one dedicated LISTEN connection and
drains it into a bounded in-process `ImpactChannel` the render loop reads,
so a slow consumer never stalls the drain. Every loss of continuity (a lost
connection, a torn group, a channel overflow, the queue brake) surfaces as
one `Reconnected`, after LISTEN is live again, so a consumer that
re-snapshots on it misses nothing.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Sequence

from ..clock import Timestamp
from ..config import EngineConfig
from ..db.literals import sql_json, sql_timestamptz
from ..db.pool import Database
from ..db.types import Conn
from ..failures import ConfigError, FrameError, TornGroup
from ..metrics import Metrics
from ..readiness import REASON_LISTENER_BRAKE, ReadinessHandle
from .framing import Reassembler, encode_group, new_group_id, parse_frame
from .model import Delivery, Impact, Reconnected, decode_impact, encode_impact

OUTBOX_CHANNEL = "service_engine_outbox"
"""Where a commit that staged outbox rows signals the relay (written by
`service_engine.outbox.relay`)."""

CHANNEL = "service_engine_impacts"
"""The NOTIFY channel every pod of a database listens on."""

REASON_LISTENER = "listener"

_log = logging.getLogger(__name__)


async def stage_in(conn: Conn, impacts: Sequence[Impact]) -> int:
    """Notify ``impacts`` inside the caller's open transaction.

    One commit should stage once, with all its impacts: they travel as one
    framed group. Raises `CauseTooLarge` (let it fail the transaction) when
    one impact cannot fit a notification. Returns how many impacts were
    staged; record them as committed only after the commit returns.
    """
    if not impacts:
        return 0
    frames = encode_group(new_group_id(), impacts)
    if len(frames) == 1:
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, frames[0])
    else:
        await conn.executemany("SELECT pg_notify($1, $2)", [(CHANNEL, f) for f in frames])
    return len(impacts)


def schedule_statement(at: Timestamp, impacts: Sequence[Impact]) -> str:
    """`schedule_in`'s insert with its values inlined (`db.literals`), to
    ride in another round trip of the caller's transaction; ``""`` for no
    impacts. Refuses now (`CauseTooLarge`) what could never be sent."""
    if not impacts:
        return ""
    encode_group(new_group_id(), impacts)
    return (
        "INSERT INTO service_engine.scheduled_impact (due_at, impacts) VALUES "
        f"({sql_timestamptz(at.value)}, {sql_json([encode_impact(i) for i in impacts])})"
    )


async def schedule_in(conn: Conn, at: Timestamp, impacts: Sequence[Impact]) -> None:
    """Deliver ``impacts`` once the database clock passes ``at``.

    Runs in the caller's transaction: a rollback schedules nothing.
    """
    if not impacts:
        return
    encode_group(new_group_id(), impacts)  # refuse now what could never be sent
    await conn.execute(
        "INSERT INTO service_engine.scheduled_impact (due_at, impacts) VALUES ($1, $2)",
        at.value, [encode_impact(i) for i in impacts],
    )


async def fire_due(db: Database, metrics: Metrics | None = None, *, batch: int = 500) -> int:
    """Stage every scheduled impact due by the database clock; each fires once.

    Rows are claimed ``FOR UPDATE SKIP LOCKED`` in the transaction that
    stages their impacts and deletes them, so pods racing here never fire a
    row twice. Returns the number of impacts fired.
    """
    fired = 0
    while True:
        async with db.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """SELECT id, impacts FROM service_engine.scheduled_impact
                    WHERE due_at <= now() ORDER BY due_at, id
                    LIMIT $1 FOR UPDATE SKIP LOCKED""",
                batch,
            )
            if not rows:
                break
            impacts = [decode_impact(obj) for row in rows for obj in row["impacts"]]
            count = await stage_in(conn, impacts)
            await conn.execute(
                "DELETE FROM service_engine.scheduled_impact WHERE id = ANY($1::bigint[])",
                [row["id"] for row in rows],
            )
        if metrics is not None:
            metrics.add_impacts_committed(count)
        fired += count
        if len(rows) < batch:
            break
    return fired


async def queue_usage(db: Database) -> float:
    """The fraction of Postgres's notification queue in use (0.0-1.0)."""
    usage = await db.pool.fetchval("SELECT pg_notification_queue_usage()")
    return float(usage)


CHANNEL_OVERFLOW = "listener channel overflow"
"""The `Reconnected` reason of an `ImpactChannel` overflow."""

LISTENER_DEPENDENCY = "listener"
"""The ``dependency_up`` series of the LISTEN connection."""


class ImpactChannel:
    """A bounded queue of deliveries between the listener and its consumer.

    Putting never blocks. When the queue is full, everything queued is
    dropped and replaced by one `Reconnected` (a loss the consumer repairs
    by re-snapshotting): an overflow episode yields exactly one marker
    however many puts overflow before the consumer catches up.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigError("listener channel capacity must be positive")
        self.capacity = capacity
        self._items: collections.deque[Delivery] = collections.deque()
        self._ready = asyncio.Event()
        self.overflows = 0

    def put(self, item: Delivery) -> None:
        items = self._items
        if isinstance(item, Reconnected) and items and isinstance(items[-1], Reconnected):
            return  # one pending marker already covers this loss
        if len(items) >= self.capacity:
            self.overflows += 1
            items.clear()
            items.append(Reconnected(CHANNEL_OVERFLOW))
            if isinstance(item, Reconnected):
                self._ready.set()
                return
        items.append(item)
        self._ready.set()

    def get_nowait(self) -> Delivery | None:
        if not self._items:
            return None
        item = self._items.popleft()
        if not self._items:
            self._ready.clear()
        return item

    async def wait(self) -> None:
        """Return once a delivery is queued."""
        while not self._items:
            await self._ready.wait()

    async def get(self) -> Delivery:
        while not self._items:
            await self._ready.wait()
        return self.get_nowait()  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._items)

    async def __aiter__(self) -> AsyncIterator[Delivery]:
        while True:
            yield await self.get()


class PgListenNotify:
    """The read side of the transport: one LISTEN connection per pod.

    Run `run` under the engine's supervisor; consume `channel` (or iterate
    `listen`). `started` is set once LISTEN is live.
    """

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        readiness: ReadinessHandle,
        *,
        max_backoff: float = 2.0,
        metrics: Metrics | None = None,
    ) -> None:
        self._db = db
        self._config = config
        self._readiness = readiness
        self._metrics = metrics
        self._max_backoff = max_backoff
        self.channel = ImpactChannel(config.listener_channel_capacity)
        self.started = asyncio.Event()
        self.outbox_wake = asyncio.Event()
        """Set when a commit staged outbox rows (and after a reconnect, which
        may have missed one); the outbox relay waits on it."""
        self._conn: Conn | None = None
        self._lost: asyncio.Event | None = None
        self._brake_reason: str | None = None
        self.connections = 0
        readiness.set_down(REASON_LISTENER, "LISTEN is not live yet")

    def _on_outbox(self, *_: object) -> None:
        self.outbox_wake.set()

    def _up(self, up: bool) -> None:
        if self._metrics is not None:
            self._metrics.set_dependency(LISTENER_DEPENDENCY, up)

    def listen(self) -> ImpactChannel:
        """The stream of deliveries: impacts and `Reconnected`."""
        return self.channel

    def set_brake(self, reason: str) -> None:
        """Close the LISTEN connection: readiness DOWN with ``reason`` until
        the listener has reconnected (which yields `Reconnected`)."""
        self._brake_reason = reason
        self._readiness.set_down(REASON_LISTENER_BRAKE, reason)
        if self._lost is not None:
            self._lost.set()

    async def check_queue(self) -> None:
        """The beat step: brake when queue usage passes the threshold."""
        usage = await queue_usage(self._db)
        if self._metrics is not None:
            self._metrics.set_listener_queue_usage(usage)
        if usage > self._config.listener_queue_threshold:
            self.set_brake(
                f"notification queue usage {usage:.6g} above listener_queue_threshold "
                f"{self._config.listener_queue_threshold:g}: listener closed and reconnecting"
            )

    async def run(self) -> None:
        reassembler = Reassembler()
        backoff = 0.05
        first = True
        while True:
            lost = asyncio.Event()
            try:
                conn = await self._db.connect_dedicated()
            except Exception as exc:
                self._up(False)
                self._readiness.set_down(REASON_LISTENER, f"LISTEN connection failed: {exc}")
                _log.warning("listener connect failed, retrying in %.2fs: %s", backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                continue

            def on_notify(_c: object, _pid: int, _channel: str, payload: object) -> None:
                try:
                    group = reassembler.feed(parse_frame(str(payload)))
                except (TornGroup, FrameError) as exc:
                    _log.warning("impact continuity lost: %s", exc)
                    self.channel.put(Reconnected(f"torn impact group: {exc}"))
                    return
                if group is not None:
                    self.channel.put(group)

            def on_terminate(_c: object, lost: asyncio.Event = lost) -> None:
                lost.set()

            try:
                conn.add_termination_listener(on_terminate)
                await conn.add_listener(CHANNEL, on_notify)
                await conn.add_listener(OUTBOX_CHANNEL, self._on_outbox)
                self._conn, self._lost = conn, lost
                self.connections += 1
                backoff = 0.05
                self._up(True)
                self._readiness.clear(REASON_LISTENER)
                self.outbox_wake.set()
                if not first:
                    # LISTEN is live again: only now may the consumer
                    # re-snapshot, or a commit in the gap would be missed.
                    reassembler.reset()
                    self.channel.put(Reconnected(self._brake_reason or "listener reconnected"))
                if self._brake_reason is not None:
                    self._brake_reason = None
                    self._readiness.clear(REASON_LISTENER_BRAKE)
                first = False
                self.started.set()
                await lost.wait()
                self._up(False)
                _log.warning("LISTEN connection closed; reconnecting")
                self._readiness.set_down(REASON_LISTENER, "LISTEN connection lost; reconnecting")
            except Exception as exc:
                self._up(False)
                _log.warning("listener failed: %s", exc)
            finally:
                self._conn = self._lost = None
                if not conn.is_closed():
                    conn.terminate()
            first = False
