"""Task-free live operations: a known live subscribe served without GraphQL per operation.

The first ``subscribe`` of a document runs the ordinary way (Strawberry's
operation: parse and validation, cached, the limiters, the context, the kit's
live resolver). When that run comes out valid as exactly one root field that
is a kit live field (`SubscriptionUnion.field`, no ``info`` parameter) whose
delivery plan (`delivery.plan_for`) covers its union, the live resolver
reports it (`subscriptions.report_live_field`) and `LiveOps` keeps the fact
per (document text, operationName) in a bounded LRU. A later ``subscribe``
of that document is a `LiveOp`: its variables coerced by graphql-core
(`get_variable_values`), the field's arguments computed and converted
exactly as Strawberry's resolver wrapper does, the slice's `LiveRequest`
called, the session attached (`engine.attach`) and its deltas turned into
frames the way the direct path (`SubscriptionUnion._frames`) does: no
Strawberry `Operation`, no graphql-core execution context, no result
generator chain. Anything else (a first subscribe, variables that fail
coercion, a projector watching a NATS lane, a request that raises) is left
to the ordinary path, which gives exactly today's messages.

One frame logic, two ways to drive it:

* `LiveOp.run` — a loop awaiting ``stream.next()`` and a ``send_text``
  coroutine per frame, for the Strawberry graphql-transport-ws handler (one
  task per operation, kept in the handler's own operations table);
* callback mode, for a protocol-level socket: `LiveOp.start` attaches (one
  short task), then the session stream calls back (`SessionStream.set_waker`)
  when a delta or the end is queued; the owner calls `LiveOp.drain`, which
  turns every queued delta into its frame text and hands them to
  ``write(texts)`` in one call; `pause` / `resume` follow the transport's
  flow control (a paused op takes nothing: its session collapses or Resets
  as the render side does for any slow subscriber). The end of the session
  drains a ``complete`` and calls ``on_done(operation_id)``.

Every frame is byte for byte what the ordinary path sends: the plan's
shared serialisation with this session's revision and this operation's id
spliced in (`frames.next_frame`); an event the plan refuses (`NotPlanned`)
is executed by graphql-core and formatted as Strawberry formats it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strawberry import Schema

__all__ = ["DRAIN_BUDGET", "KNOWN_DOCUMENTS", "LiveOp", "LiveOps"]

KNOWN_DOCUMENTS = 1024
"""Known-planned (document text, operationName) kept per app (an LRU)."""

DRAIN_BUDGET = 256
"""Deltas one `LiveOp.drain` takes at most (the rest wait for the next call)."""

Write = Callable[[list[str]], object]
"""Callback mode's writer: every frame text of one drain, in order, in one call."""

SendText = Callable[[str], Awaitable[None]]
"""`LiveOp.run`'s writer: one frame text (raises to stop the operation)."""


class LiveOps:
    """The known-planned live documents of one app, and their operations.

    ``schema`` is the schema the app serves (the limited copy);
    ``encode`` is the app's JSON encoder for messages the plan does not
    write (Strawberry's ``encode_json``: an executed event, ``complete``).
    ``enabled`` False (direct frames off, or an extension that acts per
    operation) makes `open` always answer None.
    """

    def __init__(
        self,
        schema: Schema,
        *,
        encode: Callable[[object], str | bytes],
        enabled: bool = True,
        size: int = KNOWN_DOCUMENTS,
    ) -> None:
        raise NotImplementedError

    def learning(self, payload: Mapping[str, object]) -> Any:
        """A context manager to wrap the ordinary run of a ``subscribe``
        (``payload`` is its message's payload: query, variables,
        operationName): if the kit's live resolver runs under it and its
        document is one `open` can serve, the document becomes known. Enter
        it in the operation's own task (it sets a context variable)."""
        raise NotImplementedError

    def open(
        self, operation_id: str, payload: Mapping[str, object], context: Any
    ) -> LiveOp | None:
        """The live operation serving this ``subscribe`` (``payload`` its
        message's payload, ``context`` the socket's `GraphQLContext`, its
        principal resolved), or None: run it the ordinary way.

        Synchronous and cheap: nothing is attached yet (`LiveOp.run` or
        `LiveOp.start` does). The caller has already checked the protocol
        (acknowledged, the id free, the socket's subscription bound)."""
        raise NotImplementedError

    @property
    def known(self) -> int:
        """How many documents are known planned now."""
        raise NotImplementedError


class LiveOp:
    """One known-planned live subscription on one socket, under its id.

    States: ``opened`` (built by `LiveOps.open`) → ``attaching`` →
    ``live`` → ``ended`` (its session ended: ``complete`` sent) or
    ``closed`` (`close`: the client completed, the socket went away; no
    more frames).
    """

    id: str
    """The graphql-transport-ws operation id."""

    async def run(self, send_text: SendText) -> None:
        """Attach and serve until the session ends (then send ``complete``)
        or the task is cancelled (the client completed, the socket closed):
        the session is detached on the way out either way. An error of
        ``send_text`` (a closed socket) ends the operation quietly."""
        raise NotImplementedError

    def start(
        self,
        wake: Callable[[LiveOp], None],
        on_done: Callable[[str], None],
    ) -> None:
        """Callback mode: attach (in one short task), then call
        ``wake(self)`` whenever frames are ready to `drain` (at most once
        until the next drain). Once the session ended and its ``complete``
        was drained, ``on_done(self.id)`` is called; after `close` neither
        callback is called again."""
        raise NotImplementedError

    def drain(self, write: Write, budget: int = DRAIN_BUDGET) -> bool:
        """Take up to ``budget`` queued deltas, turn them into frame texts
        and hand them to ``write`` in one call (none: no call). Returns True
        when more are queued (call again), False otherwise. Takes nothing
        while paused."""
        raise NotImplementedError

    def pause(self) -> None:
        """The writer cannot take more (the transport paused writing): take
        nothing until `resume`; the session counts as a subscriber not
        reading (its backlog collapses, then Resets)."""
        raise NotImplementedError

    def resume(self) -> None:
        """The writer can take again: ``wake`` is called if frames wait."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop for good (a ``complete`` from the client, the socket closed,
        shutdown): cancel a pending attach, detach the session, send nothing
        more. Idempotent."""
        raise NotImplementedError
