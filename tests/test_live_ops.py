"""Task-free live operations: the frames of a known document, without Strawberry per operation.

A kit live field's document is run once the ordinary way (Strawberry's
subscribe, direct frames, under `LiveOps.learning`); the next subscribe of
that document is a `LiveOp`. Over the same session deltas, driven as the
socket drives it (`LiveOp.start` / `LiveOp.drain`), it must send the bytes
the ordinary path sends, its ``complete`` included. The session here is a real `SessionStream` handed
out by a stand-in for the engine's attach (the render side is not under
test).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import strawberry
from strawberry.types import ExecutionResult

from service_engine.config import EngineConfig
from service_engine.graphql.delivery_plan import dumps
from service_engine.graphql.subscriptions import Live
from service_engine.render.deltas import Remove, Reset, Upsert
from service_engine.render.session_id import SessionId
from service_engine.render.stream import SessionStream
from service_engine.render.windows import Keys, WindowSpec
from service_engine.server.app import _DOCUMENT_FIXED, limited_schema
from service_engine.server.live_op import LiveOp
from service_engine.server.live_ops import LiveOps, per_operation_extensions

from .loop_support import CallbackAttach
from .test_delivery_frames import DELTAS
from .test_delivery_plan import (
    ALPHA,
    BETA,
    CAUSE,
    DOCUMENTS,
    FRAGMENTS,
    FULL,
    RESOLVED,
    THINGS,
    Kind,
    ThingView,
)
from .test_delivery_plan import Query as _Query

WINDOW: WindowSpec[Any] = WindowSpec(Keys(frozenset()))


@strawberry.type
class LiveSubscription:
    @THINGS.field(description="Things, live.")
    def things(self, limit: int = 10, kind: Kind | None = None) -> Live:
        # The arguments as the request received them (an enum converted).
        return Live("things", WINDOW, session_id=f"{limit}-{kind!r}")

    @THINGS.field
    def lanes(self) -> Live:
        return Live("laned", WINDOW)

    @THINGS.field
    def with_info(self, info: strawberry.Info) -> Live:
        return Live("things", WINDOW)


ORDINARY_SCHEMA = strawberry.Schema(
    query=_Query, subscription=LiveSubscription, types=THINGS.types)
SCHEMA = limited_schema(ORDINARY_SCHEMA, EngineConfig(service="live-ops-test"))
"""As an app serves it: its documents seen by their validation (the plan's input)."""


@dataclass
class _Engine(CallbackAttach):
    """The engine's attach as the kit calls it: a real session stream, pre-filled."""

    deltas: list[Any]
    end: bool = True
    fail: Exception | None = None
    streams: list[SessionStream[Any]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    attached: list[tuple[str, str | None]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once an attach reached its gate."""
    notices: list[_Notices] = field(default_factory=list)

    async def attach(self, principal: Any, projector: str, window: Any, *,
                     applier: Any = None, session_id: str | None = None) -> SessionStream[Any]:
        if self.gate is not None:
            self.entered.set()
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.attached.append((projector, session_id))
        sid = SessionId(f"s-{len(self.streams)}")
        stream: SessionStream[Any] = SessionStream(
            sid, 1000, lambda: self.closed.append(sid))
        for delta in self.deltas:
            stream.put(delta)
        if self.end:
            stream.end("test")
        self.streams.append(stream)
        return stream

    def lane_notices(self, lanes: Any) -> Any:
        notices = _Notices()
        self.notices.append(notices)
        return notices

    def lanes_of(self, projector: str) -> frozenset[str]:
        return frozenset({"presence"}) if projector == "laned" else frozenset()


class _Notices:
    """A lane notice stream as the engine hands one out (`LaneNoticeStream`)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = False

    def __aiter__(self) -> _Notices:
        return self

    async def __anext__(self) -> Any:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class _Context:
    engine: _Engine
    principal: Any = "ann"


def _ops(schema: strawberry.Schema = SCHEMA, size: int = 16) -> LiveOps:
    return LiveOps(schema, encode=lambda m: dumps(m), size=size)


def _payload(query: str, variables: dict[str, Any] | None = None,
             name: str | None = None) -> dict[str, Any]:
    return {"query": query, "variables": variables, "operationName": name}


async def _ordinary(ops: LiveOps | None, payload: dict[str, Any], engine: _Engine,
                    op_id: str = "op-1") -> list[str]:
    """What the socket sends for one subscribe the ordinary way (Strawberry's
    execution), the complete at the stream's end included."""
    sent: list[str] = []
    context = _Context(engine)
    schema = SCHEMA

    async def run() -> None:
        stream = await schema.subscribe(
            payload["query"], variable_values=payload.get("variables"),
            context_value=context, operation_name=payload.get("operationName"))
        if isinstance(stream, ExecutionResult):  # pragma: no cover - not here
            raise AssertionError(stream)
        async for result in stream:
            body: dict[str, Any] = {"data": result.data}
            if result.errors:
                body["errors"] = [e.formatted for e in result.errors]
            sent.append(dumps({"id": op_id, "type": "next", "payload": body}))
        sent.append(dumps({"id": op_id, "type": "complete"}))

    if ops is None:
        await run()
    else:
        with ops.learning(payload):
            await run()
    return sent


async def _callback(op: LiveOp, budget: int = 256) -> tuple[list[str], list[list[str]], list[str]]:
    """Callback mode driven as a socket would: drain on every wake."""
    writes: list[list[str]] = []
    done: list[str] = []
    woken = asyncio.Event()
    op.start(lambda _op: woken.set(), done.append)
    while not done:
        await asyncio.wait_for(woken.wait(), 5)
        woken.clear()
        while op.drain(writes.append, budget):
            pass
    return [text for write in writes for text in write], writes, done


KNOWN = [(query, variables, None) for query, variables in DOCUMENTS] + [
    (FRAGMENTS, None, "Named"),
]
"""The documents every delivery path serves byte for byte, and one named by its operation."""


@pytest.mark.parametrize(("query", "variables", "name"), KNOWN)
async def test_a_known_document_sends_the_ordinary_bytes_both_ways(
    query: str, variables: dict[str, Any] | None, name: str | None
) -> None:
    """Aliases, __typename, inline and named fragments, an operation name, variables in
    arguments and @skip / @include; a Reset, Upserts (one of an equal, distinct view), a
    Remove, the session's end: the second subscribe of the document is a LiveOp, and it
    sends the ordinary path's bytes, ``complete`` last."""
    ops = _ops()
    payload = _payload(query, variables, name)
    expected = await _ordinary(ops, payload, _Engine(DELTAS))
    if query is RESOLVED:  # a field with a resolver: never planned, never a LiveOp
        assert ops.known == 0 and ops.open("op-1", payload, _Context(_Engine(DELTAS))) is None
        return
    assert ops.known == 1
    assert expected[-1] == '{"id":"op-1","type":"complete"}' and len(expected) == len(DELTAS) + 1
    engine = _Engine(DELTAS)
    op = ops.open("op-1", payload, _Context(engine))
    assert op is not None
    texts, writes, done = await _callback(op)
    assert texts == expected and done == ["op-1"]
    assert len(writes) == 1  # every queued frame, the complete too, in one write
    assert engine.closed == ["s-0"]  # the session detached


async def test_arguments_reach_the_request_as_strawberry_converts_them() -> None:
    """The field's arguments, from variables, literals and defaults (an enum converted to
    its Python member), are what the request receives on the ordinary path."""
    ops = _ops()
    query = "subscription($n: Int, $k: Kind) { things(limit: $n, kind: $k) { __typename } }"
    await _ordinary(ops, _payload(query, {"n": 7}), _Engine(DELTAS))
    literal = "subscription { things(limit: 4, kind: NOTE) { __typename } }"
    await _ordinary(ops, _payload(literal), _Engine(DELTAS))
    cases = [(query, {"n": 3, "k": "TASK"}), (query, None), (query, {}), (literal, None)]
    later = _Engine(DELTAS)
    for document, variables in cases:
        op = ops.open("op-1", _payload(document, variables), _Context(later))
        assert op is not None
        await _callback(op)
    ordinary = _Engine(DELTAS)
    for document, variables in cases:
        await _ordinary(None, _payload(document, variables), ordinary)
    assert later.attached == ordinary.attached
    assert [sid for _, sid in later.attached] == [
        "3-<Kind.TASK: 'task'>", "10-None", "10-None", "4-<Kind.NOTE: 'note'>"]


async def test_a_document_without_variables_gives_every_subscribe_its_arguments() -> None:
    """A known document without variables (its arguments literals and defaults, kept after
    its first LiveOp) calls the request for every subscribe with what the ordinary path
    gives it, whatever variables the message carries; variables that are not an object
    still go the ordinary way."""
    ops = _ops()
    literal = "subscription { things(kind: NOTE) { __typename } }"
    await _ordinary(ops, _payload(literal), _Engine(DELTAS))
    cases: list[Any] = [None, {}, {"unused": 1}, None]
    later = _Engine(DELTAS)
    for variables in cases:
        op = ops.open("op-1", _payload(literal, variables), _Context(later))
        assert op is not None
        await _callback(op)
    ordinary = _Engine(DELTAS)
    for variables in cases:
        await _ordinary(None, _payload(literal, variables), ordinary)
    assert later.attached == ordinary.attached == [("things", "10-<Kind.NOTE: 'note'>")] * 4
    context = _Context(_Engine(DELTAS))
    assert ops.open("a", _payload(literal, cast(Any, [1])), context) is None


async def test_only_a_known_planned_document_opens() -> None:
    """A first subscribe, another operation name, variables that fail coercion, a field that
    takes info, a shape the plan cannot express and a schema extension acting per operation
    all go the ordinary way (open answers None)."""
    ops = _ops()
    context = _Context(_Engine(DELTAS))
    assert ops.open("a", _payload(FULL), context) is None  # never run here
    await _ordinary(ops, _payload(FULL), _Engine(DELTAS))
    assert ops.open("a", _payload(FULL, name="Other"), context) is None
    assert ops.open("a", _payload(FULL, variables=cast(Any, [1])), context) is None
    typed = "subscription($n: Int) { things(limit: $n) { __typename } }"
    await _ordinary(ops, _payload(typed, {"n": 1}), _Engine(DELTAS))
    assert ops.open("a", _payload(typed, {"n": "x"}), context) is None
    assert ops.open("a", _payload(typed, {"n": 2}), context) is not None
    for query in (
        "subscription { withInfo { __typename } }",
        "subscription { things { ... on ThingsUpsert { view { shout } } } }",
        "subscription { ... on LiveSubscription { things { __typename } } }",
    ):
        await _ordinary(ops, _payload(query), _Engine(DELTAS))
        assert ops.open("a", _payload(query), context) is None, query
    assert ops.known == 2

    class Tracing(strawberry.extensions.SchemaExtension):
        def on_operation(self) -> Any:
            yield

    traced = strawberry.Schema(query=_Query, subscription=LiveSubscription,
                               types=THINGS.types, extensions=[Tracing])
    assert per_operation_extensions(traced) == ["Tracing"]
    assert per_operation_extensions(SCHEMA, _DOCUMENT_FIXED) == []


async def test_known_documents_are_a_bounded_lru() -> None:
    """Past its size the least recently used document is forgotten (its next subscribe is
    ordinary again, and learns it anew)."""
    ops = _ops(size=2)
    queries = [f"subscription {{ things(limit: {n}) {{ __typename }} }}" for n in range(3)]
    for query in queries[:2]:
        await _ordinary(ops, _payload(query), _Engine(DELTAS))
    context = _Context(_Engine(DELTAS))
    assert ops.open("a", _payload(queries[0]), context) is not None  # now the most recent
    await _ordinary(ops, _payload(queries[2]), _Engine(DELTAS))
    assert ops.known == 2
    assert ops.open("a", _payload(queries[1]), context) is None
    assert ops.open("a", _payload(queries[0]), context) is not None


async def test_an_event_the_plan_refuses_is_executed_as_the_ordinary_path_does() -> None:
    """A null where the schema says non-null: that event's frame is graphql-core's error,
    the same bytes as the ordinary path's, and the next event is planned again."""
    broken = ThingView(id=strawberry.ID("t3"), title=None, archived=False,  # type: ignore[arg-type]
                       tags=[], kind=Kind.TASK, owner=None)
    deltas = [Reset(1, {'"t1"': ALPHA}), Upsert(2, '"t3"', broken), Upsert(3, '"t1"', ALPHA)]
    ops = _ops()
    expected = await _ordinary(ops, _payload(FULL), _Engine(deltas))
    assert '"errors"' in expected[1] and '"errors"' not in expected[2]
    op = ops.open("op-1", _payload(FULL), _Context(_Engine(deltas)))
    assert op is not None
    assert (await _callback(op))[0] == expected


async def test_a_refused_attach_sends_what_the_ordinary_path_sends() -> None:
    """The engine refuses the attach: the ordinary path's ``next`` carrying the error, then
    ``complete``."""
    ops = _ops()
    await _ordinary(ops, _payload(FULL), _Engine(DELTAS))
    refusing = _Engine(DELTAS, fail=RuntimeError("attach refused: too many sessions"))
    expected = await _ordinary(None, _payload(FULL), refusing)
    assert expected == [
        '{"id":"op-1","type":"next","payload":{"data":null,"errors":'
        '[{"message":"attach refused: too many sessions"}]}}',
        '{"id":"op-1","type":"complete"}',
    ]
    op = ops.open("op-1", _payload(FULL), _Context(refusing))
    assert op is not None
    texts, _writes, done = await _callback(op)
    assert texts == expected and done == ["op-1"]


async def test_drain_takes_at_most_its_budget_and_says_when_more_wait() -> None:
    """A drain hands at most ``budget`` frames to one write and answers True while more
    (or the end) wait; the frames are in order across drains."""
    ops = _ops()
    expected = await _ordinary(ops, _payload(FULL), _Engine(DELTAS))
    op = ops.open("op-1", _payload(FULL), _Context(_Engine(DELTAS)))
    assert op is not None
    texts, writes, _done = await _callback(op, budget=2)
    assert texts == expected
    assert [len(w) for w in writes] == [2, 2, 2]


async def test_callback_mode_wakes_once_per_batch_and_follows_flow_control() -> None:
    """The waker is called once for a burst of deltas queued before the drain, not while
    paused (the subscriber counts as not reading: ``waiting`` 0, ``last_seen`` from the
    pause), and at once on resume when frames wait; close detaches and ends the calls."""
    ops = _ops()
    await _ordinary(ops, _payload(FULL), _Engine(DELTAS))
    engine = _Engine([Reset(1, {'"t1"': ALPHA})], end=False)
    op = ops.open("op-1", _payload(FULL), _Context(engine))
    assert op is not None
    wakes: list[LiveOp] = []
    writes: list[list[str]] = []
    attached = asyncio.Event()
    def wake(o: LiveOp) -> None:
        wakes.append(o)
        attached.set()

    op.start(wake, lambda _id: None)
    await asyncio.wait_for(attached.wait(), 5)
    (stream,) = engine.streams
    assert wakes == [op] and stream.waiting == 1  # reading: the render side sees it active
    stream.put(Upsert(2, '"t1"', ALPHA, CAUSE))
    assert wakes == [op]  # not drained yet: no second wake
    assert op.drain(writes.append) is False
    assert [len(w) for w in writes] == [2]
    stream.put(Upsert(3, '"t2"', BETA))
    stream.put(Upsert(4, '"t2"', BETA))
    assert len(wakes) == 2
    op.pause()
    before = time.monotonic()
    assert stream.waiting == 0 and stream.last_seen >= before - 1
    assert op.drain(writes.append) is False and len(writes) == 1  # takes nothing paused
    stream.put(Remove(5, '"t2"', CAUSE))
    assert len(wakes) == 2
    op.resume()
    assert len(wakes) == 3 and stream.waiting == 1
    op.drain(writes.append)
    assert [len(w) for w in writes] == [2, 3]
    op.close()
    assert engine.closed == ["s-0"]
    stream.put(Upsert(6, '"t1"', ALPHA))
    assert len(wakes) == 3 and op.drain(writes.append) is False and len(writes) == 2


async def test_closing_during_the_attach_detaches_and_sends_nothing() -> None:
    """A complete (or the socket's end) while the attach is pending: the attach is
    cancelled, and a session that attached anyway is detached; nothing is written."""
    ops = _ops()
    await _ordinary(ops, _payload(FULL), _Engine(DELTAS))
    engine = _Engine(DELTAS, gate=asyncio.Event())
    op = ops.open("op-1", _payload(FULL), _Context(engine))
    assert op is not None
    calls: list[object] = []
    op.start(calls.append, calls.append)
    await asyncio.wait_for(engine.entered.wait(), 1)
    attaching = op._attaching
    assert attaching is not None
    op.close()
    engine.gate.set()  # type: ignore[union-attr]
    await asyncio.wait_for(asyncio.gather(attaching, return_exceptions=True), 1)
    assert calls == [] and engine.streams == [] and op.drain(calls.append) is False


async def test_a_closed_op_detaches_its_session() -> None:
    """The socket closes the op (complete, disconnect, session_max_age) while it is live:
    the session is detached, no complete is sent and nothing more is written."""
    ops = _ops()
    await _ordinary(ops, _payload(FULL), _Engine(DELTAS))
    engine = _Engine(DELTAS, end=False)
    op = ops.open("op-1", _payload(FULL), _Context(engine))
    assert op is not None
    sent: list[str] = []
    woken = asyncio.Event()
    done: list[str] = []
    op.start(lambda _op: woken.set(), done.append)
    await asyncio.wait_for(woken.wait(), 5)
    assert op.drain(sent.extend) is False and len(sent) == len(DELTAS)
    op.close()
    assert engine.closed == ["s-0"] and done == []
    assert '"complete"' not in sent[-1] and op.drain(sent.extend) is False


def test_the_waker_is_called_only_when_nobody_awaits() -> None:
    """SessionStream.set_waker: a put wakes the callback once until the next take; none is
    called for a stream nobody set one on; clearing it marks the subscriber not reading."""
    stream: SessionStream[Any] = SessionStream(SessionId("s"), 100, lambda: None)
    calls: list[int] = []
    stream.put(Reset(1, {}))
    stream.set_waker(lambda: calls.append(1))
    assert calls == [1] and stream.waiting == 1  # something waited: called at once
    stream.put(Upsert(2, '"k"', ALPHA))
    assert calls == [1]
    assert stream.get_nowait() is not None
    stream.put(Upsert(3, '"k"', BETA))
    assert calls == [1, 1]
    stream.set_waker(None)
    assert stream.waiting == 0
    stream.end("bye")
    assert calls == [1, 1]


LANED = """subscription { lanes { __typename
  ... on ThingsReset { revision keys }
  ... on ThingsUpsert { revision key view { title } }
  ... on LanesPaused { lanes }
  ... on LanesResumed { lanes }
} }"""


class _Watched(list[str]):
    """A list of frames whose growth sets an event."""

    def __init__(self) -> None:
        super().__init__()
        self.grew = asyncio.Event()

    def append(self, item: str) -> None:
        super().append(item)
        self.grew.set()

    def extend(self, items: Any) -> None:
        super().extend(items)
        self.grew.set()

    async def reach(self, n: int) -> None:
        async def wait() -> None:
            while len(self) < n:
                self.grew.clear()
                await self.grew.wait()
        await asyncio.wait_for(wait(), 5)


async def _scripted(drive: Any, engine: _Engine, sent: _Watched) -> None:
    """Feed a laned session step by step (each step's frame arrives before the next is
    fed, as a notice and a render pass are apart in time) while ``drive`` serves it."""
    from service_engine.lanes.notices import LaneNotice

    task = asyncio.create_task(drive)
    arrived = sent.reach
    await arrived(1)  # the Reset
    (stream,), (notices,) = engine.streams, engine.notices
    notices.queue.put_nowait(LaneNotice.pause(["presence"]))
    await arrived(2)
    stream.put(Upsert(2, '"t1"', ALPHA))
    await arrived(3)
    notices.queue.put_nowait(LaneNotice.resume(["presence"]))
    await arrived(4)
    stream.put(Reset(3, {'"t1"': ALPHA, '"t2"': BETA}))
    await arrived(5)
    stream.end("test")
    await asyncio.wait_for(task, 5)
    assert notices.closed


async def test_lane_notices_are_merged_in_as_the_ordinary_path_merges_them() -> None:
    """A projector watching a NATS lane: its LanesPaused / LanesResumed notices between the
    session's Reset, Upsert and Reset are the ordinary path's bytes, and the notice stream is
    closed at the end."""
    ops = _ops()
    payload = _payload(LANED)
    engine = _Engine([Reset(1, {'"t1"': ALPHA})], end=False)
    expected = _Watched()

    async def ordinary_run() -> None:
        with ops.learning(payload):
            stream = await SCHEMA.subscribe(LANED, context_value=_Context(engine))
            async for result in stream:
                body: dict[str, Any] = {"data": result.data}
                expected.append(dumps({"id": "op-1", "type": "next", "payload": body}))
        expected.append(dumps({"id": "op-1", "type": "complete"}))

    await _scripted(ordinary_run(), engine, expected)
    assert ops.known == 1 and len(expected) == 6
    assert '"LanesPaused"' in expected[1] and '"LanesResumed"' in expected[3]

    engine = _Engine([Reset(1, {'"t1"': ALPHA})], end=False)
    op = ops.open("op-1", payload, _Context(engine))
    assert op is not None
    drained = _Watched()
    done = _Watched()
    loop = asyncio.get_running_loop()

    def wake(live: LiveOp) -> None:
        loop.call_soon(lambda: live.drain(drained.extend))

    op.start(wake, done.append)
    await _scripted(done.reach(1), engine, drained)
    assert drained == expected and done == ["op-1"]
