"""The fused write: a caught-up session's delta goes from the put straight to its socket.

A callback-mode `LiveOp` started with a ``direct`` write is offered each
delta put while its session has nothing queued (`SessionStream.set_waker`'s
``direct``); its socket writes `LiveOp.frame_bytes` at once when nothing is
ahead of it (no drain pending, not paused), and declines otherwise, leaving
the delta to the ordinary queue, wake and drain. Over random deltas and
random stretches of a slow or paused reader, a fused session must write the
very bytes, revisions and ends an ordinary session writes when its drain
runs right after each put it could take: the stream's numbering, collapse,
overflow and Reset are the same either way. Pure: no socket, no render side
(the deltas are put as a render pass puts them).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service_engine.render.deltas import Remove, Reset, Upsert
from service_engine.render.session_id import SessionId
from service_engine.render.stream import SessionStream
from service_engine.server import wire_protocol as wp
from service_engine.server.live_op import LiveOp
from service_engine.server.live_ops import LiveOps

from .loop_support import CallbackAttach
from .test_delivery_frames import DELTAS as LEARNED
from .test_delivery_plan import ALPHA, BETA, CAUSE, FULL
from .test_live_ops import _Context, _ops, _ordinary, _payload
from .test_live_ops import _Engine as _EndingEngine

CAPACITY = 12
"""Untaken deltas before a stream drops its backlog for a Reset (BEHIND = 8 collapses first)."""

KEYS = ['"t1"', '"t2"', '"t3"']
VIEWS = [ALPHA, BETA]
DELTAS: list[Any] = [Upsert(0, key, view, cause) for key in KEYS for view in VIEWS
                     for cause in (None, CAUSE)]
DELTAS += [Remove(0, key, CAUSE) for key in KEYS]
DELTAS += [Reset(0, {'"t1"': ALPHA}), Reset(0, {'"t2"': BETA, '"t3"': ALPHA})]
"""What a render pass puts: shared delta objects (a cohort's sessions get the same
ones, numbered for whichever session rendered them first)."""

_KNOWN: list[LiveOps] = []


@dataclass
class _Engine(CallbackAttach):
    """The engine's attach: a real session stream, its first Reset queued."""

    streams: list[SessionStream[Any]] = field(default_factory=list)

    async def attach(self, principal: Any, projector: str, window: Any, *,
                     applier: Any = None, session_id: str | None = None) -> SessionStream[Any]:
        stream: SessionStream[Any] = SessionStream(
            SessionId(f"s-{len(self.streams)}"), CAPACITY, lambda: None)
        stream.put(Reset(1, {'"t1"': ALPHA, '"t2"': BETA}))
        self.streams.append(stream)
        return stream

    def lanes_of(self, projector: str) -> frozenset[str]:
        return frozenset()


class _Socket:
    """A socket as `WireSocket` drives its live op: a wake schedules one
    drain for the loop's next turn; ``fused`` writes a frame now when
    nothing is ahead of it, as `WireSocket._fused` does. Without ``fused``
    it is the ordinary path; ``prompt`` then drains right after a put it
    could have taken (the reference the fused write must equal)."""

    def __init__(self, fused: bool) -> None:
        self.fused = fused
        self.woken = False
        self.paused = False
        self.busy = False
        """The loop has not run this socket's drain yet (a slow stretch)."""
        self.written: list[bytes] = []
        self.direct_writes = 0
        self.done: list[str] = []

    def wake(self, _op: LiveOp) -> None:
        self.woken = True

    def ready(self) -> bool:
        return not (self.woken or self.paused or self.busy)

    def direct(self, op: LiveOp, delta: Any, revision: int) -> bool:
        if not self.ready():
            return False
        data = op.frame_bytes(delta, revision)
        if data is None:
            return False
        self.written.append(data)
        self.direct_writes += 1
        return True

    def write(self, texts: list[str]) -> None:
        self.written.extend(wp.text_frame(text.encode()) for text in texts)

    def turn(self, op: LiveOp) -> None:
        """The loop's turn: the drain `_Drains` runs for a woken socket."""
        self.busy = False
        while self.woken:
            self.woken = False
            if op.drain(self.write) and not self.paused:
                self.woken = True


def _texts(written: list[bytes]) -> list[str]:
    out = []
    for data in written:
        size, start = data[1] & 0x7F, 2
        if size == 126:
            start = 4
        elif size == 127:
            start = 10
        assert data[0] == 0x81 and len(data) == start + len(data[start:])
        text = data[start:].decode()
        assert wp.text_frame(text.encode()) == data
        out.append(text)
    return out


STEP = st.one_of(
    st.tuples(st.just("put"), st.integers(0, len(DELTAS) - 1)),
    st.tuples(st.sampled_from(["pause", "resume", "busy", "turn"]), st.just(0)),
)


