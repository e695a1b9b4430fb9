"""The inbound NATS loop: one shared durable consumer per registered reaction
(declared with `inbound.declaration.InboundReaction`).

Each reaction gets one durable consumer on the gitops-declared
``INTEGRATION_CMD`` / ``INTEGRATION_EVT`` stream (bind-only: an absent
stream fails loud with its name, the engine never creates one). The engine
creates or updates the durable with a frozen contract: explicit ack,
deliver-all, instant replay, the reaction's exact filter subject,
``max_deliver`` unlimited (the budget is enforced in code), ``ack_wait`` and
``max_ack_pending`` from `EngineConfig`. Every pod binds the same durable,
so a message is owned by one pod at a time.

Per frame (`ReactionRunner`, in ``dispatch``): identify the envelope (none: one dead letter,
Term); decode the payload; run the reaction in the write pipeline under its
idempotency claim and sequence guard (`run_reaction`); commit, then ack.
A `Retry` naks with a growing, capped backoff, a `Park` with the park
delay, both until the reaction's `ReactionBudget` is spent; a `Terminal`,
an integrity or data violation (SQLSTATE class 23 / 22, on the engine's
own authority) and any other handler exception are dead-lettered and
terminated; a retryable database fault (a lock timeout, a lost connection)
naks. A dead letter that cannot be written naks instead of terminating.

`InboundConsumer` is the pull loop: one pull request at a time for as many
frames as it has free slots, answered as soon as frames exist (an idle
consumer adds no latency), expiring after `PULL_EXPIRES`. On shutdown it
naks what it pulled and did not finish. Its supervision (restarts, readiness)
is `inbound.health`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, ReplayPolicy

from ..config import EngineConfig
from ..failures import EngineError
from ..inbound.declaration import InboundReaction
from ..messaging.nats import Nats, NatsUnavailable, StreamMissing, delivery_of
from ..messaging.reactions import Ack, Nak, Settlement, Term, backoff_delay
from .dispatch import InboundFrame, ReactionRunner

__all__ = [
    "PULL_EXPIRES",
    "ConsumerBindFailed",
    "ConsumerLost",
    "InboundConsumer",
]

_log = logging.getLogger(__name__)


PULL_EXPIRES = 1.0
"""Seconds a pull request lingers on the server. Frames are handed over the
moment they exist, so this bounds only how often an idle consumer asks
again (and how soon it re-asks after a reconnect)."""
_PULL_GRACE = 1.0
"""Past expiry, how long to wait for the server's 408 before asking again."""
_PULL_PAUSE = 0.1
"""Pause after a pull the server ended with an unexpected status."""
_JS_API = "$JS.API"



class ConsumerBindFailed(EngineError):
    """JetStream refused the reaction's durable (an incompatible existing
    durable, a limit): fix the declaration or the stream; the engine never
    deletes a durable itself."""


class ConsumerLost(EngineError):
    """A bound consumer stopped answering (deleted, its stream gone): the
    supervisor restarts it."""


# -- the pull loop ---------------------------------------------------------------------


def _status(msg: Msg) -> tuple[str, str] | None:
    """A JetStream status message's (code, description); None for a frame."""
    if msg.reply:
        return None
    headers = msg.headers or {}
    return headers.get("Status", ""), headers.get("Description", "")


