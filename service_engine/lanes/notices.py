"""Lane notices: the out-of-band signal that the NATS lanes paused or resumed.

Past ``nats_grace`` the lanes (presence, the accumulated lane) pause: every
session watching one is told ``LanesPaused { lanes }``; when NATS is back,
``LanesResumed { lanes }`` and then a Reset of that session (what it holds
may be stale). A notice carries no revision, so Reset / Upsert / Remove
contiguity is untouched.

* `LaneNotice` is the raw signal (``Engine.lane_notices``); the GraphQL kit
  maps it to its ``LanesPaused`` / ``LanesResumed`` union members.
* `LaneGate` (pure) turns "NATS is down past its grace" observations into
  notices.
* `LaneNotices` is the hub: which projectors watch which lane, the
  subscribers' streams, and the Reset of the watching sessions on resume.
* `reset_sessions` re-snapshots every live session of some projectors (a
  Reset on each stream) through the render loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..impacts.transport import ImpactChannel
from ..render.registry import RenderRegistry
from ..resources import AsyncResource

__all__ = [
    "ACCUMULATED_LANE",
    "LaneGate",
    "LaneHealth",
    "LaneNotice",
    "LaneNoticeStream",
    "LaneNotices",
    "reset_sessions",
]

_log = logging.getLogger(__name__)

ACCUMULATED_LANE = "accumulated"
"""The lane name of lane A: a projector rendering accumulator state watches it
(``Engine.watch_lane(ACCUMULATED_LANE, projector)``); presence lanes watch
``presence`` on their own."""

NOTICE_BUFFER = 64
"""Notices a subscriber may fall behind by; older ones are dropped (the
latest notice is the state that matters)."""


@dataclass(frozen=True, slots=True)
class LaneNotice:
    """``lanes`` paused (``paused``) or resumed; no revision."""

    paused: bool
    lanes: tuple[str, ...]

    @classmethod
    def pause(cls, lanes: Iterable[str]) -> LaneNotice:
        return cls(True, tuple(sorted(set(lanes))))

    @classmethod
    def resume(cls, lanes: Iterable[str]) -> LaneNotice:
        return cls(False, tuple(sorted(set(lanes))))

    def only(self, lanes: Collection[str]) -> LaneNotice | None:
        """This notice narrowed to ``lanes``; None when none is named."""
        kept = tuple(lane for lane in self.lanes if lane in lanes)
        return LaneNotice(self.paused, kept) if kept else None


class LaneGate:
    """Pure: "the lanes' dependency is down past its grace" observations in,
    at most one notice per transition out."""

    __slots__ = ("paused",)

    def __init__(self) -> None:
        self.paused = False

    def observe(self, down: bool, lanes: Iterable[str]) -> LaneNotice | None:
        """The notice this observation calls for (None: no transition, or no lane)."""
        names = tuple(lanes)
        if down == self.paused or not names:
            return None
        self.paused = down
        return LaneNotice.pause(names) if down else LaneNotice.resume(names)


class LaneHealth(Protocol):
    """What the notice worker reads: ``down`` past the grace (`NatsHealth`),
    checked every ``interval`` seconds."""

    @property
    def down(self) -> bool: ...

    @property
    def interval(self) -> float: ...


def reset_sessions(
    render: RenderRegistry, channel: ImpactChannel, projectors: Collection[str]
) -> int:
    """Re-snapshot every live session of ``projectors``: each gets a Reset on
    its stream from the next render pass. Returns how many were marked."""
    marked = 0
    for rec in list(render.sessions.values()):
        if rec.projector.NAME in projectors and rec.session.live:
            rec.resync = True
            marked += 1
    if marked:
        channel.put([])  # wakes the render loop; the pass re-snapshots them
    return marked


class LaneNoticeStream(AsyncResource):
    """One subscriber's notices (`LaneNotices.subscribe`), an async iterator
    that ends when closed."""

    def __init__(self, hub: LaneNotices, lanes: Collection[str] | None) -> None:
        self._hub = hub
        self.lanes = None if lanes is None else frozenset(lanes)
        self._queue: asyncio.Queue[LaneNotice | None] = asyncio.Queue(NOTICE_BUFFER)
        self._closed = False

    def _offer(self, notice: LaneNotice) -> None:
        if self._closed:
            return
        narrowed = notice if self.lanes is None else notice.only(self.lanes)
        if narrowed is None:
            return
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(narrowed)

    def __aiter__(self) -> AsyncIterator[LaneNotice]:
        return self

    async def __anext__(self) -> LaneNotice:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._hub._unsubscribe(self)
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)


class LaneNotices:
    """The lane-notice hub of one engine.

    ``watch(lane, projector)`` declares that sessions of ``projector`` watch
    ``lane`` (presence lanes do it on registration; an accumulator's
    projector does it for the accumulated lane). `run` is the worker: it
    observes ``health`` every ``interval`` seconds and, on a transition,
    hands the notice to every subscriber and — on resume — Resets every
    session watching a resumed lane.
    """

    def __init__(self, render: RenderRegistry, channel: ImpactChannel) -> None:
        self._render = render
        self._channel = channel
        self._watchers: dict[str, set[str]] = {}
        self._streams: set[LaneNoticeStream] = set()
        self.gate = LaneGate()
        self.on_notice: Callable[[LaneNotice], None] | None = None

    def watch(self, lane: str, projector: str) -> None:
        """Sessions of ``projector`` watch ``lane`` from now on."""
        self._watchers.setdefault(lane, set()).add(projector)

    @property
    def lanes(self) -> tuple[str, ...]:
        """The lanes some projector watches, sorted."""
        return tuple(sorted(self._watchers))

    def lanes_of(self, projector: str) -> frozenset[str]:
        """The lanes sessions of ``projector`` watch (empty: none)."""
        return frozenset(lane for lane, names in self._watchers.items() if projector in names)

    def subscribe(self, lanes: Collection[str] | None = None) -> LaneNoticeStream:
        """A stream of the notices naming any of ``lanes`` (None: every lane),
        narrowed to those lanes. Close it when done."""
        stream = LaneNoticeStream(self, lanes)
        self._streams.add(stream)
        return stream

    def _unsubscribe(self, stream: LaneNoticeStream) -> None:
        self._streams.discard(stream)

    @property
    def paused(self) -> bool:
        return self.gate.paused

    def publish(self, notice: LaneNotice) -> None:
        """Hand ``notice`` to every subscriber; on a resume, Reset every live
        session watching a resumed lane (after the notice, so a subscriber
        sees LanesResumed before the Reset)."""
        _log.info("lanes %s: %s", "paused" if notice.paused else "resumed", ", ".join(notice.lanes))
        for stream in list(self._streams):
            stream._offer(notice)
        if self.on_notice is not None:
            self.on_notice(notice)
        if not notice.paused:
            projectors = set().union(*(self._watchers.get(lane, set()) for lane in notice.lanes))
            reset_sessions(self._render, self._channel, projectors)

    def observe(self, down: bool) -> LaneNotice | None:
        """Feed one health observation; publish and return the notice it calls for."""
        notice = self.gate.observe(down, self.lanes)
        if notice is not None:
            self.publish(notice)
        return notice

    async def run(self, health: LaneHealth, interval: float) -> None:
        """The worker: observe ``health`` every ``interval`` seconds."""
        while True:
            self.observe(health.down)
            await asyncio.sleep(interval)
