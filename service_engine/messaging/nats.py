"""The engine's own NATS connection over nats-py.

Bind-only: the engine never creates a stream or bucket it depends on; an
absent one fails loud with its name.

Every JetStream publish goes through `Nats.publish`, bounded by the publish
ack timeout, and ends in one `PublishOutcome` value; `classify_publish_failure`
is the one place a failed publish is judged *Unanswered* (the broker could
not answer: wait, spend nothing) or *Rejected* (the broker refused this
message: count an attempt). nats-py exceptions never leave this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from ..failures import ConfigError, EngineError
from ..resources import AsyncResource

_log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PUBLISH_ACK_TIMEOUT = timedelta(seconds=2)
"""`EngineConfig.publish_ack_timeout`'s default, for a `Nats` built without one."""


_V1_ACK_TOKENS = 9
"""``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``."""
_V2_ACK_TOKENS = 11
"""``$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]``."""


def delivery_of(reply: str | None) -> tuple[int, datetime] | None:
    """(times delivered, when the stream stored it) of a JetStream frame,
    read from its ack subject ``reply``; None when ``reply`` is not one.

    The fields nats-py's ``Msg.metadata`` reads, by its rules (the v1 and v2
    ack subject layouts), without building its metadata objects for every
    frame."""
    if not reply:
        return None
    tokens = reply.split(".")
    count = len(tokens)
    if count == _V1_ACK_TOKENS:
        delivered, stamp = tokens[4], tokens[7]
    elif count >= _V2_ACK_TOKENS:
        delivered, stamp = tokens[6], tokens[9]
    else:
        return None
    if tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    try:
        return int(delivered), datetime.fromtimestamp(int(stamp) / 1_000_000_000.0, UTC)
    except (ValueError, OverflowError, OSError):
        return None


class NatsUnavailable(EngineError):
    """The NATS server could not be reached or did not answer in time."""


class StreamMissing(EngineError):
    """A gitops-declared stream the engine binds does not exist."""

    def __init__(self, stream: str) -> None:
        super().__init__(
            f"JetStream stream {stream!r} is not declared (the engine never creates it)"
        )
        self.stream = stream


class BucketMissing(EngineError):
    """A gitops-declared key-value bucket the engine binds does not exist."""

    def __init__(self, bucket: str) -> None:
        super().__init__(
            f"JetStream key-value bucket {bucket!r} is not declared "
            "(the engine never creates it)"
        )
        self.bucket = bucket


class KvConflict(EngineError):
    """A compare-and-set lost: the key exists (create) or moved past the
    revision the caller observed (update). Re-read and decide again."""

    def __init__(self, bucket: str, key: str, detail: str) -> None:
        super().__init__(f"key {key!r} in bucket {bucket!r}: {detail}")
        self.bucket = bucket
        self.key = key


# -- publish outcomes ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acked:
    """JetStream stored the message at ``seq`` of ``stream``."""

    stream: str
    seq: int


@dataclass(frozen=True, slots=True)
class Duplicate:
    """JetStream already held a message with this ``Nats-Msg-Id``: it is
    published (treat exactly like `Acked`)."""

    stream: str
    seq: int


@dataclass(frozen=True, slots=True)
class Unanswered:
    """The broker did not answer: not connected, a timeout, a broken pipe,
    no responders, or JetStream unavailable.

    An outage, not a verdict on the message: spend no attempt, stop the
    pass and let the message wait. It may even have been stored; the
    ``Nats-Msg-Id`` deduplicates the republish.
    """

    detail: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """The broker refused this message (a size or limit refusal, a wrong
    expected sequence). Count a bounded attempt; at the bound, dead-letter it.

    ``err_code`` is JetStream's error code when it gave one (10054 message
    too large, 10071 wrong last sequence, ...).
    """

    detail: str
    err_code: int | None = None


