"""The engine's facade against a real Postgres and a spawned nats-server:
``Engine.seal`` seals a lane-A key outside any mutation, and the outbox
relay's hygiene sweep runs at the period `EngineConfig` carries."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from service_engine import Database, Engine, EngineConfig
from service_engine.embedded import EmbeddedNats
from service_engine.errors import AlreadySealed, KeySealed, SealHashMismatch

from ..support.accumulator_support import (
    chunk_rows,
    hash_of,
    lane_pod,
    provision,
    seal_row,
    text_accumulator,
)
from ..support.harness import assert_never, engine_running, fast_engine_config, wait_until
from ..support.nats_support import engine_nats

BOUND = 10.0


async def test_engine_seal_seals_a_key_through_the_facade(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """``Engine.seal(accumulator, key, last_seq, hash)`` on a running engine
    (by declaration or by name) returns the fold, writes the marker at
    ``last_seq + 1`` and refuses every later chunk; a wrong hash writes
    nothing, and a second seal is AlreadySealed."""
    assert callable(Engine.seal)
    await provision(nats_server)
    acc = text_accumulator()
    async with lane_pod(db, nats_server, [acc]) as pod:
        engine = pod.engine
        for seq, chunk in enumerate(("a", "b", "c")):
            await engine.push_chunk(acc, "r", seq, chunk.encode())
        with pytest.raises(SealHashMismatch):
            await engine.seal(acc, "r", 2, hash_of("a", "b", "x"))
        assert await seal_row(db, "r") is None
        assert len(await chunk_rows(db, "r")) == 3

        assert await engine.seal(acc.name, "r", 2, hash_of("a", "b", "c")) == "abc"
        marker = await seal_row(db, "r")
        assert (marker["high_water"], marker["gesture"]) == (3, "seal")
        with pytest.raises(KeySealed):
            await engine.push_chunk(acc, "r", 3, b"d")
        with pytest.raises(AlreadySealed):
            await engine.seal(acc, "r", 2, hash_of("a", "b", "c"))


def test_the_sweep_period_is_configured() -> None:
    """``EngineConfig.outbox_sweep_every`` is the hygiene sweep's period:
    sixty seconds unless configured, read from the environment in seconds,
    and refused when not positive."""
    assert EngineConfig().outbox_sweep_every == timedelta(seconds=60)
    env = {"SERVICE_ENGINE_OUTBOX_SWEEP_EVERY": "0.5"}
    assert EngineConfig.from_env(env).outbox_sweep_every == timedelta(seconds=0.5)
    with pytest.raises(ValueError, match="outbox_sweep_every > 0"):
        EngineConfig(outbox_sweep_every=timedelta(0))


async def _published_rows(db: Database) -> int:
    count = await db.pool.fetchval(
        "SELECT count(*) FROM service_engine.integration_outbox WHERE status = 'PUBLISHED'"
    )
    return int(count)


async def _stage_published(db: Database) -> None:
    await db.pool.execute(
        "INSERT INTO service_engine.integration_outbox"
        " (message_id, subject, payload, status, published_at)"
        " VALUES ($1, 'integration.evt.sample.x.y', '{}'::jsonb, 'PUBLISHED', now())",
        uuid.uuid4(),
    )


async def test_the_running_relay_sweeps_at_the_configured_period(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A running engine's relay deletes PUBLISHED rows at the configured
    sweep period: a row published after the leader's first sweep (which
    removed a row staged before boot) is gone within a few short periods,
    and stays under the default period of a minute."""
    async with engine_nats(nats_server) as conn:
        quick = fast_engine_config(
            "sample", lock_timeout=timedelta(seconds=1),
            outbox_sweep_every=timedelta(milliseconds=300),
        )
        await _stage_published(db)
        async with engine_running(quick, db, nats=conn) as engine:
            assert engine.integration.outbox is not None
            assert engine.integration.outbox.bounds.sweep_every == timedelta(milliseconds=300)
            await wait_until(lambda: _none_published(db), timeout=BOUND, what="the first sweep")
            await _stage_published(db)
            await wait_until(lambda: _none_published(db), timeout=BOUND, what="a later sweep")
    async with engine_nats(nats_server) as conn:
        await _stage_published(db)
        async with engine_running(
            fast_engine_config("sample", lock_timeout=timedelta(seconds=1)), db, nats=conn
        ) as engine:
            assert engine.integration.outbox is not None
            assert engine.integration.outbox.bounds.sweep_every == timedelta(seconds=60)
            await wait_until(lambda: _none_published(db), timeout=BOUND, what="the first sweep")
            await _stage_published(db)
            await assert_never(lambda: _none_published(db), within=1.5, what="a second sweep")


async def _none_published(db: Database) -> bool:
    return await _published_rows(db) == 0
