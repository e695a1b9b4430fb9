"""Task-free live operations on the served socket, against real Postgres.

The reference service's board slice runs in process; a standard
graphql-transport-ws client subscribes. The first subscribe of a document
runs through Strawberry; the next one of the same document is a `LiveOp`
(seen by a spy on `LiveOps.open`, the engine itself untouched). Its frames
are the ordinary path's bytes, and the socket treats it as an operation:
``complete`` detaches its session, a duplicate id closes 4409, it counts
toward ``ws_max_subscriptions_per_socket``, ``session_max_age`` and a
disconnect detach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
from datetime import timedelta
from typing import Any

import pytest

from service_engine.embedded import ProvisionedDatabase
from service_engine.graphql import GraphQLContext
from service_engine.render.session import Session
from service_engine.render.stream import SessionStream
from service_engine.server.live_op import LiveOp
from service_engine.server.live_ops import LiveOps
from service_engine.server.wire import WireSocket

from ..blackbox.harness import ADMIN, BOARDS_SUBSCRIPTION, CREATE, RENAME, GqlSocket
from ..support.example_support import Running, example_config, running
from ..support.harness import wait_until

BOUND = 10.0

@pytest.fixture
def socket_kind() -> dict[str, Any]:
    """The config overrides of the served socket: none (the engine's own
    socket is the one socket path)."""
    return {}



@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids `LiveOps.open` served as a LiveOp (a spy: the real open runs)."""
    served: list[str] = []
    real = LiveOps.open

    def spy(self: LiveOps, operation_id: str, payload: Any, context: Any) -> LiveOp | None:
        op = real(self, operation_id, payload, context)
        if op is not None:
            served.append(operation_id)
        return op

    monkeypatch.setattr(LiveOps, "open", spy)
    return served


async def _frames(socket: GqlSocket, wanted: dict[str, int]) -> dict[str, list[str]]:
    """Raw frames by operation id until each op in ``wanted`` has that many."""
    got: dict[str, list[str]] = {op: [] for op in wanted}
    while any(len(got[op]) < n for op, n in wanted.items()):
        raw = await asyncio.wait_for(socket.ws.recv(), BOUND)
        assert isinstance(raw, str)
        got.setdefault(json.loads(raw)["id"], []).append(raw)
    return got


def _as(frames: list[str], op_id: str) -> list[str]:
    """The frames with their operation id replaced (the only per-op byte)."""
    return [f.replace(f'{{"id":"{json.loads(f)["id"]}"', f'{{"id":"{op_id}"', 1)
            for f in frames]


def _sessions(run: Running) -> int:
    return len(run.engine.render.sessions)


async def test_the_second_subscribe_of_a_document_is_a_live_op_with_the_same_bytes(
    store: ProvisionedDatabase, opened: list[str], socket_kind: dict[str, Any]
) -> None:
    """The first subscribe goes through Strawberry, the second (same socket) and a third
    (another socket) are LiveOps; all three receive the same bytes for the Reset, a create
    and a rename; a ``complete`` detaches the live op's session and it sends nothing more,
    while the others go on."""
    config = example_config(**socket_kind)
    async with running(store, ["board"], config=config) as run, run.socket(ADMIN) as a, \
            run.socket(ADMIN) as b:
        await a.subscribe("first", BOARDS_SUBSCRIPTION)
        first = await _frames(a, {"first": 1})
        await a.subscribe("second", BOARDS_SUBSCRIPTION)
        await b.subscribe("third", BOARDS_SUBSCRIPTION)
        second = await _frames(a, {"second": 1})
        third = await _frames(b, {"third": 1})
        assert opened == ["second", "third"]
        assert _as(second["second"], "first") == first["first"] == _as(third["third"], "first")
        created = await run.gql(CREATE, {"id": "b-live", "title": "Live \u00e9 \"q\""}, ADMIN)
        assert created["createBoard"]["success"], created
        on_a = await _frames(a, {"first": 1, "second": 1})
        on_b = await _frames(b, {"third": 1})
        assert _as(on_a["second"], "first") == on_a["first"] == _as(on_b["third"], "first")
        await a.send({"id": "second", "type": "complete"})
        await wait_until(lambda: _sessions(run) == 2, timeout=BOUND, what="second detached")
        renamed = await run.gql(RENAME, {"id": "b-live", "title": "renamed"}, ADMIN)
        assert renamed["renameBoard"]["success"], renamed
        on_a = await _frames(a, {"first": 1})
        on_b = await _frames(b, {"third": 1})
        assert set(on_a) == {"first"} and _as(on_b["third"], "first") == on_a["first"]
        await a.quiet(0.3)