PublishOutcome: TypeAlias = Acked | Duplicate | Unanswered | Rejected
"""What one JetStream publish came to; a publishing loop branches on it."""

_REJECTED_TYPES: tuple[type[BaseException], ...] = (
    nats.errors.MaxPayloadError,
    nats.errors.BadSubjectError,
    nats.errors.BadHeaderError,
)


def classify_publish_failure(exc: BaseException) -> Unanswered | Rejected:
    """Judge a failed JetStream publish: the broker could not answer, or it
    refused the message.

    The one shared place this is decided. A timeout, a broken pipe, no
    responders (no stream captures the subject, or JetStream is off) and a
    5xx JetStream answer are `Unanswered`; a 4xx JetStream answer and a
    client-side size or subject refusal are `Rejected`. An unknown nats-py
    error is `Unanswered`: waiting never loses a committed row, while a
    wrong `Rejected` would spend its budget.
    """
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, nats.js.errors.APIError):
        code = exc.code or 0
        if 400 <= code < 500:
            return Rejected(detail, exc.err_code)
        return Unanswered(detail)
    if isinstance(exc, _REJECTED_TYPES):
        return Rejected(detail)
    # A timeout (nats-py's or ours), no responders, a broken pipe, a closed,
    # reconnecting or draining connection, an unreadable ack: the broker
    # said nothing about this message.
    return Unanswered(detail)


def _timeout_seconds(value: timedelta | float) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds <= 0:
        raise ConfigError("publish_ack_timeout must be positive")
    return seconds


def _honour_cancellation() -> None:
    # On Python 3.11 asyncio.wait_for (which nats-py uses inside every
    # request) swallows a cancellation that races the reply. The request
    # cancel stays counted on the task: raise it, or a loop being shut down
    # would run on forever.
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _bounded(awaitable: Awaitable[T], seconds: float) -> T:
    """Await within ``seconds`` (`TimeoutError` past it), honouring a
    cancellation nats-py may have swallowed."""
    async with asyncio.timeout(seconds):
        result = await awaitable
    _honour_cancellation()
    return result


# -- key-value ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One key's current value and the revision to compare-and-set against."""

    key: str
    value: bytes
    revision: int


