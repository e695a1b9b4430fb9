"""The presence bucket's I/O: bind (fail-loud), write with a per-key TTL, read
the current values, watch from a revision.

nats-py's KV API has no per-key TTL on ``put`` and no watch from a revision,
so this adapter speaks to the bucket's stream ``KV_<bucket>`` directly: a
write is a JetStream publish to ``$KV.<bucket>.<key>`` carrying ``Nats-TTL``
(through `Nats.publish`, bounded by the publish ack timeout), a read is an
ordered consumer delivering the last message per subject, a watch an ordered
consumer from a start sequence. Every nats-py error is translated here:
`PresenceBucketMissing` for an absent bucket, `NatsUnavailable` otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from ...messaging.nats import Nats, NatsUnavailable, PublishOutcome, Unanswered
from ...resources import AsyncResource
from .model import (
    BucketFacts,
    PresenceBucketMissing,
    PresenceChange,
    PresenceEntry,
    classify,
    ttl_header,
)

__all__ = ["PresenceBucket", "PresenceWatch", "bind_presence_bucket"]

_DRIVER_ERRORS = (TimeoutError, nats.errors.Error, OSError, json.JSONDecodeError)


async def _bounded(awaitable: Any, seconds: float) -> Any:
    async with asyncio.timeout(seconds):
        result = await awaitable
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        # nats-py's requests can swallow a cancellation that races the reply.
        raise asyncio.CancelledError
    return result


async def bind_presence_bucket(nats_conn: Nats, name: str) -> PresenceBucket:
    """Read the declared bucket's stream config (bind-only: never creates it).

    Raises `PresenceBucketMissing` when it is absent and `NatsUnavailable`
    when JetStream does not answer; the caller checks the facts
    (`check_bucket`).
    """
    stream = f"KV_{name}"
    try:
        info = await _bounded(nats_conn.js.stream_info(stream), nats_conn.publish_ack_timeout)
    except nats.js.errors.NotFoundError as exc:
        raise PresenceBucketMissing(
            name, "the bucket is not declared (the engine never creates it)"
        ) from exc
    except _DRIVER_ERRORS as exc:
        raise NatsUnavailable(f"stream_info {stream} failed: {type(exc).__name__}: {exc}") from exc
    config = info.config
    facts = BucketFacts(
        name=name,
        max_age=float(config.max_age or 0),
        marker_ttl=float(config.subject_delete_marker_ttl or 0) or None,
        allow_msg_ttl=bool(config.allow_msg_ttl),
    )
    return PresenceBucket(nats_conn, facts)


@dataclass(frozen=True, slots=True)
class _Message:
    key: str
    revision: int
    headers: Mapping[str, str] | None
    data: bytes


class PresenceBucket:
    """A bound presence bucket (`bind_presence_bucket`)."""

    def __init__(self, nats_conn: Nats, facts: BucketFacts) -> None:
        self.nats = nats_conn
        self.facts = facts
        self.name = facts.name
        self.stream = f"KV_{facts.name}"
        self._prefix = f"$KV.{facts.name}."
        self._timeout = nats_conn.publish_ack_timeout

    # -- writes --------------------------------------------------------------------

    async def put(self, key: str, payload: bytes, ttl: timedelta) -> PublishOutcome:
        """Write ``payload`` under bucket key ``key``, expiring after ``ttl``."""
        return await self.nats.publish(
            self._prefix + key, payload, {"Nats-TTL": ttl_header(ttl)}
        )

    async def clear(self, key: str) -> PublishOutcome:
        """Delete bucket key ``key`` (a delete its watchers see)."""
        return await self.nats.publish(self._prefix + key, b"", {"KV-Operation": "DEL"})

    # -- reads ---------------------------------------------------------------------

    def _message(self, msg: Any) -> _Message:
        return _Message(
            str(msg.subject).removeprefix(self._prefix),
            int(msg.metadata.sequence.stream),
            msg.headers,
            bytes(msg.data or b""),
        )

    async def last_revision(self) -> int:
        """The bucket's current revision (its stream's last sequence)."""
        try:
            info = await _bounded(self.nats.js.stream_info(self.stream), self._timeout)
        except nats.js.errors.NotFoundError as exc:
            raise PresenceBucketMissing(self.name, "the bucket disappeared") from exc
        except _DRIVER_ERRORS as exc:
            raise NatsUnavailable(
                f"stream_info {self.stream}: {type(exc).__name__}: {exc}"
            ) from exc
        return int(info.state.last_seq or 0)

    async def snapshot(self) -> tuple[dict[str, dict[str, PresenceEntry]], int]:
        """Every present key by lane, and the revision the read reached: a
        watch from that revision plus one misses nothing."""
        reached = await self.last_revision()
        lanes: dict[str, dict[str, PresenceEntry]] = {}
        if reached == 0:
            return lanes, reached
        try:
            sub = await _bounded(
                self.nats.js.subscribe(
                    self._prefix + ">", stream=self.stream, ordered_consumer=True,
                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                ),
                self._timeout,
            )
        except _DRIVER_ERRORS as exc:
            raise NatsUnavailable(f"reading {self.stream}: {type(exc).__name__}: {exc}") from exc
        try:
            info = await _bounded(sub.consumer_info(), self._timeout)
            remaining = int(info.num_pending or 0) + int(info.delivered.consumer_seq or 0)
            while remaining > 0:
                msg = await sub.next_msg(timeout=self._timeout)
                message = self._message(msg)
                reached = max(reached, message.revision)
                change = classify(message.key, message.revision, message.headers, message.data)
                if change is not None and change.value is not None:
                    lanes.setdefault(change.lane, {})[change.key] = PresenceEntry(
                        change.key, change.value, change.revision
                    )
                remaining = int(msg.metadata.num_pending or 0)
        except _DRIVER_ERRORS as exc:
            raise NatsUnavailable(f"reading {self.stream}: {type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return lanes, reached

    async def watch(self, from_revision: int) -> PresenceWatch:
        """Every change from ``from_revision`` on, in revision order."""
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, from_revision)
        )
        try:
            sub = await _bounded(
                self.nats.js.subscribe(
                    self._prefix + ">", stream=self.stream, ordered_consumer=True, config=config,
                ),
                self._timeout,
            )
        except _DRIVER_ERRORS as exc:
            raise NatsUnavailable(f"watching {self.stream}: {type(exc).__name__}: {exc}") from exc
        return PresenceWatch(self, sub)


class PresenceWatch(AsyncResource):
    """The live changes of the bucket (`PresenceBucket.watch`)."""

    def __init__(self, bucket: PresenceBucket, sub: Any) -> None:
        self._bucket = bucket
        self._sub = sub

    async def next(self, within: float) -> PresenceChange | Unanswered | None:
        """The next change; None when none arrived within ``within`` seconds
        (or the message was not one a lane owns); `Unanswered` when the
        subscription broke (watch again)."""
        try:
            msg = await self._sub.next_msg(timeout=within)
        except nats.errors.TimeoutError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from None
            return None
        except _DRIVER_ERRORS as exc:
            return Unanswered(f"{type(exc).__name__}: {exc}")
        message = self._bucket._message(msg)
        return classify(message.key, message.revision, message.headers, message.data)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()
