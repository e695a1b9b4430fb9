"""One known live subscribe served without GraphQL per operation: `LiveOp`.

The socket drives a `LiveOp` by callbacks: `LiveOp.start` attaches (no
task: `RenderRegistry.attach_soon` calls back), then the session stream
calls back (`SessionStream.set_waker`) when a delta or the end is queued;
the socket calls `LiveOp.drain`, which
turns every queued delta into its frame text and hands them to
``write(texts)`` in one call; `pause` / `resume` follow the transport's flow
control (a paused op takes nothing: its session collapses or Resets as the
render side does for any slow subscriber). With the socket's ``direct``
write, a delta put while the session is caught up skips the queue: the
socket writes `LiveOp.frame_bytes` from inside the put (the fused write), or
declines and it is queued. A projector watching NATS lanes has their
notices read in one task per such operation.

Every frame is byte for byte what the ordinary path sends: the plan's
shared serialisation with this session's revision and this operation's id
spliced in (`next_frame`); an event the plan refuses (`NotPlanned`)
is executed by graphql-core and formatted as Strawberry formats it.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from graphql import GraphQLError
from graphql.execution import execute_subscription_event

from ..graphql.delivery_plan import Encoded, NotPlanned, dumps
from ..graphql.subscriptions import Live, SubscriptionUnion
from ..logs import bind_session
from ..render.deltas import Remove, Reset, Upsert, renumbered
from ..render.stream import SessionStream
from .delivery import SharedPlan, report_errors
from .live_known import Known
from .wire_protocol import text_frame

if TYPE_CHECKING:
    from strawberry import Schema

__all__ = ["DRAIN_BUDGET", "LiveOp", "Owner", "Write", "next_frame", "next_frame_head", "planned"]

DRAIN_BUDGET = 256
"""Deltas one `LiveOp.drain` takes at most (the rest wait for the next call)."""

Write = Callable[[list[str]], object]
"""Callback mode's writer: every frame text of one drain, in order, in one call."""

_log = logging.getLogger(__name__)

_TAIL = "}}"


@functools.lru_cache(maxsize=1024)
def next_frame_head(operation_id: str) -> str:
    """The text of a ``next`` message up to its data, for ``operation_id``
    (interned: operations under one id share the one string, and a frame
    kept for one of them is found for the others by identity; the heads of
    the ids last used are kept, clients mostly number their operations
    alike)."""
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


def planned(union: SubscriptionUnion[Any], shared: SharedPlan, item: Any) -> Encoded | None:
    """``item``'s member serialised by the plan, or None (it refuses it)."""
    try:
        return shared.encode(union.message(item))
    except NotPlanned:
        return None


class Owner(Protocol):
    """What a `LiveOp` asks of the `LiveOps` that opened it."""

    @property
    def schema(self) -> Schema: ...

    def encode(self, message: object) -> str: ...


class _State(enum.Enum):
    OPENED = "opened"
    ATTACHING = "attaching"
    LIVE = "live"
    ENDED = "ended"
    """The session ended (or failed to attach): its last frames are queued
    or sent, ``complete`` among them."""
    DONE = "done"
    """The owner was told (``on_done``); nothing more."""
    CLOSED = "closed"