class InboundConsumer:
    """The pull loop of one reaction's shared durable on one pod.

    `run` binds (creating or updating the durable), then pulls and handles
    frames until cancelled; it raises when the consumer is lost or cannot
    be bound (`StreamMissing`, `ConsumerBindFailed`, `ConsumerLost`,
    `NatsUnavailable`), for `ConsumerSupervisor` to restart it.
    """

    def __init__(
        self,
        reaction: InboundReaction[Any],
        runner: ReactionRunner,
        nats: Nats,
        config: EngineConfig,
    ) -> None:
        self.reaction = reaction
        self.runner = runner
        self.nats = nats
        self.config = config
        self.stream = reaction.stream
        self.subject = reaction.subject(config.service)
        self.durable = reaction.durable(config.service)
        self.concurrency = min(reaction.concurrency, config.max_ack_pending)
        self._refill_at = max(1, self.concurrency // 2)
        self._next_subject = f"{_JS_API}.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}"

    def consumer_config(self) -> ConsumerConfig:
        """The frozen work-loop contract of the durable."""
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            description=f"service-engine reaction {self.reaction.name}",
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            replay_policy=ReplayPolicy.INSTANT,
            filter_subject=self.subject,
            max_deliver=-1,
            ack_wait=self.config.ack_wait.total_seconds(),
            max_ack_pending=self.config.max_ack_pending,
        )

    async def bind(self) -> None:
        """Create or update the durable on its declared stream.

        Raises `StreamMissing` (naming the stream) when it is absent,
        `ConsumerBindFailed` when JetStream refuses the durable,
        `NatsUnavailable` when it does not answer.
        """
        await self.nats.bind_stream(self.stream)
        timeout = self.config.publish_ack_timeout.total_seconds()
        try:
            async with asyncio.timeout(timeout + 0.5):
                await self.nats.js.add_consumer(
                    self.stream, self.consumer_config(), timeout=timeout
                )
        except nats.js.errors.NotFoundError as exc:
            raise StreamMissing(self.stream) from exc
        except nats.js.errors.APIError as exc:
            raise ConsumerBindFailed(
                f"JetStream refused durable {self.durable} on {self.stream} "
                f"(filter {self.subject}): {exc}"
            ) from exc
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise NatsUnavailable(
                f"binding durable {self.durable} on {self.stream} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    async def run(self, on_healthy: Callable[[], None] | None = None) -> None:
        """Bind, then pull and handle frames until cancelled.

        ``on_healthy`` is called whenever the server answered a pull (a
        frame, an expiry): the supervisor's signal the consumer works.

        The pull inbox is a callback subscription: nats-py hands each frame
        to `_PullInbox.on_msg` in order, which dispatches it at once (no
        per-frame ``next_msg`` task and timeout); this loop waits only for
        the end of each pull request.
        """
        healthy = on_healthy or (lambda: None)
        await self.bind()
        client = self.nats.client
        inbox = _PullInbox(self, client.new_inbox(), healthy)
        try:
            sub = await client.subscribe(f"{inbox.prefix}.*", cb=inbox.on_msg)
        except (nats.errors.Error, OSError) as exc:
            raise NatsUnavailable(f"subscribing the pull inbox failed: {exc}") from exc
        keepalive = _KeepAlive(inbox.frames, max(self.config.ack_wait.total_seconds() / 3, 0.05))
        try:
            while True:
                free = self.concurrency - len(inbox.frames)
                if inbox.frames and free < self._refill_at:
                    await inbox.wait_for_room(self._refill_at)
                    continue
                pull = inbox.open(free)
                body = json.dumps(
                    {"batch": free, "expires": int(PULL_EXPIRES * 1_000_000_000)}
                ).encode()
                try:
                    await client.publish(self._next_subject, body, reply=pull.reply)
                except (nats.errors.Error, OSError) as exc:
                    raise NatsUnavailable(f"pull request failed: {exc}") from exc
                await inbox.until_ended(pull, PULL_EXPIRES + _PULL_GRACE)
        finally:
            keepalive.cancel()
            await self._release(sub, inbox)

    async def _process(self, msg: Msg) -> None:
        delivery = delivery_of(msg.reply)
        if delivery is None:  # not a JetStream frame: nothing to settle
            _log.warning("durable %s: a frame without JetStream metadata (reply %r)",
                         self.durable, msg.reply)
            return
        frame = InboundFrame(msg.subject, msg.data or b"", msg.headers or {}, *delivery)
        try:
            settlement: Settlement = await self.runner.handle(frame)
        except asyncio.CancelledError:
            # Shutdown mid-frame: the transaction rolled back; hand the frame
            # back now rather than after ack_wait.
            await asyncio.shield(_settle(msg, Nak(0, "shutdown"), self.durable))
            raise
        except Exception as exc:
            budget = self.reaction.budget
            delay = backoff_delay(frame.delivered, budget.retry_backoff, budget.retry_backoff_cap)
            _log.error("durable %s: handling a frame failed: %s", self.durable, exc, exc_info=exc)
            settlement = Nak(delay, "runner_error", str(exc))
        await _settle(msg, settlement, self.durable)

    async def _release(self, sub: Subscription, inbox: _PullInbox) -> None:
        """On the way out: drop the inbox, nak what was delivered but never
        started, stop the frames in hand (each naks itself)."""
        inbox.closed = True
        # Interest goes first: the server drops a pull request whose inbox
        # lost interest, so a frame nak'ed below is redelivered to a live
        # pod, not to this pod's still-open request.
        with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
            await sub.unsubscribe()
            await self.nats.client.flush(timeout=1)
        # Frames the client received but had not handed to the callback yet.
        pending: asyncio.Queue[Msg] | None = getattr(sub, "_pending_queue", None)
        while pending is not None and not pending.empty():
            msg = pending.get_nowait()
            if _status(msg) is None:
                inbox.late.append(msg)
        with contextlib.suppress(nats.errors.Error, OSError):
            for msg in inbox.late:
                await _settle(msg, Nak(0, "shutdown"), self.durable)
        in_flight = list(inbox.frames)
        for task in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)


@dataclass(slots=True)
class _InFlight:
    """A frame being handled: its message and when it was dispatched."""

    msg: Msg
    since: float


