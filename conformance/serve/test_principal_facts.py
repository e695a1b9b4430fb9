"""Principal facts contributed by the slices: the engine runs every
registered loader right after the principal is resolved (GraphQL HTTP and
WebSocket attach) and on a principal-facts refresh; a failing loader is
fail-closed, like a failing resolver. Over the GraphQL kit's toy service,
the render battery's sample cards, and the reference board slice (an
accepted invite reaching the guest's live window)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import httpx
import pytest

from service_engine import Database
from service_engine.embedded import EmbeddedPostgres
from service_engine.graphql import PASSPORT_HEADER, graphql_app
from service_engine.impacts import Impact
from service_engine.impacts.transport import stage_in
from service_engine.render import Remove, Reset, Upsert
from service_engine.render.stream import SessionEnded

from ..blackbox.harness import (
    ACCEPT,
    ADMIN,
    BOARDS_SUBSCRIPTION,
    CREATE,
    GUEST,
    INVITE,
    OUTSIDER,
    key,
)
from ..support.example_support import example_database, running
from ..support.render_support import ALICE as CARDS_ALICE
from ..support.render_support import running_engine as running_cards_engine
from ..support.render_support import window as cards_window
from ..support.sample_cards import CardsView
from ..support.sample_cards import Principal as CardsPrincipal
from .test_graphql_app import (
    ALICE,
    SCHEMA,
    Me,
    closed,
    resolve_me,
    running_engine,
    send,
    serving,
    ws_connect,
)

WHOAMI = {"query": "{ whoami { sub roles } }"}


def adds(role: str, seen: list[str] | None = None) -> Callable[[Me], Awaitable[Me]]:
    async def load(principal: Me) -> Me:
        if seen is not None:
            seen.append(role)
        return dataclasses.replace(principal, roles=(*principal.roles, role))

    return load


async def failing(principal: Me) -> Me:
    raise RuntimeError("the fact table is unreachable")


async def test_loaders_run_in_order_after_the_resolve(db: Database) -> None:
    """Each request's principal carries every slice's fact, loaded in
    registration order right after the passport resolved."""
    seen: list[str] = []
    async with running_engine(db) as engine:
        engine.register_principal_fact(adds("fact:one", seen))
        engine.register_principal_fact(adds("fact:two", seen))
        async with serving(graphql_app(engine, SCHEMA, resolve_me)) as addr, httpx.AsyncClient(
            base_url=f"http://{addr}"
        ) as http:
            body = (await http.post(
                "/graphql", json=WHOAMI, headers={PASSPORT_HEADER: ALICE.to_header()}
            )).json()
    assert body == {"data": {"whoami": {"sub": "alice", "roles": ["member", "fact:one", "fact:two"]}}}
    assert seen == ["fact:one", "fact:two"]


async def test_a_failing_loader_closes_the_request_and_the_socket(db: Database) -> None:
    """A loader that raises serves no data over HTTP and closes the socket at
    connection_init with the internal-error code, as a resolver failure does."""
    async with running_engine(db) as engine:
        engine.register_principal_fact(adds("fact:one"))
        engine.register_principal_fact(failing)
        async with serving(graphql_app(engine, SCHEMA, resolve_me)) as addr:
            async with httpx.AsyncClient(base_url=f"http://{addr}") as http:
                response = await http.post(
                    "/graphql", json=WHOAMI, headers={PASSPORT_HEADER: ALICE.to_header()}
                )
                assert response.status_code != 200 or response.json().get("data") is None
                assert "member" not in response.text
            async with ws_connect(addr, ALICE.to_header()) as ws:
                await send(ws, {"type": "connection_init"})
                close = await closed(ws)
                assert close.rcvd is not None and close.rcvd.code == 4500
                assert "principal" in close.rcvd.reason


async def test_a_failing_loader_on_refresh_ends_the_live_session(db: Database) -> None:
    """On a principal-facts refresh the running engine runs every registered
    loader; one that fails ends the refreshed live session fail-closed,
    never serving it a view gated on stale facts."""
    failing_now = False

    async def flaky(principal: CardsPrincipal) -> CardsPrincipal:
        if failing_now:
            raise RuntimeError("the fact table is unreachable")
        return principal

    async with running_cards_engine(db, CardsView()) as engine:
        engine.register_principal_fact(flaky)
        stream = await engine.attach(CARDS_ALICE, "cards", cards_window())
        assert isinstance(await asyncio.wait_for(stream.next(), 10), Reset)
        failing_now = True
        async with db.pool.acquire() as conn, conn.transaction():
            await stage_in(conn, [Impact.principal_facts(CARDS_ALICE.id, ["card"])])
        with pytest.raises(SessionEnded, match="principal"):
            while True:
                delta = await asyncio.wait_for(stream.next(), 10)
                assert isinstance(delta, Reset | Upsert | Remove)


async def test_accepted_invite_reaches_the_live_window(pg_server: EmbeddedPostgres) -> None:
    """The reference board slice over the running engine: a guest of another
    org subscribed to their boards sees nothing of acme's board; accepting an
    invite (a mutation that stages the guest's principal-facts impact) makes
    the engine re-run the slice's BoardMemberships loader and the board
    arrives in the guest's live window as an Upsert; erasing the guest
    removes the membership and the board leaves that window as a Remove. An
    outsider's window sees neither."""
    async with example_database(pg_server) as store, running(store, ["board"]) as run:
        created = (await run.gql(CREATE, {"id": "b-inv", "title": "plans"}, ADMIN))["createBoard"]
        assert created["success"], created
        async with run.socket(GUEST) as guest, run.socket(OUTSIDER) as outsider:
            await guest.subscribe("g", BOARDS_SUBSCRIPTION)
            await outsider.subscribe("o", BOARDS_SUBSCRIPTION)
            reset = (await guest.next("g"))["boards"]
            assert reset["__typename"] == "BoardsReset" and reset["keys"] == []
            assert (await outsider.next("o"))["boards"]["keys"] == []

            token = (await run.gql(INVITE, {"id": "b-inv"}, ADMIN))["inviteToBoard"]["token"]
            joined = (await run.gql(ACCEPT, {"token": token}, GUEST))["acceptInvite"]
            assert joined["success"], joined
            upsert = (await guest.next("g"))["boards"]
            assert (upsert["__typename"], upsert["key"]) == ("BoardsUpsert", key("b-inv"))
            assert upsert["view"]["member"] is True
            assert upsert["revision"] == reset["revision"] + 1

            erased = await run.engine.erase(GUEST.sub)
            assert erased.fresh
            removed = (await guest.next("g"))["boards"]
            assert (removed["__typename"], removed["key"]) == ("BoardsRemove", key("b-inv"))
            assert removed["revision"] == upsert["revision"] + 1
            await guest.quiet(0.3)
            await outsider.quiet(0.3)
