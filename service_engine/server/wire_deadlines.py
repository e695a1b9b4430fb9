"""A socket's deadlines and keepalive, one loop timer for all the sockets of a loop."""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
import struct

from websockets.frames import Frame

from . import wire_protocol as wp
from .app import (
    SESSION_MAX_AGE_CLOSE_CODE,
    SESSION_MAX_AGE_CLOSE_REASON,
)
from .wire_state import SocketState, close_args

__all__ = ["TICK", "DeadlineWheel", "SocketDeadlines"]

_log = logging.getLogger(__name__)


TICK = 0.05
"""Seconds of one step of `DeadlineWheel`: a socket's deadline is met at most
this much late (the deadlines are seconds to hours; the sockets of one step
share its table, so a coarser step holds fewer bytes a socket)."""


class Step:
    """The sockets waiting for one step, and the step (one int for all)."""

    __slots__ = ("sockets", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.sockets: dict[SocketState, None] = {}


class DeadlineWheel:
    """The sockets of one loop by their soonest deadline (`SocketDeadlines._arm`),
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

    def add(self, socket: SocketState, at: float) -> int:
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

    def remove(self, socket: SocketState, step: int) -> None:
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
        due: list[SocketState] = []
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


class SocketDeadlines(SocketState):
    """The init timeout, the session's max age, the keepalive ping and its
    pong, the close echo's bound and the attach turn's: the soonest waits in
    the endpoint's `DeadlineWheel`, met within `TICK`."""

    __slots__ = ()

    def _arm(self) -> None:
        soonest: float | None = None
        for at in (self._init_at, self._max_age_at, self._ping_at, self._pong_at,
                   self._close_at, self._gate_at):
            if at is not None and (soonest is None or at < soonest):
                soonest = at
        step = self._due_step
        if step is not None:
            if soonest is not None and step * TICK <= soonest:
                return
            # Nothing pending (the socket is released now), or due sooner.
            self._endpoint.deadlines(self.loop).remove(self, step)
            self._due_step = None
        if soonest is not None:
            self._due_step = self._endpoint.deadlines(self.loop).add(self, soonest)

    def _on_timer(self) -> None:
        self._due_step = None
        now = self.loop.time()
        # What was due when its step came, in deadline order; each runs
        # once, and only if no earlier one cleared or moved it.
        due = sorted((at, order) for order, at in enumerate(
            (self._close_at, self._pong_at, self._init_at, self._max_age_at, self._ping_at,
             self._gate_at))
            if at is not None and at <= now)
        for at, order in due:
            if order == 0 and self._close_at == at:
                self._close_at = None
                self.transport.close()
            elif order == 1 and self._pong_at == at:
                self._keepalive_timeout()
            elif order == 2 and self._init_at == at:
                self._init_timed_out()
            elif order == 3 and self._max_age_at == at:
                self._max_age_reached()
            elif order == 4 and self._ping_at == at:
                self._send_ping()
            elif order == 5 and self._gate_at == at:
                self._leave_gate()  # no operation answered within the bound
        if not self._lost:
            self._arm()

    def _init_timed_out(self) -> None:
        self._init_at = None
        if self._init.received or self._closed:
            return
        view = self._endpoint.view
        if not self._init_extended and view.handshakes.full():
            # A burst holds every handshake slot: one more period, never two.
            self._init_extended = True
            self._init_at = self.loop.time() + self._endpoint.init_timeout
            return
        self._init.timed_out = True
        self.close(*close_args(wp.INIT_TIMEOUT))

    def _max_age_reached(self) -> None:
        self._max_age_at = None
        # The operations stop before the close frame: none sends after it.
        self._stop_operations()
        self.close(SESSION_MAX_AGE_CLOSE_CODE, SESSION_MAX_AGE_CLOSE_REASON)

    def _start_keepalive(self) -> None:
        if self.ping_interval is not None and self.ping_interval > 0:
            self._schedule_ping()

    def _schedule_ping(self) -> None:
        assert self.ping_interval is not None
        delay = max(0.0, self.ping_interval - self._rtt)
        self._ping_at = self.loop.time() + delay
        self._arm()

    def _send_ping(self) -> None:
        # uvicorn's keepalive: a random 4-byte ping, its pong within ping_timeout.
        self._ping_at = None
        if self._closed or self.transport.is_closing():
            return
        self._ping_payload = struct.pack("!I", random.getrandbits(32))
        self._ping_sent_at = self.loop.time()
        self.conn.send_ping(self._ping_payload)
        self._flush()
        if self.ping_timeout is not None:
            self._pong_at = self._ping_sent_at + self.ping_timeout
            self._arm()
        else:
            self._schedule_ping()

    def _pong(self, event: Frame) -> None:
        if self._ping_payload is None or bytes(event.data) != self._ping_payload:
            return
        self._rtt = self.loop.time() - self._ping_sent_at
        self._ping_payload = None
        if self._pong_at is not None:
            self._pong_at = None
            self._schedule_ping()

    def _keepalive_timeout(self) -> None:
        self._pong_at = None
        self._ping_payload = None
        if self._closed or self.transport.is_closing():
            return
        self._ended()
        self.conn.fail(1011, "keepalive ping timeout")
        self._flush()
        self._closed = True
        self.transport.close()

    def _stop_keepalive(self) -> None:
        self._ping_at = self._pong_at = None
        self._ping_payload = None
        self._arm()