class KvBucket:
    """A bound, gitops-declared JetStream key-value bucket.

    Obtain one with `Nats.bind_bucket`. Transport failures raise
    `NatsUnavailable`; a lost compare-and-set raises `KvConflict`.
    """

    def __init__(self, name: str, kv: Any, timeout: float, js: Any = None) -> None:
        self.name = name
        self._kv = kv
        self._timeout = timeout
        self._js = js

    def key(self, key: str) -> KvKey:
        """A handle on one key of this bucket."""
        return KvKey(self, key)

    async def get(self, key: str) -> KvEntry | None:
        """The key's current entry, or None when absent or deleted."""
        try:
            entry = await _bounded(self._kv.get(key), self._timeout)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except Exception as exc:
            raise self._failure("get", key, exc) from exc
        return KvEntry(key, bytes(entry.value or b""), int(entry.revision))

    async def put(self, key: str, value: bytes) -> int:
        """Write unconditionally; returns the new revision."""
        try:
            revision = await _bounded(self._kv.put(key, value), self._timeout)
        except Exception as exc:
            raise self._failure("put", key, exc) from exc
        return int(revision)

    async def create(self, key: str, value: bytes) -> int:
        """Write only if the key is absent; returns the new revision.

        Raises `KvConflict` when the key already holds a value.
        """
        try:
            revision = await _bounded(self._kv.create(key, value), self._timeout)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KvConflict(self.name, key, "already exists") from exc
        except Exception as exc:
            raise self._failure("create", key, exc) from exc
        return int(revision)

    async def update(self, key: str, value: bytes, *, last: int) -> int:
        """Write only if the key is still at revision ``last``; returns the
        new revision. Raises `KvConflict` when it moved."""
        try:
            revision = await _bounded(self._kv.update(key, value, last=last), self._timeout)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KvConflict(self.name, key, f"not at revision {last}") from exc
        except Exception as exc:
            raise self._failure("update", key, exc) from exc
        return int(revision)

    async def delete(self, key: str, *, last: int | None = None) -> None:
        """Delete the key (a tombstone its watchers see); with ``last``, only
        while it is still at that revision (`KvConflict` when it moved)."""
        try:
            await _bounded(self._kv.delete(key, last=last), self._timeout)
        except nats.js.errors.APIError as exc:
            if exc.err_code == _WRONG_LAST_SEQUENCE:
                raise KvConflict(self.name, key, f"not at revision {last}") from exc
            raise self._failure("delete", key, exc) from exc
        except Exception as exc:
            raise self._failure("delete", key, exc) from exc

    # -- reading the bucket's stream (nats-py has no watch-from-revision) --

    @property
    def stream(self) -> str:
        return f"KV_{self.name}"

    def _subject(self, prefix: str) -> str:
        return f"$KV.{self.name}.{prefix}.>" if prefix else f"$KV.{self.name}.>"

    def _change(self, msg: Any) -> KvChange:
        key = str(msg.subject).removeprefix(f"$KV.{self.name}.")
        op = (msg.headers or {}).get("KV-Operation")
        value = None if op in ("DEL", "PURGE") else bytes(msg.data or b"")
        return KvChange(key, int(msg.metadata.sequence.stream), value)

    async def last_revision(self) -> int:
        """The bucket's current revision (its stream's last sequence)."""
        try:
            info = await _bounded(self._js.stream_info(self.stream), self._timeout)
        except nats.js.errors.NotFoundError as exc:
            raise BucketMissing(self.name) from exc
        except Exception as exc:
            raise self._failure("stream_info", "", exc) from exc
        return int(info.state.last_seq or 0)

    async def read_prefix(self, prefix: str) -> tuple[dict[str, KvEntry], int]:
        """Every live key under ``prefix`` (``prefix.>``) with its revision,
        and the highest revision the read saw under the prefix (deletes
        included; 0 when none): a watch from that revision plus one misses
        nothing."""
        reached = 0
        entries: dict[str, KvEntry] = {}
        try:
            sub = await _bounded(
                self._js.subscribe(
                    self._subject(prefix), stream=self.stream, ordered_consumer=True,
                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                ),
                self._timeout,
            )
        except Exception as exc:
            raise self._failure("read", prefix, exc) from exc
        try:
            info = await _bounded(sub.consumer_info(), self._timeout)
            remaining = int(info.num_pending or 0) + int(info.delivered.consumer_seq or 0)
            while remaining > 0:
                msg = await sub.next_msg(timeout=self._timeout)
                change = self._change(msg)
                reached = max(reached, change.revision)
                if change.value is None:
                    entries.pop(change.key, None)
                else:
                    entries[change.key] = KvEntry(change.key, change.value, change.revision)
                remaining = int(msg.metadata.num_pending or 0)
        except Exception as exc:
            raise self._failure("read", prefix, exc) from exc
        finally:
            with contextlib.suppress(Exception):
                await _bounded(sub.unsubscribe(), self._timeout)
        return entries, reached

    async def watch_prefix(self, prefix: str, from_revision: int) -> KvWatch:
        """Every change under ``prefix`` from revision ``from_revision`` on
        (an ordered consumer on the bucket's stream from that sequence)."""
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, from_revision)
        )
        try:
            sub = await _bounded(
                self._js.subscribe(
                    self._subject(prefix), stream=self.stream, ordered_consumer=True,
                    config=config,
                ),
                self._timeout,
            )
        except Exception as exc:
            raise self._failure("watch", prefix, exc) from exc
        return KvWatch(self, sub)

    def _failure(self, op: str, key: str, exc: BaseException) -> EngineError:
        if isinstance(exc, nats.js.errors.KeyWrongLastSequenceError):
            return KvConflict(self.name, key, str(exc))
        return NatsUnavailable(f"kv {op} {self.name}/{key} failed: {type(exc).__name__}: {exc}")


