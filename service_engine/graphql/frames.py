"""Planned frames straight from the session stream to the socket.

Ordinary delivery hands every live event to graphql-core (a per-event
executor, `map_async_iterable`), then to Strawberry (its result processing,
the extensions' per-result hooks, a ``next`` message dict, ``send_json``).
For an operation whose payload the delivery plan expresses
(`service_engine.graphql.delivery.plan_for`), none of that changes a byte:
the frame is the plan's shared serialisation with this session's revision
and this operation's id spliced in. So the operation's task writes it
itself.

The graphql-transport-ws handler opens a `FrameSink` for each ``subscribe``
it runs (`open_sink`, around Strawberry's own operation), when direct frames
are enabled and nothing of the schema acts per event (`direct_frames_allowed`).
Everything before the first event stays Strawberry's: parse and validation
(cached), the context, the errors, the live field's resolver that attaches
the session. The kit's live resolver finds the sink (`current_sink`) and
writes each planned member's frame through it; a member the plan refuses
(`NotPlanned`), and every member of an operation it cannot plan, is yielded
to Strawberry as before. The end of the stream, a ``complete`` from the
client, a disconnect and the session bound behave exactly as on the
ordinary path: the same generator ends, is cancelled or closed.

The frame text is `next_frame`'s, which is what Strawberry's encoder gives
for ``{"id": id, "type": "next", "payload": {"data": data}}``.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocketDisconnect, WebSocketState
from strawberry.extensions import SchemaExtension
from strawberry.http.exceptions import WebSocketDisconnected

from .delivery_plan import Encoded, dumps

if TYPE_CHECKING:
    from starlette.websockets import WebSocket

__all__ = [
    "FrameSink",
    "current_sink",
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
    """Where one operation's planned frames are written: its socket, under its id."""

    __slots__ = ("_head", "_send", "_ws")

    def __init__(self, websocket: WebSocket, operation_id: str) -> None:
        self._ws = websocket
        self._send = websocket.send
        self._head = next_frame_head(operation_id)

    async def next(self, data: Encoded, revision: int | None = None) -> None:
        """Write the ``next`` message carrying ``data`` (at ``revision``: a
        cohort's shared serialisation, this session's revision).

        Raises `WebSocketDisconnected` once the socket is closed, as the
        handler's own ``send_json`` does, so the operation ends the same way.
        """
        await self.text(next_frame(self._head, data, revision))

    async def text(self, text: str) -> None:
        """Write one whole message's text (raises as `next` does)."""
        if self._ws.application_state is WebSocketState.DISCONNECTED:
            raise WebSocketDisconnected
        try:
            await self._send({"type": "websocket.send", "text": text})
        except WebSocketDisconnect as exc:
            raise WebSocketDisconnected from exc


def current_sink() -> FrameSink | None:
    """The sink of the operation this task serves, or None (ordinary delivery)."""
    return _SINK.get()


@contextlib.contextmanager
def open_sink(websocket: WebSocket, operation_id: str) -> Iterator[FrameSink]:
    """Serve this task's operation ``operation_id`` with direct frames."""
    sink = FrameSink(websocket, operation_id)
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


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
