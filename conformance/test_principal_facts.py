"""Principal facts contributed by the slices: the engine runs every
registered loader right after the principal is resolved (GraphQL HTTP and
WebSocket attach) and on a principal-facts refresh; a failing loader is
fail-closed, like a failing resolver. Over the GraphQL kit's toy service."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import httpx
import pytest

from service_engine import Database
from service_engine.graphql import PASSPORT_HEADER, graphql_app
from service_engine.principal_facts import PrincipalFactLoadFailed

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


async def test_the_refresh_reloads_the_facts_fail_closed(db: Database) -> None:
    """Registering a loader makes the engine's principal-facts refresh run
    the loaders (a refreshed principal carries the fact once, not twice);
    a failing loader raises PrincipalFactLoadFailed (the refreshed sessions end)."""
    async with running_engine(db) as engine:
        engine.register_principal_fact(adds("fact:one"))
        principal = Me("alice", "acme", ("member",))
        loaded = await engine.load_principal_facts(principal)
        assert loaded.roles == ("member", "fact:one")
        assert engine.render._refresh == engine.load_principal_facts
        engine.register_principal_fact(failing)
        with pytest.raises(PrincipalFactLoadFailed):
            await engine.load_principal_facts(principal)
