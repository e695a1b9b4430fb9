"""The outbox relay's RowClaim discipline against a real Postgres and a
spawned nats-server: two running engines on one database both publish the
backlog, each row once, every producer sequence in order."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import nats
from nats.aio.msg import Msg
from pydantic import BaseModel

from service_engine import Database, Engine
from service_engine.embedded import EmbeddedNats
from service_engine.messaging.envelope import (
    HEADER_NATS_MSG_ID,
    HEADER_SEQ,
    HEADER_SEQ_KEY,
    Actor,
    DeclaredSequence,
    EventMetadata,
    build_event,
)
from service_engine.outbox.relay import RowClaimOutboxRelay
from service_engine.outbox.staging import stage_outbound

from ..support.harness import assert_never, engine_running, fast_engine_config, wait_until
from ..support.nats_support import engine_nats, stream_count

SERVICE = "cards"
BOUND = 30.0


class CardMoved(BaseModel):
    AGGREGATE: ClassVar[str] = "card"
    FACT: ClassVar[str] = "moved"
    VERSION: ClassVar[int] = 1

    card_id: str
    version: int
    sequenced: bool

    def sequence(self) -> DeclaredSequence | None:
        return DeclaredSequence(self.card_id, self.version) if self.sequenced else None


async def stage(db: Database, events: list[CardMoved]) -> None:
    """One committed transaction staging ``events`` in list order."""
    meta = EventMetadata.originating(Actor.service(SERVICE))
    async with db.pool.acquire() as conn, conn.transaction():
        for payload in events:
            await stage_outbound(conn, build_event(
                payload, service=SERVICE, metadata=meta, occurred_at=datetime.now(UTC)
            ))


@contextlib.asynccontextmanager
async def pod(db: Database, server: EmbeddedNats, name: str) -> AsyncIterator[Engine]:
    config = fast_engine_config(
        SERVICE, pod_id=name, outbox_discipline="row_claim", outbox_drain_bound=150,
        lock_timeout=timedelta(seconds=1),
    )
    async with engine_nats(server) as conn, engine_running(config, db, nats=conn) as engine:
        yield engine


async def _pending(db: Database) -> int:
    return int(await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.integration_outbox WHERE status <> 'PUBLISHED'"
    ))


async def test_row_claim_relay_publishes_once_across_pods(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """With ``outbox_discipline="row_claim"`` two running engines on one
    database both publish a backlog committed under them: every row is
    published exactly once (a subscriber sees each message id once, the
    stream stores each once, the pods' published counters sum to the
    backlog and each pod published some), and each producer sequence
    arrives in order although the pods interleave."""
    keys = [f"k{i}" for i in range(5)]
    versions = dict.fromkeys(keys, 0)
    backlog: list[CardMoved] = []
    rng = random.Random(171)
    for n in range(1500):
        if n % 3 == 0:
            key = rng.choice(keys)
            versions[key] += 1
            backlog.append(CardMoved(card_id=key, version=versions[key], sequenced=True))
        else:
            backlog.append(CardMoved(card_id=f"free-{n}", version=1, sequenced=False))

    listener = await nats.connect(nats_server.url, connect_timeout=5, max_reconnect_attempts=0)
    seen: list[tuple[str, str | None, str | None]] = []

    async def on_message(msg: Msg) -> None:
        headers = msg.headers or {}
        seen.append((headers[HEADER_NATS_MSG_ID], headers.get(HEADER_SEQ_KEY),
                     headers.get(HEADER_SEQ)))

    await listener.subscribe("integration.evt.cards.>", cb=on_message)
    await listener.flush()
    try:
        async with pod(db, nats_server, "pod-a") as a, pod(db, nats_server, "pod-b") as b:
            assert isinstance(a.integration.outbox, RowClaimOutboxRelay)
            assert isinstance(b.integration.outbox, RowClaimOutboxRelay)
            for start in range(0, len(backlog), 500):
                await stage(db, backlog[start:start + 500])
            await wait_until(lambda: _pending_is_zero(db), timeout=BOUND, what="the backlog")
            await wait_until(lambda: len(seen) >= len(backlog), timeout=BOUND,
                             what="every publish at the subscriber")
            await assert_never(lambda: len(seen) > len(backlog), within=0.5,
                               what="a second publish of a row")
            per_pod = [
                e.metrics.sample("service_engine_outbox_published_total") or 0.0 for e in (a, b)
            ]
    finally:
        await listener.close()

    duplicates = [m for m, n in Counter(m for m, _, _ in seen).items() if n > 1]
    assert duplicates == []
    assert len(seen) == len(backlog)
    assert await stream_count(nats_server.url, "INTEGRATION_EVT") == len(backlog)
    assert sum(per_pod) == len(backlog)
    assert all(count > 0 for count in per_pod), per_pod
    for key in keys:
        arrived = [int(seq) for _, k, seq in seen if k == key and seq is not None]
        assert arrived == list(range(1, versions[key] + 1)), key


async def _pending_is_zero(db: Database) -> bool:
    return await _pending(db) == 0


