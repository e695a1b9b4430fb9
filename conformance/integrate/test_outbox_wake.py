"""The outbox relay's wake-up pass: what it sends to Postgres while the lease
is fresh (no renewal, no backlog COUNT, the mark's reset riding with COMMIT),
and that it stays fenced (a relay whose lease was taken over marks nothing)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from service_engine import Database
from service_engine.beat.leader import LeaderLease
from service_engine.embedded import EmbeddedNats
from service_engine.messaging.dead_letters import DeadLetters
from service_engine.metrics import Metrics
from service_engine.outbox.relay import OUTBOX_SLOT, OutboxRelay

from ..support.harness import Statements, wait_until
from ..support.nats_support import engine_nats, stream_count
from .test_outbox import SERVICE, commit_events, event, fast_bounds, relay_for, statuses


def _relay(db: Database, conn: Any, lease: timedelta, holder: str = "pod-a") -> OutboxRelay:
    metrics = Metrics(SERVICE, holder)
    return OutboxRelay(
        db, conn, DeadLetters(db, metrics), LeaderLease(db, OUTBOX_SLOT, holder, lease),
        metrics=metrics, bounds=fast_bounds(),
    )


async def test_a_wake_with_a_fresh_lease_selects_publishes_and_marks_in_four_round_trips(
    logged: tuple[Database, Statements], db: Database, nats_server: EmbeddedNats
) -> None:
    """While the lease is fresh a wake-up pass neither renews the lease nor counts the
    backlog: it selects the pending rows, publishes them and marks them in one fenced
    transaction whose COMMIT carries the pool's release reset."""
    relay_db, statements = logged
    async with engine_nats(nats_server) as conn:
        relay = _relay(relay_db, conn, timedelta(seconds=30))
        assert (await relay.step()).skipped is None  # the beat: takes the lease
        # A first wake warms the connection (the driver's one-off type introspection).
        await commit_events(db, [event("c0")])
        assert (await relay.wake()).published == 1
        await commit_events(db, [event("c1"), event("c2")])
        statements.take()
        result = await relay.wake()
        sent = statements.take()
    assert result.published == 2 and await statuses(db) == {"PUBLISHED": 3}
    assert not any("leader_slot AS s" in s or "count(*)" in s for s in sent), sent
    assert len(sent) == 6, sent  # select + reset, BEGIN, the lease check, UPDATE, COMMIT + reset
    assert sent[2] == "BEGIN" and "FOR SHARE" in sent[3] and sent[5].startswith("COMMIT;")
    assert await stream_count(nats_server.url, "INTEGRATION_EVT") == 3


async def test_a_wake_past_half_the_lease_renews_it_and_gauges_the_backlog(
    logged: tuple[Database, Statements], db: Database, nats_server: EmbeddedNats
) -> None:
    """A wake-up more than half a lease after the last renewal renews the lease (and gauges
    the backlog) before it publishes, as the beat does; a pod that never held it does too."""
    relay_db, statements = logged
    async with engine_nats(nats_server) as conn:
        relay = _relay(relay_db, conn, timedelta(milliseconds=400))
        await commit_events(db, [event("c1")])
        first = await relay.wake()  # never acquired: a full step
        assert first.published == 1 and any("leader_slot AS s" in s for s in statements.take())
        await wait_until(lambda: _stale(relay), timeout=5, what="half the lease to pass")
        await commit_events(db, [event("c2")])
        second = await relay.wake()
        sent = statements.take()
    assert second.published == 1
    assert any("leader_slot AS s" in s for s in sent) and any("count(*)" in s for s in sent)


def _stale(relay: OutboxRelay) -> bool:
    return not relay._lease_fresh()


async def test_a_wake_after_a_takeover_marks_nothing(db: Database, nats_server: EmbeddedNats) -> None:
    """A relay that wakes while it still believes its lease fresh, after another pod took
    the slot over, fails its fenced mark: the rows stay PENDING for the new leader, which
    publishes them (JetStream deduplicates what the old one sent)."""
    async with engine_nats(nats_server) as conn:
        old = _relay(db, conn, timedelta(seconds=30))
        assert (await old.step()).skipped is None
        # The slot expires under it (as if this pod froze past its lease) and pod-b takes over.
        await db.pool.execute(
            "UPDATE service_engine.leader_slot SET expires_at = clock_timestamp() WHERE slot = $1",
            OUTBOX_SLOT,
        )
        successor = relay_for(db, conn, holder="pod-b")
        assert (await successor.step()).skipped is None
        await commit_events(db, [event("c1"), event("c2")])
        late = await old.wake()
        assert late.halted == "lease lost" and late.published == 0
        assert await statuses(db) == {"PENDING": 2}
        assert (await successor.wake()).published == 2
    assert await stream_count(nats_server.url, "INTEGRATION_EVT") == 2