class LiveOp:
    """One known-planned live subscription on one socket, under its id.

    States: ``opened`` (built by `LiveOps.open`) → ``attaching`` →
    ``live`` → ``ended`` (its session ended or could not attach:
    ``complete`` queued) → ``done`` (the owner told); or ``closed``
    (`close`: the client completed, the socket went away; no more frames).
    """

    __slots__ = (
        "_attaching", "_context", "_direct", "_ending", "_executor", "_head", "_known", "_lanes",
        "_live", "_notices", "_on_done", "_ops", "_outbox", "_paused", "_principal", "_shared",
        "_state", "_stream", "_variables", "_wake", "_waker", "id",
    )

    def __init__(
        self, ops: Owner, known: Known, operation_id: str, context: Any, principal: Any,
        live: Live, shared: SharedPlan, variables: object, lanes: frozenset[str] = frozenset(),
    ) -> None:
        self.id = operation_id
        """The graphql-transport-ws operation id."""
        self._ops = ops
        self._known = known
        self._context = context
        self._principal = principal
        self._live = live
        self._shared = shared
        self._variables = variables
        self._head = next_frame_head(operation_id)
        self._state = _State.OPENED
        self._stream: SessionStream[Any] | None = None
        self._attaching: asyncio.Future[None] | None = None
        """The pending attach (`RenderRegistry.attach_soon`), cancelled by `close`."""
        self._wake: Callable[[LiveOp], None] | None = None
        self._waker: Callable[[], None] | None = None
        self._direct: Callable[[Any, int], bool] | None = None
        """The owner's fused write (`start`), bound to this op: the stream
        offers it a delta put while the session is caught up."""
        self._on_done: Callable[[str], None] | None = None
        self._outbox: list[str] | None = None
        self._ending: list[str] | None = None
        """What ends the operation after a frame failed (`_frame_or_end`)."""
        self._paused = False
        self._executor: Any = None
        self._lanes = lanes
        """The NATS lanes the session watches: their notices are merged in."""
        self._notices: Any = None
        """The task reading the lane notices (`_read_notices`)."""

    @property
    def state(self) -> str:
        return self._state.value

    # -- attach -------------------------------------------------------------------

    def _attach(self) -> None:
        """Begin the attach (`RenderRegistry.attach_soon`); `_attached` ends it."""
        live = self._live
        try:
            self._attaching = self._context.engine.render.attach_soon(
                self._principal, live.projector, live.window, self._attached,
                applier=live.applier, session_id=live.session_id,
            )
        except Exception as error:
            self._outbox = self._failed(error)
            self._woken()

    def _attached(self, result: SessionStream[Any] | Exception) -> None:
        """The attach's end: its stream (the Reset queued), or the error
        refusing it (what the ordinary path sends for it is queued)."""
        self._attaching = None
        if self._state is _State.CLOSED:
            if isinstance(result, SessionStream):
                result.detach()
            return
        if isinstance(result, Exception):
            self._outbox = self._failed(result)
            self._woken()
            return
        stream = result
        bind_session(str(stream.id))  # (the lane notices' task inherits it)
        self._stream = stream
        self._state = _State.LIVE
        if self._lanes:
            self._notices = asyncio.get_running_loop().create_task(
                self._read_notices(self._context.engine.lane_notices(self._lanes)))
        if not self._paused:
            stream.set_waker(self._waker, self._direct)  # wakes at once: the Reset is queued

    def _failed(self, error: Exception) -> list[str]:
        """What the ordinary path sends when the stream fails before its
        first event (the attach refused): a ``next`` with the error, then
        ``complete`` (Strawberry's `_stream` coerces the error)."""
        graphql_error = error if isinstance(error, GraphQLError) else GraphQLError(
            str(error), original_error=error)
        report_errors(self._ops.schema, [graphql_error])
        return [
            self._ops.encode({"id": self.id, "type": "next", "payload": {
                "data": None, "errors": [graphql_error.formatted]}}),
            self._complete(),
        ]

    def _complete(self) -> str:
        self._state = _State.ENDED
        return self._ops.encode({"id": self.id, "type": "complete"})

    # -- frames -------------------------------------------------------------------

    def _frame(self, delta: Any, revision: int | None = None) -> str:
        """The frame of one delta, as the ordinary path would send it;
        ``revision`` (when given) is the reader's, whatever ``delta`` carries
        (`SessionStream.get_raw_nowait`)."""
        text = self._planned_frame(delta, revision)
        if text is not None:
            return text
        if revision is not None and delta.revision != revision:
            delta = renumbered(delta, revision)
        return self._executed(self._known.union.message(delta))

    def _planned_frame(self, delta: Any, revision: int | None) -> str | None:
        """`_frame` when the plan renders ``delta``; None when it refuses it
        (the frame is then an execution's)."""
        kind = type(delta)
        union = self._known.union
        shared = self._shared
        if kind is Upsert or kind is Remove:
            hit = shared.shared(union.upsert if kind is Upsert else union.remove, delta)
            if hit is not None:
                return next_frame(self._head, hit,
                                  delta.revision if revision is None else revision)
        elif kind is Reset:
            # A cohort attaching together: one serialisation of its window.
            try:
                data = shared.encode_reset(union.message, delta)
            except NotPlanned:
                return None
            return next_frame(self._head, data, delta.revision if revision is None else revision)
        if revision is not None and delta.revision != revision:
            delta = renumbered(delta, revision)
        found = planned(union, shared, delta)
        return None if found is None else next_frame(self._head, found)

    def frame_bytes(self, delta: Any, revision: int) -> bytes | None:
        """The whole WebSocket frame (an uncompressed text frame) of
        ``delta`` at this reader's ``revision``, for the owner's fused write;
        None when it must go the ordinary way (the op has frames waiting,
        the plan refuses the delta, building it failed: the drain builds it
        again and ends the op with the error as it does).

        A cohort's sessions are given the very same delta objects and
        mostly read at the same revision under the same operation id: the
        plan keeps the last such frame (`SharedPlan.last_frame`), so the bytes
        are built once per (delta, revision, operation id), not per session."""
        if self._outbox is not None:
            return None
        shared = self._shared
        last = shared.last_frame
        if (last is not None and last[0] is delta and last[1] == revision
                and last[2] is self._head):
            return last[3]
        try:
            text = self._planned_frame(delta, revision)
        except Exception:
            return None
        if text is None:
            return None
        data = text_frame(text.encode())
        kind = type(delta)
        if kind is Upsert or kind is Remove:
            # (A Reset is one session's window: not kept, not held here.)
            shared.last_frame = (delta, revision, self._head, data)
        return data

    def _frame_or_end(self, item: Any) -> str | None:
        """``item``'s frame; None when building it failed: the operation
        then ends as the ordinary path ends a stream that raised (a ``next``
        carrying the error, then ``complete``: `_ending`), and only this
        operation, never its socket's others."""
        try:
            return self._frame(item)
        except Exception as error:
            _log.exception("live operation %s: a frame could not be built", self.id)
            self._ending = self._failed(error)
            return None

    def _executed(self, member: object) -> str:
        """A member the plan refuses, executed by graphql-core as the
        ordinary path's per-event execution does, formatted as Strawberry's
        ``send_next`` formats it."""
        executor = self._executor
        if executor is None:
            schema = self._ops.schema
            known = self._known
            built = schema.execution_context_class.build(
                known.schema, known.document(), None, self._context,
                self._variables if isinstance(self._variables, dict) else None,
                known.operation_name, operation_extensions=None,
            )
            if isinstance(built, list):  # cannot be: these variables coerced at open
                raise RuntimeError(f"live operation {self.id}: {built}")
            executor = self._executor = built
        result = execute_subscription_event(executor.build_per_event_executor(member))
        if inspect.isawaitable(result):
            result = _finish_now(result)
        payload: dict[str, object] = {"data": result.data}
        if result.errors:
            report_errors(self._ops.schema, list(result.errors))
            payload["errors"] = [e.formatted for e in result.errors]
        return self._ops.encode({"id": self.id, "type": "next", "payload": payload})

    # -- (b) callback mode --------------------------------------------------------

    def start(
        self,
        wake: Callable[[LiveOp], None],
        on_done: Callable[[str], None],
        direct: Callable[[LiveOp, Any, int], bool] | None = None,
    ) -> None:
        """Callback mode: attach (no task: the registry calls back), then call
        ``wake(self)`` whenever frames are ready to `drain` (at most once
        until the next drain). Once the session ended and its ``complete``
        was drained, ``on_done(self.id)`` is called; after `close` neither
        callback is called again.

        ``direct(self, delta, revision)``, when given, is the owner's fused
        write: a delta put while the session is caught up (nothing queued)
        is offered to it first, from inside the render pass; it writes
        `frame_bytes` now and answers True, or answers False (not writable
        now, a frame waiting: the ordinary wake and drain then carry it)."""
        if self._state is not _State.OPENED:
            raise RuntimeError(f"live operation {self.id} was started already")
        self._wake = wake
        self._on_done = on_done
        # The stream calls the owner's wake with this op directly (one call
        # per put that wakes, from inside the render pass).
        self._waker = functools.partial(wake, self)
        if direct is not None:
            self._direct = functools.partial(direct, self)
        self._state = _State.ATTACHING
        self._attach()

    def _woken(self) -> None:
        wake = self._wake
        if wake is not None:
            wake(self)

    async def _read_notices(self, notices: Any) -> None:
        """Callback mode's lane notices: each one's frame queued ahead of
        the deltas not yet drained (as merging prefers a ready notice)."""
        try:
            async for notice in notices:
                if self._state is not _State.LIVE:
                    return
                text = self._frame_or_end(notice)
                if text is None:
                    # The notice could not be framed: the operation ends
                    # with the error, as the ordinary path's stream would.
                    stream = self._stream
                    if stream is not None:
                        stream.set_waker(None)
                    self._outbox = (self._outbox or []) + (self._ending or [])
                    if not self._paused:
                        self._woken()
                    return
                if self._outbox is None:
                    self._outbox = [text]
                else:
                    self._outbox.append(text)
                if not self._paused:
                    self._woken()
        finally:
            await notices.aclose()

    def drain(self, write: Write, budget: int = DRAIN_BUDGET) -> bool:
        """Take up to ``budget`` queued deltas, turn them into frame texts
        and hand them to ``write`` in one call (none: no call). Returns True
        when more are queued (call again), False otherwise. Takes nothing
        while paused. The session's end drains its ``complete`` (the owner's
        ``on_done`` is called first, as the ordinary path forgets the id
        before sending it)."""
        state = self._state
        if state is _State.CLOSED or state is _State.DONE:
            return False
        out = self._outbox
        self._outbox = None
        more = False
        stream = self._stream
        if out is None:
            out = []
        if state is _State.LIVE and stream is not None and not self._paused:
            take = stream.get_raw_nowait
            frame = self._frame
            append = out.append
            for _ in range(budget):
                delta = take()
                if delta is None:
                    if stream.end_reason is not None:
                        stream.set_waker(None)
                        append(self._complete())
                    break
                try:
                    append(frame(delta, stream.taken))
                except Exception as error:
                    # This operation ends (an errors `next`, then `complete`);
                    # what it and the socket's other ops took is still written.
                    _log.exception("live operation %s: a frame could not be built", self.id)
                    stream.set_waker(None)
                    out.extend(self._failed(error))
                    break
            else:
                more = stream.pending() > 0
        if self._state is _State.ENDED:
            self._state = _State.DONE
            on_done = self._on_done
            self._release()
            if on_done is not None:
                on_done(self.id)
        if out:
            write(out)
        return more

    def pause(self) -> None:
        """The writer cannot take more (the transport paused writing): take
        nothing until `resume`; the session counts as a subscriber not
        reading (its backlog collapses, then Resets)."""
        if self._paused:
            return
        self._paused = True
        if self._stream is not None and self._state is _State.LIVE:
            self._stream.set_waker(None)

    def resume(self) -> None:
        """The writer can take again: ``wake`` is called if frames wait."""
        if not self._paused:
            return
        self._paused = False
        if self._outbox:
            self._woken()
        if self._state is _State.LIVE and self._stream is not None:
            self._stream.set_waker(self._waker, self._direct)

    def close(self) -> None:
        """Stop for good (a ``complete`` from the client, the socket closed,
        shutdown): cancel a pending attach, detach the session, send nothing
        more. Idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        attaching = self._attaching
        if attaching is not None:
            self._attaching = None
            attaching.cancel()  # the registry detaches the session
        self._outbox = None
        self._release()

    def _release(self) -> None:
        """Detach the session (once) and drop the callbacks."""
        self._wake = self._waker = self._on_done = self._direct = None
        notices, self._notices = self._notices, None
        if isinstance(notices, asyncio.Task):
            notices.cancel()  # its finally closes the stream
        stream = self._stream
        if stream is not None:
            self._stream = None
            stream.detach()


def _finish_now(awaitable: Awaitable[Any]) -> Any:
    """The value of an awaitable that completes without suspending (an
    event execution over basic fields only, as a planned document's are)."""
    coroutine = awaitable.__await__()
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    close = getattr(coroutine, "close", None)
    if close is not None:
        close()
    raise RuntimeError("an executed live event suspended")
