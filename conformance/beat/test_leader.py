"""Fenced leases over leader_slot: one holder at a time, takeover only after
expiry by the database clock, a frozen holder's fenced writes fail."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from service_engine import Database
from service_engine.beat.leader import LeaderLease, LeaseLost

from ..support.harness import wait_until

LONG = timedelta(seconds=30)
SHORT = timedelta(milliseconds=300)


async def fenced_write(db: Database, lease: LeaderLease, value: str) -> None:
    async with db.pool.acquire() as conn, conn.transaction():
        await lease.assert_lease(conn)
        await conn.execute(
            """INSERT INTO service_engine.leader_slot (slot, holder, expires_at)
               VALUES ('audit:' || $1, $1, now())""",
            value,
        )


async def audit(db: Database) -> list[str]:
    rows = await db.pool.fetch(
        "SELECT holder FROM service_engine.leader_slot WHERE slot LIKE 'audit:%' ORDER BY holder"
    )
    return [r["holder"] for r in rows]


async def test_only_one_of_two_holders_holds(db: Database) -> None:
    """Of two pods racing for one slot exactly one holds it; renewals keep its fence, the
    loser keeps losing and its fenced write fails."""
    a = LeaderLease(db, "relay", "pod-a", LONG)
    b = LeaderLease(db, "relay", "pod-b", LONG)
    results = await asyncio.gather(a.acquire(), b.acquire())
    held = [r for r in results if r is not None]
    assert len(held) == 1
    winner = a if results[0] is not None else b
    loser = b if winner is a else a
    # renewals keep the holder and its fence; the other keeps losing
    first = winner.current
    assert first is not None and first.fence == 1
    renewed = await winner.acquire()
    assert renewed is not None and renewed.fence == first.fence
    assert renewed.expires_at >= first.expires_at
    assert await loser.acquire() is None
    with pytest.raises(LeaseLost):
        await fenced_write(db, loser, "loser")
    await fenced_write(db, winner, "winner")
    assert await audit(db) == ["winner"]


async def test_takeover_only_after_expiry_bumps_the_fence(db: Database) -> None:
    """A takeover happens only after expiry and bumps the fence; the frozen former holder's
    fenced write fails and it cannot renew."""
    a = LeaderLease(db, "relay", "pod-a", SHORT)
    b = LeaderLease(db, "relay", "pod-b", SHORT)
    held = await a.acquire()
    assert held is not None
    assert await b.acquire() is None, "taken over before the lease expired"
    await wait_until(lambda: _acquired(b), timeout=5, what="takeover after expiry")
    assert b.current is not None and b.current.fence == held.fence + 1
    # pod-a, frozen past its lease, wakes up: its fenced write fails and it
    # cannot renew over the new holder
    with pytest.raises(LeaseLost):
        await fenced_write(db, a, "stale")
    assert await a.acquire() is None
    await fenced_write(db, b, "fresh")
    assert await audit(db) == ["fresh"]


async def test_an_expired_holder_fails_its_writes_even_before_a_takeover(db: Database) -> None:
    """A holder past its lease fails its fenced writes even before anyone takes over."""
    a = LeaderLease(db, "relay", "pod-a", SHORT)
    assert await a.acquire() is not None
    await fenced_write(db, a, "in-time")

    async def expired() -> bool:
        try:
            await fenced_write(db, a, "late")
        except LeaseLost:
            return True
        await db.pool.execute("DELETE FROM service_engine.leader_slot WHERE slot = 'audit:late'")
        return False

    await wait_until(expired, timeout=5, what="the lease to expire")
    assert await audit(db) == ["in-time"]


async def test_a_takeover_waits_for_the_holders_fenced_transaction(db: Database) -> None:
    """The fenced transaction locks the slot: a takeover racing it lands
    after its commit, never in the middle of it."""
    a = LeaderLease(db, "relay", "pod-a", SHORT)
    b = LeaderLease(db, "relay", "pod-b", SHORT)
    assert await a.acquire() is not None
    async with db.pool.acquire() as conn, conn.transaction():
        await a.assert_lease(conn)
        await wait_until(lambda: _expired(db, "relay"), timeout=5, what="the lease to expire mid-transaction")
        takeover = asyncio.create_task(b.acquire())
        done, _ = await asyncio.wait({takeover}, timeout=0.2)
        assert not done, "the takeover did not wait for the fenced transaction"
        await conn.execute(
            "INSERT INTO service_engine.leader_slot (slot, holder, expires_at) VALUES ('audit:a', 'a', now())"
        )
    assert await asyncio.wait_for(takeover, 5) is not None
    assert await audit(db) == ["a"]


async def test_release_lets_another_pod_take_over_at_once(db: Database) -> None:
    """A released lease is taken by another pod at once, on the next fence."""
    a = LeaderLease(db, "relay", "pod-a", LONG)
    b = LeaderLease(db, "relay", "pod-b", LONG)
    assert await a.acquire() is not None
    await a.release()
    taken = await b.acquire()
    assert taken is not None and taken.fence == 2
    assert a.current is None


async def _acquired(lease: LeaderLease) -> bool:
    return await lease.acquire() is not None


async def _expired(db: Database, slot: str) -> bool:
    """The slot's lease is past its expiry by the database clock."""
    return bool(await db.pool.fetchval(
        "SELECT expires_at <= clock_timestamp() FROM service_engine.leader_slot WHERE slot = $1", slot
    ))
