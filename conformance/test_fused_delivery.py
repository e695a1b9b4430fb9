"""The fused write on the wire: a caught-up socket's frames go from the render pass's
put straight to its transport, a paused one's wait in its session's stream.

The reference service over real Postgres, served by the engine's own socket
(`service_engine.graphql.wire`); its known-planned live subscription is a
`LiveOp` in callback mode on each socket. A reader that keeps up is written
as each delta is put (`WireSocket._fused`); a reader that stops reading
pauses its transport, takes the ordinary path (queued, collapsed or Reset)
and, reading again, converges. Both see contiguous revisions.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service_engine.graphql.live_ops import LiveOp
from service_engine.graphql.wire import WireSocket

from .blackbox.harness import ADMIN, BOARDS_SUBSCRIPTION, CREATE, RENAME
from .example_support import BOUND, example_config, example_database, running
from .harness import wait_until
from .test_wire import INIT, _masked, _raw_upgrade, _read_frames


@pytest.fixture
async def store(pg_server: Any) -> AsyncIterator[Any]:
    async with example_database(pg_server) as provisioned:
        yield provisioned


class _Reader:
    """One subscriber's view of its ``boards`` frames: contiguous revisions
    (a Reset may restart them one past the last), the latest title of a board."""

    def __init__(self, board: str, revision: int) -> None:
        self.board = board
        self.revision = revision
        self.title = ""
        self.frames = 0

    def take(self, message: dict[str, Any]) -> None:
        assert message["type"] == "next" and not message["payload"].get("errors"), message
        member = message["payload"]["data"]["boards"]
        assert member["revision"] == self.revision + 1, (member["revision"], self.revision)
        self.revision = member["revision"]
        self.frames += 1
        if member["__typename"] == "BoardsReset":
            self.title = next(v["title"] for v in member["views"] if v["id"] == self.board)
        elif member["__typename"] == "BoardsUpsert" and member["key"] == json.dumps(self.board):
            self.title = member["view"]["title"]


async def test_a_caught_up_socket_and_a_paused_one_both_converge_with_contiguous_revisions(
    store: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two sockets hold the same live subscription of one board list. The one whose
    reader keeps up is written through the fused path (the frame written from the put:
    no queue, no drain) and receives every revision in order up to the latest title; the
    one whose reader stops pauses its transport, takes no fused write, has its deltas
    queued in its session's stream, and once it reads again receives contiguous
    revisions (collapsed, or a Reset) ending at the same latest title."""
    sockets: list[WireSocket] = []
    fused: Counter[int] = Counter()
    real_init = WireSocket.__init__
    real_fused = WireSocket._fused

    def spy(self: WireSocket, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        sockets.append(self)

    def counting(self: WireSocket, live: LiveOp, delta: Any, revision: int) -> bool:
        written = real_fused(self, live, delta, revision)
        if written:
            fused[id(self)] += 1
        return written

    monkeypatch.setattr(WireSocket, "__init__", spy)
    monkeypatch.setattr(WireSocket, "_fused", counting)
    board = "b-fused"
    async with running(store, ["board"], config=example_config()) as run:
        async with run.socket(ADMIN) as first:
            # The document's first subscribe (through Strawberry) makes it known.
            await first.subscribe("learn", BOARDS_SUBSCRIPTION)
            await first.next("learn")
            created = await run.gql(CREATE, {"id": board, "title": "t-start"}, ADMIN)
            assert created["createBoard"]["success"], created
            await first.next("learn")
        async with run.socket(ADMIN) as caught:
            await caught.subscribe("live", BOARDS_SUBSCRIPTION)
            reset = (await caught.next("live"))["boards"]
            assert reset["__typename"] == "BoardsReset"
            caught_wire = sockets[-1]
            assert isinstance(caught_wire._ops.get("live"), LiveOp)
            keeping_up = _Reader(board, reset["revision"])
            keeping_up.title = next(v["title"] for v in reset["views"] if v["id"] == board)

            async def read_caught() -> None:
                while True:
                    keeping_up.take(await caught.receive(BOUND))

            reading = asyncio.create_task(read_caught())
            raw = await _raw_upgrade(run.addr, rcvbuf=4096, passport=ADMIN.to_header())
            loop = asyncio.get_running_loop()
            try:
                buffer = b""
                while b"\r\n\r\n" not in buffer:
                    buffer += await loop.sock_recv(raw, 65536)
                buffer = buffer.partition(b"\r\n\r\n")[2]
                slow_wire = sockets[-1]
                await loop.sock_sendall(raw, _masked(json.dumps(INIT).encode()))
                await loop.sock_sendall(raw, _masked(json.dumps({
                    "id": "live", "type": "subscribe",
                    "payload": {"query": BOARDS_SUBSCRIPTION}}).encode()))
                got, buffer = await _read_frames(raw, buffer)
                assert json.loads(got[0]) == {"type": "connection_ack"}
                if len(got) == 1:
                    more, buffer = await _read_frames(raw, buffer)
                    got += more
                slow_reset = json.loads(got[1])["payload"]["data"]["boards"]
                assert slow_reset["__typename"] == "BoardsReset"
                slow = _Reader(board, slow_reset["revision"])
                slow.title = next(v["title"] for v in slow_reset["views"] if v["id"] == board)
                slow_op = slow_wire._ops.get("live")
                assert isinstance(slow_op, LiveOp)
                # A tiny send buffer on the slow socket's side: its transport pauses soon.
                server_sock = slow_wire.transport.get_extra_info("socket")
                server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                slow_wire.transport.set_write_buffer_limits(high=2048, low=512)
                title = ""
                for n in range(400):
                    title = f"t{n}-" + "x" * 190
                    renamed = await run.gql(RENAME, {"id": board, "title": title}, ADMIN)
                    assert renamed["renameBoard"]["success"], renamed
                    if not slow_wire.writable and n >= 20:
                        break
                assert not slow_wire.writable, "the slow transport never paused"
                paused_at = fused[id(slow_wire)]
                for n in range(20):
                    title = f"u{n}-" + "y" * 190
                    renamed = await run.gql(RENAME, {"id": board, "title": title}, ADMIN)
                    assert renamed["renameBoard"]["success"], renamed
                stream = slow_op._stream
                assert stream is not None
                await wait_until(lambda: stream.pending() > 0, what="deltas queued, untaken")
                assert fused[id(slow_wire)] == paused_at  # paused: no fused write
                await wait_until(lambda: reading.done() or keeping_up.title == title,
                                 timeout=BOUND, what="the caught-up reader at the latest title")
                if reading.done():
                    reading.result()  # its reader's failure, as raised
                    raise AssertionError("the caught-up socket stopped")
                # Every frame of the caught-up socket after its Reset was a fused write.
                assert fused[id(caught_wire)] == keeping_up.frames > 20
                # Reading again: contiguous revisions (or a Reset) up to the latest title.
                while slow.title != title:
                    frames, buffer = await _read_frames(raw, buffer)
                    for frame in frames:
                        message = json.loads(frame)
                        assert message["id"] == "live", message
                        slow.take(message)
            finally:
                raw.close()
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
