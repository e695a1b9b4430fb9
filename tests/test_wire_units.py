"""The socket's units alone (`service_engine.server.wire_writer`,
`service_engine.server.wire_deadlines`): the writer's frames, flow control
and close against a transport of asyncio's interface; the deadlines' order,
arming and keepalive."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import OPEN
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from service_engine.server import wire_protocol as wp
from service_engine.server.wire_deadlines import (
    CLOSE,
    INIT,
    MAX_AGE,
    PONG,
    TICK,
    TURN,
    DeadlineWheel,
    SocketDeadlines,
)
from service_engine.server.wire_writer import SocketWriter

from .loop_support import turns_until


class _Transport(asyncio.Transport):
    """asyncio's transport interface, recording what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after the close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _frames(data: bytes) -> list[Frame]:
    """The frames a client reads from the server's ``data`` (websockets' own parser)."""
    client = ClientProtocol(parse_uri("ws://localhost/"), state=OPEN, max_size=None)
    client.receive_data(data)
    return [event for event in client.events_received() if isinstance(event, Frame)]


def _writer() -> tuple[SocketWriter, _Transport]:
    transport = _Transport()
    return SocketWriter(transport, ServerProtocol(state=OPEN)), transport


def test_the_writer_writes_text_frames_one_write_per_batch() -> None:
    """One message is one write of its text frame (websockets' bytes); a
    batch of messages is one write of their frames in order; nothing is
    written for an empty batch."""
    writer, transport = _writer()
    writer.write(b'{"type":"pong"}')
    writer.write_texts(["a", "b" * 200, "c" * 70_000])
    writer.write_texts([])
    assert len(transport.writes) == 2
    assert transport.writes[0] == wp.text_frame(b'{"type":"pong"}')
    frames = _frames(transport.writes[1])
    assert [(f.opcode, f.fin, bytes(f.data)) for f in frames] == [
        (Opcode.TEXT, True, text.encode()) for text in ["a", "b" * 200, "c" * 70_000]]


async def test_a_paused_writer_holds_its_senders_until_resumed_or_closed() -> None:
    """While paused the writer is not writable and `wait_writable` waits;
    `resume` releases every waiter; after a close a waiter is released, the
    close frame (code and reason cut to fit) is the last thing written and
    nothing follows it."""
    loop = asyncio.get_running_loop()
    writer, transport = _writer()
    assert writer.writable
    await asyncio.wait_for(writer.wait_writable(loop), 1)  # not paused: at once
    writer.pause()
    assert not writer.writable
    first = asyncio.ensure_future(writer.wait_writable(loop))
    second = asyncio.ensure_future(writer.wait_writable(loop))
    await turns_until(lambda: len(writer.waiters or ()) == 2, "both senders waiting")
    assert not first.done() and not second.done()
    writer.resume()
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert writer.writable and writer.waiters is None
    writer.pause()
    waiting = asyncio.ensure_future(writer.wait_writable(loop))
    await turns_until(lambda: bool(writer.waiters), "the sender waiting")
    assert writer.send_close(4400, "x" * 300)
    await asyncio.wait_for(waiting, 1)
    assert writer.closed and not writer.writable
    writer.write(b"late")
    writer.write_texts(["later"])
    (close_frame,) = _frames(b"".join(transport.writes))
    close = Close.parse(bytes(close_frame.data))
    assert close.code == 4400 and close.reason == "x" * wp.MAX_CLOSE_REASON_BYTES


def test_a_close_websockets_cannot_send_closes_the_transport() -> None:
    """A second close frame is refused by websockets: the writer closes the
    transport instead and answers False."""
    writer, transport = _writer()
    assert writer.send_close(1000, "")
    assert not transport.closed
    assert not writer.send_close(1000, "")
    assert transport.closed


def _deadlines(ping_interval: float | None = 20.0, ping_timeout: float | None = 20.0
               ) -> SocketDeadlines:
    return SocketDeadlines(uvicorn.Config(app="example_service:app", ws_ping_interval=ping_interval,
                                          ws_ping_timeout=ping_timeout))


