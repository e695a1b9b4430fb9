"""The subscription side of a delivery, in process: from a session's delta to the frame text.

    python bench/frames.py [--sessions 1000] [--rounds 20] [--equal-views]

``--sessions`` live subscriptions (one task each, Strawberry's ``subscribe``
over a field that serves a `SessionStream` as the kit's live field does,
the parse and validation caches on) each get one Upsert per round, all of
one view (``--equal-views``: an equal copy per session, as a view projected
per principal is). Each frame is handed to an ASGI ``send`` that keeps it
(no socket: `ws_frames.py` measures the write). Reported: process CPU per
delivery for

- ``executed``: graphql-core's execution per subscriber per event;
- ``planned``: the delivery plan, each event still through graphql-core's
  per-event executor and Strawberry's result path (``encode_frame``);
- ``direct``: the frames written by the operation's task (`frames.py`).

The session side (``put``, waking the task) is included; the render pass and
the socket are not.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import enum
import gc
import os
import time
from collections.abc import AsyncGenerator
from typing import Any

import strawberry
from starlette.websockets import WebSocketState

from service_engine.graphql import subscription_union
from service_engine.impacts.model import Cause
from service_engine.render.deltas import Reset, Upsert
from service_engine.render.session import SessionId
from service_engine.render.stream import SessionStream
from service_engine.server import delivery, frames
from service_engine.server.frames import _shared_plan


@strawberry.enum
class Kind(enum.Enum):
    TASK = "task"


@strawberry.type
class Affordance:
    action: str
    allowed: bool
    reason: str | None = None


@strawberry.type
class BoardView:
    id: strawberry.ID
    title: str
    archived: bool
    kind: Kind
    affordances: list[Affordance]


BOARDS = subscription_union("Boards", BoardView)
DOCUMENT = """subscription { boards { __typename
  ... on BoardsReset { revision keys }
  ... on BoardsUpsert { revision key view { id title archived kind affordances { action allowed reason } } cause { name } }
  ... on BoardsRemove { revision key } } }"""


@strawberry.type
class Query:
    ping: str = "pong"


@strawberry.type
class Subscription:
    @strawberry.subscription(graphql_type=BOARDS.type)  # type: ignore[untyped-decorator]
    async def boards(self, info: strawberry.Info) -> AsyncGenerator[Any, None]:
        # The kit's live field once attached (subscriptions._live_resolver).
        stream = info.context["stream"]
        sink = frames.current_sink()
        shared = _shared_plan(info) if sink is not None else None
        if sink is None or shared is None:
            async for message in BOARDS.subscribe(stream, None):
                yield message
            return
        async for member in frames.planned_frames(BOARDS, stream, None, shared, sink):
            yield member


EXECUTED = strawberry.Schema(query=Query, subscription=Subscription, types=BOARDS.types)
EXECUTED.extensions = (*delivery.document_caches(),)
PLANNED = copy.copy(EXECUTED)
PLANNED.execution_context_class = delivery.live_executor_class(EXECUTED.execution_context_class)


class _Frames:
    """Frames sent on every socket, and an event when they reach ``target``."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.reached = asyncio.Event()

    def add(self, n: int) -> None:
        self.count += n
        if self.count >= self.target:
            self.reached.set()

    async def until(self, target: int) -> None:
        self.target = target
        if self.count < target:
            self.reached.clear()
            await self.reached.wait()


class _Socket:
    application_state = WebSocketState.CONNECTED

    def __init__(self, counted: _Frames) -> None:
        self.counted = counted

    async def send(self, message: dict[str, Any]) -> None:
        self.counted.add(1)


async def _session(schema: strawberry.Schema, stream: SessionStream[Any], socket: _Socket,
                   op_id: str, direct: bool) -> None:
    async def run() -> None:
        result = await schema.subscribe(DOCUMENT, context_value={"stream": stream})
        async for event in result:
            message = {"id": op_id, "type": "next", "payload": {"data": event.data}}
            text = delivery.encode_frame(message)
            await socket.send({"type": "websocket.send", "text": text or repr(message)})

    if direct:
        with frames.open_sink(socket, op_id):  # type: ignore[arg-type]
            await run()
    else:
        await run()


def _view(n: int) -> BoardView:
    return BoardView(id=strawberry.ID("b1"), title=f"w{n}", archived=False, kind=Kind.TASK,
                     affordances=[Affordance(action="archive", allowed=True),
                                  Affordance(action="rename", allowed=False, reason="no")])


async def measure(variant: str, sessions: int, rounds: int, equal_views: bool) -> float:
    schema = EXECUTED if variant == "executed" else PLANNED
    streams: list[SessionStream[Any]] = [
        SessionStream(SessionId(f"s{i}"), 10_000, lambda: None) for i in range(sessions)]
    counted = _Frames()
    sockets = [_Socket(counted) for _ in range(sessions)]
    tasks = [asyncio.create_task(_session(schema, s, k, str(i), variant == "direct"))
             for i, (s, k) in enumerate(zip(streams, sockets, strict=True))]
    for stream in streams:
        stream.put(Reset(1, {}))
    await counted.until(sessions)
    cause = Cause("board.renamed", {})
    # Built before the clock starts: projecting is the render pass's cost.
    views = [[copy.deepcopy(view) for _ in streams] if equal_views else [view] * sessions
             for view in map(_view, range(rounds))]
    gc.collect()
    began = time.process_time()
    for n in range(rounds):
        for stream, view in zip(streams, views[n], strict=True):
            stream.put(Upsert(n + 2, '"b1"', view, cause))
        await counted.until(sessions * (n + 2))
    used = time.process_time() - began
    for stream in streams:
        stream.end("done")
    await asyncio.gather(*tasks)
    return used / (sessions * rounds) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--equal-views", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"executed": [], "planned": [], "direct": []}
    for _ in range(args.repeat):  # interleaved, so load drifts touch every variant
        for variant, got in results.items():
            got.append(asyncio.run(measure(variant, args.sessions, args.rounds,
                                           args.equal_views)))
    print(f"load average {os.getloadavg()[0]:.2f}; {args.sessions} sessions x {args.rounds} "
          f"rounds; {'an equal view per session' if args.equal_views else 'one shared view'}")
    print(f"{'variant':10} {'us/delivery (best)':>19} {'median':>8}")
    for variant, got in results.items():
        got.sort()
        print(f"{variant:10} {got[0]:19.1f} {got[len(got) // 2]:8.1f}")


if __name__ == "__main__":
    main()
