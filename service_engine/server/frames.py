"""Planned frames straight from the session stream to the socket.

For an operation whose payload the delivery plan expresses
(`service_engine.server.delivery.plan_for`), the frame is the plan's shared
serialisation with this session's revision and this operation's id spliced
in (`next_frame`): what Strawberry's encoder gives for ``{"id": id, "type":
"next", "payload": {"data": data}}``. The socket opens a `FrameSink` for
each ``subscribe`` it runs through Strawberry (`open_sink`) when nothing of
the schema acts per event (`direct_frames_allowed`): parse and validation
(cached), the context, the errors and the live field's resolver stay
Strawberry's; the kit's live resolver writes each planned member through
the sink, and yields to Strawberry only what the plan refuses (`NotPlanned`).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import Any, TypeAlias

from strawberry.extensions import SchemaExtension
from strawberry.schema import BaseSchema

from ..graphql import subscriptions
from ..graphql.delivery_plan import Encoded, NotPlanned, dumps
from ..graphql.subscriptions import Live, LiveRequest, SubscriptionUnion
from ..lanes.notices import LaneNoticeStream
from ..render.deltas import Remove, Upsert
from ..render.stream import SessionEnded, SessionStream
from .delivery import SharedPlan, plan_for, seen

__all__ = [
    "FrameSink",
    "current_sink",
    "deliver",
    "direct_frames_allowed",
    "next_frame",
    "next_frame_head",
    "open_sink",
]

_TAIL = "}}"

_SINK: contextvars.ContextVar[FrameSink | None] = contextvars.ContextVar(
    "service_engine_frame_sink", default=None
)


def next_frame_head(operation_id: str) -> str:
    """The text of a ``next`` message up to its data, for ``operation_id``
    (interned: operations under one id share the one string, and a frame
    kept for one of them is found for the others by identity)."""
    return sys.intern(f'{{"id":{dumps(operation_id)},"type":"next","payload":{{"data":')


def next_frame(head: str, data: Encoded, revision: int | None = None) -> str:
    """The whole ``next`` message: ``head`` (`next_frame_head`), ``data``'s
    text (cut at its revision: ``revision`` spliced in when given)."""
    chunks = data.chunks
    if len(chunks) == 1:
        return head + chunks[0] + _TAIL
    if revision is None:
        revision = data.revision
    if len(chunks) == 2:
        return f"{head}{chunks[0]}{revision}{chunks[1]}{_TAIL}"
    return head + str(revision).join(chunks) + _TAIL


class FrameSink:
    """Where one operation's planned frames are written: its socket, under
    its id, for the schema the socket serves."""

    __slots__ = ("head", "schema", "send_text")

    def __init__(self, send_text: Callable[[str], Awaitable[None]], operation_id: str,
                 schema: BaseSchema) -> None:
        self.send_text = send_text
        """Writes one whole message (raises once the socket is closed, as the
        handler's own sends do, so the operation ends the same way)."""
        self.head = next_frame_head(operation_id)
        self.schema = schema

    async def next(self, data: Encoded, revision: int | None = None) -> None:
        """Write the ``next`` message carrying ``data`` (at ``revision``: a
        cohort's shared serialisation, this session's revision)."""
        await self.send_text(next_frame(self.head, data, revision))


def current_sink() -> FrameSink | None:
    """The sink of the operation this task serves, or None (ordinary delivery)."""
    return _SINK.get()


@contextlib.contextmanager
def open_sink(send_text: Callable[[str], Awaitable[None]], operation_id: str,
              schema: BaseSchema) -> Iterator[FrameSink]:
    """Serve this task's operation ``operation_id`` with direct frames: the
    kit's live fields deliver through `deliver` within it."""
    sink = FrameSink(send_text, operation_id, schema)
    token = _SINK.set(sink)
    try:
        with subscriptions.delivered_by(deliver):
            yield sink
    finally:
        _SINK.reset(token)


LiveFieldReport: TypeAlias = Callable[[SubscriptionUnion[Any], LiveRequest, Any], None]
"""Told by a live field delivered by direct frames, as it starts, which
union and request it serves and with which ``info`` (see `reporting`)."""

_REPORT: contextvars.ContextVar[LiveFieldReport | None] = contextvars.ContextVar(
    "service_engine_live_field_report", default=None
)


@contextlib.contextmanager
def reporting(report: LiveFieldReport) -> Iterator[None]:
    """Within this task, a live field served by direct frames that takes
    no ``info`` calls ``report(union, request, info)`` when it starts
    (`service_engine.server.live_ops` learns its documents so)."""
    token = _REPORT.set(report)
    try:
        yield
    finally:
        _REPORT.reset(token)


def deliver(union: SubscriptionUnion[Any], request: LiveRequest, live: Live, info: Any,
            declares_info: bool) -> AsyncGenerator[Any, None] | None:
    """A live field's delivery under an open sink (`subscriptions.delivered_by`):
    its planned members written as frames by this task, the rest yielded to
    the ordinary path; None (all ordinary) when there is no sink or plan."""
    sink = _SINK.get()
    if sink is None:
        return None
    shared = _shared_plan(sink.schema, info)
    if shared is None:
        return None
    if not declares_info:
        report = _REPORT.get()
        if report is not None:
            report(union, request, info)
    return _direct(union, info.context, live, shared, sink)


async def _direct(
    union: SubscriptionUnion[Any],
    context: Any,
    live: Live,
    shared: SharedPlan,
    sink: FrameSink,
) -> AsyncGenerator[Any, None]:
    """`SubscriptionUnion.live`, its planned frames written by this task."""
    async with union.attached(
        context.engine, context.principal, live.projector, live.window,
        applier=live.applier, session_id=live.session_id,
    ) as (stream, notices), contextlib.aclosing(
        planned_frames(union, stream, notices, shared, sink)
    ) as refused:
        async for member in refused:
            yield member


def _shared_plan(served: BaseSchema, info: Any) -> SharedPlan | None:
    """The delivery plan of the operation ``info`` resolves the root of
    (Strawberry's public ``Info``: its operation and variables)."""
    operation = seen(served, info.operation)
    if operation is None:
        return None
    return plan_for(operation.schema, operation.operation, operation.fragments,
                    info.variable_values)


async def planned_frames(
    union: SubscriptionUnion[Any],
    stream: SessionStream[Any],
    notices: LaneNoticeStream | None,
    shared: SharedPlan,
    sink: FrameSink,
) -> AsyncGenerator[Any, None]:
    """Write each planned member's frame through ``sink``; yield only the
    members the plan refuses (Strawberry sends each before the next is
    read, so the order holds)."""
    send = sink.next
    upsert, remove = union.upsert, union.remove
    if notices is None:
        # The hot path: the session's deltas, one loop, no merge; a
        # cohort's shared Upsert / Remove found without building its member.
        while True:
            try:
                delta = await stream.next()
            except SessionEnded:
                return
            kind = type(delta)
            if kind is Upsert or kind is Remove:
                hit = shared.shared(upsert if kind is Upsert else remove, delta)
                if hit is not None:
                    await send(hit, delta.revision)
                    continue
            data = planned(union, shared, delta)
            if data is None:
                yield union.message(delta)
            else:
                await send(data)
    async with contextlib.aclosing(subscriptions.merge_streams(stream, notices)) as items:
        async for item in items:
            data = planned(union, shared, item)
            if data is None:
                yield union.message(item)
            else:
                await send(data)


def planned(union: SubscriptionUnion[Any], shared: SharedPlan, item: Any) -> Encoded | None:
    """``item``'s member serialised by the plan, or None (it refuses it)."""
    try:
        return shared.encode(union.message(item))
    except NotPlanned:
        return None


_PER_RESULT_HOOKS = ("get_results", "on_stream_result")
"""The extension hooks that act on each streamed result (``on_execute``
wraps only the creation of a subscription's stream; ``resolve`` hooks keep
the plan itself out, `delivery.resolves_fields`)."""


def direct_frames_allowed(schema: Any) -> bool:
    """Whether no extension of a Strawberry schema acts on a streamed
    result (adds ``extensions`` to it, rewrites it): then the plan's frame
    is the message Strawberry would send."""
    for extension in schema.get_extensions():
        cls = type(extension)
        for hook in _PER_RESULT_HOOKS:
            if getattr(cls, hook) is not getattr(SchemaExtension, hook):
                return False
    return True
