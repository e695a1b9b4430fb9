"""Shared fixtures of the lane A scenarios: a text accumulator, a pod that
registers it over a real Postgres and a spawned nats-server, an
out-of-process-style producer publishing frames over raw nats-py, and the
seal gestures run through the real write pipeline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import nats

from service_engine import Database, Engine, EngineConfig, ReadinessHandle
from service_engine.embedded import EmbeddedNats, provision_lane_stream
from service_engine.lanes.accumulated.accumulator import Accumulator, Cancelled
from service_engine.lanes.accumulated.chunks import ChunkFrame, encode_frame, seal_hash
from service_engine.messaging.nats import open_nats
from service_engine.pipeline import Mutation

from .harness import fast_engine_config, wait_until

SERVICE = "lanes"
STREAM = f"STREAMING_{SERVICE}"


def text_accumulator(name: str = "text") -> Accumulator[str]:
    """A fresh declaration per test: the chunks' text, concatenated."""
    return Accumulator(name, initial=lambda: "", fold=lambda text, chunk: text + chunk.decode())


def lane_config(**overrides: Any) -> EngineConfig:
    service = overrides.pop("service", SERVICE)
    values: dict[str, Any] = {"lock_timeout": timedelta(milliseconds=500)}
    values.update(overrides)
    return fast_engine_config(service, **values)


def hash_of(*chunks: str) -> str:
    return seal_hash(chunk.encode() for chunk in chunks)


@dataclass
class LanePod:
    engine: Engine
    readiness: ReadinessHandle
    task: asyncio.Task[None] | None

    async def seal(self, accumulator: Accumulator[str], key: str, last_seq: int, hash: str) -> str:
        async def handler(cx: Mutation[str]) -> str:
            return await cx.seal(accumulator, key, last_seq, hash)

        result: str = await self._run(handler)
        return result

    async def seal_partial(self, accumulator: Accumulator[str], key: str, last_seq: int) -> str:
        return (await self.cancel_partial(accumulator, key, last_seq)).state

    async def seal_current(self, accumulator: Accumulator[str], key: str) -> str:
        return (await self.cancel_current(accumulator, key)).state

    async def cancel_partial(
        self, accumulator: Accumulator[str], key: str, last_seq: int
    ) -> Cancelled[str]:
        async def handler(cx: Mutation[str]) -> Cancelled[str]:
            return await cx.seal_partial(accumulator, key, last_seq)

        result: Cancelled[str] = await self._run(handler)
        return result

    async def cancel_current(self, accumulator: Accumulator[str], key: str) -> Cancelled[str]:
        async def handler(cx: Mutation[str]) -> Cancelled[str]:
            return await cx.seal_current(accumulator, key)

        result: Cancelled[str] = await self._run(handler)
        return result

    async def _run(self, handler: Any) -> Any:
        # Run the handler in the real pipeline and raise its seal refusal
        # as itself (the executor would answer it as a MutationError).
        from service_engine.clock import SystemClock
        from service_engine.pipeline.run import run_pipeline

        engine = self.engine
        result: Any = await run_pipeline(
            engine.db, engine.config,
            lambda conn, now: Mutation(conn, engine.config, now, "tester"),
            handler, clock=SystemClock(), metrics=engine.metrics,
        )
        return result


@contextlib.asynccontextmanager
async def lane_pod(
    db: Database,
    server: EmbeddedNats,
    accumulators: Iterable[Accumulator[Any]],
    *,
    config: EngineConfig | None = None,
    run: bool = True,
) -> AsyncIterator[LanePod]:
    """One pod with its own NATS connection, the accumulators registered,
    running (and UP) unless ``run`` is False."""
    conn = await open_nats(server.url, publish_ack_timeout=timedelta(seconds=1), ping_interval=1)
    try:
        readiness = ReadinessHandle()
        engine = await Engine.boot(config or lane_config(), db, conn, readiness)
        for accumulator in accumulators:
            engine.register_accumulator(accumulator)
        task: asyncio.Task[None] | None = None
        if run:
            task = asyncio.create_task(engine.run())
            await wait_until(lambda: readiness.is_up or task.done(), what="the pod UP")
            if task.done():
                task.result()
        try:
            yield LanePod(engine, readiness, task)
        finally:
            engine.shutdown()
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 10)
    finally:
        await conn.aclose()


async def provision(server: EmbeddedNats, max_age: timedelta | None = timedelta(hours=1)) -> None:
    await provision_lane_stream(server.url, SERVICE, max_age=max_age)


class Producer:
    """A separate producer: its own raw nats-py connection publishing frames."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.js = client.jetstream()

    async def send(self, key: str, seq: int, chunk: str, accumulator: str | None = None) -> None:
        from service_engine.lanes.accumulated.chunks import ChunkSeq

        subject, headers, payload = encode_frame(
            SERVICE, ChunkFrame(key, ChunkSeq(seq), chunk.encode(), accumulator)
        )
        await self.js.publish(subject, payload, headers=headers)

    async def subject_count(self, key: str) -> int:
        info = await self.js.stream_info(STREAM, subjects_filter=f"stream.{SERVICE}.{key}")
        return sum((info.state.subjects or {}).values())


@contextlib.asynccontextmanager
async def producer(server: EmbeddedNats) -> AsyncIterator[Producer]:
    client = await nats.connect(server.url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        yield Producer(client)
    finally:
        await client.close()


async def chunk_rows(db: Database, key: str) -> list[tuple[int, bytes]]:
    rows = await db.pool.fetch(
        "SELECT seq, chunk FROM service_engine.accumulator_chunk WHERE key = $1 ORDER BY seq", key
    )
    return [(int(r["seq"]), bytes(r["chunk"])) for r in rows]


async def seal_row(db: Database, key: str) -> Any:
    return await db.pool.fetchrow(
        "SELECT * FROM service_engine.accumulator_seal WHERE key = $1", key
    )
