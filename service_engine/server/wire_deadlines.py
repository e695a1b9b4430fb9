"""A socket's deadlines and keepalive (a unit of `service_engine.server.wire.Timed`),
one loop timer for all the sockets of a loop (`DeadlineWheel`)."""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
import struct
from collections.abc import Iterator
from typing import Protocol

import uvicorn

__all__ = ["CLOSE", "INIT", "MAX_AGE", "PING", "PONG", "TICK", "TURN", "DeadlineWheel",
           "SocketDeadlines", "Timed"]

_log = logging.getLogger(__name__)


TICK = 0.05
"""Seconds of one step of `DeadlineWheel`: a socket's deadline is met at most
this much late (the deadlines are seconds to hours; the sockets of one step
share its table, so a coarser step holds fewer bytes a socket)."""


class Timed(Protocol):
    """What waits in a `DeadlineWheel`: a socket (`wire.WireSocket`)."""

    def _on_timer(self) -> None:
        """Its step is due (it then arms its next deadline, if any)."""


class Step:
    """The sockets waiting for one step, and the step (one int for all)."""

    __slots__ = ("sockets", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.sockets: dict[Timed, None] = {}


class DeadlineWheel:
    """The sockets of one loop by their soonest deadline (`SocketDeadlines.arm`),
    in steps of `TICK`: one loop timer for the earliest step, not one timer
    handle (its callback and context) per socket. A step's sockets are called
    together once it is due; each then arms its next deadline."""

    __slots__ = ("_heap", "_steps", "_timer", "_timer_step", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._steps: dict[int, Step] = {}
        self._heap: list[int] = []
        """The steps that have sockets (and some emptied since, skipped)."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_step = 0

    def add(self, socket: Timed, at: float) -> int:
        """Call ``socket._on_timer`` once ``at`` passed; the step to `remove` it from."""
        step = math.ceil(at / TICK)
        record = self._steps.get(step)
        if record is None:
            record = self._steps[step] = Step(step)
            heapq.heappush(self._heap, step)
        record.sockets[socket] = None
        if self._timer is None or step < self._timer_step:
            self._arm(step)
        return record.step

    def remove(self, socket: Timed, step: int) -> None:
        record = self._steps.get(step)
        if record is not None:
            record.sockets.pop(socket, None)
            if not record.sockets:
                del self._steps[step]  # its heap entry is skipped when reached

    def _arm(self, step: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_step = step
        self._timer = self.loop.call_at(step * TICK, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.loop.time()
        heap, steps = self._heap, self._steps
        due: list[Timed] = []
        while heap and heap[0] * TICK <= now:
            record = steps.pop(heapq.heappop(heap), None)
            if record is not None:
                due.extend(record.sockets)
        for socket in due:
            try:
                socket._on_timer()
            except Exception:
                # One socket's failure is its own: the others' deadlines run.
                _log.exception("a socket's deadline failed")
        while heap and heap[0] not in steps:
            heapq.heappop(heap)
        if not heap:
            # Idle again: the tables at their idle size.
            self._heap, self._steps = [], {}
        elif self._timer is None or self._timer_step > heap[0]:
            # (A socket's re-arm above may have armed a later step.)
            self._arm(heap[0])


CLOSE, PONG, INIT, MAX_AGE, PING, TURN = range(6)
"""A socket's deadlines (`SocketDeadlines.due`), in the order those due
together in one step run: the close echo's bound, the keepalive's pong,
the init timeout, the session's max age, the next keepalive ping, the
attach turn's bound."""

_AT = ("close_at", "pong_at", "init_at", "max_age_at", "ping_at", "turn_at")


class SocketDeadlines:
    """One socket's deadlines (the init timeout, the session's max age, the
    keepalive ping and its pong, the close echo's bound, the attach turn's)
    and its keepalive's round trip. The soonest waits in the endpoint's
    `DeadlineWheel` (`arm`), met within `TICK`; the socket runs what is `due`."""

    __slots__ = ("close_at", "config", "due_step", "init_at", "max_age_at", "ping_at",
                 "ping_payload", "ping_sent_at", "pong_at", "rtt", "turn_at")

    def __init__(self, config: uvicorn.Config) -> None:
        self.config = config
        """uvicorn's: its ``ws_ping_interval`` and ``ws_ping_timeout``."""
        self.due_step: int | None = None
        """The step of the `DeadlineWheel` the socket waits in."""
        self.init_at: float | None = None
        self.max_age_at: float | None = None
        self.ping_at: float | None = None
        self.pong_at: float | None = None
        self.close_at: float | None = None
        self.turn_at: float | None = None
        self.ping_payload: bytes | None = None
        self.ping_sent_at = 0.0
        self.rtt = 0.0

    def arm(self, socket: Timed, wheel: DeadlineWheel) -> None:
        """Wait in ``wheel`` for the soonest deadline (nowhere when none is set)."""
        soonest: float | None = None
        for at in (self.init_at, self.max_age_at, self.ping_at, self.pong_at,
                   self.close_at, self.turn_at):
            if at is not None and (soonest is None or at < soonest):
                soonest = at
        step = self.due_step
        if step is not None:
            if soonest is not None and step * TICK <= soonest:
                return
            # Nothing pending (the socket is released now), or due sooner.
            wheel.remove(socket, step)
            self.due_step = None
        if soonest is not None:
            self.due_step = wheel.add(socket, soonest)

    def due(self, now: float) -> Iterator[int]:
        """The deadlines passed by ``now`` (`CLOSE` ... `TURN`), in deadline
        order, each cleared as it is reached: each once, and only if no
        earlier one's work cleared or moved it meanwhile."""
        self.due_step = None
        due = sorted((at, kind) for kind, at in enumerate(
            (self.close_at, self.pong_at, self.init_at, self.max_age_at, self.ping_at,
             self.turn_at))
            if at is not None and at <= now)
        for at, kind in due:
            if getattr(self, _AT[kind]) == at:
                setattr(self, _AT[kind], None)
                yield kind

    def start_keepalive(self, now: float) -> None:
        interval = self.config.ws_ping_interval
        if interval is not None and interval > 0:
            self._schedule_ping(now)

    def _schedule_ping(self, now: float) -> None:
        interval = self.config.ws_ping_interval
        assert interval is not None
        self.ping_at = now + max(0.0, interval - self.rtt)

    def ping(self, now: float) -> bytes:
        """uvicorn's keepalive: the random 4-byte ping sent now; its pong is
        due within ``ws_ping_timeout`` (or, without one, the next ping is)."""
        self.ping_payload = struct.pack("!I", random.getrandbits(32))
        self.ping_sent_at = now
        timeout = self.config.ws_ping_timeout
        if timeout is not None:
            self.pong_at = now + timeout
        else:
            self._schedule_ping(now)
        return self.ping_payload

    def pong(self, payload: bytes, now: float) -> None:
        """A pong came: the round trip, and the next ping if it answers ours."""
        if self.ping_payload is None or payload != self.ping_payload:
            return
        self.rtt = now - self.ping_sent_at
        self.ping_payload = None
        if self.pong_at is not None:
            self.pong_at = None
            self._schedule_ping(now)

    def stop_keepalive(self) -> None:
        self.ping_at = self.pong_at = None
        self.ping_payload = None
