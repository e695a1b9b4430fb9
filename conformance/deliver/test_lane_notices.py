"""Lane notices against a spawned nats-server: past nats_grace the lanes
pause and every session watching one is told out of band; on return it is
told they resumed and gets a Reset. s170: the notices reach a GraphQL
subscriber over a real WebSocket through the generated subscription union."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import strawberry

from service_engine import Database, Query, WindowSpec
from service_engine.embedded import EmbeddedNats
from service_engine.graphql import (
    Live,
    Passport,
    SliceFragment,
    compose_service,
    graphql_app,
    presence_subscription_union,
)
from service_engine.lanes import LaneNotice, PresenceEntry
from service_engine.lanes.notices import ACCUMULATED_LANE, LaneNoticeStream
from service_engine.messaging.nats import Nats
from service_engine.render import Reset, Upsert

from ..serve.test_graphql_app import initialise, receive, send, serving, ws_connect
from ..support.harness import assert_never, wait_until
from ..support.nats_support import engine_nats
from ..support.presence_support import Replica, Typing, presence_engine, provision, room
from ..support.sample_cards import CardsView, Principal, RankQuery

ALICE = Principal("alice", frozenset({"acme"}))

GRACE = timedelta(milliseconds=500)


async def _notice(stream: LaneNoticeStream, timeout: float = 10.0) -> LaneNotice:
    return await asyncio.wait_for(anext(stream), timeout)


async def _outage(server: EmbeddedNats, conn: Nats) -> None:
    await asyncio.to_thread(server.stop)
    await wait_until(lambda: not conn.reachable(), what="the client to see the outage")


async def _back(server: EmbeddedNats, conn: Nats) -> None:
    await asyncio.to_thread(server.start)
    await wait_until(conn.reachable, timeout=15, what="the client to reconnect")


async def test_lanes_pause_past_grace_and_resume_with_a_reset(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """Past nats_grace every lane-watching session's owner is told
    LanesPaused { presence } (no revision, no delta on the session); on
    return LanesResumed and then a Reset of the session whose revision
    follows the last one (contiguity untouched)."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, nats_grace=GRACE, typing_ttl=timedelta(seconds=60)
    ) as lanes:
        engine = lanes.engine
        assert engine.lanes_of("typing") == frozenset({"presence"})
        replica = await lanes.attach("typing", room("r1"))
        await lanes.typing.put("r1.alice", {"who": "alice"})
        assert isinstance(await replica.next(), Upsert)
        notices = engine.lane_notices(engine.lanes_of("typing"))
        try:
            await _outage(nats_server, conn)
            paused = await _notice(notices)
            assert paused == LaneNotice(True, ("presence",))
            assert not hasattr(paused, "revision")
            await assert_never(lambda: replica.stream.pending() > 0, within=0.3,
                               what="a delta on the paused session")
            await _back(nats_server, conn)
            resumed = await _notice(notices)
            assert resumed == LaneNotice(False, ("presence",))
            reset = await replica.until(lambda d: isinstance(d, Reset), what="the Reset")
            assert isinstance(reset, Reset) and reset.views == {'"r1.alice"': {"who": "alice"}}
        finally:
            await notices.aclose()


async def test_an_outage_shorter_than_the_grace_pauses_nothing(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A NATS blip shorter than nats_grace sends no notice."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, nats_grace=timedelta(seconds=30)
    ) as lanes:
        notices = lanes.engine.lane_notices()
        try:
            await _outage(nats_server, conn)
            await _back(nats_server, conn)
            with contextlib.suppress(TimeoutError):
                notice = await _notice(notices, timeout=0.5)
                raise AssertionError(f"a notice for a short outage: {notice}")
        finally:
            await notices.aclose()


