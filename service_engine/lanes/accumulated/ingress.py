"""Lane A ingress: the pod's ephemeral consumer on ``STREAMING_{service}``.

Boot binds the gitops-declared stream (`bind_lane_stream`: absent, it fails
loud with `LaneStreamMissing`; its max_age not covered by
``seal_retention``, with `SealRetentionTooShort`). Each pod then runs one
ephemeral consumer (deliver-all, explicit ack) over ``stream.{service}.>``
and submits every ``(key, seq, chunk)`` frame to the same flush as
`Engine.push_chunk`; a frame is acked once its chunk is durable, or refused
for good (a sealed key: dropped on every pod; a conflicting resubmit; a
frame that is no lane frame), and nak'ed when Postgres failed.

`IngressSupervisor` restarts the consumer with a bounded, doubling backoff
and, past ``inbound_failure_threshold`` consecutive failures, holds
readiness DOWN (`REASON_LANE_INGRESS`,
``service_engine_dependency_up{dependency="streaming"}`` = 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ...config import EngineConfig
from ...db.errors import DatabaseError
from ...failures import ConfigError, ShuttingDown
from ...messaging.nats import Nats, StreamMissing
from ...metrics import Metrics
from ...readiness import ReadinessHandle
from ...supervisor import Restarting
from .chunks import parse_frame, stream_name, stream_subject
from .errors import (
    ChunkConflict,
    KeySealed,
    LaneStreamMissing,
    SealRetentionTooShort,
)
from .runtime import Accumulators

__all__ = [
    "DEPENDENCY",
    "REASON_LANE_INGRESS",
    "IngressSupervisor",
    "LaneIngress",
    "bind_lane_stream",
]

_log = logging.getLogger(__name__)

DEPENDENCY = "streaming"
REASON_LANE_INGRESS = "lane_ingress_stopped"
FETCH_BATCH = 256
FETCH_TIMEOUT = 1.0
INACTIVE_THRESHOLD = 30.0
"""Seconds an ephemeral consumer outlives its pod (the server deletes it then)."""
_NAK_DELAY = 0.2


async def bind_lane_stream(nats: Nats, service: str, seal_retention: timedelta) -> timedelta:
    """Bind ``STREAMING_{service}`` and check ``seal_retention`` covers its
    max_age; answers the max_age."""
    name = stream_name(service)
    try:
        max_age = await nats.stream_max_age(name)
    except StreamMissing as exc:
        raise LaneStreamMissing(name) from exc
    if max_age is None:
        raise SealRetentionTooShort(
            f"stream {name} keeps messages forever: give it a max_age of at most "
            f"seal_retention ({seal_retention.total_seconds():g}s), so a seal marker outlives it"
        )
    if seal_retention < max_age:
        raise SealRetentionTooShort(
            f"seal_retention ({seal_retention.total_seconds():g}s) is below stream {name}'s "
            f"max_age ({max_age.total_seconds():g}s): a sealed key's chunks could be "
            "redelivered after its marker is swept"
        )
    return max_age


class LaneIngress:
    """One ephemeral consumer folding the stream's frames into Postgres."""

    def __init__(self, lanes: Accumulators, nats: Nats, config: EngineConfig) -> None:
        assert config.service is not None
        self.lanes = lanes
        self.nats = nats
        self.config = config
        self.service = config.service
        self.frames = 0
        self.dropped = 0

    async def run(self, healthy: Callable[[], None]) -> None:
        """Consume until cancelled; raises when the consumer is lost."""
        js = self.nats.js
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.config.ack_wait.total_seconds(),
            max_ack_pending=self.config.max_ack_pending,
            inactive_threshold=INACTIVE_THRESHOLD,
        )
        try:
            sub = await js.pull_subscribe(
                stream_subject(self.service), stream=stream_name(self.service), config=config
            )
        except nats.js.errors.NotFoundError as exc:
            raise LaneStreamMissing(stream_name(self.service)) from exc
        # Frames are folded while the next batch is pulled, up to
        # max_ack_pending in hand, so the flush writes large batches.
        in_hand: set[asyncio.Task[None]] = set()
        limit = self.config.max_ack_pending
        # Pull again once half a batch is free, not slot by slot.
        low_water = max(1, min(FETCH_BATCH, limit) // 2)
        try:
            while True:
                for failed in [t for t in in_hand if t.done()]:
                    in_hand.discard(failed)
                    failed.result()  # an unexpected failure restarts the consumer
                if limit - len(in_hand) < low_water:
                    await asyncio.wait(in_hand, return_when=asyncio.FIRST_COMPLETED)
                    continue
                try:
                    msgs = await sub.fetch(min(FETCH_BATCH, limit - len(in_hand)),
                                           timeout=FETCH_TIMEOUT)
                except TimeoutError:
                    healthy()
                    continue
                healthy()
                for msg in msgs:
                    task = asyncio.create_task(self._fold(msg))
                    in_hand.add(task)
                    task.add_done_callback(_forget(in_hand))
        finally:
            # Pulled and not finished: each task naks its frame as it is cancelled.
            for task in in_hand:
                task.cancel()
            await asyncio.gather(*in_hand, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            # Best effort: the server deletes it past INACTIVE_THRESHOLD anyway.
            with contextlib.suppress(Exception):
                info = await asyncio.wait_for(sub.consumer_info(), 1)
                await asyncio.wait_for(
                    js.delete_consumer(stream_name(self.service), info.name), 1
                )

    async def _fold(self, msg: Msg) -> None:
        try:
            frame = parse_frame(self.service, msg.subject, msg.headers, msg.data)
            accumulator = self.lanes.resolve(frame.accumulator)
        except ConfigError as exc:
            _log.warning("lane frame on %s refused: %s", msg.subject, exc)
            self.dropped += 1
            await _settle(msg.term())
            return
        try:
            await self.lanes.flusher.submit(accumulator.name, frame.key, frame.seq, frame.chunk)
        except KeySealed:
            self.dropped += 1  # the key is sealed: every pod drops it
        except ChunkConflict as exc:
            _log.warning("lane frame refused: %s", exc)
            self.dropped += 1
        except (DatabaseError, ShuttingDown):
            await _settle(msg.nak(delay=_NAK_DELAY))  # not durable: redeliver
            return
        except asyncio.CancelledError:
            await _settle(msg.nak())  # pulled, not finished: to a live pod
            raise
        self.frames += 1
        await _settle(msg.ack())


def _forget(in_hand: set[asyncio.Task[None]]) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            return  # kept, so the pull loop sees the failure
        in_hand.discard(task)

    return done


async def _settle(call: Any) -> None:
    with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
        await call


class IngressSupervisor(Restarting):
    """Keeps one `LaneIngress` running with a bounded backoff; holds
    readiness DOWN past ``threshold`` consecutive failures."""

    what = "lane ingress"
    returned = "the consumer returned"

    def __init__(
        self,
        ingress: LaneIngress,
        readiness: ReadinessHandle,
        metrics: Metrics | None,
        *,
        threshold: int,
        backoff: timedelta,
        backoff_cap: timedelta,
    ) -> None:
        super().__init__(threshold=threshold, backoff=backoff, backoff_cap=backoff_cap)
        self.ingress = ingress
        self.readiness = readiness
        self.metrics = metrics
        self._gauge(True)

    def _gauge(self, up: bool) -> None:
        if self.metrics is not None:
            self.metrics.set_dependency(DEPENDENCY, up)

    async def attempt(self, healthy: Callable[[], None]) -> None:
        await self.ingress.run(healthy)

    def recovered(self) -> None:
        self.readiness.clear(REASON_LANE_INGRESS)
        self._gauge(True)

    def stopped(self, detail: str) -> None:
        self.readiness.set_down(REASON_LANE_INGRESS, detail)
        self._gauge(False)
