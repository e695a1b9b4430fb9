"""The battery's visibility check over every reference projector: for
principals of several orgs, a cross-org board member and a person without
an org, each live window the running reference service opens holds
exactly the committed rows its projector's visibility lets that principal
see (`check_window_matches_visibility`), as `check_gates_match_affordances`
is run over the card slice's gates."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from example_service.kernel import Principal
from example_service.slices import SLICES
from example_service.slices.board.commands import create_board
from example_service.slices.board.domain import OrgBoard
from example_service.slices.board.views import (
    BOARDS,
    ORG_BOARDS,
    ORG_CONTEXT,
    BoardsQuery,
)
from example_service.slices.card.commands import create_card
from example_service.slices.card.views import CARDS, CardsQuery
from example_service.slices.ledger.commands import open_ledger
from example_service.slices.ledger.domain import Ledger
from example_service.slices.ledger.views import LEDGERS, LedgersQuery
from example_service.slices.reply.commands import start_reply, typing_key
from example_service.slices.reply.views import REPLIES, TYPING, RepliesQuery
from example_service.slices.roster.views import PEOPLE, PeopleQuery
from example_twin.contract import Person
from example_twin.roster import publish_roster
from service_engine import Database, Projector, Query, WindowSpec
from service_engine.embedded import EmbeddedNats, ProvisionedDatabase
from service_engine.errors import VisibilityMismatch
from service_engine.impacts.model import canonical_json
from service_engine.lanes import PresenceEntry
from service_engine.persistence import keys as event_keys
from service_engine.render import Reset
from service_engine.render.attached import PopulateCx
from service_engine.render.projector import check_window_matches_visibility

from ..blackbox.harness import provision_kv, provision_lanes
from ..support.example_support import Running, person, running
from ..support.harness import owner_connection, wait_until
from ..support.nats_support import engine_nats

BOUND = 10.0

Candidates = Callable[[Running, Principal], Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True)
class Window:
    """How the battery opens a projector's window and lists the committed
    rows that window's population covers."""

    query: Any
    candidates: Candidates
    rls: bool = False


async def _rows(run: Running, store: Any, sql: str) -> dict[str, Any]:
    async with run.db.pool.acquire() as conn:
        ids = [r[0] for r in await conn.fetch(sql)]
        rows = await store.read_many(conn, ids)
    return {canonical_json(store.key_of(row)): row for row in rows}


def table(store: Any, sql: str) -> Candidates:
    async def read(run: Running, principal: Principal) -> Mapping[str, Any]:
        return await _rows(run, store, sql)

    return read


async def ledgers(run: Running, principal: Principal) -> Mapping[str, Any]:
    async with run.db.pool.acquire() as conn:
        found = await event_keys(conn, Ledger)
        rows = await Ledger.Store.read_many(conn, found)
    return {canonical_json(Ledger.Store.key_of(row)): row for row in rows}


async def org_boards(run: Running, principal: Principal) -> Mapping[str, Any]:
    """What the RLS projector's population covers: the rows the policy
    shows the principal's org context."""
    async with run.db.pool.acquire() as conn, conn.transaction():
        await ORG_CONTEXT.apply(conn, principal)
        ids = [r["id"] for r in await conn.fetch("SELECT id FROM org_board")]
        rows = await OrgBoard.Store.read_many(conn, ids)
    return {canonical_json(OrgBoard.Store.key_of(row)): row for row in rows}


TYPED: dict[str, dict[str, str]] = {
    typing_key("r-acme", "alice"): {"reply_id": "r-acme", "person": "alice", "org": "acme"},
    # A mark of another org on the same reply: selected by the query, never visible.
    typing_key("r-acme", "gina"): {"reply_id": "r-acme", "person": "gina", "org": "globex"},
}


async def typing_marks(run: Running, principal: Principal) -> Mapping[str, Any]:
    return {canonical_json(k): PresenceEntry(k, v, 0) for k, v in TYPED.items()}


def windows() -> dict[str, Window]:
    from example_service.slices.board.domain import Board
    from example_service.slices.card.domain import Card
    from example_service.slices.reply.domain import Reply
    from example_service.slices.roster.domain import Person as KnownPerson

    return {
        BOARDS: Window(BoardsQuery(), table(Board.Store, "SELECT id FROM board")),
        ORG_BOARDS: Window(None, org_boards, rls=True),
        CARDS: Window(CardsQuery(limit=100), table(Card.Store, "SELECT id FROM card")),
        LEDGERS: Window(LedgersQuery(), ledgers),
        REPLIES: Window(RepliesQuery(limit=100), table(Reply.Store, "SELECT id FROM reply")),
        PEOPLE: Window(PeopleQuery(), table(KnownPerson.Store, "SELECT id FROM known_persons")),
        TYPING: Window("r-acme", typing_marks),
    }