@dataclass(slots=True)
class _Pull:
    """One open pull request: its reply subject and the frames still owed."""

    reply: str
    remaining: int
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    failure: BaseException | None = None
    pause: bool = False


class _PullInbox:
    """The pull inbox's callback: frames are dispatched as they arrive, a
    status message ends (or fails) the request it answers."""

    def __init__(self, consumer: InboundConsumer, prefix: str, healthy: Callable[[], None]) -> None:
        self.consumer = consumer
        self.prefix = prefix
        self.healthy = healthy
        self.frames: dict[asyncio.Task[None], _InFlight] = {}
        """The frames in hand, by the task handling each."""
        self.late: list[Msg] = []
        """Frames that arrived once the loop was shutting down (nak'ed on release)."""
        self.closed = False
        self._pull: _Pull | None = None
        self._requests = 0
        self._room = asyncio.Event()
        self._room_at = 0

    def open(self, batch: int) -> _Pull:
        self._requests += 1
        self._pull = _Pull(f"{self.prefix}.{self._requests}", batch)
        return self._pull

    async def until_ended(self, pull: _Pull, within: float) -> None:
        """Until ``pull`` got its frames or an end status; past ``within``
        the server forgot it (a reconnect): the caller asks again."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await pull.ended.wait()
        if pull.failure is not None:
            raise pull.failure
        if pull.pause:
            # Any other answer (a leadership change, a server limit) ends
            # this request; pause before the next so a server that keeps
            # answering at once is not asked in a hot loop.
            await asyncio.sleep(_PULL_PAUSE)

    async def wait_for_room(self, free: int) -> None:
        """Until at least ``free`` slots are free."""
        self._room_at = free
        self._room.clear()
        await self._room.wait()

    def _done(self, task: asyncio.Task[None]) -> None:
        del self.frames[task]
        if not self._room.is_set() and \
                self.consumer.concurrency - len(self.frames) >= self._room_at:
            self._room.set()

    async def on_msg(self, msg: Msg) -> None:
        status = _status(msg)
        pull = self._pull
        if status is None:
            if self.closed:
                self.late.append(msg)
                return
            if pull is not None:
                pull.remaining -= 1
                if pull.remaining <= 0:
                    pull.ended.set()
            self.healthy()
            consumer = self.consumer
            task = asyncio.create_task(
                consumer._process(msg), name=f"service_engine:inbound:{consumer.reaction.name}"
            )
            self.frames[task] = _InFlight(msg, time.monotonic())
            task.add_done_callback(self._done)
            return
        if pull is None or msg.subject != pull.reply:
            return  # the late answer of an earlier request
        code, description = status
        if code == "100":
            self.healthy()
            return
        consumer = self.consumer
        if code in ("404", "408"):
            self.healthy()
        elif code == "409" and "deleted" in description.lower():
            pull.failure = ConsumerLost(
                f"durable {consumer.durable} on {consumer.stream}: {description}"
            )
        elif code == "503":
            pull.failure = ConsumerLost(
                f"durable {consumer.durable} on {consumer.stream} does not answer "
                "(no responders: the consumer or its stream is gone)"
            )
        else:
            _log.debug("durable %s: pull ended with %s %s", consumer.durable, code, description)
            pull.pause = True
        pull.ended.set()


class _KeepAlive:
    """Sends ``+WPI`` (in progress) for each frame in hand longer than
    ``interval``, every ``interval``, so a long handler's frame is not
    redelivered to another pod meanwhile. One timer per consumer, not per
    frame: most frames finish long before the first tick."""

    def __init__(self, frames: dict[asyncio.Task[None], _InFlight], interval: float) -> None:
        self._frames = frames
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handle = self._loop.call_later(interval, self._tick)

    def _tick(self) -> None:
        due = time.monotonic() - self._interval
        for frame in list(self._frames.values()):
            if frame.since <= due:
                task = self._loop.create_task(self._send(frame.msg))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        self._handle = self._loop.call_later(self._interval, self._tick)

    @staticmethod
    async def _send(msg: Msg) -> None:
        with contextlib.suppress(nats.errors.Error, OSError):
            await msg.in_progress()

    def cancel(self) -> None:
        self._handle.cancel()
        for task in self._tasks:
            task.cancel()


async def _settle(msg: Msg, settlement: Settlement, durable: str) -> None:
    try:
        if isinstance(settlement, Ack):
            await msg.ack()
        elif isinstance(settlement, Term):
            await msg.term()
        else:
            await msg.nak(delay=settlement.delay if settlement.delay > 0 else None)
    except (nats.errors.Error, OSError) as exc:
        # The frame is redelivered after ack_wait; its claim (or its derived
        # dead-letter id) makes the redelivery a no-op.
        _log.warning("durable %s: could not settle a frame (%s): %s", durable,
                     type(settlement).__name__, exc)