def test_the_due_deadlines_come_in_deadline_order_each_once() -> None:
    """`due` yields what passed, soonest first (ties in the order close,
    pong, init, max age, ping, turn), clears each as it is reached, skips
    one that an earlier one's work cleared or moved, and leaves the rest."""
    deadlines = _deadlines()
    deadlines.close_at = deadlines.init_at = 5.0
    deadlines.pong_at = 4.0
    deadlines.max_age_at = deadlines.turn_at = 3.0
    deadlines.ping_at = 9.0
    assert list(deadlines.due(6.0)) == [MAX_AGE, TURN, PONG, CLOSE, INIT]
    assert deadlines.close_at is None and deadlines.init_at is None
    assert deadlines.pong_at is None
    assert deadlines.ping_at == 9.0
    deadlines.init_at = deadlines.turn_at = 1.0
    seen: list[int] = []
    for kind in deadlines.due(2.0):
        seen.append(kind)
        deadlines.turn_at = 8.0  # the init's work moves the turn: it is not due now
    assert seen == [INIT] and deadlines.turn_at == 8.0
    deadlines.max_age_at = 1.0
    for kind in deadlines.due(2.0):
        assert kind == MAX_AGE
        deadlines.ping_at = None  # cleared by an earlier one: never yielded
    assert list(deadlines.due(100.0)) == [TURN]


def test_the_keepalive_pings_after_the_round_trip_and_waits_for_its_pong() -> None:
    """A ping is due an interval after the start (less the last round
    trip); once sent its pong is due within the timeout; only the pong
    carrying the ping's payload counts; without a timeout the next ping is
    due instead; stopping clears it all."""
    deadlines = _deadlines(ping_interval=1.0, ping_timeout=0.5)
    deadlines.start_keepalive(10.0)
    assert deadlines.ping_at == 11.0
    payload = deadlines.ping(11.0)
    assert len(payload) == 4 and deadlines.pong_at == 11.5
    deadlines.pong(b"nope", 11.1)
    assert deadlines.pong_at == 11.5
    deadlines.pong(payload, 11.2)
    assert deadlines.pong_at is None and deadlines.ping_payload is None
    assert abs(deadlines.rtt - 0.2) < 1e-9
    assert deadlines.ping_at is not None and abs(deadlines.ping_at - 12.0) < 1e-9
    deadlines.stop_keepalive()
    assert (deadlines.ping_at, deadlines.pong_at, deadlines.ping_payload) == (None, None, None)
    untimed = _deadlines(ping_interval=1.0, ping_timeout=None)
    untimed.ping(3.0)
    assert untimed.pong_at is None and untimed.ping_at == 4.0
    off = _deadlines(ping_interval=None)
    off.start_keepalive(1.0)
    assert off.ping_at is None


class _Socket:
    """What waits in the wheel: counts its calls."""

    def __init__(self) -> None:
        self.calls = asyncio.Event()

    def _on_timer(self) -> None:
        self.calls.set()


async def test_arm_waits_in_one_step_for_the_soonest_and_leaves_when_none() -> None:
    """`arm` puts the socket in the wheel's step of its soonest deadline,
    moves it only to a sooner one, takes it out once nothing is pending,
    and the wheel calls it once that step is due."""
    loop: Any = asyncio.get_running_loop()
    wheel = DeadlineWheel(loop)
    socket = _Socket()
    deadlines = _deadlines()

    def steps() -> list[int]:
        return [step for step, record in wheel._steps.items() if socket in record.sockets]

    now = loop.time()
    deadlines.max_age_at = now + 60
    deadlines.arm(socket, wheel)
    assert steps() == [deadlines.due_step]
    deadlines.ping_at = now + 120  # later: it stays
    deadlines.arm(socket, wheel)
    assert len(steps()) == 1 and deadlines.due_step is not None
    assert deadlines.due_step * TICK >= now + 60
    deadlines.init_at = now + 0.01  # sooner: it moves
    deadlines.arm(socket, wheel)
    assert len(steps()) == 1 and deadlines.due_step * TICK < now + 1
    await asyncio.wait_for(socket.calls.wait(), 2)
    assert list(deadlines.due(loop.time())) == [INIT]
    deadlines.max_age_at = deadlines.ping_at = None
    deadlines.arm(socket, wheel)
    assert steps() == [] and deadlines.due_step is None