async def test_a_view_that_watches_the_accumulated_lane_is_paused_and_reset_too(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """A Postgres-backed projector declared to watch the accumulated lane
    (Engine.watch_lane) gets that lane's notices, narrowed to it, and a Reset
    on resume; the raw signal names every watched lane."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, nats_grace=GRACE, also=[CardsView()]
    ) as lanes:
        engine = lanes.engine
        engine.watch_lane(ACCUMULATED_LANE, "cards")
        assert engine.lanes_of("cards") == frozenset({"accumulated"})
        cards = Replica(await engine.attach(ALICE, "cards", WindowSpec(Query(RankQuery()))))
        assert isinstance(await cards.next(), Reset)
        narrowed = engine.lane_notices(engine.lanes_of("cards"))
        everything = engine.lane_notices()
        try:
            await _outage(nats_server, conn)
            assert await _notice(narrowed) == LaneNotice(True, ("accumulated",))
            assert await _notice(everything) == LaneNotice(True, ("accumulated", "presence"))
            await _back(nats_server, conn)
            assert await _notice(narrowed) == LaneNotice(False, ("accumulated",))
            assert isinstance(await cards.next(), Reset)
        finally:
            await narrowed.aclose()
            await everything.aclose()


# -- s170 over a real WebSocket ----------------------------------------------------------------


@dataclass(frozen=True)
class Me:
    id: str


def resolve_me(passport: Passport) -> Me:
    return Me(passport.sub)


@strawberry.type
class Typist:
    who: str


class TypingGql(Typing):
    """The sample typing lane, rendering a GraphQL type."""

    def project(self, row: PresenceEntry, principal: Any) -> Any:
        assert isinstance(row.value, dict)
        return Typist(who=str(row.value["who"]))


TYPING = presence_subscription_union("Typing", Typist)


@strawberry.type
class PresenceSubscription:
    @TYPING.field(description="Who is typing in a room, live.")
    def typing(self, room_id: str) -> Live:
        return Live("typing", room(room_id))


@strawberry.type
class PresenceQuery:
    @strawberry.field
    def ok(self) -> bool:
        return True


SCHEMA = compose_service([
    SliceFragment("presence", query=PresenceQuery, subscription=PresenceSubscription,
                  types=(Typist, *TYPING.types))
]).schema()

SELECTION = """subscription { typing(roomId: "r1") {
    __typename
    ... on TypingReset { revision keys views { who } }
    ... on TypingUpsert { revision key view { who } }
    ... on TypingRemove { revision key }
    ... on LanesPaused { lanes }
    ... on LanesResumed { lanes } } }"""


@contextlib.asynccontextmanager
async def _ws(addr: str) -> AsyncIterator[Any]:
    async with ws_connect(addr, Passport(sub="alice").to_header()) as ws:
        await initialise(ws)
        await send(ws, {"id": "1", "type": "subscribe", "payload": {"query": SELECTION}})
        yield ws


async def _message(ws: Any) -> dict[str, Any]:
    message = await receive(ws)
    assert message["type"] == "next", message
    data: dict[str, Any] = message["payload"]["data"]["typing"]
    return data


async def test_s170_a_lane_pause_reaches_a_graphql_subscriber_over_a_real_websocket(
    db: Database, nats_server: EmbeddedNats
) -> None:
    """s170: a lane notice maps through the generated union into its
    LanesPaused / LanesResumed members and subscribe(deltas, notices)
    merges it into the subscription stream: over graphql-transport-ws the
    subscriber sees LanesPaused past the grace, then LanesResumed followed by
    a Reset, and the notices carry no revision."""
    await provision(nats_server)
    async with engine_nats(nats_server) as conn, presence_engine(
        db, conn, nats_grace=GRACE, typing_ttl=timedelta(seconds=60), typing=TypingGql()
    ) as lanes:
        app = graphql_app(lanes.engine, SCHEMA, resolve_me)
        async with serving(app) as addr, _ws(addr) as ws:
            first = await _message(ws)
            assert first == {"__typename": "TypingReset", "revision": 1, "keys": [], "views": []}
            await lanes.typing.put("r1.alice", {"who": "alice"})
            upsert = await _message(ws)
            assert upsert == {"__typename": "TypingUpsert", "revision": 2,
                              "key": '"r1.alice"', "view": {"who": "alice"}}
            await _outage(nats_server, conn)
            assert await _message(ws) == {"__typename": "LanesPaused", "lanes": ["presence"]}
            await _back(nats_server, conn)
            assert await _message(ws) == {"__typename": "LanesResumed", "lanes": ["presence"]}
            reset = await _message(ws)
            assert reset["__typename"] == "TypingReset" and reset["revision"] == 3
            assert reset["views"] == [{"who": "alice"}]

