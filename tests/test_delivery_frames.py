"""Direct frames: a planned live operation's frames written by its own task.

The frames the direct path writes, interleaved with the messages it hands
to Strawberry (the members the plan refuses), must be the bytes ordinary
execution sends for the same events, in the same order; the frame text is
Strawberry's encoding of the ``next`` message; a schema whose extensions act
per result is never served directly.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest
import strawberry
from graphql import OperationDefinitionNode, parse
from strawberry.extensions import SchemaExtension
from strawberry.http.exceptions import WebSocketDisconnected

from service_engine.config import EngineConfig
from service_engine.graphql.delivery_plan import Encoded, dumps
from service_engine.graphql.subscriptions import LanesPaused, LanesResumed
from service_engine.render.deltas import Remove, Reset, Upsert
from service_engine.render.session import SessionId
from service_engine.render.stream import SessionStream
from service_engine.server import delivery, frames
from service_engine.server.app import limited_schema
from service_engine.server.frames import _shared_plan, planned_frames

from .test_delivery_plan import (
    ALPHA,
    BETA,
    CAUSE,
    DOCUMENTS,
    FULL,
    GRAPHQL_SCHEMA,
    SERVED,
    THINGS,
    Kind,
    ThingView,
    _events,
)
from .test_delivery_plan import Query as _Query


class _Socket:
    """A socket as the sink writes to it: one message's text at a time, refused (as the
    engine's socket refuses it) once closed."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.closed = False

    async def send_text(self, text: str) -> None:
        if self.closed:
            raise WebSocketDisconnected
        self.sent.append(text)


def _stream(items: list[Any]) -> SessionStream[Any]:
    stream: SessionStream[Any] = SessionStream(SessionId("s-1"), 1000, lambda: None)
    for item in items:
        stream.put(item)
    stream.end("test")
    return stream


async def _notices(items: list[Any]) -> AsyncGenerator[Any, None]:
    for item in items:
        yield item


@strawberry.type
class DirectSubscription:
    @strawberry.subscription(graphql_type=THINGS.type)  # type: ignore[untyped-decorator]
    async def things(self, info: strawberry.Info, limit: int = 10) -> AsyncGenerator[Any, None]:
        # What the kit's live resolver does once the session is attached.
        sink = frames.current_sink()
        shared = _shared_plan(sink.schema, info) if sink is not None else None
        deltas, notices = info.context["deltas"], info.context["notices"]
        if sink is None or shared is None:
            async for message in THINGS.subscribe(_events(deltas), notices):
                yield message
            return
        async for member in planned_frames(THINGS, _stream(deltas), notices, shared, sink):
            yield member


DIRECT_ORDINARY = strawberry.Schema(
    query=_Query, subscription=DirectSubscription, types=THINGS.types)
"""Every event executed by graphql-core (no sink: the ordinary path)."""
DIRECT = limited_schema(DIRECT_ORDINARY, EngineConfig(service="frames-test"))
"""As served: its documents seen by their validation (the plan's input)."""


async def _wire(schema: strawberry.Schema, query: str, variables: dict[str, Any] | None,
                deltas: list[Any], notices: list[Any] | None, *, direct: bool) -> list[str]:
    """Every ``next`` frame the socket carries, in order: the sink's and Strawberry's."""
    socket = _Socket()
    context = {"deltas": deltas, "notices": _notices(notices) if notices is not None else None}

    async def run() -> None:
        stream = await schema.subscribe(query, variable_values=variables, context_value=context)
        async for result in stream:
            payload: dict[str, Any] = {"data": result.data}
            if result.errors:
                payload["errors"] = [e.formatted for e in result.errors]
            socket.sent.append(dumps({"id": "op-1", "type": "next", "payload": payload}))

    if direct:
        with frames.open_sink(socket.send_text, "op-1", schema):
            await run()
    else:
        await run()
    return socket.sent


DELTAS: list[Any] = [
    Reset(1, {'"t1"': ALPHA, '"t2"': BETA}),
    Upsert(2, '"t1"', ALPHA, CAUSE),
    Upsert(3, '"t2"', BETA),
    Remove(4, '"t2"', CAUSE),
    Upsert(5, '"t1"', copy.deepcopy(ALPHA), CAUSE),
]


@pytest.mark.parametrize(("query", "variables"), DOCUMENTS)
async def test_direct_frames_are_the_executed_frames_byte_for_byte(
    query: str, variables: dict[str, Any] | None
) -> None:
    """Aliases, __typename, fragments, variables, a Reset, Upserts (one of an equal, distinct
    view), a Remove, and a document the plan cannot express: what the socket carries is the
    bytes of ordinary execution."""
    direct = await _wire(DIRECT, query, variables, DELTAS, None, direct=True)
    assert direct == await _wire(DIRECT_ORDINARY, query, variables, DELTAS, None, direct=False)
    assert len(direct) == len(DELTAS)


async def test_lane_notices_are_merged_into_the_direct_frames() -> None:
    """Lane notices merged with the deltas are framed as ordinary delivery frames them, and
    every delta still arrives (the merge's order between two sources is theirs)."""
    notices = [LanesPaused(lanes=["presence"]), LanesResumed(lanes=["presence"])]
    direct = await _wire(DIRECT, FULL, None, DELTAS, notices, direct=True)
    ordinary = await _wire(DIRECT_ORDINARY, FULL, None, DELTAS, notices, direct=False)
    assert sorted(direct) == sorted(ordinary)
    kinds = [json.loads(f)["payload"]["data"]["things"]["__typename"] for f in direct]
    assert sorted(kinds) == sorted(["LanesPaused", "LanesResumed", "ThingsReset",
                                    "ThingsUpsert", "ThingsUpsert", "ThingsRemove",
                                    "ThingsUpsert"])


