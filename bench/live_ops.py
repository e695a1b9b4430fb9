"""Live operations in process: what a held subscription costs, served three ways.

    python bench/live_ops.py [--sessions 2000] [--rounds 20] [--repeat 3]

``--sessions`` subscriptions of one kit live field (`SubscriptionUnion.field`,
the session a real `SessionStream` handed out by a stand-in for the engine's
attach), each get a Reset, then one Upsert per round (one shared view, as a
cohort's is). The frames go to a socket stand-in that counts them (no
syscall: `ws_frames.py` measures the write). Three ways:

- ``strawberry``: today's operation: Strawberry's ``subscribe`` (parse and
  validation cached), the kit's resolver, direct frames (`frames.py`), one
  task per operation;
- ``live run``: `LiveOp.run`, a task per operation awaiting the session;
- ``live drain``: callback mode (`LiveOp.start` / `drain`): no task per
  operation once attached, the frames of a drain in one write;
- ``live fused``: callback mode with the socket's fused write
  (`LiveOp.start`'s ``direct``): a delta put into a caught-up session is
  written from the put (`LiveOp.frame_bytes`), no wake, no drain (skipped
  on a tree without it).

``--shared-deltas``: one Upsert object per round for every session (as a
render pass gives a cohort's sessions holding equal windows), not one each:
the fused write then builds a round's frame bytes once.

Reported side by side: process CPU per delivery (the session's ``put``, the
wake, the frame, the send; not the render pass), and the Python memory
held per live operation (tracemalloc, after the Reset: the operation's own
state, the session stream included).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import inspect
import os
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import strawberry

from service_engine.graphql import subscription_union
from service_engine.graphql.subscriptions import Live
from service_engine.impacts.model import Cause
from service_engine.render.deltas import Reset, Upsert
from service_engine.render.session import SessionId
from service_engine.render.stream import SessionStream
from service_engine.render.windows import Keys, WindowSpec
from service_engine.server import delivery, frames
from service_engine.server.live_ops import LiveOp, LiveOps

# The frame counting socket of bench/frames.py (loaded by path: this script
# also uses the engine's `frames` module under that name).
_spec = importlib.util.spec_from_file_location(
    "bench_frames", Path(__file__).resolve().parent / "frames.py")
assert _spec is not None and _spec.loader is not None
_bench_frames = importlib.util.module_from_spec(_spec)
sys.modules["bench_frames"] = _bench_frames
_spec.loader.exec_module(_bench_frames)
_Counted = _bench_frames._Frames
_Socket = _bench_frames._Socket

try:
    from bench.frames import BoardView, _view
except ModuleNotFoundError:  # run as a script from bench/
    from frames import BoardView, _view  # type: ignore[no-redef]

BOARDS = subscription_union("LiveBoards", BoardView)
WINDOW: WindowSpec[Any] = WindowSpec(Keys(frozenset()))  # type: ignore[arg-type]
DOCUMENT = """subscription { boards { __typename
  ... on LiveBoardsReset { revision keys }
  ... on LiveBoardsUpsert { revision key view { id title archived kind affordances { action allowed reason } } cause { name } }
  ... on LiveBoardsRemove { revision key } } }"""
PAYLOAD = {"query": DOCUMENT}


@strawberry.type
class Query:
    ping: str = "pong"


@strawberry.type
class Subscription:
    @BOARDS.field
    def boards(self) -> Live:
        return Live("boards", WINDOW)


SCHEMA = strawberry.Schema(query=Query, subscription=Subscription, types=BOARDS.types)
SCHEMA.extensions = (*delivery.document_caches(),)
SCHEMA.execution_context_class = delivery.live_executor_class(SCHEMA.execution_context_class)


@dataclass
class _Engine:
    streams: list[SessionStream[Any]] = field(default_factory=list)

    async def attach(self, principal: Any, projector: str, window: Any, *,
                     applier: Any = None, session_id: str | None = None) -> SessionStream[Any]:
        stream: SessionStream[Any] = SessionStream(
            SessionId(f"s{len(self.streams)}"), 10_000, lambda: None)
        stream.put(Reset(1, {}))
        self.streams.append(stream)
        return stream

    def lanes_of(self, projector: str) -> frozenset[str]:
        return frozenset()


@dataclass
class _Context:
    engine: _Engine
    principal: Any = "ann"


async def _strawberry(context: _Context, socket: _Socket, op_id: str, ops: LiveOps) -> None:
    with frames.open_sink(socket, op_id), ops.learning(PAYLOAD):  # type: ignore[arg-type]
        result = await SCHEMA.subscribe(DOCUMENT, context_value=context)
        async for event in result:  # type: ignore[union-attr]
            raise AssertionError(event)  # every member is planned: none reaches here


def fused_supported() -> bool:
    """Whether this tree's `LiveOp.start` takes the owner's fused write."""
    return "direct" in inspect.signature(LiveOp.start).parameters


async def measure(variant: str, sessions: int, rounds: int,
                  shared: bool = False) -> tuple[float, float]:
    """(CPU µs per delivery, bytes held per operation)."""
    engine = _Engine()
    context = _Context(engine)
    counted = _Counted()
    ops = LiveOps(SCHEMA, encode=lambda m: delivery.dumps(m))
    # The document's first subscribe, as on a pod: it makes the document known.
    first = asyncio.create_task(_strawberry(context, _Socket(counted), "learn", ops))
    await counted.until(1)
    first.cancel()
    engine.streams.clear()
    counted.count = 0
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held: list[Any] = []
    if variant == "strawberry":
        for i in range(sessions):
            held.append(asyncio.create_task(
                _strawberry(context, _Socket(counted), str(i), ops)))
    else:
        for i in range(sessions):
            op = ops.open(str(i), PAYLOAD, context)
            assert op is not None
            held.append(op)
        if variant == "live run":
            socket = _Socket(counted)
            sinks = [frames.FrameSink(socket, str(i)) for i in range(sessions)]  # type: ignore[arg-type]
            held = [asyncio.create_task(op.run(sink.text))
                    for op, sink in zip(held, sinks, strict=True)]
            held.extend(sinks)
        else:
            loop = asyncio.get_running_loop()
            dirty: list[LiveOp] = []

            def write(texts: list[str]) -> None:
                counted.add(len(texts))  # one transport.write per socket per drain

            def flush() -> None:
                woken = dirty[:]
                dirty.clear()
                for op in woken:
                    while op.drain(write):
                        pass

            def wake(op: LiveOp) -> None:
                if not dirty:
                    loop.call_soon(flush)
                dirty.append(op)

            def direct(op: LiveOp, delta: Any, revision: int) -> bool:
                data = op.frame_bytes(delta, revision)
                if data is None:
                    return False
                counted.add(1)  # one transport.write of these bytes
                return True

            for op in held:
                if variant == "live fused":
                    op.start(wake, lambda _id: None, direct)
                else:
                    op.start(wake, lambda _id: None)
    await counted.until(sessions)
    gc.collect()
    per_op = (tracemalloc.get_traced_memory()[0] - before) / sessions
    tracemalloc.stop()
    cause = Cause("board.renamed", {})
    views = [_view(n) for n in range(rounds)]
    streams = engine.streams
    gc.collect()
    began = time.process_time()
    for n in range(rounds):
        view = views[n]
        if shared:
            delta = Upsert(n + 2, '"b1"', view, cause)
            for stream in streams:
                stream.put(delta)
        else:
            for stream in streams:
                stream.put(Upsert(n + 2, '"b1"', view, cause))
        await counted.until(sessions * (n + 2))
    used = time.process_time() - began
    for stream in streams:
        stream.end("done")
    for item in held:
        if isinstance(item, asyncio.Task):
            await item
    return used / (sessions * rounds) * 1e6, per_op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shared-deltas", action="store_true",
                        help="one Upsert object per round for every session (a cohort's)")
    parser.add_argument("--variants", default="strawberry,live run,live drain,live fused")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",")
                if v != "live fused" or fused_supported()]
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for _ in range(args.repeat):  # interleaved, so load drifts touch every variant
        for variant, got in results.items():
            got.append(asyncio.run(
                measure(variant, args.sessions, args.rounds, args.shared_deltas)))
    print(f"load average {os.getloadavg()[0]:.2f}; {args.sessions} sessions x {args.rounds} "
          f"rounds; one shared view; {'shared' if args.shared_deltas else 'own'} delta objects")
    print(f"{'variant':12} {'us/delivery best':>17} {'median':>8} {'KB held/op':>11}")
    for variant, got in results.items():
        cpu = sorted(c for c, _ in got)
        mem = sorted(m for _, m in got)
        print(f"{variant:12} {cpu[0]:17.1f} {cpu[len(cpu) // 2]:8.1f} "
              f"{mem[len(mem) // 2] / 1024:11.2f}")


if __name__ == "__main__":
    main()