async def _scenario(pairs: list[list[tuple[str, int]]]) -> None:
    ops = await _known()
    sessions: list[tuple[list[tuple[str, int]], tuple[LiveOp, _Socket], tuple[LiveOp, _Socket]]] = []
    for n, steps in enumerate(pairs):
        ends = []
        for fused in (True, False):
            engine = _Engine()
            op = ops.open(f"op-{n}", _payload(FULL), _Context(engine))  # type: ignore[arg-type]
            assert op is not None
            sock = _Socket(fused)
            op.start(sock.wake, sock.done.append, sock.direct if fused else None)
            await _attached(op)
            ends.append((op, sock, engine))
        sessions.append((steps, (ends[0][0], ends[0][1]), (ends[1][0], ends[1][1])))
        for op, sock, _engine in ends:
            sock.turn(op)  # the Reset queued at attach
    # The pairs' steps interleave (their fused ops share the plan's frame cache).
    longest = max(len(steps) for steps in pairs)
    for i in range(longest):
        for steps, (fop, fsock), (rop, rsock) in sessions:
            if i >= len(steps):
                continue
            kind, index = steps[i]
            fstream, rstream = fop._stream, rop._stream
            assert fstream is not None and rstream is not None
            if kind == "put":
                delta = DELTAS[index]
                prompt = rsock.ready()
                assert prompt == (fsock.ready() and not len(fstream._backlog))
                taken = [fstream.put(delta), rstream.put(delta)]
                if prompt:
                    rsock.turn(rop)  # the ordinary drain, right after the put
                assert taken[0] == taken[1]
                if not taken[0]:
                    # Overflow: the render side re-snapshots (a Reset of committed state).
                    fstream.put(Reset(0, {'"t1"': BETA}))
                    rstream.put(Reset(0, {'"t1"': BETA}))
            elif kind == "pause":
                for op, sock in ((fop, fsock), (rop, rsock)):
                    sock.paused = True
                    op.pause()
            elif kind == "resume":
                for op, sock in ((fop, fsock), (rop, rsock)):
                    sock.paused = False
                    op.resume()
            elif kind == "busy":
                fsock.busy = rsock.busy = True
            else:
                fsock.turn(fop)
                rsock.turn(rop)
            assert fstream.taken == rstream.taken
            assert fstream.pending() == rstream.pending()
            assert fstream.collapsed == rstream.collapsed
            assert fsock.written == rsock.written
    for _steps, (fop, fsock), (rop, rsock) in sessions:
        for op, sock in ((fop, fsock), (rop, rsock)):
            stream = op._stream
            assert stream is not None
            sock.paused = False
            op.resume()
            sock.turn(op)
            stream.end("test")
            sock.turn(op)
        assert fsock.written == rsock.written
        assert fsock.done == rsock.done == [fop.id]
        texts = _texts(fsock.written)
        assert texts[-1] == json.dumps({"id": fop.id, "type": "complete"},
                                       separators=(",", ":"))
        revisions = [json.loads(t)["payload"]["data"]["things"]["revision"] for t in texts[:-1]]
        assert revisions == list(range(1, len(revisions) + 1))


async def _attached(op: LiveOp) -> None:
    """``op``'s attach done (the stand-in's task, then its callback): its session is live."""
    task = op._attaching
    assert task is not None
    await asyncio.wait_for(task, 5)
    assert op.state == "live"


async def _known() -> LiveOps:
    """LiveOps that know FULL (its first subscribe ran the ordinary way)."""
    if not _KNOWN:
        ops = _ops()
        await _ordinary(ops, _payload(FULL), _EndingEngine(LEARNED))
        _KNOWN.append(ops)
    return _KNOWN[0]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(STEP, max_size=60), min_size=1, max_size=3))
def test_a_fused_session_writes_what_the_ordinary_path_writes(
    pairs: list[list[tuple[str, int]]],
) -> None:
    """Shared Upserts, Removes and Resets put on sessions whose readers keep up, fall
    behind (a drain not yet run), pause and resume, past collapse and overflow: a session
    whose caught-up deltas are written as they are put writes the same frames, byte for
    byte, as an ordinary session drained right after each such put; its stream's
    revision, queue and collapse count agree at every step, its revisions run 1, 2, 3, ...
    and both end with the same ``complete``. Several sessions under other operation ids
    share the plan's frame cache."""
    asyncio.run(_scenario(pairs))


def test_a_caught_up_session_is_written_as_it_is_put_and_a_slow_one_is_queued() -> None:
    """The fused write is taken while the session keeps up (nothing queued, the socket
    ready), declined while its socket has a drain pending or is paused (the delta is
    queued and woken for as any other), and taken again once the reader caught up."""

    async def scenario() -> None:
        engine = _Engine()
        op = (await _known()).open("op-1", _payload(FULL), _Context(engine))  # type: ignore[arg-type]
        assert op is not None
        sock = _Socket(True)
        op.start(sock.wake, sock.done.append, sock.direct)
        await _attached(op)
        (stream,) = engine.streams
        assert sock.woken and sock.direct_writes == 0  # the attach's Reset is queued
        sock.turn(op)
        stream.put(DELTAS[0])
        stream.put(DELTAS[1])
        assert sock.direct_writes == 2 and not sock.woken and stream.pending() == 0
        assert stream.taken == 3
        sock.busy = True
        stream.put(DELTAS[2])
        assert sock.direct_writes == 2 and sock.woken and stream.pending() == 1
        stream.put(DELTAS[3])  # behind the queued one: queued too
        assert sock.direct_writes == 2 and stream.pending() == 2
        sock.turn(op)
        assert stream.pending() == 0 and stream.taken == 5
        sock.paused = True
        op.pause()
        stream.put(DELTAS[4])
        assert sock.direct_writes == 2 and stream.pending() == 1 and stream.waiting == 0
        sock.paused = False
        op.resume()
        sock.turn(op)
        stream.put(DELTAS[5])
        assert sock.direct_writes == 3 and stream.taken == 7
        revisions = [json.loads(t)["payload"]["data"]["things"]["revision"]
                     for t in _texts(sock.written)]
        assert revisions == [1, 2, 3, 4, 5, 6, 7]
        op.close()
        stream.put(DELTAS[0])
        assert sock.direct_writes == 3  # closed: detached, nothing offered

    asyncio.run(scenario())