_WRONG_LAST_SEQUENCE = 10071


@dataclass(frozen=True, slots=True)
class KvChange:
    """One message of a bucket's stream: ``value`` None for a delete or purge."""

    key: str
    revision: int
    value: bytes | None


class KvWatch(AsyncResource):
    """The live changes of one prefix, in revision order (`KvBucket.watch_prefix`)."""

    def __init__(self, bucket: KvBucket, sub: Any) -> None:
        self._bucket = bucket
        self._sub = sub

    async def next(self, within: float) -> KvChange | None:
        """The next change, or None when none arrived within ``within`` seconds."""
        try:
            msg = await self._sub.next_msg(timeout=within)
        except nats.errors.TimeoutError:
            _honour_cancellation()
            return None
        except Exception as exc:
            raise self._bucket._failure("watch", "", exc) from exc
        return self._bucket._change(msg)

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await _bounded(self._sub.unsubscribe(), self._bucket._timeout)


@dataclass(frozen=True, slots=True)
class KvKey:
    """One key of a bound bucket."""

    bucket: KvBucket
    name: str

    async def get(self) -> KvEntry | None:
        return await self.bucket.get(self.name)

    async def put(self, value: bytes) -> int:
        return await self.bucket.put(self.name, value)

    async def create(self, value: bytes) -> int:
        return await self.bucket.create(self.name, value)

    async def update(self, value: bytes, *, last: int) -> int:
        return await self.bucket.update(self.name, value, last=last)

    async def delete(self) -> None:
        await self.bucket.delete(self.name)


# -- the connection -------------------------------------------------------------