async def test_a_live_op_is_an_operation_of_its_socket(
    store: ProvisionedDatabase, opened: list[str], socket_kind: dict[str, Any]
) -> None:
    """A live op counts toward ws_max_subscriptions_per_socket (the typed refusal, the
    socket stays up), its id is taken while it lives (4409), and closing the socket
    detaches its session."""
    config = example_config(ws_max_subscriptions_per_socket=2, **socket_kind)
    async with running(store, ["board"], config=config) as run:
        async with run.socket(ADMIN) as ws:
            await ws.subscribe("first", BOARDS_SUBSCRIPTION)
            await _frames(ws, {"first": 1})
            await ws.subscribe("second", BOARDS_SUBSCRIPTION)
            await _frames(ws, {"second": 1})
            assert opened == ["second"]
            await ws.subscribe("over", BOARDS_SUBSCRIPTION)
            refused = json.loads((await _frames(ws, {"over": 1}))["over"][0])
            assert refused["type"] == "error", refused
            assert refused["payload"][0]["extensions"]["code"] == "too_many_subscriptions"
            await ws.send({"id": "second", "type": "complete"})
            await wait_until(lambda: _sessions(run) == 1, timeout=BOUND, what="detached")
            await ws.subscribe("again", BOARDS_SUBSCRIPTION)
            await _frames(ws, {"again": 1})
            assert opened == ["second", "again"]
            await ws.subscribe("again", BOARDS_SUBSCRIPTION)
            ended, _at, _before = await ws.closed()
            assert ended.rcvd is not None and ended.rcvd.code == 4409, ended
        await wait_until(lambda: _sessions(run) == 0, timeout=BOUND, what="all detached")


async def test_session_max_age_stops_live_ops_before_closing(
    store: ProvisionedDatabase, opened: list[str], socket_kind: dict[str, Any]
) -> None:
    """At session_max_age the socket's live op is stopped (its session detached) and the
    socket closed with 1001 ``session_max_age``."""
    config = example_config(session_max_age=timedelta(seconds=3),
                            session_ttl=timedelta(seconds=1), **socket_kind)
    async with running(store, ["board"], config=config) as run, run.socket(ADMIN) as ws:
        await ws.subscribe("first", BOARDS_SUBSCRIPTION)
        await _frames(ws, {"first": 1})
        await ws.subscribe("second", BOARDS_SUBSCRIPTION)
        await _frames(ws, {"second": 1})
        assert opened == ["second"]
        ended, _at, _before = await ws.closed(timeout=BOUND)
        assert ended.rcvd is not None, ended
        assert (ended.rcvd.code, ended.rcvd.reason) == (1001, "session_max_age")
        await wait_until(lambda: _sessions(run) == 0, timeout=BOUND, what="all detached")


