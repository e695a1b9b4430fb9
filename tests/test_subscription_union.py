"""subscription_union: engine deltas become typed union members; lane
notices merge into the stream without disturbing revision contiguity."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
import strawberry

from service_engine import Query, WindowSpec
from service_engine.errors import ConfigError
from service_engine.graphql import (
    LanesPaused,
    LanesResumed,
    Live,
    merge_streams,
    subscription_union,
)
from service_engine.impacts.model import Cause
from service_engine.render.deltas import Remove, Reset, Upsert, WindowReplica

BOUND = 2.0


@strawberry.type
class Card:
    title: str
    done: bool


CARDS = subscription_union("Cards", Card)


def test_deltas_map_to_their_members() -> None:
    """Reset, Upsert and Remove map to the union's typed members (the view passed through, not
    copied), a lane notice passes as itself, and anything else is refused naming the union."""
    a, b = Card(title="a", done=False), Card(title="b", done=True)
    reset = CARDS.message(Reset(1, {'"a"': a, '"b"': b}))
    assert isinstance(reset, CARDS.reset)
    assert (reset.revision, reset.keys, reset.views) == (1, ['"a"', '"b"'], [a, b])
    cause = Cause("card.moved", {"to": "done"})
    upsert = CARDS.message(Upsert(2, '"a"', b, cause))
    assert isinstance(upsert, CARDS.upsert)
    assert (upsert.revision, upsert.key, upsert.view, upsert.cause) == (2, '"a"', b, cause)
    assert upsert.view is b  # the rendered view passes through, never copied
    remove = CARDS.message(Remove(3, '"b"'))
    assert isinstance(remove, CARDS.remove)
    assert (remove.revision, remove.key, remove.cause) == (3, '"b"', None)
    paused = LanesPaused(lanes=["presence"])
    assert CARDS.message(paused) is paused
    with pytest.raises(TypeError, match="CardsMessage"):
        CARDS.message("nonsense")  # type: ignore[arg-type]


def test_projector_names_are_graphql_names() -> None:
    """A projector name that is not a GraphQL name is refused."""
    for bad in ("", "1Cards", "Cards-View", "__Cards"):
        with pytest.raises(ValueError, match="GraphQL name"):
            subscription_union(bad, Card)


async def _feed(queue: asyncio.Queue[Any]) -> AsyncGenerator[Any, None]:
    while True:
        item = await queue.get()
        if item is None:
            return
        yield item


@strawberry.type
class RootQuery:
    ok: bool = True


def _schema(deltas: asyncio.Queue[Any], notices: asyncio.Queue[Any]) -> strawberry.Schema:
    @strawberry.type
    class Subscription:
        @strawberry.subscription(graphql_type=CARDS.type)
        async def cards(self) -> AsyncGenerator[Any, None]:
            async for message in CARDS.subscribe(_feed(deltas), _feed(notices)):
                yield message

    return strawberry.Schema(query=RootQuery, subscription=Subscription, types=CARDS.types)


SELECTION = """subscription { cards {
  __typename
  ... on CardsReset { revision keys views { title done } }
  ... on CardsUpsert { revision key view { title done } cause { name data } }
  ... on CardsRemove { revision key cause { name } }
  ... on LanesPaused { lanes }
  ... on LanesResumed { lanes }
} }"""


async def test_a_subscription_serves_typed_members_over_graphql() -> None:
    """Over GraphQL the subscription serves Reset, Upsert and Remove as typed members with
    contiguous revisions, lane notices in between without breaking contiguity, and ends when the
    session's stream ends."""
    deltas: asyncio.Queue[Any] = asyncio.Queue()
    notices: asyncio.Queue[Any] = asyncio.Queue()
    schema = _schema(deltas, notices)
    stream = await schema.subscribe(SELECTION)
    assert isinstance(stream, AsyncIterator)

    async def next_payload() -> dict[str, Any]:
        result = await asyncio.wait_for(anext(stream), BOUND)
        assert result.errors is None, result.errors
        assert result.data is not None
        payload: dict[str, Any] = result.data["cards"]
        return payload

    replica: WindowReplica[dict[str, Any]] = WindowReplica()
    try:
        await deltas.put(Reset(1, {'"a"': Card(title="a", done=False)}))
        reset = await next_payload()
        assert reset == {"__typename": "CardsReset", "revision": 1, "keys": ['"a"'],
                         "views": [{"title": "a", "done": False}]}
        replica.apply(Reset(reset["revision"], dict(zip(reset["keys"], reset["views"], strict=True))))

        await notices.put(LanesPaused(lanes=["presence", "accumulated"]))
        assert await next_payload() == {"__typename": "LanesPaused", "lanes": ["presence", "accumulated"]}

        await deltas.put(Upsert(2, '"a"', Card(title="a", done=True), Cause("card.done", {"by": "u-1"})))
        upsert = await next_payload()
        assert upsert == {"__typename": "CardsUpsert", "revision": 2, "key": '"a"',
                          "view": {"title": "a", "done": True},
                          "cause": {"name": "card.done", "data": {"by": "u-1"}}}
        replica.apply(Upsert(upsert["revision"], upsert["key"], upsert["view"]))

        await notices.put(LanesResumed(lanes=["presence"]))
        assert (await next_payload())["__typename"] == "LanesResumed"

        await deltas.put(Remove(3, '"a"'))
        remove = await next_payload()
        assert remove == {"__typename": "CardsRemove", "revision": 3, "key": '"a"', "cause": None}
        replica.apply(Remove(remove["revision"], remove["key"]))
        # The notices in between did not break contiguity.
        assert replica.revision == 3 and replica.views == {}

        await deltas.put(None)  # the session's stream ends: so does the subscription
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), BOUND)
    finally:
        await stream.aclose()