def reference_projectors() -> set[str]:
    """Every projector the reference slices declare (each slice's views)."""
    names = set()
    for slice_name in SLICES:
        try:
            module = importlib.import_module(f"example_service.slices.{slice_name}.views")
        except ModuleNotFoundError:
            continue
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, Projector)
                    and value.__module__ == module.__name__):
                names.add(value.NAME)
    return names



async def _seed(run: Running, store: ProvisionedDatabase, nats_url: str) -> None:
    alice, gina = person("alice", "acme"), person("gina", "globex")
    executor = run.executor
    for who, suffix in ((alice, "acme"), (gina, "globex")):
        await executor.execute(who, create_board, f"Plans {suffix}", f"b-{suffix}")
        await executor.execute(who, create_card, f"card {suffix}", f"c-{suffix}")
        await executor.execute(who, open_ledger, f"l-{suffix}")
        await executor.execute(who, start_reply, f"r-{suffix}")
    # zoe, of another org, accepted an invite onto acme's board
    async with owner_connection(store) as owner:
        await owner.execute(
            "INSERT INTO board_member (id, board_id, person) VALUES ('m-zoe', 'b-acme', 'zoe')"
        )
    for key, value in TYPED.items():
        assert await run.engine.present(TYPING, key, value)


async def _window_keys(run: Running, principal: Principal, name: str, spec: Window) -> list[str]:
    stream = await run.engine.attach(
        principal, name, WindowSpec(Query(spec.query), rls=spec.rls),
        applier=ORG_CONTEXT if spec.rls else None,
    )
    try:
        reset = await asyncio.wait_for(stream.next(), BOUND)
        assert isinstance(reset, Reset)
        return list(reset.views)
    finally:
        await stream.aclose()


async def test_every_reference_window_matches_its_visibility(
    store: ProvisionedDatabase, nats_server: EmbeddedNats
) -> None:
    """For every reference projector (the battery's table names each one
    the slices declare) and every principal (two orgs, a cross-org member,
    no org), the running service's window holds exactly the committed rows
    that principal may see; a window holding one more row is refused by the
    same check."""
    specs = windows()
    assert set(specs) == reference_projectors()
    await provision_kv(nats_server.url)
    await provision_lanes(nats_server.url)
    async with engine_nats(nats_server) as nats, running(
        store, ["board", "card", "ledger", "reply", "roster"], nats=nats
    ) as run:
        await publish_roster(nats, [Person(id="gus", name="Gus", org="globex")])
        await _seed(run, store, nats_server.url)
        await wait_until(lambda: _known(run.db, "gus"), timeout=BOUND, what="the mirrored roster")
        principals = [
            await run.engine.load_principal_facts(p)
            for p in (person("alice", "acme"), person("gina", "globex"),
                      person("zoe", "other"), person("nemo", None))
        ]
        checked = 0
        held_somewhere: set[str] = set()
        hidden_somewhere: set[str] = set()
        for name, spec in specs.items():
            projector = run.engine.render.projector(name)
            for principal in principals:
                candidates = await spec.candidates(run, principal)
                held = await _window_keys(run, principal, name, spec)
                check_window_matches_visibility(projector, principal, candidates, held)
                checked += 1
                hidden = sorted(set(candidates) - set(held))
                if held:
                    held_somewhere.add(name)
                if hidden:
                    hidden_somewhere.add(name)
                    with pytest.raises(VisibilityMismatch):
                        check_window_matches_visibility(
                            projector, principal, candidates, [*held, hidden[0]]
                        )
        assert checked == len(specs) * len(principals)
        # The seed gives every window rows to hold, and every cohort-gated
        # one rows some principal must not see (an RLS window's population
        # is already the policy's: its candidates are what the org sees).
        assert held_somewhere == set(specs)
        assert hidden_somewhere == {n for n, spec in specs.items() if not spec.rls}
        zoe_boards = await _window_keys(run, principals[2], BOARDS, specs[BOARDS])
        assert zoe_boards == [canonical_json("b-acme")]
        await _populate_many_lists_each_populate(run, principals, specs)


async def _populate_many_lists_each_populate(
    run: Running, principals: list[Principal], specs: dict[str, Window]
) -> None:
    """Every cohort-gated reference projector's `Projector.populate_many`
    (an attach burst's windows read together) lists, for each principal's
    window, what its `populate` lists for it alone."""
    registry = run.engine.render
    for name, spec in specs.items():
        if spec.rls:
            continue
        projector = registry.projector(name)
        async with registry.reading(projector, None, None) as conn:
            windows = [
                (PopulateCx(p, None, projector.VISIBILITY.window(p), conn), spec.query)
                for p in principals * 3
            ]
            together = [list(keys) for keys in await projector.populate_many(windows)]
            alone = [list(await projector.populate(cx, query)) for cx, query in windows]
        assert together == alone, name
        assert any(together), name


async def _known(db: Database, person_id: str) -> bool:
    found = await db.pool.fetchval("SELECT 1 FROM known_persons WHERE id = $1", person_id)
    return found is not None