async def test_a_live_op_whose_frame_fails_ends_alone_with_its_error(
    store: ProvisionedDatabase, opened: list[str], socket_kind: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When one live op's frame cannot be built, that op ends as the ordinary path ends
    a stream that raised (a ``next`` carrying the error, then ``complete``) and its
    session is detached; the socket's other operations receive every later revision,
    contiguous, in both ways of driving a live op."""
    real = LiveOp._planned_frame

    def failing(self: LiveOp, delta: Any, revision: int | None) -> str | None:
        # Under both the fused write (`frame_bytes`) and the drain's `_frame`.
        if self.id == "bad" and type(delta).__name__ == "Upsert":
            raise RuntimeError("this frame cannot be built")
        return real(self, delta, revision)

    monkeypatch.setattr(LiveOp, "_planned_frame", failing)
    config = example_config(**socket_kind)
    async with running(store, ["board"], config=config) as run, run.socket(ADMIN) as a:
        created = await run.gql(CREATE, {"id": "b-fail", "title": "t"}, ADMIN)
        assert created["createBoard"]["success"], created
        for op in ("learn", "good", "bad"):
            await a.subscribe(op, BOARDS_SUBSCRIPTION)
            await _frames(a, {op: 1})
        assert opened == ["good", "bad"]
        renamed = await run.gql(RENAME, {"id": "b-fail", "title": "r0"}, ADMIN)
        assert renamed["renameBoard"]["success"], renamed
        got = await _frames(a, {"learn": 1, "good": 1, "bad": 2})
        error, complete = (json.loads(f) for f in got["bad"])
        assert error["type"] == "next" and error["payload"]["data"] is None
        assert error["payload"]["errors"][0]["message"] == "this frame cannot be built"
        assert complete == {"id": "bad", "type": "complete"}
        await wait_until(lambda: _sessions(run) == 2, timeout=BOUND, what="bad detached")
        revisions: dict[str, list[int]] = {"learn": [], "good": []}
        for i in (1, 2, 3):
            for op in revisions:
                revisions[op] += [json.loads(f)["payload"]["data"]["boards"]["revision"]
                                  for f in got[op]]
            if i == 3:
                break
            renamed = await run.gql(RENAME, {"id": "b-fail", "title": f"r{i}"}, ADMIN)
            assert renamed["renameBoard"]["success"], renamed
            got = await _frames(a, {"learn": 1, "good": 1})
            assert set(got) == {"learn", "good"}
        # (The create's own Upsert may reach a session after its Reset when the
        # render pass took it after the attach: the revisions are compared as a run.)
        for seen in revisions.values():
            assert seen == list(range(seen[0], seen[0] + 3)), revisions


def _held(kinds: tuple[type, ...]) -> dict[str, int]:
    """How many objects of each of ``kinds`` the process holds after a full collection."""
    gc.collect()
    counts = dict.fromkeys((kind.__name__ for kind in kinds), 0)
    for obj in gc.get_objects():
        for kind in kinds:
            if isinstance(obj, kind):
                counts[kind.__name__] += 1
    return counts


async def test_a_closed_session_leaves_no_engine_held_object_behind(
    store: ProvisionedDatabase, opened: list[str]
) -> None:
    """Sockets with live subscriptions (an ordinary operation through Strawberry
    and a task-free live op each), some closed by the client and some by a
    ``complete`` first: once they are gone and the pod holds no session,
    none of the objects a session was made of is left (the socket, its
    context, its operations, its session streams and render sessions), nor
    an entry for it in the endpoint's deadlines or attach gate."""
    kinds = (WireSocket, GraphQLContext, LiveOp, SessionStream, Session)
    async with running(store, ["board"], config=example_config()) as run:
        before = _held(kinds)
        for round_ in range(3):
            async with contextlib.AsyncExitStack() as stack:
                sockets = [await stack.enter_async_context(run.socket(ADMIN)) for _ in range(4)]
                for n, ws in enumerate(sockets):
                    await ws.subscribe("ordinary", BOARDS_SUBSCRIPTION)
                    await _frames(ws, {"ordinary": 1})
                    await ws.subscribe("live", BOARDS_SUBSCRIPTION)
                    await _frames(ws, {"live": 1})
                    if n % 2:
                        await ws.send({"id": "live", "type": "complete"})
                assert _sessions(run) > 0
            await wait_until(lambda: _sessions(run) == 0, timeout=BOUND, what="all detached")
            assert "live" in opened, round_
        await wait_until(lambda: _held(kinds) == before, timeout=BOUND,
                         what=f"nothing of a closed session held (before: {before})")