def test_lane_notices_carry_no_revision() -> None:
    """The lane notice types carry their lanes and no revision."""
    sdl = _schema(asyncio.Queue(), asyncio.Queue()).as_str()
    assert "type LanesPaused {\n" in sdl
    paused = sdl.split("type LanesPaused {", 1)[1].split("}", 1)[0]
    resumed = sdl.split("type LanesResumed {", 1)[1].split("}", 1)[0]
    assert "revision" not in paused and "revision" not in resumed
    assert "lanes: [String!]!" in paused


class Source:
    """An async generator fed from a queue that records being closed."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = False

    async def stream(self) -> AsyncGenerator[Any, None]:
        try:
            while True:
                item = await self.queue.get()
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.closed = True


async def test_merge_keeps_each_order_and_ends_with_the_primary() -> None:
    """Merging deltas with notices keeps each source's order, outlives the notices' end, and ends
    with the deltas', closing both."""
    primary, secondary = Source(), Source()
    merged = merge_streams(primary.stream(), secondary.stream())
    for item in ("d1", "d2"):
        primary.queue.put_nowait(item)
    assert [await asyncio.wait_for(anext(merged), BOUND) for _ in range(2)] == ["d1", "d2"]
    secondary.queue.put_nowait(None)  # the notices end; the stream goes on
    primary.queue.put_nowait("d3")
    assert await asyncio.wait_for(anext(merged), BOUND) == "d3"
    primary.queue.put_nowait(None)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(merged), BOUND)
    assert primary.closed and secondary.closed


async def test_merge_yields_a_ready_notice_before_a_ready_delta() -> None:
    """When a notice and a delta are both ready, the notice comes first."""
    primary, secondary = Source(), Source()
    primary.queue.put_nowait("reset")
    secondary.queue.put_nowait("resumed")
    merged = merge_streams(primary.stream(), secondary.stream())
    try:
        got = [await asyncio.wait_for(anext(merged), BOUND) for _ in range(2)]
    finally:
        await merged.aclose()
    assert got == ["resumed", "reset"]


async def test_closing_the_merge_closes_both_sources() -> None:
    """Closing the merged stream while both reads are pending closes both sources."""
    primary, secondary = Source(), Source()
    merged = merge_streams(primary.stream(), secondary.stream())
    primary.queue.put_nowait("d1")
    assert await asyncio.wait_for(anext(merged), BOUND) == "d1"
    await merged.aclose()  # the client completed while both reads were pending
    assert primary.closed and secondary.closed