class Nats(AsyncResource):
    """One NATS connection with JetStream, reconnecting on its own.

    Open it with `open_nats`. ``publish_ack_timeout`` bounds every publish
    (pass `EngineConfig.publish_ack_timeout`).
    """

    def __init__(
        self,
        client: Client,
        *,
        publish_ack_timeout: timedelta | float = DEFAULT_PUBLISH_ACK_TIMEOUT,
    ) -> None:
        self._client = client
        self.js: Any = client.jetstream()
        self.publish_ack_timeout = _timeout_seconds(publish_ack_timeout)

    @property
    def client(self) -> Client:
        return self._client

    def reachable(self) -> bool:
        """True while the connection is up (not reconnecting or closed).

        A loop that publishes skips its pass while this is false: it costs
        nothing and spends no attempt.
        """
        return bool(self._client.is_connected)

    async def publish(
        self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> PublishOutcome:
        """Publish to JetStream and wait at most ``publish_ack_timeout`` for
        the ack. Never raises for a broker condition: branch on the outcome.

        Set ``Nats-Msg-Id`` in ``headers`` so a republish after an
        `Unanswered` is deduplicated (it answers `Duplicate`).
        """
        if not self._client.is_connected:
            # nats-py would buffer the request until reconnect; a publish the
            # caller will retry anyway should not sit in that buffer.
            return Unanswered("not connected to NATS")
        try:
            ack = await _bounded(
                self.js.publish(
                    subject, payload, timeout=self.publish_ack_timeout,
                    headers=dict(headers) if headers else None,
                ),
                # The client's own timeout normally fires first; this bounds
                # a publish stuck before its request is even written.
                self.publish_ack_timeout + 0.5,
            )
        except (TimeoutError, nats.errors.Error, OSError, json.JSONDecodeError) as exc:
            return classify_publish_failure(exc)
        if ack.duplicate:
            return Duplicate(str(ack.stream), int(ack.seq))
        return Acked(str(ack.stream), int(ack.seq))

    async def probe_jetstream(self, within: float) -> str | None:
        """Ask JetStream for the account info within ``within`` seconds.

        Returns None when it answered, else why not (not connected, no
        answer, JetStream unavailable).
        """
        if not self._client.is_connected:
            return "not connected to NATS"
        try:
            await _bounded(self.js.account_info(), within)
        except (TimeoutError, nats.errors.Error, OSError, json.JSONDecodeError) as exc:
            return f"JetStream did not answer: {type(exc).__name__}: {exc}"
        return None

    async def bind_stream(self, name: str) -> None:
        """Fail loud with `StreamMissing` when stream ``name`` is absent."""
        await self.stream_max_age(name)

    async def stream_max_age(self, name: str) -> timedelta | None:
        """The declared ``max_age`` of stream ``name``; None when unlimited.

        Raises `StreamMissing` when the stream is absent, `NatsUnavailable`
        when JetStream does not answer.
        """
        try:
            info = await _bounded(self.js.stream_info(name), self.publish_ack_timeout)
        except nats.js.errors.NotFoundError as exc:
            raise StreamMissing(name) from exc
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise NatsUnavailable(
                f"stream_info {name} failed: {type(exc).__name__}: {exc}"
            ) from exc
        max_age = info.config.max_age
        if not max_age:
            return None
        # nats-py reports max_age in seconds (float).
        return timedelta(seconds=float(max_age))

    async def bind_bucket(self, name: str) -> KvBucket:
        """Bind the declared key-value bucket ``name``.

        Raises `BucketMissing` (naming it) when absent: the engine never
        creates a bucket.
        """
        try:
            kv = await _bounded(self.js.key_value(name), self.publish_ack_timeout)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError) as exc:
            raise BucketMissing(name) from exc
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise NatsUnavailable(
                f"binding bucket {name} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return KvBucket(name, kv, self.publish_ack_timeout, self.js)

    async def aclose(self) -> None:
        """Flush and close; a connection that is down is closed without
        waiting for it to come back."""
        client = self._client
        if client.is_closed:
            return
        try:
            if client.is_connected:
                await _bounded(client.drain(), 5)
            else:
                await client.close()
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            _log.debug("nats close: %s", exc)
            if not client.is_closed:
                await client.close()


async def open_nats(
    url: str,
    *,
    name: str = "service-engine",
    publish_ack_timeout: timedelta | float = DEFAULT_PUBLISH_ACK_TIMEOUT,
    ping_interval: float = 5.0,
) -> Nats:
    """Connect to ``url``; reconnects forever once connected.

    ``ping_interval`` bounds how long a silently dead connection (a
    partition, a frozen server) stays "connected": about two intervals.
    Raises `NatsUnavailable` when the first connect fails.
    """
    # One warning per outage, not one per reconnect attempt.
    episode = {"logged": False}

    async def on_error(exc: Exception) -> None:
        if episode["logged"]:
            _log.debug("nats: %s", exc)
        else:
            episode["logged"] = True
            _log.warning("nats: %s", exc)

    opened: list[Client] = []

    async def on_disconnected() -> None:
        if opened and (opened[0].is_closed or opened[0].is_draining):
            return  # our own aclose, not an outage
        _log.warning("nats: disconnected from %s; reconnecting", url)

    async def on_reconnected() -> None:
        episode["logged"] = False
        _log.info("nats: reconnected to %s", url)

    try:
        client = await nats.connect(
            url, name=name, connect_timeout=5, max_reconnect_attempts=-1,
            reconnect_time_wait=0.5, ping_interval=ping_interval, max_outstanding_pings=2,
            error_cb=on_error, disconnected_cb=on_disconnected, reconnected_cb=on_reconnected,
        )
    except Exception as exc:
        raise NatsUnavailable(f"cannot connect to NATS at {url}: {exc}") from exc
    opened.append(client)
    return Nats(client, publish_ack_timeout=publish_ack_timeout)
