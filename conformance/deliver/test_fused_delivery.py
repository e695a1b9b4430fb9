"""The fused write on the wire: a caught-up socket's frames go from the render pass's
put straight to its transport, a paused one's wait in its session's stream.

The reference service over real Postgres, served by the engine's own socket
(`service_engine.server.wire`); its known-planned live subscription is a
`LiveOp` in callback mode on each socket. A reader that keeps up is written
as each delta is put (`WireSocket._fused`); a reader that stops reading
pauses its transport, takes the ordinary path (queued, collapsed or Reset)
and, reading again, converges. Both see contiguous revisions.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from service_engine.server.live_op import LiveOp
from service_engine.server.wire import WireSocket

from ..blackbox.harness import ADMIN, BOARDS_SUBSCRIPTION, CREATE, RENAME
from ..serve.test_wire import _raw_upgrade, _read_frames, raw_live_subscription, tiny_send_buffer
from ..support.example_support import BOUND, example_config, running
from ..support.harness import wait_until


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
            assert caught_wire.operations is not None
            assert isinstance(caught_wire.operations.ops.get("live"), LiveOp)
            keeping_up = _Reader(board, reset["revision"])
            keeping_up.title = next(v["title"] for v in reset["views"] if v["id"] == board)

            async def read_caught() -> None:
                while True:
                    keeping_up.take(await caught.receive(BOUND))

            reading = asyncio.create_task(read_caught())
            raw = await _raw_upgrade(run.addr, rcvbuf=4096, passport=ADMIN.to_header())
            try:
                reset_message, buffer = await raw_live_subscription(raw, BOARDS_SUBSCRIPTION)
                slow_wire = sockets[-1]
                slow_reset = reset_message["payload"]["data"]["boards"]
                assert slow_reset["__typename"] == "BoardsReset"
                slow = _Reader(board, slow_reset["revision"])
                slow.title = next(v["title"] for v in slow_reset["views"] if v["id"] == board)
                assert slow_wire.operations is not None
                slow_op = slow_wire.operations.ops.get("live")
                assert isinstance(slow_op, LiveOp)
                tiny_send_buffer(slow_wire)  # the slow socket's transport pauses soon
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