async def test_an_error_of_either_source_is_raised() -> None:
    """An error in either source is raised from the merged stream, and both sources are closed."""
    for failing in ("primary", "secondary"):
        primary, secondary = Source(), Source()
        merged = merge_streams(primary.stream(), secondary.stream())
        (primary if failing == "primary" else secondary).queue.put_nowait(RuntimeError(failing))
        with pytest.raises(RuntimeError, match=failing):
            await asyncio.wait_for(anext(merged), BOUND)
        await merged.aclose()
        assert primary.closed and secondary.closed


async def test_without_notices_the_deltas_pass_straight_through() -> None:
    """Without a notice stream the deltas pass straight through as typed members."""
    async def deltas() -> AsyncGenerator[Any, None]:
        yield Reset(1, {})
        yield Upsert(2, '"k"', Card(title="k", done=False))

    messages = [m async for m in CARDS.subscribe(deltas())]
    assert [type(m) for m in messages] == [CARDS.reset, CARDS.upsert]


async def test_closing_a_stream_without_notices_closes_the_deltas() -> None:
    """Closing a subscription without notices closes its delta source."""
    primary = Source()
    stream = CARDS.subscribe(primary.stream())
    primary.queue.put_nowait(Reset(1, {}))
    assert isinstance(await asyncio.wait_for(anext(stream), BOUND), CARDS.reset)
    await stream.aclose()
    assert primary.closed


# -- the live field ----------------------------------------------------------------------


@strawberry.type
class LiveSubscription:
    @CARDS.field(description="The caller's cards, live.")
    def cards(self, limit: int = 50) -> Live:
        return Live("cards", WindowSpec(Query(limit)))

    @CARDS.field(name="pagedCards")
    def paged(self, session_id: str, limit: int = 50) -> Live:
        return Live("cards", WindowSpec(Query(limit)), session_id=session_id)

    @CARDS.field
    def declared(self, info: strawberry.Info) -> Live:
        return Live("cards", WindowSpec(Query(None)))


def test_a_live_field_takes_its_functions_arguments_and_serves_the_union() -> None:
    """A live field's GraphQL arguments are its function's (defaults and docstring kept, no info),
    and it serves the union."""
    schema = strawberry.Schema(query=RootQuery, subscription=LiveSubscription, types=CARDS.types)
    sdl = schema.as_str()
    subscription = sdl.split("type LiveSubscription {", 1)[1].split("}", 1)[0]
    assert '"""The caller\'s cards, live."""\n  cards(limit: Int! = 50): CardsMessage!' in subscription
    assert "pagedCards(sessionId: String!, limit: Int! = 50): CardsMessage!" in subscription
    # The kit's own ``info`` is never a GraphQL argument, nor a declared one.
    assert "declared: CardsMessage!" in subscription
    assert "info" not in subscription


def test_a_live_field_needs_named_arguments() -> None:
    """A live field refuses a function taking **kwargs, and anything that is not a function
    returning Live."""
    def loose(self: object, **arguments: Any) -> Live:
        return Live("cards", WindowSpec(Query(None)))

    with pytest.raises(ConfigError, match="no \\*\\*kwargs"):
        CARDS.field(loose)
    with pytest.raises(ConfigError, match="returning Live"):
        CARDS.field("cards")  # type: ignore[call-overload]


async def test_a_live_field_that_does_not_return_live_fails_its_subscription() -> None:
    """A live field whose function returns something other than Live fails its subscription with an
    error naming the type returned."""
    @strawberry.type
    class Wrong:
        @CARDS.field
        def cards(self) -> Live:
            return "cards"  # type: ignore[return-value]

    schema = strawberry.Schema(query=RootQuery, subscription=Wrong, types=CARDS.types)
    stream = await schema.subscribe("subscription { cards { __typename } }")
    assert isinstance(stream, AsyncIterator)
    result = await asyncio.wait_for(anext(stream), BOUND)
    assert result.errors is not None
    assert "returned str, not Live" in result.errors[0].message