async def test_a_member_the_plan_refuses_goes_through_strawberry_in_order() -> None:
    """A null where the schema says non-null: that one member is executed by Strawberry (its
    error included), between the direct frames before and after it."""
    broken = ThingView(id=strawberry.ID("t3"), title=None, archived=False,  # type: ignore[arg-type]
                       tags=[], kind=Kind.TASK, owner=None)
    deltas = [Upsert(1, '"t1"', ALPHA), Upsert(2, '"t3"', broken), Upsert(3, '"t1"', ALPHA)]
    direct = await _wire(DIRECT, FULL, None, deltas, None, direct=True)
    assert direct == await _wire(DIRECT_ORDINARY, FULL, None, deltas, None, direct=False)
    assert ['"errors"' in f for f in direct] == [False, True, False]


async def test_a_closed_socket_ends_the_operation_as_strawberry_would() -> None:
    """Writing to a socket already closed raises Strawberry's WebSocketDisconnected, as its
    own send does, so the operation ends the same way."""
    socket = _Socket()
    sink = frames.FrameSink(socket.send_text, "op-1", DIRECT)
    data = Encoded(('{"x":',  "}"), 3)
    await sink.next(data)
    assert socket.sent == ['{"id":"op-1","type":"next","payload":{"data":{"x":3}}}']
    socket.closed = True
    with pytest.raises(WebSocketDisconnected):
        await sink.next(data)


def _ids() -> Iterator[str]:
    yield from ("1", "op-1", "a\"b\\c", "\u00e9\u4e2d", "emoji \U0001f600", "\x00\n\t", "")


@pytest.mark.parametrize("op_id", list(_ids()))
@pytest.mark.parametrize("data", [
    Encoded(('{"things":{"revision":', ',"t":"\\u00e9\\"q\\""}}'), 17),
    Encoded(('{"things":{"lanes":["a"]}}',), None),
    Encoded(('{"a":', ',"b":', "}"), 5),
])
def test_the_frame_is_strawberrys_encoding_of_the_next_message(op_id: str, data: Encoded) -> None:
    """The frame text is json.dumps of {"id", "type": "next", "payload": {"data"}} with
    Strawberry's separators, for any operation id."""
    message = {"id": op_id, "type": "next", "payload": {"data": data.value()}}
    assert frames.next_frame(frames.next_frame_head(op_id), data) == json.dumps(
        message, separators=(",", ":"))


def test_a_cohorts_delta_is_found_without_building_its_member() -> None:
    """shared answers a delta whose fields another session's member carried (equal or the
    same objects; its chunks, framed at the delta's own revision), and nothing for a changed
    view or cause, a Reset or a lane notice."""
    document = parse(FULL)
    operation = document.definitions[0]
    assert isinstance(operation, OperationDefinitionNode)
    shared = delivery.plan_for(GRAPHQL_SCHEMA, operation, {}, {})
    assert shared is not None
    first = shared.encode(THINGS.message(Upsert(2, '"t1"', ALPHA, CAUSE)))
    later = Upsert(9, '"t1"', copy.deepcopy(ALPHA), CAUSE)
    hit = shared.shared(THINGS.upsert, later)
    assert hit is not None and hit.chunks is first.chunks
    head = frames.next_frame_head("op")
    assert frames.next_frame(head, hit, later.revision) == frames.next_frame(
        head, shared.encode(THINGS.message(later)))
    changed = copy.deepcopy(ALPHA)
    changed.title = "other"
    assert shared.shared(THINGS.upsert, Upsert(10, '"t1"', changed, CAUSE)) is None
    assert shared.shared(THINGS.upsert, Upsert(10, '"t1"', ALPHA, None)) is None
    removed = shared.encode(THINGS.message(Remove(11, '"t1"', CAUSE)))
    hit = shared.shared(THINGS.remove, Remove(12, '"t1"', CAUSE))
    assert hit is not None and hit.chunks is removed.chunks
    reset = THINGS.message(Reset(1, {'"t1"': ALPHA}))
    shared.encode(reset)
    assert shared.shared(THINGS.reset, reset) is None  # a Reset's lists are the session's
    assert shared.shared(LanesPaused, LanesPaused(lanes=["x"])) is None


class _Tracing(SchemaExtension):
    def get_results(self) -> dict[str, Any]:
        return {"trace": 1}


class _Rewriting(SchemaExtension):
    def on_stream_result(self, result: Any) -> Iterator[None]:
        yield


class _Harmless(SchemaExtension):
    def on_execute(self) -> Iterator[None]:
        yield


@pytest.mark.parametrize(("extension", "allowed"), [
    (None, True), (_Harmless, True), (_Tracing, False), (_Rewriting, False)])
def test_extensions_acting_per_result_keep_the_direct_path_off(
    extension: type[SchemaExtension] | None, allowed: bool
) -> None:
    """An extension adding results or rewriting a streamed result would change Strawberry's
    message: such a schema is never served by direct frames."""
    schema = copy.copy(SERVED)
    schema.extensions = (extension,) if extension is not None else ()
    assert frames.direct_frames_allowed(schema) is allowed
