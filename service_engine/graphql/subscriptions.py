"""One typed subscription union per projector, and the stream that feeds it.

`subscription_union` builds, for one projector and its view type, the
Strawberry union a slice's subscription field returns::

    union BoardsMessage = BoardsReset | BoardsUpsert | BoardsRemove
                        | LanesPaused | LanesResumed

    type BoardsReset  { revision: Int!  keys: [String!]!  views: [BoardView!]! }
    type BoardsUpsert { revision: Int!  key: String!  view: BoardView!  cause: DeltaCause }
    type BoardsRemove { revision: Int!  key: String!  cause: DeltaCause }
    type LanesPaused  { lanes: [String!]! }     # out of band: no revision
    type LanesResumed { lanes: [String!]! }

``revision`` is the session's contiguous delta counter (a gap means the
client missed something and must resubscribe); a key is its canonical JSON
text; ``keys[i]`` is the key of ``views[i]`` in a Reset; ``cause`` is the
event that caused the change when the projector emits causes. The lane
notices carry no revision, so they never disturb that contiguity; a
LanesResumed is followed by a Reset.

A slice usually declares a live field with `Views.field`; with no `Views`
(a presence lane), `SubscriptionUnion.field` does the same over a function
answering the whole `Live`. A stream the kit does not attach (a test's
queue) is served with ``@strawberry.subscription(graphql_type=BOARDS.type)``
over `SubscriptionUnion.subscribe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import re
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeAlias, TypeVar, Union, overload

import strawberry
from strawberry.scalars import JSON

from ..failures import ConfigError
from ..lanes import notices as lane_notices
from ..logs import bind_session
from ..render.deltas import Delta, Remove, Reset, Upsert
from ..render.windows import WindowSpec

if TYPE_CHECKING:
    from ..engine import Engine
    from ..render.projector import RlsApplier

__all__ = [
    "DeltaCause", "LaneNotice", "LanesPaused", "LanesResumed", "Live", "LiveRequest",
    "SubscriptionUnion", "merge_streams", "presence_subscription_union", "subscription_union",
]

V = TypeVar("V")
A = TypeVar("A")
B = TypeVar("B")

_GRAPHQL_NAME = re.compile(r"[A-Za-z][_0-9A-Za-z]*")


@strawberry.type(description="The event that caused a change (a projector's PerImpact cause).")
class DeltaCause:
    name: str
    data: JSON | None = None


@strawberry.type(
    description="The named lanes paused (their dependency is unavailable); "
    "their views are stale until LanesResumed. Carries no revision."
)
class LanesPaused:
    lanes: list[str]


@strawberry.type(
    description="The named lanes are back; a Reset of the session follows. Carries no revision."
)
class LanesResumed:
    lanes: list[str]


LaneNotice: TypeAlias = LanesPaused | LanesResumed
"""An out-of-band notice on a subscription (the lanes' raw signal, mapped)."""

Notice: TypeAlias = LaneNotice | lane_notices.LaneNotice
"""What ``subscribe``'s notices may carry: a member as is, or the engine's
raw `service_engine.lanes.notices.LaneNotice` (mapped to its member)."""


@dataclass(frozen=True, slots=True)
class Live:
    """What a live subscription field attaches: a session of ``projector``
    over ``window`` (under ``applier`` for an RLS window; under the client's
    ``session_id`` when it pages the window later)."""

    projector: str
    window: WindowSpec[Any]
    applier: RlsApplier[Any] | None = None
    session_id: str | None = None


LiveRequest: TypeAlias = Callable[..., Live]
"""A live field's function: its arguments (and ``self``, ``info`` when it
declares them) to the `Live` session it attaches."""

_INFO = "info"


LiveFieldReport: TypeAlias = Callable[["SubscriptionUnion[Any]", "LiveRequest", Any], None]
"""Told by a live field that takes no ``info``, as it starts, which union
and request it serves and with which ``info`` (see `reporting`)."""

_REPORT: contextvars.ContextVar[LiveFieldReport | None] = contextvars.ContextVar(
    "service_engine_live_field_report", default=None
)


@contextlib.contextmanager
def reporting(report: LiveFieldReport) -> Iterator[None]:
    """Within this task, a live field that takes no ``info`` calls
    ``report(union, request, info)`` when it starts (a server learns its
    documents so; the kit knows no server)."""
    token = _REPORT.set(report)
    try:
        yield
    finally:
        _REPORT.reset(token)


@dataclass(frozen=True, eq=False)
class SubscriptionUnion(Generic[V]):
    """The generated union of one projector; build it with `subscription_union`.

    `field` declares a live subscription field over it; ``type`` is the
    union itself (a field's ``graphql_type``); ``types`` are the generated
    member types the slice declares in its `SliceFragment`.
    """

    name: str
    view_type: Any
    reset: type[Any]
    upsert: type[Any]
    remove: type[Any]
    type: Any

    @property
    def union_name(self) -> str:
        return f"{self.name}Message"

    @property
    def types(self) -> tuple[type[Any], ...]:
        """The member types this union generated (not the engine's shared ones)."""
        return (self.reset, self.upsert, self.remove)

    def message(self, item: Delta[V] | Notice) -> Any:
        """The union member for one engine delta (or a lane notice, as is)."""
        # Upserts dominate a live session: test for them first.
        if isinstance(item, Upsert):
            # The engine's Cause has ``name`` and ``data``: DeltaCause has no
            # is_type_of, so it is served as is, with no per-delta copy.
            return self.upsert(
                revision=item.revision, key=item.key, view=item.view, cause=item.cause
            )
        if isinstance(item, Remove):
            return self.remove(revision=item.revision, key=item.key, cause=item.cause)
        if isinstance(item, Reset):
            return self.reset(
                revision=item.revision, keys=list(item.views), views=list(item.views.values())
            )
        if isinstance(item, LanesPaused | LanesResumed):
            return item
        if isinstance(item, lane_notices.LaneNotice):
            lanes = list(item.lanes)
            return LanesPaused(lanes=lanes) if item.paused else LanesResumed(lanes=lanes)
        raise TypeError(f"{self.union_name} cannot carry a {type(item).__name__}")

    def subscribe(
        self,
        deltas: AsyncIterable[Delta[V]],
        notices: AsyncIterable[Notice] | None = None,
    ) -> AsyncGenerator[Any, None]:
        """The subscription stream: ``deltas`` mapped to members, ``notices``
        merged in as they arrive (`merge_streams`: it ends with ``deltas``;
        closing it closes both)."""
        return _mapped(self, merge_streams(deltas, notices))

    async def live(
        self,
        engine: Engine,
        principal: Any,
        projector: str,
        window: WindowSpec[Any],
        *,
        applier: RlsApplier[Any] | None = None,
        session_id: str | None = None,
    ) -> AsyncGenerator[Any, None]:
        """A subscription field's whole body: attach a session of
        ``projector`` for ``principal``, stream its members (with the lane
        notices merged in when the projector watches a NATS lane), and
        detach when the client completes or disconnects."""
        lanes = engine.lanes_of(projector)
        stream = await engine.attach(
            principal, projector, window, applier=applier, session_id=session_id
        )
        bind_session(str(stream.id))  # this operation's task serves this session
        notices = engine.lane_notices(lanes) if lanes else None
        try:
            async with contextlib.aclosing(self.subscribe(stream, notices)) as messages:
                async for message in messages:
                    yield message
        finally:
            await stream.aclose()
            if notices is not None:
                await notices.aclose()

    @overload
    def field(self, request: LiveRequest, /) -> Any: ...

    @overload
    def field(self, request: None = None, /, *, name: str | None = None,
              description: str | None = None, deprecation_reason: str | None = None
              ) -> Callable[[LiveRequest], Any]: ...

    def field(self, request: LiveRequest | None = None, /, *, name: str | None = None,
              description: str | None = None, deprecation_reason: str | None = None) -> Any:
        """Declare a live subscription field of this union (a decorator, with
        or without arguments): ``request`` maps the field's arguments (its
        parameters, ``self`` and a declared ``info`` excepted) to the `Live`
        session that each subscription attaches for the caller (`live`).
        ``name``, ``description`` and ``deprecation_reason`` are as with
        `strawberry.subscription`.
        """

        return live_field(
            self, request, name=name, description=description,
            deprecation_reason=deprecation_reason,
        )


def live_field(
    union: SubscriptionUnion[Any],
    request: LiveRequest | None,
    *,
    name: str | None,
    description: str | None,
    deprecation_reason: str | None,
    session: Callable[[WindowSpec[Any]], Live] | None = None,
) -> Any:
    """`SubscriptionUnion.field`'s body; ``session`` turns a request's
    `WindowSpec` into the `Live` it attaches (`Views.field`)."""

    def declare(function: LiveRequest) -> Any:
        if session is not None:
            function = _session_of(function, session)
        return strawberry.subscription(
            _live_resolver(union, function),
            name=name,
            description=description,
            deprecation_reason=deprecation_reason,
            graphql_type=union.type,
        )

    return declare if request is None else declare(request)


def _session_of(
    function: Callable[..., Any], session: Callable[[WindowSpec[Any]], Live]
) -> LiveRequest:
    """``function`` (its signature kept) with a `WindowSpec` it returns
    turned into its `Live` by ``session``."""

    @functools.wraps(function)
    def request(*args: Any, **kwargs: Any) -> Live:
        live = function(*args, **kwargs)
        return session(live) if isinstance(live, WindowSpec) else live

    return request


def _live_resolver(union: SubscriptionUnion[Any], request: LiveRequest) -> Callable[..., Any]:
    """The resolver of a live field: ``request``'s signature (plus ``info``
    when it does not declare it), returning the union's stream."""
    if not callable(request):
        raise ConfigError(f"a live field takes a function returning Live, got {request!r}")
    signature = inspect.signature(request)
    parameters = list(signature.parameters.values())
    declares_info = _INFO in signature.parameters
    if not declares_info:
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            raise ConfigError(
                f"live field {request.__qualname__}: declare its arguments (no **kwargs)"
            )
        parameters.append(
            inspect.Parameter(_INFO, inspect.Parameter.KEYWORD_ONLY, annotation=strawberry.Info)
        )

    async def resolve(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        # An async generator, as a hand-written field is: nothing (not even
        # reading the principal) runs before the client reads the stream.
        info = kwargs[_INFO] if declares_info else kwargs.pop(_INFO)
        live = request(*args, **kwargs)
        if not isinstance(live, Live):
            raise TypeError(
                f"live field {request.__qualname__} returned {type(live).__name__}, not Live"
            )
        if not declares_info:
            report = _REPORT.get()
            if report is not None:
                report(union, request, info)
        context = info.context
        messages = union.live(
            context.engine, context.principal, live.projector, live.window,
            applier=live.applier, session_id=live.session_id,
        )
        async with contextlib.aclosing(messages):
            async for message in messages:
                yield message

    # Strawberry reads the arguments from this signature and resolves its
    # (string) annotations in the module of the slice's function.
    resolve.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=inspect.Signature.empty
    )
    resolve.__module__ = request.__module__
    resolve.__name__ = request.__name__
    resolve.__qualname__ = request.__qualname__
    resolve.__doc__ = request.__doc__
    return resolve


async def _mapped(
    union: SubscriptionUnion[V], source: AsyncGenerator[Any, None]
) -> AsyncGenerator[Any, None]:
    message = union.message
    async with contextlib.aclosing(source):
        async for item in source:
            yield message(item)


def subscription_union(name: str, view_type: Any, *, description: str | None = None
                       ) -> SubscriptionUnion[Any]:
    """Generate the typed union members of the projector ``name`` over ``view_type``.

    ``name`` is a GraphQL name (``"Boards"``) and prefixes the generated
    types ``<name>Reset``, ``<name>Upsert``, ``<name>Remove`` and the union
    ``<name>Message``; ``view_type`` is the Strawberry output type the
    projector renders. Call it once per projector, at import time.
    """
    if not isinstance(name, str) or not _GRAPHQL_NAME.fullmatch(name):
        raise ValueError(
            f"a projector name is a GraphQL name ([A-Za-z][_0-9A-Za-z]*), got {name!r}"
        )
    about = description or f"the {name} projector"
    reset = _object_type(
        f"{name}Reset",
        {"revision": int, "keys": list[str], "views": list[view_type]},
        f"Replace the whole window of {about}: keys[i] is the key of views[i].",
    )
    upsert = _object_type(
        f"{name}Upsert",
        {"revision": int, "key": str, "view": view_type, "cause": DeltaCause | None},
        f"Set the view of one key in the window of {about}.",
    )
    remove = _object_type(
        f"{name}Remove",
        {"revision": int, "key": str, "cause": DeltaCause | None},
        f"Drop one key from the window of {about}.",
    )
    members = (reset, upsert, remove, LanesPaused, LanesResumed)
    union = Annotated[
        Union[members],  # type: ignore[valid-type]  # noqa: UP007 - built from a tuple at runtime
        strawberry.union(
            f"{name}Message", description=f"One message on a subscription to {about}."
        ),
    ]
    return SubscriptionUnion(name, view_type, reset, upsert, remove, union)


def presence_subscription_union(
    name: str, view_type: Any, *, description: str | None = None
) -> SubscriptionUnion[Any]:
    """`subscription_union` for a presence projector (a `PresenceProjector`
    registered with ``Engine.register_presence``): the same Reset / Upsert /
    Remove members over the lane's views, and the lane notices, which its
    live fields merge in (``LanesPaused`` past ``nats_grace``,
    ``LanesResumed`` and a Reset on return)."""
    return subscription_union(
        name, view_type, description=description or f"the {name} presence lane"
    )


def _object_type(name: str, fields: dict[str, Any], description: str) -> type[Any]:
    # Annotations are real objects here (not strings), so Strawberry needs no
    # module namespace to resolve them.
    namespace = {"__annotations__": fields, "__module__": __name__, "__qualname__": name}
    cls: type[Any] = strawberry.type(type(name, (), namespace), description=description)
    return cls


async def merge_streams(
    primary: AsyncIterable[A], secondary: AsyncIterable[B] | None
) -> AsyncGenerator[A | B, None]:
    """Yield the items of both streams as they arrive, each in its own order.

    Ends when ``primary`` ends (the end of ``secondary`` does not end it);
    an error of either is raised. When both have an item ready the
    ``secondary`` one is yielded first (a lane notice precedes the Reset the
    engine sends after it). Closing the merged stream cancels the pending
    reads and closes both sources.
    """
    first = aiter(primary)
    if secondary is None:
        # No notices to merge: no task per item on the hot path.
        try:
            async for item in first:
                yield item
        finally:
            await _aclose(first)
        return
    second = aiter(secondary)
    first_next: asyncio.Future[A] | None = asyncio.ensure_future(anext(first))
    second_next: asyncio.Future[B] | None = asyncio.ensure_future(anext(second))
    try:
        while first_next is not None:
            waiting: set[asyncio.Future[Any]] = {first_next}
            if second_next is not None:
                waiting.add(second_next)
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if second_next is not None and second_next in done:
                try:
                    notice = second_next.result()
                except StopAsyncIteration:
                    second_next = None
                else:
                    second_next = asyncio.ensure_future(anext(second))
                    yield notice
            if first_next in done:
                try:
                    item = first_next.result()
                except StopAsyncIteration:
                    first_next = None
                else:
                    first_next = asyncio.ensure_future(anext(first))
                    yield item
    finally:
        for pending in (first_next, second_next):
            if pending is None:
                continue
            pending.cancel()
            # Awaiting also retrieves an outcome nobody consumed (a read that
            # finished while the consumer was closing), so none is reported
            # as "never retrieved".
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await pending
        await _aclose(first)
        await _aclose(second)


async def _aclose(source: AsyncIterator[Any]) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()
